// Every verifier error of the dist dialect, one case per split.
// RUN: %meshplan-opt %s -split-input-file -verify-diagnostics

// expected-error @+1 {{'dist.mesh' op axis "dp" appears twice}}
dist.mesh @m ["dp" = 2, "dp" = 2]

// -----

// Only reachable in generic form: the custom syntax pairs names and sizes.
// expected-error @+1 {{'dist.mesh' op mesh lists 2 axis names but 1 sizes}}
"dist.mesh"() <{sym_name = "m", axis_names = ["dp", "tp"], shape = array<i64: 2>}> : () -> ()

// -----

// expected-error @+1 {{'dist.mesh' op axis "dp" has size 0; sizes must be >= 1}}
dist.mesh @m ["dp" = 0]

// -----

// expected-error @+1 {{'dist.mesh' op managed axis "ddp" is not an axis of the mesh (axes: dp, tp)}}
dist.mesh @m ["dp" = 2, "tp" = 2] managed = ["ddp"]

// -----

// expected-error @+1 {{'dist.mesh' op device order lists 3 ranks but the mesh has 4 devices}}
dist.mesh @m ["dp" = 2, "tp" = 2] order = [0, 1, 2]

// -----

// expected-error @+1 {{'dist.comm' op refers to @nowhere, which is not a dist.mesh}}
dist.comm @c on @nowhere axes {"dp"}

// -----

dist.mesh @m ["dp" = 2, "tp" = 2]
// expected-error @+1 {{'dist.comm' op axis "fsdp" is not in the mesh (axes: dp, tp)}}
dist.comm @c on @m axes {"fsdp"}

// -----

dist.mesh @m ["x" = 8]
// expected-error @+1 {{'dist.comm' op comm uses overlapping parts of axis "x": x:(1)4 and x:(2)2}}
dist.comm @c on @m axes {"x":(1)4, "x":(2)2}

// -----

dist.mesh @m ["x" = 8]
// expected-error @+1 {{'dist.comm' op sub-axis "x":(1)3: pre-size * size (3) must divide the size of x (8)}}
dist.comm @c on @m axes {"x":(1)3}

// -----

dist.mesh @m ["ddp" = 2, "fsdp" = 2]
// expected-error @+1 {{'dist.comm' op view "slice(ddp,fsdp).slice(fsdp)" groups ranks by [fsdp] but the comm's axes are [ddp]}}
dist.comm @c on @m axes {"ddp"} view = #dist.view<"slice(ddp,fsdp).slice(fsdp)">

// -----

dist.mesh @m ["ddp" = 2, "fsdp" = 2]
// expected-error @+1 {{'dist.comm' op view "slice(ddp).slice(fsdp)": column 12 (slice): axis "fsdp" is not in the view (axes: ddp)}}
dist.comm @c on @m axes {"fsdp"} view = #dist.view<"slice(ddp).slice(fsdp)">

// -----

// expected-error @+1 {{unknown reduce op "mean"; expected one of sum, avg, max, min, product}}
func.func private @f(tensor<8xf32, #dist.layout<@m, [{}], partial(mean) = {"dp"}>>)

// -----

// expected-error @+1 {{sub-axis "x": pre-size and size must be >= 1}}
func.func private @f(tensor<8xf32, #dist.layout<@m, [{"x":(0)2}]>>)

// -----

dist.mesh @m ["dp" = 2, "tp" = 2]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{"dp"}]>>) {
  // expected-error @+1 {{'dist.annotate' op operand already has a layout; use dist.redistribute to change it}}
  %0 = dist.annotate %a : tensor<8xf32, #dist.layout<@m, [{"dp"}]>> -> tensor<8xf32, #dist.layout<@m, [{"tp"}]>>
  return
}

// -----

dist.mesh @m ["dp" = 2, "tp" = 2]
func.func @f(%a: tensor<8xf32>) {
  // expected-error @+1 {{'dist.annotate' op result has no #dist.layout encoding}}
  %0 = dist.annotate %a : tensor<8xf32> -> tensor<8xf32>
  return
}

// -----

dist.mesh @m ["dp" = 2, "tp" = 2]
func.func @f(%a: tensor<8xf32>) {
  // expected-error @+1 {{'dist.annotate' op changes the tensor itself ('tensor<8xf32>' -> 'tensor<8xf16, #dist.layout<@m, [{"dp"}]>>'); only the layout may be added}}
  %0 = dist.annotate %a : tensor<8xf32> -> tensor<8xf16, #dist.layout<@m, [{"dp"}]>>
  return
}

// -----

dist.mesh @m ["dp" = 2, "tp" = 2]
func.func @f(%a: tensor<8xf32>) {
  // expected-error @+1 {{'dist.annotate' op layout has 2 dims but the tensor has 1}}
  %0 = dist.annotate %a : tensor<8xf32> -> tensor<8xf32, #dist.layout<@m, [{"dp"}, {}]>>
  return
}

// -----

dist.mesh @m ["dp" = 2, "tp" = 2]
func.func @f(%a: tensor<8xf32>) {
  // expected-error @+1 {{'dist.annotate' op layout: dim 0: axis "fsdp" is not in the mesh (axes: dp, tp)}}
  %0 = dist.annotate %a : tensor<8xf32> -> tensor<8xf32, #dist.layout<@m, [{"fsdp"}]>>
  return
}

// -----

dist.mesh @m ["dp" = 2, "tp" = 2]
func.func @f(%a: tensor<8x4xf32>) {
  // expected-error @+1 {{'dist.annotate' op layout: layout uses axis "dp" twice}}
  %0 = dist.annotate %a : tensor<8x4xf32> -> tensor<8x4xf32, #dist.layout<@m, [{"dp"}, {"dp"}]>>
  return
}

// -----

dist.mesh @m ["r" = 2, "s" = 2] managed = ["r"]
func.func @f(%a: tensor<8xf32>) {
  // expected-error @+1 {{'dist.annotate' op layout: managed axis "r" cannot split tensor dim 0}}
  %0 = dist.annotate %a : tensor<8xf32> -> tensor<8xf32, #dist.layout<@m, [{"r"}]>>
  return
}

// -----

func.func @f(%a: tensor<8xf32>) {
  // expected-error @+1 {{'dist.annotate' op refers to @nowhere, which is not a dist.mesh}}
  %0 = dist.annotate %a : tensor<8xf32> -> tensor<8xf32, #dist.layout<@nowhere, [{"dp"}]>>
  return
}

// -----

dist.mesh @m ["dp" = 2]
dist.mesh @n ["dp" = 2]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{"dp"}]>>) {
  // expected-error @+1 {{'dist.redistribute' op operand is on mesh @m but the result is on mesh @n}}
  %0 = dist.redistribute %a : tensor<8xf32, #dist.layout<@m, [{"dp"}]>> -> tensor<8xf32, #dist.layout<@n, [{"dp"}]>>
  return
}

// -----

dist.mesh @m ["dp" = 2]
func.func @f(%a: tensor<8xf32>) {
  // expected-error @+1 {{'dist.redistribute' op operand has no #dist.layout encoding}}
  %0 = dist.redistribute %a : tensor<8xf32> -> tensor<8xf32, #dist.layout<@m, [{"dp"}]>>
  return
}

// -----

dist.mesh @m ["dp" = 2, "tp" = 2]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{"tp", "dp"}]>>) {
  // expected-error @+1 {{'dist.all_gather' op all_gather: axes {tp} are not the minor-most levels of dim 0 (its axes: {tp,dp})}}
  %0 = dist.all_gather %a dim 0 over {"tp"} : tensor<8xf32, #dist.layout<@m, [{"tp", "dp"}]>> -> tensor<8xf32, #dist.layout<@m, [{"dp"}]>>
  return
}

// -----

dist.mesh @m ["dp" = 2, "tp" = 2]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{"tp", "dp"}]>>) {
  // expected-error @+1 {{'dist.all_gather' op result layout [{}] is not what all_gather makes of [{tp,dp}] (expected [{tp}])}}
  %0 = dist.all_gather %a dim 0 over {"dp"} : tensor<8xf32, #dist.layout<@m, [{"tp", "dp"}]>> -> tensor<8xf32, #dist.layout<@m, [{}]>>
  return
}

// -----

dist.mesh @m ["dp" = 2, "tp" = 2]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{"dp"}]>>) {
  // expected-error @+1 {{'dist.all_gather' op all_gather: dim 1 is out of range for a 1-d tensor}}
  %0 = dist.all_gather %a dim 1 over {"dp"} : tensor<8xf32, #dist.layout<@m, [{"dp"}]>> -> tensor<8xf32, #dist.layout<@m, [{}]>>
  return
}

// -----

dist.mesh @m ["dp" = 2, "tp" = 2]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"dp"}>>) {
  // expected-error @+1 {{'dist.all_reduce' op all_reduce: axis "tp" is not partial in the operand's layout}}
  %0 = dist.all_reduce %a sum over {"tp"} : tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"dp"}>> -> tensor<8xf32, #dist.layout<@m, [{}]>>
  return
}

// -----

dist.mesh @m ["dp" = 2, "tp" = 2]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"dp"}>>) {
  // expected-error @+1 {{'dist.reduce_scatter' op reduce_scatter: reduce op max differs from the operand's pending sum}}
  %0 = dist.reduce_scatter %a dim 0 max over {"dp"} : tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"dp"}>> -> tensor<8xf32, #dist.layout<@m, [{"dp"}]>>
  return
}

// -----

dist.mesh @m ["dp" = 2, "tp" = 2]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{"dp"}]>>) {
  // expected-error @+1 {{'dist.local_slice' op local_slice: axis "dp" is split or partial in the operand's layout}}
  %0 = dist.local_slice %a dim 0 over {"dp"} : tensor<8xf32, #dist.layout<@m, [{"dp"}]>> -> tensor<8xf32, #dist.layout<@m, [{"tp"}]>>
  return
}

// -----

dist.mesh @m ["dp" = 2, "tp" = 2]
func.func @f(%a: tensor<8x4xf32, #dist.layout<@m, [{"dp"}, {}]>>) {
  // expected-error @+1 {{'dist.all_to_all' op all_to_all: source and target dim are both 0}}
  %0 = dist.all_to_all %a dim 0 to 0 over {"dp"} : tensor<8x4xf32, #dist.layout<@m, [{"dp"}, {}]>> -> tensor<8x4xf32, #dist.layout<@m, [{"dp"}, {}]>>
  return
}

// -----

dist.mesh @m ["dp" = 2, "tp" = 2]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{"dp", "tp"}]>>) {
  // expected-error @+1 {{'dist.permute' op permute: {dp} is not a reordering of {dp,tp}}}
  %0 = dist.permute %a dim 0 to {"dp"} over {"dp", "tp"} : tensor<8xf32, #dist.layout<@m, [{"dp", "tp"}]>> -> tensor<8xf32, #dist.layout<@m, [{"tp", "dp"}]>>
  return
}

// -----

dist.mesh @m ["dp" = 2, "tp" = 2]
func.func @f(%a: tensor<7xf32, #dist.layout<@m, [{"dp", "tp"}]>>) {
  // expected-error @+1 {{'dist.permute' op permute: dim 0 (size 7) is not split evenly, so boxes differ in size and cannot be permuted}}
  %0 = dist.permute %a dim 0 to {"tp", "dp"} over {"dp", "tp"} : tensor<7xf32, #dist.layout<@m, [{"dp", "tp"}]>> -> tensor<7xf32, #dist.layout<@m, [{"tp", "dp"}]>>
  return
}

// -----

dist.mesh @m ["dp" = 2, "tp" = 2]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"dp"}>>) {
  // expected-error @+1 {{'dist.mark_partial' op mark_partial: reduce op max differs from the operand's pending sum}}
  %0 = dist.mark_partial %a max over {"tp"} : tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"dp"}>> -> tensor<8xf32, #dist.layout<@m, [{}], partial(max) = {"dp", "tp"}>>
  return
}

// -----

dist.mesh @m ["dp" = 2, "tp" = 2]
dist.comm @c on @m axes {"tp"}
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{"dp"}]>>) {
  // expected-error @+1 {{'dist.all_gather' op comm @c groups ranks by [tp] but the op's axes are [dp]}}
  %0 = dist.all_gather %a dim 0 over {"dp"} comm = @c : tensor<8xf32, #dist.layout<@m, [{"dp"}]>> -> tensor<8xf32, #dist.layout<@m, [{}]>>
  return
}

// -----

dist.mesh @m ["dp" = 2, "tp" = 2]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{"dp"}]>>) {
  // expected-error @+1 {{'dist.all_gather' op refers to @c, which is not a dist.comm}}
  %0 = dist.all_gather %a dim 0 over {"dp"} comm = @c : tensor<8xf32, #dist.layout<@m, [{"dp"}]>> -> tensor<8xf32, #dist.layout<@m, [{}]>>
  return
}

// -----

dist.mesh @m ["dp" = 2, "tp" = 2]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{}]>>) {
  // expected-error @+1 {{'dist.broadcast' op root 2 is outside the group of 2 ranks}}
  %0 = dist.broadcast %a root 2 over {"dp"} : tensor<8xf32, #dist.layout<@m, [{}]>> -> tensor<8xf32, #dist.layout<@m, [{}]>>
  return
}

// -----

dist.mesh @m ["dp" = 2, "tp" = 2]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{}]>>) {
  // expected-error @+1 {{'dist.all_reduce' op all_reduce: empty axis list}}
  %0 = dist.all_reduce %a sum over {} : tensor<8xf32, #dist.layout<@m, [{}]>> -> tensor<8xf32, #dist.layout<@m, [{}]>>
  return
}

// -----

dist.mesh @m ["dp" = 2]
func.func @f(%a: tensor<8xf32>) {
  // expected-error @+1 {{'dist.all_gather' op has neither layouts (global form) nor a group (rank-local form)}}
  %0 = dist.all_gather %a dim 0 over {"dp"} : tensor<8xf32> -> tensor<16xf32>
  return
}

// -----

dist.mesh @m ["dp" = 2]
func.func @f(%a: tensor<8xf32>) {
  // expected-error @+1 {{'dist.all_gather' op has an empty group}}
  %0 = dist.all_gather %a dim 0 over {"dp"} group = [] : tensor<8xf32> -> tensor<16xf32>
  return
}

// -----

dist.mesh @m ["dp" = 2]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{"dp"}]>>) {
  // expected-error @+1 {{'dist.all_gather' op has layouts and a group; a group belongs to the rank-local form only}}
  %0 = dist.all_gather %a dim 0 over {"dp"} group = [0, 1] : tensor<8xf32, #dist.layout<@m, [{"dp"}]>> -> tensor<8xf32, #dist.layout<@m, [{}]>>
  return
}

// -----

dist.mesh @m ["dp" = 2]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{"dp"}]>>) {
  // expected-error @+1 {{'dist.all_gather' op changes the tensor itself}}
  %0 = dist.all_gather %a dim 0 over {"dp"} : tensor<8xf32, #dist.layout<@m, [{"dp"}]>> -> tensor<16xf32, #dist.layout<@m, [{}]>>
  return
}

// -----

dist.mesh @m ["dp" = 2]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{"dp"}]>>) {
  // expected-error @+1 {{'dist.all_gather' op result has no #dist.layout encoding}}
  %0 = dist.all_gather %a dim 0 over {"dp"} : tensor<8xf32, #dist.layout<@m, [{"dp"}]>> -> tensor<8xf32>
  return
}

// -----

dist.mesh @m ["dp" = 2]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{"dp"}, {}]>>) {
  // expected-error @+1 {{'dist.redistribute' op operand layout has 2 dims but the tensor has 1}}
  %0 = dist.redistribute %a : tensor<8xf32, #dist.layout<@m, [{"dp"}, {}]>> -> tensor<8xf32, #dist.layout<@m, [{}]>>
  return
}

// -----

dist.mesh @m ["dp" = 2]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{"dp"}]>>) {
  // expected-error @+1 {{'dist.redistribute' op result layout: dim 0: axis "tp" is not in the mesh (axes: dp)}}
  %0 = dist.redistribute %a : tensor<8xf32, #dist.layout<@m, [{"dp"}]>> -> tensor<8xf32, #dist.layout<@m, [{"tp"}]>>
  return
}

// -----

dist.mesh @m ["dp" = 2]
dist.mesh @n ["dp" = 2]
dist.comm @c on @n axes {"dp"}
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{"dp"}]>>) {
  // expected-error @+1 {{'dist.all_gather' op comm @c is not on the operand's mesh}}
  %0 = dist.all_gather %a dim 0 over {"dp"} comm = @c : tensor<8xf32, #dist.layout<@m, [{"dp"}]>> -> tensor<8xf32, #dist.layout<@m, [{}]>>
  return
}

// -----

dist.mesh @m ["dp" = 2]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{}]>>) {
  // expected-error @+1 {{'dist.broadcast' op root -1 is negative}}
  %0 = dist.broadcast %a root -1 over {"dp"} : tensor<8xf32, #dist.layout<@m, [{}]>> -> tensor<8xf32, #dist.layout<@m, [{}]>>
  return
}

// -----

func.func @f(%a: tensor<4x8xf32>, %b: tensor<4x8xf32>) {
  // expected-error @+1 {{'dist.matmul' op shapes do not multiply: 'tensor<4x8xf32>' x 'tensor<4x8xf32>' -> 'tensor<4x8xf32>'}}
  %0 = dist.matmul %a, %b : tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x8xf32>
  return
}

// -----

func.func @f(%a: tensor<4x8x2xf32>, %b: tensor<8x2xf32>) {
  // expected-error @+1 {{'dist.matmul' op takes 2-d operands and result}}
  %0 = dist.matmul %a, %b : tensor<4x8x2xf32>, tensor<8x2xf32> -> tensor<4x2xf32>
  return
}

// -----

func.func @f(%a: tensor<4x8xf32>) {
  // expected-error @+1 {{'dist.bitcast' op changes the number of bits in the last dim ('tensor<4x8xf32>' -> 'tensor<4x8xbf16>')}}
  %0 = dist.bitcast %a : tensor<4x8xf32> -> tensor<4x8xbf16>
  return
}

// -----

func.func @f(%a: tensor<4x8xf32>) {
  // expected-error @+1 {{'dist.bitcast' op may change only the last dim ('tensor<4x8xf32>' -> 'tensor<2x16xf32>')}}
  %0 = dist.bitcast %a : tensor<4x8xf32> -> tensor<2x16xf32>
  return
}

// -----

func.func @f(%a: tensor<4x8xf32>) {
  // expected-error @+1 {{'dist.reduce_sum' op dim 2 is out of range for 'tensor<4x8xf32>'}}
  %0 = dist.reduce_sum %a dims = [2] : tensor<4x8xf32> -> tensor<4x8xf32>
  return
}

// -----

func.func @f(%a: tensor<4x8xf32>) {
  // expected-error @+1 {{'dist.reduce_sum' op result 'tensor<8xf32>' is not 'tensor<4x8xf32>' summed over the given dims}}
  %0 = dist.reduce_sum %a dims = [1] : tensor<4x8xf32> -> tensor<8xf32>
  return
}

// -----

func.func @f(%a: tensor<4x8xf32>) {
  // expected-error @+1 {{'dist.reshape' op changes the elements ('tensor<4x8xf32>' -> 'tensor<30xf32>')}}
  %0 = dist.reshape %a : tensor<4x8xf32> -> tensor<30xf32>
  return
}

// -----

dist.mesh @m ["dp" = 2]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"dp"}>>) {
  // expected-error @+1 {{unknown reduce op "mean"; expected one of sum, avg, max, min, product}}
  %0 = dist.all_reduce %a mean over {"dp"} : tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"dp"}>> -> tensor<8xf32, #dist.layout<@m, [{}]>>
  return
}

// -----

// Training-step ops (dist.compute, dist.optimizer_step, dist.adamw,
// dist.fp8_amax, dist.fp8_cast, dist.free) and fault_tolerant all_reduce.

// expected-error @+1 {{'dist.compute' op needs a module name}}
dist.compute forward "" ()

// -----

func.func @f(%a: tensor<8xf32>) {
  // expected-error @+1 {{'dist.compute' op forward produces no values; gradients come from backward}}
  %0 = dist.compute forward "l" (%a) : tensor<8xf32> -> tensor<8xf32>
  return
}

// -----

func.func @f(%a: tensor<8xf32>) {
  // expected-error @+1 {{'dist.compute' op has 2 gradients but only 1 inputs}}
  %0, %1 = dist.compute backward "l" (%a) : tensor<8xf32> -> tensor<8xf32>, tensor<8xf32>
  return
}

// -----

// expected-error @+1 {{'dist.compute' op flops must be >= 0}}
dist.compute forward "l" () flops = -1.0

// -----

func.func @f(%a: tensor<8xf32, #dist.layout<@nowhere, [{"dp"}]>>) {
  // expected-error @+1 {{'dist.compute' op refers to @nowhere, which is not a dist.mesh}}
  dist.compute forward "l" (%a) : tensor<8xf32, #dist.layout<@nowhere, [{"dp"}]>>
  return
}

// -----

dist.mesh @m ["dp" = 2]
dist.mesh @n ["dp" = 2]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{"dp"}]>>, %b: tensor<8xf32, #dist.layout<@n, [{"dp"}]>>) {
  // expected-error @+1 {{'dist.compute' op operand #1 is on mesh @n but an earlier value is on @m}}
  dist.compute forward "l" (%a, %b) : tensor<8xf32, #dist.layout<@m, [{"dp"}]>>, tensor<8xf32, #dist.layout<@n, [{"dp"}]>>
  return
}

// -----

dist.mesh @m ["dp" = 2]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{}]>>) {
  // expected-error @+1 {{'dist.compute' op result #0 layout has 2 dims but the tensor has 1}}
  %0 = dist.compute backward "l" (%a) : tensor<8xf32, #dist.layout<@m, [{}]>> -> tensor<8xf32, #dist.layout<@m, [{}, {}], partial(sum) = {"dp"}>>
  return
}

// -----

dist.mesh @m ["dp" = 2]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{"tp"}]>>) {
  // expected-error @+1 {{'dist.compute' op operand #0 layout: dim 0: axis "tp" is not in the mesh (axes: dp)}}
  dist.compute forward "l" (%a) : tensor<8xf32, #dist.layout<@m, [{"tp"}]>>
  return
}

// -----

func.func @f(%w: tensor<8x4xf32>, %g: tensor<4x8xf32>) {
  // expected-error @+1 {{'dist.optimizer_step' op gradient shape differs from the parameter's ('tensor<4x8xf32>' vs 'tensor<8x4xf32>')}}
  dist.optimizer_step %w, %g : tensor<8x4xf32>, tensor<4x8xf32>
  return
}

// -----

func.func @f(%w: tensor<8xf32>, %g: tensor<8xi32>) {
  // expected-error @+1 {{'dist.optimizer_step' op needs floating-point parameter and gradient}}
  dist.optimizer_step %w, %g : tensor<8xf32>, tensor<8xi32>
  return
}

// -----

dist.mesh @m ["dp" = 2]
func.func @f(%w: tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"dp"}>>, %g: tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"dp"}>>) {
  // expected-error @+1 {{'dist.optimizer_step' op parameter layout is partial; a stored parameter is never pending a reduction}}
  dist.optimizer_step %w, %g : tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"dp"}>>, tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"dp"}>>
  return
}

// -----

dist.mesh @m ["dp" = 2]
dist.mesh @n ["dp" = 2]
func.func @f(%w: tensor<8xf32, #dist.layout<@m, [{"dp"}]>>, %g: tensor<8xf32, #dist.layout<@n, [{}], partial(sum) = {"dp"}>>) {
  // expected-error @+1 {{'dist.optimizer_step' op operand #1 is on mesh @n but an earlier value is on @m}}
  dist.optimizer_step %w, %g : tensor<8xf32, #dist.layout<@m, [{"dp"}]>>, tensor<8xf32, #dist.layout<@n, [{}], partial(sum) = {"dp"}>>
  return
}

// -----

func.func @f(%p: tensor<8xf32>, %g: tensor<4xf32>, %m: tensor<8xf32>, %v: tensor<8xf32>) {
  // expected-error @+1 {{'dist.adamw' op gradient shape differs from the parameter's ('tensor<4xf32>' vs 'tensor<8xf32>')}}
  %0:3 = dist.adamw %p, %g, %m, %v {lr = 1.0e-3, beta1 = 0.9, beta2 = 0.999, eps = 1.0e-8, weight_decay = 0.0, seed = 0, tensor_id = 0} : tensor<8xf32>, tensor<4xf32>, tensor<8xf32>, tensor<8xf32>
  return
}

// -----

dist.mesh @m ["dp" = 2]
func.func @f(%p: tensor<8xf32, #dist.layout<@m, [{"dp"}]>>, %g: tensor<8xf32, #dist.layout<@m, [{"dp"}]>>, %m: tensor<8xf32, #dist.layout<@m, [{"dp"}]>>, %v: tensor<8xf32, #dist.layout<@m, [{}]>>) {
  // expected-error @+1 {{'dist.adamw' op exp_avg_sq is laid out differently from the parameter ('tensor<8xf32, #dist.layout<@m, [{}]>>' vs 'tensor<8xf32, #dist.layout<@m, [{"dp"}]>>'); the update must be local to the stored shard}}
  %0:3 = dist.adamw %p, %g, %m, %v {lr = 1.0e-3, beta1 = 0.9, beta2 = 0.999, eps = 1.0e-8, weight_decay = 0.0, seed = 0, tensor_id = 0} : tensor<8xf32, #dist.layout<@m, [{"dp"}]>>, tensor<8xf32, #dist.layout<@m, [{"dp"}]>>, tensor<8xf32, #dist.layout<@m, [{"dp"}]>>, tensor<8xf32, #dist.layout<@m, [{}]>>
  return
}

// -----

dist.mesh @m ["dp" = 2]
func.func @f(%p: tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"dp"}>>, %m: tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"dp"}>>) {
  // expected-error @+1 {{'dist.adamw' op operands are partial; reduce the gradient first}}
  %0:3 = dist.adamw %p, %p, %m, %m {lr = 1.0e-3, beta1 = 0.9, beta2 = 0.999, eps = 1.0e-8, weight_decay = 0.0, seed = 0, tensor_id = 0} : tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"dp"}>>, tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"dp"}>>, tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"dp"}>>, tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"dp"}>>
  return
}

// -----

func.func @f(%p: tensor<8xbf16>, %m: tensor<8xf32>, %v: tensor<8xbf16>) {
  // expected-error @+1 {{'dist.adamw' op optimizer state must be float32}}
  %0:3 = dist.adamw %p, %p, %m, %v {lr = 1.0e-3, beta1 = 0.9, beta2 = 0.999, eps = 1.0e-8, weight_decay = 0.0, seed = 0, tensor_id = 0} : tensor<8xbf16>, tensor<8xbf16>, tensor<8xf32>, tensor<8xbf16>
  return
}

// -----

func.func @f(%p: tensor<8xi32>, %m: tensor<8xf32>) {
  // expected-error @+1 {{'dist.adamw' op needs floating-point parameter and gradient}}
  %0:3 = dist.adamw %p, %p, %m, %m {lr = 1.0e-3, beta1 = 0.9, beta2 = 0.999, eps = 1.0e-8, weight_decay = 0.0, seed = 0, tensor_id = 0} : tensor<8xi32>, tensor<8xi32>, tensor<8xf32>, tensor<8xf32>
  return
}

// -----

func.func @f(%p: tensor<8xf32>) {
  // expected-error @+1 {{'dist.adamw' op stochastic rounding needs a bfloat16 parameter, not 'f32'}}
  %0:3 = dist.adamw %p, %p, %p, %p {lr = 1.0e-3, beta1 = 0.9, beta2 = 0.999, eps = 1.0e-8, weight_decay = 0.0, stochastic_rounding, seed = 0, tensor_id = 0} : tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>
  return
}

// -----

func.func @f(%p: tensor<8xf32>) {
  // expected-error @+1 {{'dist.adamw' op hyper-parameters out of range (lr >= 0, 0 <= beta < 1, eps > 0, weight_decay >= 0)}}
  %0:3 = dist.adamw %p, %p, %p, %p {lr = 1.0e-3, beta1 = 1.0, beta2 = 0.999, eps = 1.0e-8, weight_decay = 0.0, seed = 0, tensor_id = 0} : tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>
  return
}

// -----

dist.mesh @m ["dp" = 2]
func.func @f(%p: tensor<8xf32, #dist.layout<@m, [{"tp"}]>>) {
  // expected-error @+1 {{'dist.adamw' op operand #0 layout: dim 0: axis "tp" is not in the mesh (axes: dp)}}
  %0:3 = dist.adamw %p, %p, %p, %p {lr = 1.0e-3, beta1 = 0.9, beta2 = 0.999, eps = 1.0e-8, weight_decay = 0.0, seed = 0, tensor_id = 0} : tensor<8xf32, #dist.layout<@m, [{"tp"}]>>, tensor<8xf32, #dist.layout<@m, [{"tp"}]>>, tensor<8xf32, #dist.layout<@m, [{"tp"}]>>, tensor<8xf32, #dist.layout<@m, [{"tp"}]>>
  return
}

// -----

// Only reachable in generic form: the custom syntax cannot spell an empty
// type list.
func.func @f() {
  // expected-error @+1 {{'dist.fp8_amax' op needs at least one input}}
  %0 = "dist.fp8_amax"() : () -> tensor<0xf32>
  return
}

// -----

func.func @f(%a: tensor<8xbf16>, %b: tensor<8xbf16>) {
  // expected-error @+1 {{'dist.fp8_amax' op result must be tensor<2xf32>, one amax per input}}
  %0 = dist.fp8_amax %a, %b : tensor<8xbf16>, tensor<8xbf16> -> tensor<1xf32>
  return
}

// -----

func.func @f(%a: tensor<8xbf16>, %b: tensor<8xi8>) {
  // expected-error @+1 {{'dist.fp8_amax' op operand #1 is not floating-point}}
  %0 = dist.fp8_amax %a, %b : tensor<8xbf16>, tensor<8xi8> -> tensor<2xf32>
  return
}

// -----

dist.mesh @m ["dp" = 2]
func.func @f(%a: tensor<8xbf16, #dist.layout<@m, [{}], partial(sum) = {"dp"}>>) {
  // expected-error @+1 {{'dist.fp8_amax' op operand #0 is partial; its amax is undefined}}
  %0 = dist.fp8_amax %a : tensor<8xbf16, #dist.layout<@m, [{}], partial(sum) = {"dp"}>> -> tensor<1xf32, #dist.layout<@m, [{}], partial(max) = {"dp"}>>
  return
}

// -----

dist.mesh @m ["dp" = 2, "tp" = 2]
func.func @f(%a: tensor<8xbf16, #dist.layout<@m, [{"dp"}]>>, %b: tensor<8xbf16, #dist.layout<@m, [{"tp"}]>>) {
  // expected-error @+1 {{'dist.fp8_amax' op operand #1 is split over [tp] but operand #0 over [dp]; one amax all-reduce needs one set of axes}}
  %0 = dist.fp8_amax %a, %b : tensor<8xbf16, #dist.layout<@m, [{"dp"}]>>, tensor<8xbf16, #dist.layout<@m, [{"tp"}]>> -> tensor<2xf32, #dist.layout<@m, [{}], partial(max) = {"dp"}>>
  return
}

// -----

dist.mesh @m ["dp" = 2]
func.func @f(%a: tensor<8xbf16, #dist.layout<@m, [{"dp"}]>>) {
  // expected-error @+1 {{'dist.fp8_amax' op result must not be split}}
  %0 = dist.fp8_amax %a : tensor<8xbf16, #dist.layout<@m, [{"dp"}]>> -> tensor<1xf32, #dist.layout<@m, [{"dp"}]>>
  return
}

// -----

dist.mesh @m ["dp" = 2]
func.func @f(%a: tensor<8xbf16, #dist.layout<@m, [{"dp"}]>>) {
  // expected-error @+1 {{'dist.fp8_amax' op result must be partial(max)}}
  %0 = dist.fp8_amax %a : tensor<8xbf16, #dist.layout<@m, [{"dp"}]>> -> tensor<1xf32, #dist.layout<@m, [{}], partial(sum) = {"dp"}>>
  return
}

// -----

dist.mesh @m ["dp" = 2, "tp" = 2]
func.func @f(%a: tensor<8xbf16, #dist.layout<@m, [{"dp"}]>>) {
  // expected-error @+1 {{'dist.fp8_amax' op result is partial over [dp,tp] but the inputs are split over [dp]}}
  %0 = dist.fp8_amax %a : tensor<8xbf16, #dist.layout<@m, [{"dp"}]>> -> tensor<1xf32, #dist.layout<@m, [{}], partial(max) = {"dp", "tp"}>>
  return
}

// -----

dist.mesh @m ["dp" = 2]
dist.mesh @n ["dp" = 2]
func.func @f(%a: tensor<8xbf16, #dist.layout<@m, [{"dp"}]>>) {
  // expected-error @+1 {{'dist.fp8_amax' op result is on mesh @n but an earlier value is on @m}}
  %0 = dist.fp8_amax %a : tensor<8xbf16, #dist.layout<@m, [{"dp"}]>> -> tensor<1xf32, #dist.layout<@n, [{}], partial(max) = {"dp"}>>
  return
}

// -----

func.func @f(%w: tensor<8xbf16>, %a: tensor<1xf32>) {
  // expected-error @+1 {{'dist.fp8_cast' op result element type must be f8E4M3FN or f8E5M2, not 'bf16'}}
  %0 = dist.fp8_cast %w scale %a[0] : tensor<8xbf16>, tensor<1xf32> -> tensor<8xbf16>
  return
}

// -----

func.func @f(%w: tensor<8xbf16>, %a: tensor<1xf32>) {
  // expected-error @+1 {{'dist.fp8_cast' op changes more than the element type ('tensor<8xbf16>' -> 'tensor<4xf8E4M3FN>')}}
  %0 = dist.fp8_cast %w scale %a[0] : tensor<8xbf16>, tensor<1xf32> -> tensor<4xf8E4M3FN>
  return
}

// -----

dist.mesh @m ["dp" = 2]
func.func @f(%w: tensor<8xbf16, #dist.layout<@m, [{"dp"}]>>, %a: tensor<1xf32, #dist.layout<@m, [{}]>>) {
  // expected-error @+1 {{'dist.fp8_cast' op changes more than the element type ('tensor<8xbf16, #dist.layout<@m, [{"dp"}]>>' -> 'tensor<8xf8E4M3FN, #dist.layout<@m, [{}]>>')}}
  %0 = dist.fp8_cast %w scale %a[0] : tensor<8xbf16, #dist.layout<@m, [{"dp"}]>>, tensor<1xf32, #dist.layout<@m, [{}]>> -> tensor<8xf8E4M3FN, #dist.layout<@m, [{}]>>
  return
}

// -----

func.func @f(%w: tensor<8xbf16>, %a: tensor<1xbf16>) {
  // expected-error @+1 {{'dist.fp8_cast' op amax must be a 1-D float32 tensor}}
  %0 = dist.fp8_cast %w scale %a[0] : tensor<8xbf16>, tensor<1xbf16> -> tensor<8xf8E5M2>
  return
}

// -----

func.func @f(%w: tensor<8xbf16>, %a: tensor<2xf32>) {
  // expected-error @+1 {{'dist.fp8_cast' op amax index 2 is outside 'tensor<2xf32>'}}
  %0 = dist.fp8_cast %w scale %a[2] : tensor<8xbf16>, tensor<2xf32> -> tensor<8xf8E4M3FN>
  return
}

// -----

func.func @f(%w: tensor<8xbf16>, %a: tensor<?xf32>) {
  // expected-error @+1 {{'dist.fp8_cast' op amax index -1 is outside 'tensor<?xf32>'}}
  %0 = dist.fp8_cast %w scale %a[-1] : tensor<8xbf16>, tensor<?xf32> -> tensor<8xf8E4M3FN>
  return
}

// -----

dist.mesh @m ["dp" = 2]
func.func @f(%w: tensor<8xbf16, #dist.layout<@m, [{"dp"}]>>, %a: tensor<1xf32, #dist.layout<@m, [{}], partial(max) = {"dp"}>>) {
  // expected-error @+1 {{'dist.fp8_cast' op amax is still partial; all-reduce it (max) before casting, or ranks scale differently}}
  %0 = dist.fp8_cast %w scale %a[0] : tensor<8xbf16, #dist.layout<@m, [{"dp"}]>>, tensor<1xf32, #dist.layout<@m, [{}], partial(max) = {"dp"}>> -> tensor<8xf8E4M3FN, #dist.layout<@m, [{"dp"}]>>
  return
}

// -----

dist.mesh @m ["dp" = 2]
dist.mesh @n ["dp" = 2]
func.func @f(%w: tensor<8xbf16, #dist.layout<@m, [{"dp"}]>>, %a: tensor<1xf32, #dist.layout<@n, [{}]>>) {
  // expected-error @+1 {{'dist.fp8_cast' op operand #1 is on mesh @n but an earlier value is on @m}}
  %0 = dist.fp8_cast %w scale %a[0] : tensor<8xbf16, #dist.layout<@m, [{"dp"}]>>, tensor<1xf32, #dist.layout<@n, [{}]>> -> tensor<8xf8E4M3FN, #dist.layout<@m, [{"dp"}]>>
  return
}

// -----

// Only reachable in generic form: the custom syntax cannot spell an empty
// type list.
func.func @f() {
  // expected-error @+1 {{'dist.free' op needs at least one value}}
  "dist.free"() : () -> ()
  return
}

// -----

func.func @f(%a: tensor<8xf32>) {
  // expected-error @+1 {{'dist.free' op frees a value that is used afterwards}}
  dist.free %a : tensor<8xf32>
  dist.compute forward "l" (%a) : tensor<8xf32>
  return
}

// -----

dist.mesh @m ["dp" = 2, "tp" = 2] managed = ["dp"]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"dp", "tp"}>>) {
  // expected-error @+1 {{'dist.all_reduce' op is fault_tolerant but reduces over no managed axis}}
  %0 = dist.all_reduce %a sum fault_tolerant over {"tp"} : tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"dp", "tp"}>> -> tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"dp"}>>
  return
}

// -----

// A size-1 piece of a managed axis reduces over nothing of it.
dist.mesh @m ["dp" = 2, "tp" = 2] managed = ["dp"]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"tp"}>>) {
  // expected-error @+1 {{'dist.all_reduce' op is fault_tolerant but reduces over no managed axis}}
  %0 = dist.all_reduce %a sum fault_tolerant over {"tp", "dp":(1)1} : tensor<8xf32, #dist.layout<@m, [{}], partial(sum) = {"tp"}>> -> tensor<8xf32, #dist.layout<@m, [{}]>>
  return
}

// -----

// The operand the message compares with is the first one with a layout.
dist.mesh @m ["dp" = 2, "tp" = 2]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{"dp"}]>>, %b: tensor<8xf32, #dist.layout<@m, [{"tp"}]>>) {
  // expected-error @+1 {{'dist.fp8_amax' op operand #1 is split over [tp] but operand #0 over [dp]}}
  %0 = dist.fp8_amax %a, %b : tensor<8xf32, #dist.layout<@m, [{"dp"}]>>, tensor<8xf32, #dist.layout<@m, [{"tp"}]>> -> tensor<2xf32, #dist.layout<@m, [{}], partial(max) = {"dp"}>>
  return
}

// -----

dist.mesh @m ["dp" = 2]
func.func @f(%a: tensor<8xf32, #dist.layout<@m, [{"dp"}]>>) {
  // expected-error @+1 {{'dist.fp8_amax' op result #0 has no layout but an earlier value has one; use layouts on every value (global form) or on none (rank-local form)}}
  %0 = dist.fp8_amax %a : tensor<8xf32, #dist.layout<@m, [{"dp"}]>> -> tensor<1xf32>
  return
}

// -----

dist.mesh @m ["dp" = 2]
func.func @f(%w: tensor<8xbf16, #dist.layout<@m, [{"dp"}]>>, %a: tensor<1xf32>) {
  // expected-error @+1 {{'dist.fp8_cast' op operand #1 has no layout but an earlier value has one}}
  %0 = dist.fp8_cast %w scale %a[0] : tensor<8xbf16, #dist.layout<@m, [{"dp"}]>>, tensor<1xf32> -> tensor<8xf8E4M3FN, #dist.layout<@m, [{"dp"}]>>
  return
}

// -----

dist.mesh @m ["dp" = 2]
func.func @f(%w: tensor<8xbf16, #dist.layout<@m, [{"dp"}]>>, %a: tensor<2xf32, #dist.layout<@m, [{"dp"}]>>) {
  // expected-error @+1 {{'dist.fp8_cast' op amax must be replicated: every rank reads every weight's scale}}
  %0 = dist.fp8_cast %w scale %a[1] : tensor<8xbf16, #dist.layout<@m, [{"dp"}]>>, tensor<2xf32, #dist.layout<@m, [{"dp"}]>> -> tensor<8xf8E4M3FN, #dist.layout<@m, [{"dp"}]>>
  return
}

// -----

func.func @f(%w: tensor<8xi32>, %a: tensor<1xf32>) {
  // expected-error @+1 {{'dist.fp8_cast' op input must be a wider floating-point tensor, not 'i32'}}
  %0 = dist.fp8_cast %w scale %a[0] : tensor<8xi32>, tensor<1xf32> -> tensor<8xf8E4M3FN>
  return
}

// -----

func.func @f(%w: tensor<8xf32>) {
  // expected-error @+1 {{'dist.compute' op gradient #0 ('tensor<3x3xi8>') must be a floating-point tensor of the shape of input #0 ('tensor<8xf32>'), or of that shape with one leading dim}}
  %0 = dist.compute backward "l" (%w) : tensor<8xf32> -> tensor<3x3xi8>
  return
}

// -----

func.func @f(%a: tensor<8xf32>) {
  // expected-error @+1 {{'dist.free' op frees a value that is used afterwards}}
  dist.free %a : tensor<8xf32>
  %0 = tensor.generate {
  ^bb0(%i: index):
    %c0 = arith.constant 0 : index
    %x = tensor.extract %a[%c0] : tensor<8xf32>
    tensor.yield %x : f32
  } : tensor<4xf32>
  return
}

// -----

//===----------------------------------------------------------------------===//
// Pipelines: dist.pipeline, dist.pair, dist.send, dist.recv, staged computes
//===----------------------------------------------------------------------===//

dist.mesh @m ["pp" = 2]
// expected-error @+1 {{'dist.pipeline' op activation must be a statically shaped floating-point tensor without a layout (one rank's microbatch), not 'tensor<?x8xbf16>'}}
dist.pipeline @p on @m axis "pp" schedule "1f1b" microbatches 2 stages_per_rank 1 activation tensor<?x8xbf16>

// -----

dist.mesh @m ["pp" = 2]
// expected-error @+1 {{'dist.pipeline' op activation must be a statically shaped floating-point tensor without a layout (one rank's microbatch), not 'tensor<4x8xi32>'}}
dist.pipeline @p on @m axis "pp" schedule "1f1b" microbatches 2 stages_per_rank 1 activation tensor<4x8xi32>

// -----

dist.mesh @m ["pp" = 2]
// expected-error @+1 {{'dist.pipeline' op activation must be a statically shaped floating-point tensor without a layout}}
dist.pipeline @p on @m axis "pp" schedule "1f1b" microbatches 2 stages_per_rank 1 activation tensor<4x8xbf16, #dist.layout<@m, [{"pp"}, {}]>>

// -----

dist.mesh @m ["pp" = 2]
// expected-error @+1 {{'dist.pipeline' op unknown pipeline schedule "1f2b"; expected one of gpipe, 1f1b, interleaved_1f1b, zbv}}
dist.pipeline @p on @m axis "pp" schedule "1f2b" microbatches 2 stages_per_rank 1 activation tensor<4x8xbf16>

// -----

// expected-error @+1 {{'dist.pipeline' op refers to @nowhere, which is not a dist.mesh}}
dist.pipeline @p on @nowhere axis "pp" schedule "1f1b" microbatches 2 stages_per_rank 1 activation tensor<4x8xbf16>

// -----

dist.mesh @m ["pp" = 2, "dp" = 2]
// expected-error @+1 {{'dist.pipeline' op axis "tp" is not in mesh @m (axes: pp, dp)}}
dist.pipeline @p on @m axis "tp" schedule "1f1b" microbatches 2 stages_per_rank 1 activation tensor<4x8xbf16>

// -----

dist.mesh @m ["pp" = 2, "dp" = 2] managed = ["pp"]
// expected-error @+1 {{'dist.pipeline' op pipeline axis "pp" is managed; stages need a fixed membership}}
dist.pipeline @p on @m axis "pp" schedule "1f1b" microbatches 2 stages_per_rank 1 activation tensor<4x8xbf16>

// -----

// The schedule's rules are core's (checkPipelineScheduleConfig).
dist.mesh @m ["pp" = 4]
// expected-error @+1 {{'dist.pipeline' op schedule 1f1b needs at least as many microbatches as pp ranks (torch's Schedule1F1B requires microbatches >= stages), got 3 microbatches for 4 ranks}}
dist.pipeline @p on @m axis "pp" schedule "1f1b" microbatches 3 stages_per_rank 1 activation tensor<4x8xbf16>

// -----

dist.mesh @m ["pp" = 4]
// expected-error @+1 {{'dist.pipeline' op schedule zbv places exactly 2}}
dist.pipeline @p on @m axis "pp" schedule "zbv" microbatches 8 stages_per_rank 3 activation tensor<4x8xbf16>

// -----

dist.mesh @m ["pp" = 2]
// expected-error @+1 {{'dist.pair' op needs exactly two coordinates, not 3}}
dist.pair @c on @m axis "pp" coords = [0, 1, 1]

// -----

dist.mesh @m ["pp" = 2]
// expected-error @+1 {{'dist.pair' op pairs coordinate 1 with itself}}
dist.pair @c on @m axis "pp" coords = [1, 1]

// -----

dist.mesh @m ["pp" = 2]
// expected-error @+1 {{'dist.pair' op coordinate -1 is negative}}
dist.pair @c on @m axis "pp" coords = [-1, 1]

// -----

dist.mesh @m ["pp" = 2]
// expected-error @+1 {{'dist.pair' op coordinate 2 is outside axis "pp" of size 2}}
dist.pair @c on @m axis "pp" coords = [1, 2]

// -----

dist.mesh @m ["pp" = 2]
// expected-error @+1 {{'dist.pair' op axis "dp" is not in mesh @m (axes: pp)}}
dist.pair @c on @m axis "dp" coords = [0, 1]

// -----

dist.mesh @m ["pp" = 2]
dist.pair @c on @m axis "pp" coords = [0, 1]
func.func @f(%a: tensor<4xf32>) {
  // expected-error @+1 {{'dist.send' op peer 2 is not a key of a pair (0 or 1)}}
  dist.send %a on @c to 2 tag "F s0 mb0" : tensor<4xf32>
  return
}

// -----

dist.mesh @m ["pp" = 2]
dist.pair @c on @m axis "pp" coords = [0, 1]
func.func @f() {
  // expected-error @+1 {{'dist.recv' op needs a tag naming what travels}}
  %a = dist.recv on @c from 0 tag "" : tensor<4xf32>
  return
}

// -----

dist.mesh @m ["pp" = 2]
dist.pair @c on @m axis "pp" coords = [0, 1]
func.func @f(%a: tensor<4xf32, #dist.layout<@m, [{}]>>) {
  // expected-error @+1 {{'dist.send' op moves one rank's buffer; 'tensor<4xf32, #dist.layout<@m, [{}]>>' has a layout (point-to-point transfers are rank-local)}}
  dist.send %a on @c to 1 tag "F s0 mb0" : tensor<4xf32, #dist.layout<@m, [{}]>>
  return
}

// -----

dist.mesh @m ["pp" = 2]
dist.pair @c on @m axis "pp" coords = [0, 1]
func.func @f() {
  // expected-error @+1 {{'dist.recv' op needs a statically shaped tensor, not 'tensor<?xf32>'}}
  %a = dist.recv on @c from 0 tag "F s0 mb0" : tensor<?xf32>
  return
}

// -----

dist.mesh @m ["pp" = 2]
dist.comm @c on @m axes {"pp"}
func.func @f(%a: tensor<4xf32>) {
  // expected-error @+1 {{'dist.send' op refers to @c, which is not a dist.pair}}
  dist.send %a on @c to 1 tag "F s0 mb0" : tensor<4xf32>
  return
}

// -----

func.func @f() {
  // expected-error @+1 {{'dist.recv' op refers to @nowhere, which is not a dist.pair}}
  %a = dist.recv on @nowhere from 0 tag "F s0 mb0" : tensor<4xf32>
  return
}

// -----

func.func @f(%w: tensor<4xf32>) {
  // expected-error @+1 {{'dist.compute' op stage -1 is negative}}
  dist.compute forward "a" (%w) stage -1 : tensor<4xf32>
  return
}

// -----

func.func @f(%w: tensor<4xf32>) {
  // expected-error @+1 {{'dist.compute' op backward_weight belongs to a pipeline stage's split backward; it needs a stage}}
  %g = dist.compute backward_weight "a" (%w) : tensor<4xf32> -> tensor<4xf32>
  return
}

// -----

func.func @f(%w: tensor<4xf32>) {
  // expected-error @+1 {{'dist.compute' op a stage's forward produces at most one value (the activation for the next stage), not 2}}
  %a, %b = dist.compute forward "a" (%w) stage 0 : tensor<4xf32> -> tensor<4xf32>, tensor<4xf32>
  return
}

// -----

dist.mesh @m ["pp" = 2]
func.func @f(%w: tensor<4xf32>) {
  // expected-error @+1 {{'dist.compute' op a stage's output activation is rank-local; it must have no layout, not 'tensor<4xf32, #dist.layout<@m, [{}]>>'}}
  %a = dist.compute forward "a" (%w) stage 0 : tensor<4xf32> -> tensor<4xf32, #dist.layout<@m, [{}]>>
  return
}

// -----

// backward_input's gradients follow the backward rule (gradient i of input i).
func.func @f(%x: tensor<4x8xbf16>, %w: tensor<8xf32>) {
  // expected-error @+1 {{'dist.compute' op gradient #0 ('tensor<8xf32>') must be a floating-point tensor of the shape of input #0 ('tensor<4x8xbf16>'), or of that shape with one leading dim}}
  %g = dist.compute backward_input "a" (%x, %w) stage 1 : tensor<4x8xbf16>, tensor<8xf32> -> tensor<8xf32>
  return
}

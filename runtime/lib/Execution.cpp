//===- Execution.cpp - The executor: one instruction at a time -----------===//
//
// Every session runs its plan here, on host buffers or on a device, through
// the Device interface (meshplan/Runtime/Device.h): one switch over the
// instruction kinds, one runCollective, one compute call, one optimizer
// update, one set of elementwise ops. What differs is the device the
// session's DeviceState holds (ExecutionSetUp.cpp):
//
//   host buffers  the inline host device (createInlineHostDevice): every
//                 call runs on the calling stream thread before it returns,
//                 so an instruction is complete when it returns; buffers are
//                 the BufferState's own bytes, allocated when first written
//                 and released by `free`, and a collective's packing blocks
//                 are allocated for the call, so a host session holds no
//                 more memory than its live buffers;
//   a device      every call is enqueued on the plan stream's device stream
//                 (docs/cuda.md, "Executor on devices"); buffers sit at
//                 their offsets of one arena sized from the plan, and the
//                 packing blocks are the stream's, allocated once.
//
// Both record and wait on the stream graph's events (StreamGraph.h); on the
// inline device they cost nothing, the work before them being complete.
// Steps that need a value on the host (the gradient norm, clipping, the
// fault-tolerant share sums) run only where the device completes on enqueue
// in host memory (Device::completesOnEnqueue); setUpExecutor refuses plans
// that need them on any other device.
//
//===----------------------------------------------------------------------===//

#include "SessionImpl.h"

#include "BoxCopy.h"

#include "meshplan/Runtime/Kernels.h"

#include <cmath>
#include <cstring>
#include <map>

namespace meshplan::runtime {

using plan::BufferKind;
using plan::DType;
using plan::OpKind;
namespace k = kernels;

namespace {

std::string notWritten(const BufferState &s) {
  return "reads \"" + s.meta->id + "\" before anything wrote it";
}

} // namespace

//===----------------------------------------------------------------------===//
// Buffers
//===----------------------------------------------------------------------===//

std::byte *Session::Impl::address(int buffer) {
  if (dev->arena)
    return dev->arena->address(size_t(buffer));
  return buffers[size_t(buffer)].data.data();
}

Result<void> Session::Impl::ensure(int buffer, DeviceStream s) {
  BufferState &st = buffers[size_t(buffer)];
  if (st.live)
    return {};
  if (!dev->arena) {
    ensureOnHost(buffer);
    return {};
  }
  st.live = true;
  if (size_t bytes = bytesOf(st))
    return dev->device->zero(address(buffer), bytes, s);
  return {};
}

Result<void> Session::Impl::copyBuffer(int into, int from, DeviceStream s) {
  BufferState &to = buffers[size_t(into)];
  const BufferState &source = buffers[size_t(from)];
  to.live = true;
  if (!dev->arena) {
    to.data = source.data; // allocated and copied at once, as before
    return {};
  }
  if (size_t bytes = bytesOf(to))
    return dev->device->copy(address(into), address(from), bytes, s);
  return {};
}

void Session::Impl::releaseBuffer(int buffer) {
  // On a device the arena planned these bytes for later buffers.
  buffers[size_t(buffer)].live = false;
  if (!dev->arena)
    buffers[size_t(buffer)].data = {};
}

Result<const float *> Session::Impl::scaleFor(const Bound &b, int buffer,
                                              DeviceStream s) {
  const plan::Buffer &meta = *buffers[size_t(buffer)].meta;
  if (!meta.scale)
    return static_cast<const float *>(nullptr);
  auto slot = dev->scales.find({b.index, buffer});
  auto amax = bufferIds.find(meta.scale->amax);
  if (slot == dev->scales.end() || amax == bufferIds.end())
    return makeError("no scale slot for \"" + meta.id + "\"");
  if (!buffers[size_t(amax->second)].live)
    return makeError(notWritten(buffers[size_t(amax->second)]));
  const float *from = reinterpret_cast<const float *>(address(amax->second)) +
                      meta.scale->index;
  MESHPLAN_TRY(dev->device->fp8Scale(from, slot->second, meta.dtype,
                                     meta.scale->powerOf2, s));
  return static_cast<const float *>(slot->second);
}

std::pair<size_t, size_t> Session::Impl::stagingBytes(const Bound &b) const {
  const Instruction &in = *b.in;
  size_t one = size_t(in.count * plan::dtypeBytes(*in.dtype));
  size_t all = one * plan.communicators[size_t(b.comm)].ranks.size();
  switch (in.op) {
  case OpKind::AllGather:
    return {one, all};
  case OpKind::ReduceScatter:
    return {all, one};
  case OpKind::AllToAll:
    return {all, all};
  case OpKind::AllReduce:
  case OpKind::Broadcast:
    return {one, 0}; // reduced or broadcast in place
  default:
    return {one, one};
  }
}

//===----------------------------------------------------------------------===//
// Instructions
//===----------------------------------------------------------------------===//

bool Session::Impl::sharing(const Bound &b) const {
  return ft && !ft->shareLayout.empty() && b.comm >= 0 &&
         plan.communicators[size_t(b.comm)].faultTolerant;
}

/// A fault_tolerant all-reduce while groups are missing (FaultTolerance::
/// sharesApart): in every pass but this rank's last, keeps the packed input
/// of the pass's share; in the last, sums every share of every member in
/// group order into `data`. True once `data` holds the sum. Fault tolerance
/// runs on host buffers only (setUpExecutor), so `data` is host memory.
Result<bool> Session::Impl::allReduceShare(const Bound &b, Communicator &c,
                                           std::byte *data, int64_t count,
                                           DType wire) {
  FaultTolerance &f = *ft;
  size_t bytes = size_t(count * plan::dtypeBytes(wire));
  std::lock_guard<std::mutex> lock(*f.stashMutex);
  std::vector<std::vector<std::byte>> &kept = f.shareStash[b.index];
  if (f.sharePass + 1 < f.dataRanks.size()) {
    kept.emplace_back(data, data + bytes);
    return false;
  }
  std::vector<const void *> mine;
  for (const std::vector<std::byte> &k : kept)
    mine.push_back(k.data());
  mine.push_back(data);
  MESHPLAN_TRY(
      c.allReduceShares(mine, data, count, wire, *b.in->reduce, f.shareLayout));
  kept.clear();
  return true;
}

/// One collective: each pair's box packed into the wire's chunk (converted
/// to the wire type), the backend's collective, and each received chunk
/// unpacked into its box. Long because each collective kind packs and
/// unpacks its own way, and the kinds read best side by side.
Result<void> Session::Impl::runCollective(Bound &b, DeviceStream s) {
  const Instruction &in = *b.in;
  auto comm = communicator(b.comm);
  if (!comm)
    return comm.error();
  Communicator &c = **comm;
  if (onDevice())
    MESHPLAN_TRY(c.setStream(s));
  Device &device = *dev->device;
  DType wire = *in.dtype;
  int64_t esize = plan::dtypeBytes(wire);
  int64_t n = c.size();
  int64_t count = in.count;
  for (int x : b.inputs)
    if (!buffers[size_t(x)].live)
      return makeError(notWritten(buffers[size_t(x)]));
  for (int x : b.outputs)
    MESHPLAN_TRY(ensure(x, s));
  auto box = [&](int buffer) {
    const plan::Buffer &m = *buffers[size_t(buffer)].meta;
    return DeviceBoxRef{address(buffer), m.dtype, m.localShape, m.offset};
  };
  auto chunk = [&](std::byte *stage, int64_t elementAt, const Pair &p,
                   const ShardBox &member) {
    return DeviceBoxRef{stage + elementAt * esize, wire, p.padded,
                        member.offset};
  };
  size_t bytes = size_t(count * esize);

  if (b.direct) {
    std::byte *src = address(b.pairs[0].in);
    std::byte *dst = address(b.pairs[0].out);
    switch (in.op) {
    case OpKind::AllGather:
      return c.allGather(src, dst, count, wire);
    case OpKind::ReduceScatter:
      return c.reduceScatter(src, dst, count, wire, *in.reduce);
    case OpKind::AllReduce:
    case OpKind::Broadcast:
      if (src != dst && bytes)
        MESHPLAN_TRY(device.copy(dst, src, bytes, s));
      if (in.op == OpKind::Broadcast)
        return c.broadcast(dst, count, wire, in.root);
      if (sharing(b)) {
        auto summed = allReduceShare(b, c, dst, count, wire);
        return summed ? Result<void>() : Result<void>(summed.error());
      }
      return c.allReduce(dst, count, wire, *in.reduce);
    default:
      break;
    }
  }

  // The packing blocks: the stream's on a device; on host buffers this
  // call's own, uninitialized (zeroed below where the collective needs it).
  std::byte *send, *recv;
  std::unique_ptr<std::byte[]> owned;
  if (dev->arena) {
    int st = dev->graph.steps[size_t(b.index)].stream;
    send = dev->sendScratch[size_t(st)];
    recv = dev->recvScratch[size_t(st)];
  } else {
    auto [sendBytes, recvBytes] = stagingBytes(b);
    owned = std::make_unique_for_overwrite<std::byte[]>(sendBytes + recvBytes);
    send = owned.get();
    recv = owned.get() + sendBytes;
  }
  auto clear = [&](std::byte *stage, size_t length) -> Result<void> {
    return length ? device.zero(stage, length, s) : Result<void>();
  };
  switch (in.op) {
  case OpKind::AllGather: {
    MESHPLAN_TRY(clear(send, bytes));
    for (const Pair &p : b.pairs) {
      const ShardBox &mine = p.members[size_t(c.key())];
      // Copy-in: the shard converted to the wire type (fp32 -> bf16, or
      // -> float8 with the gathered buffer's scale, computed where the
      // buffers are).
      auto scale = scaleFor(b, p.out, s);
      if (!scale)
        return scale.error();
      MESHPLAN_TRY(device.copyBox(box(p.in), chunk(send, p.at, p, mine),
                                  mine.offset, mine.localShape, *scale, s));
    }
    MESHPLAN_TRY(c.allGather(send, recv, count, wire));
    for (const Pair &p : b.pairs)
      for (int64_t m = 0; m < n; ++m) {
        const ShardBox &theirs = p.members[size_t(m)];
        MESHPLAN_TRY(device.copyBox(chunk(recv, m * count + p.at, p, theirs),
                                    box(p.out), theirs.offset,
                                    theirs.localShape, nullptr, s));
      }
    return {};
  }
  case OpKind::ReduceScatter: {
    MESHPLAN_TRY(clear(send, bytes * size_t(n)));
    for (const Pair &p : b.pairs)
      for (int64_t m = 0; m < n; ++m) {
        const ShardBox &theirs = p.members[size_t(m)];
        MESHPLAN_TRY(
            device.copyBox(box(p.in), chunk(send, m * count + p.at, p, theirs),
                           theirs.offset, theirs.localShape, nullptr, s));
      }
    MESHPLAN_TRY(c.reduceScatter(send, recv, count, wire, *in.reduce));
    for (const Pair &p : b.pairs) {
      const ShardBox &mine = p.members[size_t(c.key())];
      MESHPLAN_TRY(device.copyBox(chunk(recv, p.at, p, mine), box(p.out),
                                  mine.offset, mine.localShape, nullptr, s));
    }
    return {};
  }
  case OpKind::AllReduce:
  case OpKind::Broadcast: {
    MESHPLAN_TRY(clear(send, bytes));
    for (const Pair &p : b.pairs) {
      const ShardBox &mine = p.members[0];
      MESHPLAN_TRY(device.copyBox(box(p.in), chunk(send, p.at, p, mine),
                                  mine.offset, mine.localShape, nullptr, s));
    }
    if (in.op == OpKind::AllReduce && sharing(b)) {
      auto summed = allReduceShare(b, c, send, count, wire);
      if (!summed)
        return summed.error();
      if (!*summed)
        return {}; // deferred to the last share's pass
    } else if (in.op == OpKind::AllReduce) {
      MESHPLAN_TRY(c.allReduce(send, count, wire, *in.reduce));
    } else {
      MESHPLAN_TRY(c.broadcast(send, count, wire, in.root));
    }
    for (const Pair &p : b.pairs) {
      const ShardBox &mine = p.members[0];
      MESHPLAN_TRY(device.copyBox(chunk(send, p.at, p, mine), box(p.out),
                                  mine.offset, mine.localShape, nullptr, s));
    }
    return {};
  }
  case OpKind::Permute: {
    MESHPLAN_TRY(clear(send, bytes));
    MESHPLAN_TRY(clear(recv, bytes));
    const Pair &first = b.pairs[0];
    for (const Pair &p : b.pairs) {
      const ShardBox &mine = p.inBoxes[size_t(c.key())];
      MESHPLAN_TRY(device.copyBox(box(p.in), chunk(send, p.at, p, mine),
                                  mine.offset, mine.localShape, nullptr, s));
    }
    MESHPLAN_TRY(
        c.sendRecv(send, first.sendTo, recv, first.recvFrom, count, wire));
    for (const Pair &p : b.pairs) {
      const ShardBox &theirs = p.inBoxes[size_t(p.recvFrom)];
      MESHPLAN_TRY(device.copyBox(chunk(recv, p.at, p, theirs), box(p.out),
                                  theirs.offset, theirs.localShape, nullptr,
                                  s));
    }
    return {};
  }
  case OpKind::AllToAll: {
    MESHPLAN_TRY(clear(send, bytes * size_t(n)));
    MESHPLAN_TRY(clear(recv, bytes * size_t(n)));
    int64_t me = c.key();
    // Block k carries the part of my input that member k's output holds,
    // packed densely; both sides compute the same intersection.
    auto dense = [&](std::byte *stage, int64_t elementAt,
                     const ShardBox &part) {
      return DeviceBoxRef{stage + elementAt * esize, wire, part.localShape,
                          part.offset};
    };
    for (const Pair &p : b.pairs)
      for (int64_t k = 0; k < n; ++k) {
        ShardBox part = intersect(p.inBoxes[size_t(me)], p.outBoxes[size_t(k)]);
        MESHPLAN_TRY(device.copyBox(box(p.in),
                                    dense(send, k * count + p.at, part),
                                    part.offset, part.localShape, nullptr, s));
      }
    MESHPLAN_TRY(c.allToAll(send, recv, count, wire));
    for (const Pair &p : b.pairs)
      for (int64_t k = 0; k < n; ++k) {
        ShardBox part = intersect(p.inBoxes[size_t(k)], p.outBoxes[size_t(me)]);
        MESHPLAN_TRY(device.copyBox(dense(recv, k * count + p.at, part),
                                    box(p.out), part.offset, part.localShape,
                                    nullptr, s));
      }
    return {};
  }
  default:
    return makeError("unsupported collective");
  }
}

Result<void> Session::Impl::runTransfer(Bound &b, DeviceStream s) {
  const Instruction &in = *b.in;
  auto comm = communicator(b.comm);
  if (!comm)
    return comm.error();
  if (onDevice())
    MESHPLAN_TRY((*comm)->setStream(s));
  if (in.op == OpKind::Send) {
    const BufferState &src = buffers[size_t(b.inputs[0])];
    if (!src.live)
      return makeError("sends \"" + src.meta->id +
                       "\" before anything wrote it");
    return (*comm)->send(address(b.inputs[0]), in.peer, in.count, *in.dtype,
                         in.tag);
  }
  MESHPLAN_TRY(ensure(b.outputs[0], s));
  return (*comm)->recv(address(b.outputs[0]), in.peer, in.count, *in.dtype,
                       in.tag);
}

ComputeCall Session::Impl::callOf(const Bound &b) const {
  const Instruction &in = *b.in;
  ComputeCall call;
  call.phase = in.phase;
  call.unit = in.unit;
  call.microbatch = in.microbatch;
  call.step = steps + 1;
  call.session = self;
  if (ft && !ft->shareLayout.empty())
    call.shares = {int64_t(ft->sharePass)};
  else if (ft)
    for (size_t k = 0; k < ft->dataRanks.size(); ++k)
      call.shares.push_back(int64_t(k));
  return call;
}

Result<void> Session::Impl::invoke(ComputeCall &call) {
  auto it = callbacks.find({call.phase, call.unit});
  const ComputeCallback *fn =
      it != callbacks.end() ? &it->second : (fallback ? &fallback : nullptr);
  if (!fn)
    return makeError("no compute callback for " + call.phase + " " + call.unit +
                     " (register one with onCompute)");
  Result<void> ok = (*fn)(call);
  if (!ok)
    return ok.error().within("the " + call.phase + " callback of " + call.unit);
  return {};
}

Result<void> Session::Impl::runCompute(Bound &b, DeviceStream s) {
  ComputeCall call = callOf(b);
  call.stream = s;
  // A view as the callback sees it: on host buffers with its scale's value
  // (view()), on a device with the scale this instruction computes there.
  auto viewOf = [&](int x) -> Result<TensorView> {
    TensorView v = view(x);
    if (!v.onDevice)
      return v;
    auto scale = scaleFor(b, x, s);
    if (!scale)
      return scale.error();
    v.deviceScale = *scale;
    return v;
  };
  // Inputs: parameters, then (accumulating microbatches) the gradients so
  // far; amax buffers only feed the scales.
  std::map<std::string, int> accumulated;
  for (int x : b.inputs) {
    BufferState &st = buffers[size_t(x)];
    if (!st.live)
      return makeError(notWritten(st));
    if (st.meta->kind == BufferKind::Gradient) {
      accumulated[st.meta->tensor] = x;
      continue;
    }
    // An amax: its values reach the callback as scales. A pipeline stage's
    // activation (docs/pipeline.md, "Planning") is passed in its place among
    // the inputs, as is the activation a compute writes among the outputs.
    if (st.meta->tensor.empty() && st.meta->kind != BufferKind::Activation)
      continue;
    auto v = viewOf(x);
    if (!v)
      return v.error();
    call.params.push_back(*v);
  }
  for (int x : b.outputs) {
    BufferState &st = buffers[size_t(x)];
    auto from = accumulated.find(st.meta->tensor);
    if (from != accumulated.end() && from->second != x) {
      const BufferState &prev = buffers[size_t(from->second)];
      if (bytesOf(prev) != bytesOf(st))
        return makeError("accumulates \"" + prev.meta->id + "\" into \"" +
                         st.meta->id + "\", which has another size");
      MESHPLAN_TRY(copyBuffer(x, from->second, s));
    } else if (from == accumulated.end()) {
      st.live = false; // a fresh gradient starts at zero
      MESHPLAN_TRY(ensure(x, s));
    }
    auto v = viewOf(x);
    if (!v)
      return v.error();
    call.grads.push_back(*v);
  }
  return invoke(call);
}

double Session::Impl::stepLr() const {
  return lrOverride ? *lrOverride : plan.optimizer->lrAt(steps + 1);
}

Result<void> Session::Impl::runOptimizer(Bound &b, DeviceStream s) {
  const plan::OptimizerConfig &o = *plan.optimizer;
  // A non-finite gradient norm skips every update of the step; every rank
  // of the norm's group reduced the same integers, so all skip alike.
  if (skipUpdates)
    return {};
  k::AdamWParams hp{stepLr(), o.beta1, o.beta2, o.eps, o.weightDecay};
  int64_t step = steps + 1;
  Device &device = *dev->device;
  for (size_t g = 0; g + 3 < b.inputs.size(); g += 4) {
    int param = b.inputs[g], grad = b.inputs[g + 1], m = b.inputs[g + 2],
        v = b.inputs[g + 3];
    if (!buffers[size_t(grad)].live)
      return makeError(notWritten(buffers[size_t(grad)]));
    const plan::Buffer &meta = *buffers[size_t(param)].meta;
    hp.weightDecay = o.weightDecayOf(meta.tensor);
    auto *ps = address(param);
    auto *gs = reinterpret_cast<const float *>(address(grad));
    auto *ms = reinterpret_cast<float *>(address(m));
    auto *vs = reinterpret_cast<float *>(address(v));
    if (o.stochasticRounding)
      MESHPLAN_TRY(device.adamwBf16StochasticRounding(
          reinterpret_cast<uint16_t *>(ps), gs, ms, vs, hp, step,
          static_cast<uint64_t>(o.seed), static_cast<uint64_t>(*meta.tensorId),
          meta.globalShape, meta.offset, meta.localShape, s));
    else
      MESHPLAN_TRY(device.adamwFp32(reinterpret_cast<float *>(ps), gs, ms, vs,
                                    buffers[size_t(param)].numel, hp, step, s));
  }
  return {};
}

/// The local elementwise ops: casts, float8, row sums, gradient
/// accumulation, the gradient norm and clipping.
Result<void> Session::Impl::runLocal(Bound &b, DeviceStream s) {
  const Instruction &in = *b.in;
  Device &device = *dev->device;
  for (int x : b.inputs)
    if (!buffers[size_t(x)].live)
      return makeError(notWritten(buffers[size_t(x)]));
  // An elementwise conversion of n elements: both buffers seen as one flat
  // row.
  auto convert = [&](int from, int to, const float *scale) -> Result<void> {
    const BufferState &src = buffers[size_t(from)], &dst = buffers[size_t(to)];
    std::vector<int64_t> shape{src.numel}, origin{0};
    if (src.numel == 0)
      return {};
    return device.copyBox({address(from), src.meta->dtype, shape, origin},
                          {address(to), dst.meta->dtype, shape, origin}, origin,
                          shape, scale, s);
  };
  switch (in.op) {
  case OpKind::Cast:
  case OpKind::Fp8Cast:
    for (size_t i = 0; i < b.outputs.size(); ++i) {
      const BufferState &src = buffers[size_t(b.inputs[i])],
                        &dst = buffers[size_t(b.outputs[i])];
      if (src.numel != dst.numel ||
          !canConvert(src.meta->dtype, dst.meta->dtype))
        return makeError("cannot cast \"" + src.meta->id + "\" into \"" +
                         dst.meta->id + "\"");
      MESHPLAN_TRY(ensure(b.outputs[i], s));
      const float *scale = nullptr;
      if (in.op == OpKind::Fp8Cast) {
        auto sc = scaleFor(b, b.outputs[i], s);
        if (!sc)
          return sc.error();
        scale = *sc;
      }
      MESHPLAN_TRY(convert(b.inputs[i], b.outputs[i], scale));
    }
    return {};
  case OpKind::Sum:
    for (size_t i = 0; i < b.inputs.size(); ++i) {
      const BufferState &src = buffers[size_t(b.inputs[i])],
                        &dst = buffers[size_t(b.outputs[i])];
      if (src.meta->dtype != DType::Float32 ||
          dst.meta->dtype != DType::Float32 || dst.numel == 0 ||
          src.numel % dst.numel != 0)
        return makeError("cannot sum the rows of \"" + src.meta->id +
                         "\" into \"" + dst.meta->id + "\"");
      MESHPLAN_TRY(ensure(b.outputs[i], s));
      MESHPLAN_TRY(
          device.sumRows(reinterpret_cast<const float *>(address(b.inputs[i])),
                         src.numel / dst.numel, dst.numel,
                         reinterpret_cast<float *>(address(b.outputs[i])), s));
    }
    return {};
  case OpKind::Accumulate:
    // Per tensor: inputs (accumulator, addend), added in place (the reader
    // checked shapes and dtypes). bfloat16 adds in float32 and rounds to
    // nearest even, once per addition.
    for (size_t i = 0; i < b.outputs.size(); ++i) {
      const BufferState &acc = buffers[size_t(b.inputs[2 * i])],
                        &add = buffers[size_t(b.inputs[2 * i + 1])];
      if (acc.numel != add.numel || acc.meta->dtype != add.meta->dtype)
        return makeError("cannot add \"" + add.meta->id + "\" into \"" +
                         acc.meta->id + "\"");
      if (acc.meta->dtype != DType::Float32 &&
          acc.meta->dtype != DType::BFloat16)
        return makeError("cannot accumulate a " +
                         std::string(plan::dtypeName(acc.meta->dtype)) +
                         " buffer");
      if (acc.numel)
        MESHPLAN_TRY(device.accumulate(address(b.inputs[2 * i]),
                                       address(b.inputs[2 * i + 1]),
                                       acc.meta->dtype, acc.numel, s));
    }
    return {};
  case OpKind::GradNorm: {
    // The exact partial norm of the gradients this rank counts (core's
    // accumulator; the reader checked the buffer's dtype and length). On
    // the host: setUpExecutor admits it only where the device's work is
    // done in host memory when enqueued.
    BufferState &out = buffers[size_t(b.outputs[0])];
    MESHPLAN_TRY(ensure(b.outputs[0], s));
    std::span<int64_t> acc(reinterpret_cast<int64_t *>(address(b.outputs[0])),
                           size_t(out.numel));
    std::fill(acc.begin(), acc.end(), 0);
    for (int x : b.inputs)
      accumulateGradNorm(plan.optimizer->normType,
                         {reinterpret_cast<const float *>(address(x)),
                          size_t(buffers[size_t(x)].numel)},
                         acc);
    return {};
  }
  case OpKind::ClipGradients: {
    // The norm decides on the host whether the updates run (as GradNorm).
    const plan::OptimizerConfig &o = *plan.optimizer;
    const BufferState &reduced = buffers[size_t(b.inputs[0])];
    double norm = gradNormOf(
        o.normType, {reinterpret_cast<const int64_t *>(address(b.inputs[0])),
                     size_t(reduced.numel)});
    gradNorm = norm;
    skipUpdates = !std::isfinite(norm);
    clipCoefficient =
        skipUpdates ? 1.0f : meshplan::clipCoefficient(*o.maxNorm, norm);
    if (skipUpdates || clipCoefficient == 1.0f)
      return {};
    for (size_t i = 1; i < b.inputs.size(); ++i) {
      auto *d = reinterpret_cast<float *>(address(b.inputs[i]));
      for (int64_t j = 0; j < buffers[size_t(b.inputs[i])].numel; ++j)
        d[j] *= clipCoefficient;
    }
    return {};
  }
  case OpKind::Fp8Amax: {
    if (b.outputs.size() != 1)
      return makeError("fp8_amax needs one output");
    const BufferState &out = buffers[size_t(b.outputs[0])];
    if (out.meta->dtype != DType::Float32 ||
        out.numel != static_cast<int64_t>(b.inputs.size()))
      return makeError("fp8_amax's output must hold one float32 per input");
    MESHPLAN_TRY(ensure(b.outputs[0], s));
    auto *a = reinterpret_cast<float *>(address(b.outputs[0]));
    for (size_t i = 0; i < b.inputs.size(); ++i) {
      const BufferState &src = buffers[size_t(b.inputs[i])];
      if (src.meta->dtype != DType::Float32 &&
          src.meta->dtype != DType::BFloat16)
        return makeError("fp8_amax of a " +
                         std::string(plan::dtypeName(src.meta->dtype)) +
                         " buffer");
      MESHPLAN_TRY(device.amax(address(b.inputs[i]), src.meta->dtype, src.numel,
                               a + i, s));
    }
    return {};
  }
  default:
    return makeError("unsupported op " + std::string(plan::opKindName(in.op)));
  }
}

Result<void> Session::Impl::execute(Bound &b, DeviceStream s) {
  switch (b.in->op) {
  case OpKind::AllGather:
  case OpKind::ReduceScatter:
  case OpKind::AllReduce:
  case OpKind::Broadcast:
  case OpKind::AllToAll:
  case OpKind::Permute:
    return runCollective(b, s);
  case OpKind::Send:
  case OpKind::Recv:
    return runTransfer(b, s);
  case OpKind::Compute:
    return runCompute(b, s);
  case OpKind::OptimizerUpdate:
    return runOptimizer(b, s);
  case OpKind::Free:
    for (int x : b.inputs)
      releaseBuffer(x);
    return {};
  case OpKind::Wait:
    return {};
  default:
    return runLocal(b, s);
  }
}

Result<void> Session::Impl::enqueue(Bound &b) {
  Device &device = *dev->device;
  const StreamGraph::Step &g = dev->graph.steps[size_t(b.index)];
  DeviceStream s = dev->streams[size_t(g.stream)];
  // The instructions these events follow are enqueued already: they are
  // this one's deps or its communicator's earlier collectives, which
  // runPass waited for.
  for (int e : g.waits)
    MESHPLAN_TRY(device.wait(s, dev->events[size_t(e)]));
  if (dev->timingBefore.empty()) {
    MESHPLAN_TRY(execute(b, s));
  } else {
    // Held until enqueued, where enqueueing never waits for the stream,
    // so that the events time the device's work (Device::hold).
    bool held = holdsForTiming(b);
    if (held)
      MESHPLAN_TRY(device.hold(s));
    Result<void> done = device.record(dev->timingBefore[size_t(b.index)], s);
    if (done)
      done = execute(b, s);
    if (done)
      done = device.record(dev->timingAfter[size_t(b.index)], s);
    if (held)
      if (auto let = device.release(s); !let && done)
        done = let;
    MESHPLAN_TRY(done);
  }
  if (g.record >= 0)
    MESHPLAN_TRY(device.record(dev->events[size_t(g.record)], s));
  return {};
}

bool Session::Impl::holdsForTiming(const Bound &b) {
  // The runtime's own kernels: enqueueing them calls nothing but the
  // device's kernels and copies. Not a compute callback (computeOnHost waits
  // for its stream), nor a collective: a host backend's (Gloo's, staged)
  // waits for the stream before it can send, and NCCL's enqueue hung held
  // on the first GPU run (it may wait for the device inside; docs/cuda.md).
  switch (b.in->op) {
  case OpKind::Cast:
  case OpKind::Fp8Cast:
  case OpKind::Sum:
  case OpKind::Accumulate:
  case OpKind::Fp8Amax:
  case OpKind::OptimizerUpdate:
    return true;
  default:
    return false;
  }
}

} // namespace meshplan::runtime

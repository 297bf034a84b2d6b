//===- SpecGenerator.h - Well-formed specs and models from fuzz bytes -----===//
//
// Mutating JSON text rarely yields a spec that resolves: almost every input
// stops in the reader, and the planner behind it (import, the passes,
// export, instantiation, verification), where meshplan's "internal error"
// paths are, is reached by a handful of inputs. So fuzz-spec has a second
// reading of its input: when it does not start with '{', the bytes choose a
// spec and a model (FuzzedDataProvider) that are well formed by
// construction but free in everything the reader must check against the
// model and the mesh: axis sizes (1, uneven, 2^20, 2^31), roles, managed
// axes, device orders, tensor-parallel rules and styles on any module,
// float8 selections, units, dtypes, shapes (0, 1, odd, up to 2^40) and
// head counts. The resulting documents then go through the same checks as
// text inputs.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_FUZZ_SPECGENERATOR_H
#define MESHPLAN_FUZZ_SPECGENERATOR_H

#include <fuzzer/FuzzedDataProvider.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <string>
#include <vector>

namespace meshplan::fuzz {

using OrderedJson = nlohmann::ordered_json;

class SpecGenerator {
public:
  SpecGenerator(const uint8_t *data, size_t size) : in(data, size) {}

  /// The spec document, "---", and the model document (or the spec alone
  /// when it names a preset).
  std::string generate() {
    OrderedJson model = makeModel();
    OrderedJson spec = makeSpec(model);
    if (spec["model"] != "model.json")
      return spec.dump() + "\n";
    return spec.dump() + "\n---\n" + model.dump() + "\n";
  }

private:
  FuzzedDataProvider in;
  std::vector<std::string> modulePaths; ///< every module, for patterns
  std::vector<std::string> linearPaths; ///< linear modules

  int64_t dimSize() {
    static const int64_t sizes[] = {1,  2,  3,  4,   5,   6,    7,        8,
                                    12, 16, 32, 48,  64,  96,   128,      0,
                                    17, 24, 40, 256, 512, 4096, 1ll << 40};
    return in.PickValueInArray(sizes);
  }

  OrderedJson param(const std::vector<int64_t> &shape) {
    OrderedJson p = {{"name", "weight"}, {"shape", shape}};
    if (in.ConsumeBool())
      p["dtype"] = in.PickValueInArray({"float32", "bfloat16", "float16"});
    return p;
  }

  OrderedJson leaf(const std::string &path, const std::string &name,
                   const char *kind, const std::vector<int64_t> &shape) {
    modulePaths.push_back(path + name);
    if (std::string(kind) == "linear")
      linearPaths.push_back(path + name);
    return {{"name", name}, {"kind", kind}, {"parameters", {param(shape)}}};
  }

  /// A transformer of torchtitan's structure with chosen sizes, or a list of
  /// linear modules with chosen shapes.
  OrderedJson makeModel() {
    OrderedJson modules = OrderedJson::array();
    if (in.ConsumeBool()) {
      int64_t dim = dimSize(), vocab = dimSize(), ffn = dimSize();
      int64_t heads = in.ConsumeIntegralInRange<int64_t>(1, 8);
      int64_t kvHeads = in.ConsumeIntegralInRange<int64_t>(1, 8);
      int64_t headDim = std::max<int64_t>(1, dim / heads);
      modules.push_back(leaf("", "tok_embeddings", "embedding", {vocab, dim}));
      OrderedJson layers = {{"name", "layers"},
                            {"kind", "block"},
                            {"children", OrderedJson::array()}};
      modulePaths.push_back("layers");
      int nLayers = in.ConsumeIntegralInRange(1, 2);
      for (int l = 0; l < nLayers; ++l) {
        std::string block = "layers." + std::to_string(l);
        modulePaths.push_back(block);
        std::string p = block + ".";
        OrderedJson attention = {{"name", "attention"},
                                 {"kind", "attention"},
                                 {"n_heads", heads},
                                 {"n_kv_heads", kvHeads}};
        modulePaths.push_back(p + "attention");
        std::string a = p + "attention.";
        attention["children"] = {
            leaf(a, "wq", "linear", {heads * headDim, dim}),
            leaf(a, "wk", "linear", {kvHeads * headDim, dim}),
            leaf(a, "wv", "linear", {kvHeads * headDim, dim}),
            leaf(a, "wo", "linear", {dim, heads * headDim})};
        OrderedJson ffnModule = {{"name", "feed_forward"},
                                 {"kind", "feed_forward"}};
        modulePaths.push_back(p + "feed_forward");
        std::string f = p + "feed_forward.";
        ffnModule["children"] = {leaf(f, "w1", "linear", {ffn, dim}),
                                 leaf(f, "w2", "linear", {dim, ffn}),
                                 leaf(f, "w3", "linear", {ffn, dim})};
        layers["children"].push_back(
            {{"name", std::to_string(l)},
             {"kind", "block"},
             {"children",
              {leaf(p, "attention_norm", "norm", {dim}), attention,
               leaf(p, "ffn_norm", "norm", {dim}), ffnModule}}});
      }
      modules.push_back(layers);
      modules.push_back(leaf("", "norm", "norm", {dim}));
      modules.push_back(leaf("", "output", "output", {vocab, dim}));
    } else {
      int n = in.ConsumeIntegralInRange(1, 4);
      for (int i = 0; i < n; ++i)
        modules.push_back(leaf("", std::string(1, char('a' + i)), "linear",
                               {dimSize(), dimSize()}));
    }
    return {{"name", "fuzz"}, {"modules", modules}};
  }

  /// A pattern selecting some modules: a path, a wildcard form, or "*".
  std::string pattern(const std::vector<std::string> &paths) {
    if (paths.empty() || in.ConsumeIntegralInRange(0, 9) == 0)
      return "*";
    std::string p =
        paths[in.ConsumeIntegralInRange<size_t>(0, paths.size() - 1)];
    if (in.ConsumeBool() && p.rfind("layers.", 0) == 0) {
      size_t dot = p.find('.', 7);
      p = "layers.*" + (dot == std::string::npos ? "" : p.substr(dot));
    }
    return p;
  }

  OrderedJson makeSpec(const OrderedJson &) {
    OrderedJson spec;
    spec["model"] = "model.json";
    if (in.ConsumeIntegralInRange(0, 7) == 0) {
      spec["model"] = "tiny";
      modulePaths = {"tok_embeddings",
                     "layers.0",
                     "layers.0.attention",
                     "layers.0.attention.wq",
                     "layers.0.attention.wk",
                     "layers.0.attention.wv",
                     "layers.0.attention.wo",
                     "layers.0.feed_forward.w1",
                     "layers.0.feed_forward.w2",
                     "layers.0.feed_forward.w3",
                     "layers.0.attention_norm",
                     "layers.0.ffn_norm",
                     "norm",
                     "output"};
      linearPaths = {"layers.0.attention.wq", "layers.0.feed_forward.w1",
                     "layers.0.feed_forward.w2"};
    }
    static const char *names[] = {"dp", "fsdp", "tp", "cp", "ep", "r", "s"};
    static const int64_t sizes[] = {1, 2, 3, 4, 5, 8, 16, 1 << 20, 1ll << 31};
    int nAxes = in.ConsumeIntegralInRange(1, 4);
    std::vector<std::string> axes;
    OrderedJson meshAxes = OrderedJson::array();
    int64_t world = 1;
    bool overflow = false;
    for (int i = 0; i < nAxes; ++i) {
      std::string name = names[i + in.ConsumeIntegralInRange(0, 3)];
      if (std::find(axes.begin(), axes.end(), name) != axes.end())
        continue;
      int64_t size = in.ConsumeIntegralInRange(0, 7) == 0
                         ? in.PickValueInArray(sizes)
                         : in.ConsumeIntegralInRange<int64_t>(1, 4);
      axes.push_back(name);
      meshAxes.push_back({{"name", name}, {"size", size}});
      overflow |= __builtin_mul_overflow(world, size, &world);
    }
    OrderedJson mesh = {{"axes", meshAxes}};
    // Roles: each axis replicate, shard, tensor, extra, managed or none.
    std::vector<std::string> replicate, shard, extra, managed;
    std::string tpAxis;
    for (const std::string &axis : axes) {
      switch (in.ConsumeIntegralInRange(0, 5)) {
      case 0:
        replicate.push_back(axis);
        break;
      case 1:
      case 2:
        shard.push_back(axis);
        break;
      case 3:
        if (tpAxis.empty())
          tpAxis = axis;
        else
          extra.push_back(axis);
        break;
      case 4:
        extra.push_back(axis);
        break;
      default:
        break;
      }
      if (in.ConsumeIntegralInRange(0, 5) == 0)
        managed.push_back(axis);
    }
    if (!managed.empty())
      mesh["managed_axes"] = managed;
    if (!overflow && world <= 16 && in.ConsumeIntegralInRange(0, 3) == 0) {
      std::vector<int64_t> order;
      for (int64_t r = 0; r < world; ++r)
        order.push_back(r);
      for (size_t i = order.size(); i > 1; --i)
        std::swap(order[i - 1],
                  order[in.ConsumeIntegralInRange<size_t>(0, i - 1)]);
      mesh["device_order"] = order;
    }
    spec["mesh"] = mesh;
    if (!overflow && in.ConsumeBool())
      spec["world_size"] = world;

    OrderedJson dp = OrderedJson::object();
    if (!replicate.empty())
      dp["replicate_axes"] = replicate;
    if (!shard.empty())
      dp["shard_axes"] = shard;
    switch (in.ConsumeIntegralInRange(0, 4)) {
    case 0:
      dp["reshard_after_forward"] = "always";
      break;
    case 1:
      dp["reshard_after_forward"] = false;
      break;
    case 2:
      dp["reshard_after_forward"] = "default";
      break;
    default:
      break;
    }
    switch (in.ConsumeIntegralInRange(0, 4)) {
    case 0:
      dp["units"] = "per_module";
      break;
    case 1: {
      OrderedJson units = OrderedJson::array();
      int n = in.ConsumeIntegralInRange(1, 3);
      for (int i = 0; i < n; ++i)
        units.push_back({pattern(modulePaths)});
      dp["units"] = units;
      break;
    }
    default:
      break;
    }
    if (!dp.empty())
      spec["data_parallel"] = dp;

    if (!tpAxis.empty()) {
      OrderedJson plan = OrderedJson::array();
      int n = in.ConsumeIntegralInRange(0, 6);
      for (int i = 0; i < n; ++i)
        plan.push_back({{"pattern", pattern(modulePaths)},
                        {"style", in.PickValueInArray({"colwise", "rowwise",
                                                       "sequence_parallel"})}});
      spec["tensor_parallel"] = {{"axis", tpAxis}, {"plan", plan}};
    }
    if (!extra.empty())
      spec["extra_axes"] = extra;
    if (in.ConsumeBool())
      spec["mixed_precision"] = {
          {"param_dtype",
           in.PickValueInArray({"float32", "bfloat16", "float16"})},
          {"reduce_dtype", in.PickValueInArray({"float32", "bfloat16"})}};
    if (in.ConsumeIntegralInRange(0, 2) == 0) {
      OrderedJson f8 = {{"all_gather", in.ConsumeBool()}};
      if (in.ConsumeBool())
        f8["modules"] = {pattern(linearPaths)};
      if (in.ConsumeBool())
        f8["exclude"] = {pattern(modulePaths)};
      if (in.ConsumeBool())
        f8["power_of_2_scales"] = true;
      spec["float8"] = f8;
    }
    if (in.ConsumeBool()) {
      OrderedJson opt = {{"name", "adamw"}};
      if (in.ConsumeBool()) {
        opt["param_dtype"] = "bfloat16";
        opt["stochastic_rounding"] = in.ConsumeBool();
        opt["seed"] = in.ConsumeIntegral<uint32_t>();
      }
      spec["optimizer"] = opt;
    }
    if (in.ConsumeIntegralInRange(0, 3) == 0)
      spec["gradient_accumulation_steps"] = in.ConsumeIntegralInRange(1, 4);
    return spec;
  }
};

} // namespace meshplan::fuzz

#endif // MESHPLAN_FUZZ_SPECGENERATOR_H

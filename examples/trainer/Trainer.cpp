//===- Trainer.cpp - What meshplan-train's runs share ---------------------===//

#include "Trainer.h"

#include "meshplan/Pipeline/Pipeline.h"
#include "meshplan/Plan/Plan.h"
#include "meshplan/Runtime/Kernels.h"
#include "meshplan/Support/Hash.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <tuple>

namespace fs = std::filesystem;
namespace k = meshplan::runtime::kernels;

namespace meshplan::trainer {

[[noreturn]] void fatal(const std::string &message) {
  std::fprintf(stderr, "meshplan-train: error: %s\n", message.c_str());
  std::exit(1);
}

/// A tensor name's seed for its initial values and synthetic gradients.
/// FNV-1a from 1469598103934665603, not FNV's offset basis (one digit short
/// of 14695981039346656037): the basis this trainer always used, kept so
/// that initial weights, and so losses and saved checkpoints, stay what they
/// were.
static uint64_t hashName(const std::string &s) {
  return fnv1a64(s, 1469598103934665603ull);
}

//===----------------------------------------------------------------------===//
// The model's structure
//===----------------------------------------------------------------------===//

Result<ParamSite> siteOf(const std::string &tensor) {
  ParamSite site;
  if (tensor == "tok_embeddings.weight")
    return ParamSite{ParamSite::Embedding, -1, ""};
  if (tensor == "norm.weight")
    return ParamSite{ParamSite::FinalNorm, -1, ""};
  if (tensor == "output.weight")
    return ParamSite{ParamSite::Output, -1, ""};
  static const char *leaves[] = {
      "attention_norm",  "attention.wq",    "attention.wk",
      "attention.wv",    "attention.wo",    "ffn_norm",
      "feed_forward.w1", "feed_forward.w3", "feed_forward.w2"};
  if (tensor.starts_with("layers.")) {
    size_t dot = tensor.find('.', 7);
    if (dot != std::string::npos && dot > 7) {
      std::string num = tensor.substr(7, dot - 7);
      bool digits = std::all_of(num.begin(), num.end(),
                                [](char c) { return c >= '0' && c <= '9'; });
      std::string rest = tensor.substr(dot + 1);
      if (digits && num.size() < 9 && rest.ends_with(".weight")) {
        rest = rest.substr(0, rest.size() - 7);
        for (const char *leaf : leaves)
          if (rest == leaf)
            return ParamSite{ParamSite::Block, std::stoll(num), rest};
      }
    }
  }
  return makeError("parameter \"" + tensor +
                   "\" is not part of the Llama 3 architecture meshplan-train "
                   "implements (frontend/Presets.h names its parameters)");
}

template <typename Block, typename Ptr, typename Get>
static Block blockOf(int64_t layer, const Get &get) {
  std::string p = "layers." + std::to_string(layer) + ".";
  return Block{
      get(p + "attention_norm.weight"),  get(p + "attention.wq.weight"),
      get(p + "attention.wk.weight"),    get(p + "attention.wv.weight"),
      get(p + "attention.wo.weight"),    get(p + "ffn_norm.weight"),
      get(p + "feed_forward.w1.weight"), get(p + "feed_forward.w3.weight"),
      get(p + "feed_forward.w2.weight")};
}

BlockWeights
blockWeights(int64_t layer,
             const std::function<const float *(const std::string &)> &get) {
  return blockOf<BlockWeights, const float *>(layer, get);
}

BlockGrads blockGrads(int64_t layer,
                      const std::function<float *(const std::string &)> &get) {
  return blockOf<BlockGrads, float *>(layer, get);
}

/// The configuration of a Llama 3 model, every parameter checked.
static Result<LlamaConfig> configOf(const frontend::ResolvedSpec &spec) {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const frontend::ParamAssignment &p : spec.params)
    shapes[p.name] = p.shape;
  LlamaConfig c;
  auto emb = shapes.find("tok_embeddings.weight");
  if (emb == shapes.end() || emb->second.size() != 2)
    return makeError("the model has no tok_embeddings.weight [vocab, dim]");
  c.vocab = emb->second[0];
  c.dim = emb->second[1];
  for (const frontend::ModuleEntry &m : spec.modules) {
    if (m.module->kind == frontend::ModuleKind::Attention) {
      if (c.nHeads == 0) {
        c.nHeads = m.module->nHeads;
        c.nKvHeads = m.module->nKvHeads;
      } else if (c.nHeads != m.module->nHeads ||
                 c.nKvHeads != m.module->nKvHeads) {
        return makeError("module \"" + m.path +
                         "\": every layer must have the same heads");
      }
    }
  }
  while (shapes.count("layers." + std::to_string(c.nLayers) +
                      ".attention_norm.weight"))
    ++c.nLayers;
  auto w1 = shapes.find("layers.0.feed_forward.w1.weight");
  if (c.nLayers == 0 || c.nHeads <= 0 || w1 == shapes.end() ||
      w1->second.size() != 2)
    return makeError("the model is not a Llama 3 transformer (no layers.0 "
                     "with attention heads and feed_forward.w1)");
  c.ffnDim = w1->second[0];
  if (c.dim % c.nHeads != 0 || c.nKvHeads <= 0 || c.nHeads % c.nKvHeads != 0)
    return makeError("attention: dim " + std::to_string(c.dim) +
                     " must divide by n_heads " + std::to_string(c.nHeads) +
                     ", and n_heads by n_kv_heads " +
                     std::to_string(c.nKvHeads));
  int64_t hd = c.headDim();
  std::map<std::string, std::vector<int64_t>> want{
      {"tok_embeddings.weight", {c.vocab, c.dim}},
      {"norm.weight", {c.dim}},
      {"output.weight", {c.vocab, c.dim}}};
  for (int64_t l = 0; l < c.nLayers; ++l) {
    std::string p = "layers." + std::to_string(l) + ".";
    want[p + "attention_norm.weight"] = {c.dim};
    want[p + "attention.wq.weight"] = {c.nHeads * hd, c.dim};
    want[p + "attention.wk.weight"] = {c.nKvHeads * hd, c.dim};
    want[p + "attention.wv.weight"] = {c.nKvHeads * hd, c.dim};
    want[p + "attention.wo.weight"] = {c.dim, c.nHeads * hd};
    want[p + "ffn_norm.weight"] = {c.dim};
    want[p + "feed_forward.w1.weight"] = {c.ffnDim, c.dim};
    want[p + "feed_forward.w3.weight"] = {c.ffnDim, c.dim};
    want[p + "feed_forward.w2.weight"] = {c.dim, c.ffnDim};
  }
  auto text = [](const std::vector<int64_t> &s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); ++i)
      out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
  };
  for (const auto &[name, shape] : shapes) {
    auto it = want.find(name);
    if (it == want.end())
      return siteOf(name).ok() ? makeError("parameter \"" + name +
                                           "\": beyond the model's layers")
                               : siteOf(name).error();
    if (it->second != shape)
      return makeError("parameter \"" + name + "\" has shape " + text(shape) +
                       ", but a Llama 3 model of dim " + std::to_string(c.dim) +
                       " needs " + text(it->second));
  }
  for (const auto &[name, shape] : want)
    if (!shapes.count(name))
      return makeError("the model lacks parameter \"" + name + "\"");
  return c;
}

/// torchtitan's TP plan is what the model implements; anything else would
/// silently compute something different.
static Result<void> checkTensorParallel(const frontend::ResolvedSpec &spec) {
  using frontend::TPStyle;
  for (size_t i = 0; i < spec.modules.size(); ++i) {
    const frontend::ModuleEntry &m = spec.modules[i];
    if (m.module->params.empty())
      continue;
    const std::string &path = m.path;
    auto ends = [&](const char *s) { return path.ends_with(s); };
    TPStyle want = TPStyle::Colwise;
    if (path == "tok_embeddings" || ends(".wo") || ends(".w2"))
      want = TPStyle::Rowwise;
    else if (path == "norm" || ends("attention_norm") || ends("ffn_norm"))
      want = TPStyle::SequenceParallel;
    std::optional<TPStyle> got = spec.assignments[i].tpStyle;
    if (got != want)
      return makeError(
          "tensor_parallel: module \"" + path + "\" is " +
          (got ? std::string(frontend::tpStyleName(*got)) : "not split") +
          "; meshplan-train implements torchtitan's Llama plan, where it is " +
          std::string(frontend::tpStyleName(want)));
  }
  return {};
}

Result<Planned> planSpec(const TrainFlags &flags, int64_t tokensPerMicrobatch) {
  Planned out;
  auto text = plan::readTextFile(flags.spec);
  if (!text)
    return text.error().within("--spec");
  // The run's length is the learning-rate schedule's unless the spec
  // states its own total_steps.
  frontend::SpecOptions specOptions;
  specOptions.totalSteps = flags.steps;
  auto spec = frontend::parseSpec(*text, specOptions);
  if (!spec)
    return spec.error().within(flags.spec);
  std::string base = fs::path(flags.spec).parent_path().string();
  if (!flags.model.empty())
    spec->model = flags.model;
  auto model = frontend::loadSpecModel(
      *spec, flags.model.empty() ? (base.empty() ? "." : base) : ".");
  if (!model)
    return model.error().within(flags.model.empty() ? flags.spec : "--model");
  auto resolved = frontend::resolveSpec(std::move(*spec), std::move(*model));
  if (!resolved)
    return resolved.error().within(flags.spec);
  out.spec = std::move(*resolved);
  const frontend::Spec &s = out.spec.spec;

  auto config = configOf(out.spec);
  if (!config)
    return config.error().within("model \"" + out.spec.model->name + "\"");
  out.config = *config;
  if (s.tensorParallel)
    if (auto ok = checkTensorParallel(out.spec); !ok)
      return ok.error().within(flags.spec);

  // Every axis has a role: data-parallel (replicate, shard, extra) or TP.
  const Mesh &mesh = *out.spec.mesh;
  AxisRoles &r = out.roles;
  r.replicate = s.dataParallel.replicateAxes;
  r.shard = s.dataParallel.shardAxes;
  r.extra = s.extraAxes;
  if (s.tensorParallel)
    r.tp = s.tensorParallel->axis;
  if (out.spec.pipeline)
    r.pp = out.spec.pipeline->axis;
  for (const MeshAxis &axis : mesh.getAxes()) {
    auto in = [&](const std::vector<std::string> &v) {
      return std::find(v.begin(), v.end(), axis.name) != v.end();
    };
    if (in(r.replicate))
      r.replicas *= axis.size;
    else if (in(r.shard))
      r.shards *= axis.size;
    else if (in(r.extra))
      r.extras *= axis.size;
    else if (axis.name != r.tp && axis.name != r.pp)
      return makeError(flags.spec + ": mesh axis \"" + axis.name +
                       "\" has no role (data_parallel, tensor_parallel, "
                       "pipeline_parallel or extra_axes)");
  }
  // The callbacks run whole segments (the embedding, a block, the final
  // norm, the output): a unit may hold several, but not part of a block.
  for (const frontend::UnitAssignment &unit : out.spec.units) {
    std::map<int64_t, int> leaves;
    for (int i : unit.params)
      if (auto site = siteOf(out.spec.params[size_t(i)].name);
          site && site->segment == ParamSite::Block)
        ++leaves[site->layer];
    for (const auto &[layer, n] : leaves)
      if (n != 9)
        return makeError(flags.spec + ": FSDP unit \"" + unit.name +
                         "\" holds " + std::to_string(n) +
                         " of the 9 weights of layers." +
                         std::to_string(layer) +
                         "; meshplan-train runs whole blocks (data_parallel."
                         "units \"torchtitan\" or \"per_module\")");
  }
  out.modelOptions.bf16Matmul =
      s.mixedPrecision.paramDtype == frontend::DType::BFloat16;

  // Stage boundaries carry the activation in the compute dtype: fp32, or
  // bf16 rounded where a rank writes the boundary buffer (the reference
  // rounds the stream at the same boundaries). float16 would need the same
  // emulation and a float16 model; it is not implemented.
  if (out.spec.pipeline &&
      s.mixedPrecision.paramDtype == frontend::DType::Float16)
    return makeError(flags.spec +
                     ": pipeline_parallel: meshplan-train passes float32 or "
                     "bfloat16 activations between stages; "
                     "mixed_precision.param_dtype float16 is not implemented");

  // A pipelined spec is planned one template per pp coordinate, as `meshplan
  // plan --all` does (docs/pipeline.md, "Planning"): every rank plans all of
  // them, which the reference and the TP shares of other stages need.
  pipeline::CompileOptions options;
  options.import.tokensPerMicrobatch = tokensPerMicrobatch;
  options.import.sequenceLength = flags.seqLen;
  auto planned = pipeline::planSpec(std::move(out.spec), options);
  if (!planned)
    return planned.error().within("planning " + flags.spec);
  static_cast<pipeline::PlannedSpec &>(out) = std::move(*planned);
  // Microbatches (accumulation or the pipeline's): the compute labels'.
  for (const plan::Instruction &in : out.first().get().program)
    if (in.op == plan::OpKind::Compute)
      out.microbatches = std::max(out.microbatches, in.microbatch + 1);
  return out;
}

Result<std::vector<plan::Plan>> stagePlansOf(const Planned &planned,
                                             int64_t rank) {
  std::vector<plan::Plan> out;
  auto own = planned.templateFor(rank).instantiate(rank, false);
  if (!own)
    return own.error();
  out.push_back(std::move(*own));
  if (!planned.spec.pipeline)
    return out;
  const Mesh &mesh = *planned.spec.mesh;
  int axis = planned.spec.pipeline->axisIndex;
  auto position = mesh.positionOf(rank);
  if (!position)
    return position.error();
  int64_t mine = mesh.coordinateAt(*position, axis);
  for (int64_t c = 0; c < mesh.axis(axis).size; ++c) {
    if (c == mine)
      continue;
    int64_t peer = mesh.rankAt(*position + (c - mine) * mesh.stride(axis));
    auto p = planned.templateFor(peer).instantiate(peer, false);
    if (!p)
      return p.error();
    out.push_back(std::move(*p));
  }
  return out;
}

Result<int64_t> dataParallelIndex(const Planned &planned, int64_t rank) {
  auto d = frontend::dataParallelRankOf(planned.spec, rank);
  MESHPLAN_TRY(d);
  return d->index;
}

std::map<std::string, const plan::Buffer *>
computeInputs(const std::vector<plan::Plan> &plans) {
  std::map<std::string, const plan::Buffer *> seen;
  for (const plan::Plan &p : plans) {
    std::map<std::string, const plan::Buffer *> byId;
    for (const plan::Buffer &b : p.buffers)
      byId[b.id] = &b;
    for (const plan::Instruction &in : p.program)
      if (in.op == plan::OpKind::Compute && in.phase == "forward")
        for (const std::string &id : in.inputs) {
          auto it = byId.find(id);
          if (it == byId.end() || it->second->tensor.empty())
            continue;
          const plan::Buffer *b = it->second;
          // A parameter as gathered, as its shard, or cast from the shard
          // into scratch (bf16 compute without FSDP: a pipeline stage, TP).
          if (b->kind == plan::BufferKind::Gathered ||
              b->kind == plan::BufferKind::ParamShard)
            seen[b->tensor] = b;
          else if (b->kind == plan::BufferKind::Scratch)
            seen.emplace(b->tensor, b);
        }
  }
  return seen;
}

Result<TpShard> tpShardOf(const std::vector<plan::Plan> &plans,
                          const LlamaConfig &c) {
  std::map<std::string, const plan::Buffer *> seen = computeInputs(plans);
  TpShard shard;
  int64_t hd = c.headDim();
  auto rows = [&](const std::string &t, int64_t dim) {
    const plan::Buffer *b = seen.at(t);
    return std::pair<int64_t, int64_t>{b->offset[size_t(dim)],
                                       b->localShape[size_t(dim)]};
  };
  for (const char *t :
       {"tok_embeddings.weight", "output.weight",
        "layers.0.attention.wq.weight", "layers.0.attention.wk.weight",
        "layers.0.feed_forward.w1.weight"})
    if (!seen.count(t))
      return makeError(std::string("no compute instruction reads ") + t);
  auto [qOff, qLen] = rows("layers.0.attention.wq.weight", 0);
  auto [kOff, kLen] = rows("layers.0.attention.wk.weight", 0);
  auto [fOff, fLen] = rows("layers.0.feed_forward.w1.weight", 0);
  auto [vOff, vLen] = rows("output.weight", 0);
  (void)fOff;
  if (qOff % hd || qLen % hd || kOff % hd || kLen % hd)
    return makeError("tensor parallel splits attention heads: wq rows [" +
                     std::to_string(qOff) + ", +" + std::to_string(qLen) +
                     ") are not whole heads of " + std::to_string(hd));
  shard.headOffset = qOff / hd;
  shard.localHeads = qLen / hd;
  shard.kvHeadOffset = kOff / hd;
  shard.localKvHeads = kLen / hd;
  shard.localFfn = fLen;
  shard.vocabOffset = vOff;
  shard.vocabLocal = vLen;
  // Every layer and the embedding split the same way.
  for (int64_t l = 0; l < c.nLayers; ++l) {
    std::string pre = "layers." + std::to_string(l) + ".";
    auto same = [&](const std::string &t, int64_t dim, int64_t off,
                    int64_t len) -> Result<void> {
      if (!seen.count(t))
        return makeError("no compute instruction reads " + t);
      auto [o, n] = rows(t, dim);
      if (o != off || n != len)
        return makeError(t + " is split unlike layer 0's weights");
      return {};
    };
    MESHPLAN_TRY(same(pre + "attention.wq.weight", 0, qOff, qLen));
    MESHPLAN_TRY(same(pre + "attention.wk.weight", 0, kOff, kLen));
    MESHPLAN_TRY(same(pre + "attention.wv.weight", 0, kOff, kLen));
    MESHPLAN_TRY(same(pre + "attention.wo.weight", 1, qOff, qLen));
    MESHPLAN_TRY(same(pre + "feed_forward.w1.weight", 0, fOff, fLen));
    MESHPLAN_TRY(same(pre + "feed_forward.w3.weight", 0, fOff, fLen));
    MESHPLAN_TRY(same(pre + "feed_forward.w2.weight", 1, fOff, fLen));
  }
  auto [eOff, eLen] = rows("tok_embeddings.weight", 0);
  if (eOff != vOff || eLen != vLen)
    return makeError("tok_embeddings and output split the vocabulary "
                     "differently");

  return shard;
}

//===----------------------------------------------------------------------===//
// Values
//===----------------------------------------------------------------------===//

float initialValue(uint64_t seed, const std::string &tensor, int64_t g,
                   const std::vector<int64_t> &shape) {
  auto site = siteOf(tensor);
  double std = 0.02;
  if (site) {
    switch (site->segment) {
    case ParamSite::Embedding:
      std = 1.0;
      break;
    case ParamSite::Output:
      std = 1.0 / std::sqrt(double(shape.back()));
      break;
    case ParamSite::FinalNorm:
      return 1.0f;
    case ParamSite::Block:
      if (site->leaf.ends_with("norm"))
        return 1.0f;
      if (site->leaf == "attention.wo" || site->leaf == "feed_forward.w2" ||
          site->leaf == "feed_forward.w3")
        std = 0.02 / std::sqrt(2.0 * double(site->layer + 1));
      break;
    }
  }
  // Box-Muller on a counter-based hash, redrawn beyond two deviations.
  uint64_t key =
      splitmix64(seed ^ hashName(tensor)) ^ uint64_t(g) * 0x632BE59BD9B4E019ull;
  for (uint64_t attempt = 0;; ++attempt) {
    uint64_t a = splitmix64(key + 2 * attempt),
             b = splitmix64(key + 2 * attempt + 1);
    double u1 = (double(a >> 11) + 1.0) / 9007199254740993.0;
    double u2 = double(b >> 11) / 9007199254740992.0;
    double z =
        std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    if (std::fabs(z) <= 2.0)
      return static_cast<float>(z * std);
  }
}

float syntheticGrad(const std::string &tensor, int64_t g, int64_t step) {
  uint64_t h =
      splitmix64(hashName(tensor) ^ (uint64_t(g) << 8) ^ uint64_t(step));
  return std::ldexp(static_cast<float>(int64_t(h % 255) - 127), -12);
}

void emulateCast(std::vector<float> &values, plan::DType seen,
                 const std::optional<plan::Fp8Scale> &scale) {
  using plan::DType;
  if (seen == DType::BFloat16) {
    for (float &x : values)
      x = k::bf16ToFloat(k::floatToBf16(x));
  } else if (seen == DType::Float8E4M3 || seen == DType::Float8E5M2) {
    k::Fp8Format f =
        seen == DType::Float8E4M3 ? k::Fp8Format::E4M3FN : k::Fp8Format::E5M2;
    float amax = 0;
    for (float x : values)
      amax = std::max(amax, std::fabs(x));
    float s = k::fp8ScaleFromAmax(amax, f, scale && scale->powerOf2);
    for (float &x : values)
      x = k::fp8ToFloat(k::floatToFp8(x * s, f), f) / s;
  }
}

//===----------------------------------------------------------------------===//
// Dumps
//===----------------------------------------------------------------------===//

static const char kDumpMagic[8] = {'M', 'P', 'D', 'U', 'M', 'P', '1', '\n'};

Result<void> writeDump(const std::string &dir, int64_t rank,
                       const std::vector<DumpBox> &boxes) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    return makeError(dir + ": " + ec.message());
  std::string path = dir + "/rank" + std::to_string(rank) + ".bin";
  std::ofstream out(path + ".tmp", std::ios::binary | std::ios::trunc);
  auto put = [&](int64_t v) { out.write(reinterpret_cast<char *>(&v), 8); };
  out.write(kDumpMagic, 8);
  put(int64_t(boxes.size()));
  for (const DumpBox &b : boxes) {
    put(int64_t(b.tensor.size()));
    out.write(b.tensor.data(), std::streamsize(b.tensor.size()));
    put(b.bf16 ? 1 : 0);
    put(int64_t(b.globalShape.size()));
    for (size_t i = 0; i < b.globalShape.size(); ++i) {
      put(b.globalShape[i]);
      put(b.offset[i]);
      put(b.localShape[i]);
    }
    put(int64_t(b.values.size()));
    out.write(reinterpret_cast<const char *>(b.values.data()),
              std::streamsize(b.values.size() * 4));
  }
  out.close();
  if (!out)
    return makeError(path + ": write failed");
  fs::rename(path + ".tmp", path, ec);
  if (ec)
    return makeError(path + ": " + ec.message());
  return {};
}

namespace {
struct Whole {
  std::vector<int64_t> shape;
  bool bf16 = false;
  std::vector<float> values;
  std::vector<char> covered;
};

Result<std::map<std::string, Whole>> readDump(const std::string &dir) {
  std::map<std::string, Whole> out;
  std::error_code ec;
  std::vector<std::string> files;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end;
       it.increment(ec))
    if (it->path().extension() == ".bin")
      files.push_back(it->path().string());
  if (ec)
    return makeError(dir + ": " + ec.message());
  if (files.empty())
    return makeError(dir + ": no rank*.bin files");
  std::sort(files.begin(), files.end());
  for (const std::string &path : files) {
    std::ifstream in(path, std::ios::binary);
    char magic[8];
    int64_t v = 0, at = 8;
    auto bad = [&](const std::string &why) {
      return makeError(path + ": " + why + " (field ending at byte " +
                       std::to_string(at) + ")");
    };
    auto get = [&]() -> bool {
      at += 8;
      return bool(in.read(reinterpret_cast<char *>(&v), 8));
    };
    if (!in.read(magic, 8) || std::memcmp(magic, kDumpMagic, 8) != 0)
      return makeError(path + ": not a meshplan-train parameter dump");
    if (!get() || v < 0 || v > 1000000)
      return bad("bad box count");
    int64_t count = v;
    for (int64_t i = 0; i < count; ++i) {
      if (!get() || v < 0 || v > 4096)
        return bad("bad name length");
      std::string name(size_t(v), '\0');
      if (!in.read(name.data(), v) || !get())
        return bad("truncated");
      bool bf16 = v != 0;
      if (!get() || v < 0 || v > 8)
        return bad("bad rank of tensor " + name);
      size_t nd = size_t(v);
      std::vector<int64_t> gs(nd), off(nd), ls(nd);
      int64_t gn = 1, ln = 1;
      for (size_t d = 0; d < nd; ++d) {
        if (!get())
          return bad("truncated");
        gs[d] = v;
        if (!get())
          return bad("truncated");
        off[d] = v;
        if (!get())
          return bad("truncated");
        ls[d] = v;
        if (gs[d] < 0 || gs[d] > (int64_t(1) << 31) || off[d] < 0 ||
            ls[d] < 0 || off[d] + ls[d] > gs[d])
          return bad("box outside tensor " + name);
        gn *= gs[d];
        ln *= ls[d];
        if (gn > (int64_t(1) << 32))
          return bad("tensor " + name + " too large");
      }
      if (!get() || v != ln)
        return bad("value count of " + name);
      std::vector<float> vals(static_cast<size_t>(ln));
      if (!in.read(reinterpret_cast<char *>(vals.data()), ln * 4))
        return bad("truncated values of " + name);
      Whole &w = out[name];
      if (w.values.empty()) {
        w.shape = gs;
        w.bf16 = bf16;
        w.values.assign(size_t(gn), 0.0f);
        w.covered.assign(size_t(gn), 0);
      } else if (w.shape != gs) {
        return makeError(path + ": tensor " + name +
                         " has another global shape in an earlier file");
      }
      auto runs = k::boxIndexRuns(gs, off, ls);
      if (!runs)
        return makeError(path + ": tensor " + name + ": box outside it");
      for (const k::IndexRun &r : *runs)
        for (int64_t j = 0; j < r.length; ++j) {
          size_t g = size_t(r.global + j);
          float x = vals[size_t(r.local + j)];
          if (w.covered[g] && std::memcmp(&w.values[g], &x, 4) != 0)
            return makeError(
                path + ": tensor " + name + " element " + std::to_string(g) +
                " differs between two replicas (" +
                std::to_string(w.values[g]) + " vs " + std::to_string(x) + ")");
          w.values[g] = x;
          w.covered[g] = 1;
        }
    }
  }
  for (auto &[name, w] : out)
    for (size_t g = 0; g < w.covered.size(); ++g)
      if (!w.covered[g])
        return makeError(dir + ": tensor " + name + " element " +
                         std::to_string(g) + " is in no rank's file");
  return out;
}
} // namespace

int compareDumps(const std::string &a, const std::string &b, double rtol) {
  auto A = readDump(a);
  if (!A)
    fatal(A.error().message);
  auto B = readDump(b);
  if (!B)
    fatal(B.error().message);
  double worst = 0;
  std::string worstAt;
  int64_t elements = 0, identical = 0;
  // Per tensor (elements that differ, the largest difference): listed when
  // the dumps do not match, to show where.
  std::vector<std::tuple<std::string, int64_t, double>> differing;
  for (const auto &[name, wa] : *A) {
    auto it = B->find(name);
    if (it == B->end())
      fatal(b + ": has no tensor " + name);
    const Whole &wb = it->second;
    if (wa.shape != wb.shape)
      fatal("tensor " + name + " has different shapes in the two dumps");
    // Relative to the larger magnitude, floored at 1e-3 of the tensor's RMS
    // so that an element crossing zero does not divide by nothing.
    double rms = 0;
    for (float x : wa.values)
      rms += double(x) * x;
    rms = std::sqrt(rms / double(std::max<size_t>(1, wa.values.size())));
    double tensorWorst = 0;
    int64_t tensorIdentical = identical;
    for (size_t g = 0; g < wa.values.size(); ++g) {
      float x = wa.values[g], y = wb.values[g];
      ++elements;
      if (std::memcmp(&x, &y, 4) == 0) {
        ++identical;
        continue;
      }
      double denom =
          std::max({std::fabs(double(x)), std::fabs(double(y)), 1e-3 * rms});
      double rel = std::fabs(double(x) - double(y)) / std::max(denom, 1e-30);
      if (!(rel <= tensorWorst))
        tensorWorst = std::isnan(rel) ? INFINITY : rel;
    }
    tensorIdentical = identical - tensorIdentical;
    if (tensorIdentical != int64_t(wa.values.size()))
      differing.emplace_back(name, int64_t(wa.values.size()) - tensorIdentical,
                             tensorWorst);
    if (worstAt.empty() || tensorWorst > worst) {
      worst = tensorWorst;
      worstAt = name;
    }
  }
  for (const auto &[name, wb] : *B)
    if (!A->count(name))
      fatal(a + ": has no tensor " + name);
  bool ok = worst <= rtol;
  std::printf("compare %s %s: %zu tensors, %lld elements, %lld bit-identical; "
              "max relative difference %.3g (%s), tolerance %.3g: %s\n",
              a.c_str(), b.c_str(), A->size(), static_cast<long long>(elements),
              static_cast<long long>(identical), worst, worstAt.c_str(), rtol,
              ok ? "MATCH" : "DIFFERENT");
  if (!ok)
    for (const auto &[name, n, rel] : differing)
      std::fprintf(stderr, "  %s: %lld elements differ, max relative %.3g\n",
                   name.c_str(), static_cast<long long>(n), rel);
  return ok ? 0 : 1;
}

} // namespace meshplan::trainer

//===- HfLlama.cpp - Hugging Face Llama checkpoints for meshplan ckpt -----===//

#include "HfLlama.h"

#include "MeshSetup.h"

#include "meshplan/Frontend/Model.h"
#include "meshplan/Support/Json.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>

using namespace meshplan;
using namespace meshplan::cli;
namespace fs = std::filesystem;

namespace meshplan::cli::hf {

namespace {

constexpr const char *kSingleFile = "model.safetensors";
constexpr const char *kIndexFile = "model.safetensors.index.json";
constexpr const char *kConfigFile = "config.json";

std::string ints(const std::vector<int64_t> &v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i)
    out += (i ? "," : "") + std::to_string(v[i]);
  return out + "]";
}

std::string joinPath(const std::string &dir, const std::string &name) {
  return dir.empty() || dir == "." ? name : dir + "/" + name;
}

/// A file name the index may name: a plain name inside the directory.
bool plainFileName(const std::string &name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find('/') == std::string::npos &&
         name.find('\\') == std::string::npos && name.size() <= 255;
}

json::Json readJsonFile(const std::string &path) {
  auto text = json::readFile(path);
  if (!text)
    throw CliError(text.error().message);
  auto doc = json::parseJson(*text);
  if (!doc)
    throw CliError(path + ": " + doc.error().message);
  if (!doc->is_object())
    throw CliError(path + ": expected a JSON object, got " +
                   json::describe(*doc));
  return std::move(*doc);
}

} // namespace

//===----------------------------------------------------------------------===//
// The model's dims and the name map
//===----------------------------------------------------------------------===//

LlamaDims llamaDimsOf(const frontend::Model &model) {
  std::map<std::string, std::vector<int64_t>> shapes;
  LlamaDims d;
  for (const frontend::ModuleEntry &m : frontend::flattenModules(model)) {
    for (const frontend::Parameter &p : m.module->params)
      shapes[m.path + "." + p.name] = p.shape;
    if (m.module->kind == frontend::ModuleKind::Attention && d.nHeads == 0) {
      d.nHeads = m.module->nHeads;
      d.nKvHeads = m.module->nKvHeads;
    }
  }
  auto fail = [&](const std::string &why) {
    return CliError("model " + json::quote(model.name) +
                    " is not a Llama with torchtitan's names and shapes, "
                    "which --format hf-llama maps: " +
                    why);
  };
  auto emb = shapes.find("tok_embeddings.weight");
  if (emb == shapes.end() || emb->second.size() != 2)
    throw fail("no tok_embeddings.weight [vocab, dim]");
  d.vocab = emb->second[0];
  d.dim = emb->second[1];
  while (shapes.count("layers." + std::to_string(d.nLayers) +
                      ".attention_norm.weight"))
    ++d.nLayers;
  auto w1 = shapes.find("layers.0.feed_forward.w1.weight");
  if (d.nLayers == 0 || d.nHeads <= 0 || w1 == shapes.end() ||
      w1->second.size() != 2)
    throw fail("no layers.0 with attention heads and feed_forward.w1");
  d.ffnDim = w1->second[0];
  if (d.dim % d.nHeads != 0 || d.nKvHeads <= 0 || d.nHeads % d.nKvHeads != 0 ||
      d.headDim() % 2 != 0)
    throw fail("dim " + std::to_string(d.dim) + " must divide by n_heads " +
               std::to_string(d.nHeads) +
               " into an even head_dim, and n_heads "
               "by n_kv_heads " +
               std::to_string(d.nKvHeads));
  // Exactly the parameters hfNamesOf lists, with their shapes.
  std::map<std::string, std::vector<int64_t>> want;
  const int64_t hd = d.headDim();
  for (const HfName &n : hfNamesOf(d)) {
    std::string_view name = n.meshplan;
    std::vector<int64_t> shape;
    if (name == "tok_embeddings.weight" || name == "output.weight")
      shape = {d.vocab, d.dim};
    else if (name.ends_with("norm.weight"))
      shape = {d.dim};
    else if (name.ends_with("wq.weight"))
      shape = {d.nHeads * hd, d.dim};
    else if (name.ends_with("wk.weight") || name.ends_with("wv.weight"))
      shape = {d.nKvHeads * hd, d.dim};
    else if (name.ends_with("wo.weight"))
      shape = {d.dim, d.nHeads * hd};
    else if (name.ends_with("w1.weight") || name.ends_with("w3.weight"))
      shape = {d.ffnDim, d.dim};
    else
      shape = {d.dim, d.ffnDim};
    want[n.meshplan] = shape;
  }
  for (const auto &[name, shape] : shapes) {
    auto it = want.find(name);
    if (it == want.end())
      throw fail("parameter " + json::quote(name) + " has no HF counterpart");
    if (it->second != shape)
      throw fail("parameter " + json::quote(name) + " has shape " +
                 ints(shape) + ", expected " + ints(it->second));
  }
  for (const auto &[name, shape] : want)
    if (!shapes.count(name))
      throw fail("no parameter " + json::quote(name));
  return d;
}

std::vector<HfName> hfNamesOf(const LlamaDims &d) {
  std::vector<HfName> out;
  out.push_back({"tok_embeddings.weight", "model.embed_tokens.weight"});
  for (int64_t l = 0; l < d.nLayers; ++l) {
    std::string m = "layers." + std::to_string(l) + ".";
    std::string h = "model.layers." + std::to_string(l) + ".";
    out.push_back({m + "attention_norm.weight", h + "input_layernorm.weight"});
    out.push_back(
        {m + "attention.wq.weight", h + "self_attn.q_proj.weight", d.nHeads});
    out.push_back(
        {m + "attention.wk.weight", h + "self_attn.k_proj.weight", d.nKvHeads});
    out.push_back({m + "attention.wv.weight", h + "self_attn.v_proj.weight"});
    out.push_back({m + "attention.wo.weight", h + "self_attn.o_proj.weight"});
    out.push_back(
        {m + "ffn_norm.weight", h + "post_attention_layernorm.weight"});
    out.push_back({m + "feed_forward.w1.weight", h + "mlp.gate_proj.weight"});
    out.push_back({m + "feed_forward.w3.weight", h + "mlp.up_proj.weight"});
    out.push_back({m + "feed_forward.w2.weight", h + "mlp.down_proj.weight"});
  }
  out.push_back({"norm.weight", "model.norm.weight"});
  out.push_back({"output.weight", "lm_head.weight"});
  return out;
}

int64_t hfRowOf(int64_t row, int64_t headDim) {
  const int64_t head = row / headDim, within = row % headDim;
  return head * headDim + (within % 2) * (headDim / 2) + within / 2;
}

//===----------------------------------------------------------------------===//
// config.json
//===----------------------------------------------------------------------===//

namespace {

/// Checks config.json against the model: every dim meshplan's Llama has,
/// and the hyper-parameters its code fixes. Returns tie_word_embeddings.
bool checkConfig(const std::string &path, const json::Json &c,
                 const LlamaDims &d) {
  auto at = [&](const std::string &key) { return path + ": /" + key + ": "; };
  auto integer = [&](const std::string &key,
                     std::optional<int64_t> fallback) -> int64_t {
    const json::Json *v = json::member(c, key);
    if (!v || v->is_null()) {
      if (fallback)
        return *fallback;
      throw CliError(path + ": missing key " + json::quote(key));
    }
    if (!v->is_number_integer())
      throw CliError(at(key) + "expected an integer, got " +
                     json::describe(*v));
    return v->get<int64_t>();
  };
  auto number = [&](const std::string &key, double fallback) -> double {
    const json::Json *v = json::member(c, key);
    if (!v || v->is_null())
      return fallback;
    if (!v->is_number())
      throw CliError(at(key) + "expected a number, got " + json::describe(*v));
    return v->get<double>();
  };
  auto boolean = [&](const std::string &key, bool fallback) -> bool {
    const json::Json *v = json::member(c, key);
    if (!v || v->is_null())
      return fallback;
    if (!v->is_boolean())
      throw CliError(at(key) + "expected true or false, got " +
                     json::describe(*v));
    return v->get<bool>();
  };
  if (const json::Json *t = json::member(c, "model_type");
      t && !(t->is_string() && t->get<std::string>() == "llama"))
    throw CliError(at("model_type") + json::describe(*t) +
                   ", but --format hf-llama reads \"llama\"");
  struct Dim {
    const char *key;
    int64_t want;
    const char *what;
    std::optional<int64_t> fallback;
  };
  const int64_t heads = integer("num_attention_heads", std::nullopt);
  const Dim dims[] = {
      {"hidden_size", d.dim, "dim", std::nullopt},
      {"num_hidden_layers", d.nLayers, "layers", std::nullopt},
      {"num_attention_heads", d.nHeads, "n_heads", std::nullopt},
      // transformers' default: as many kv heads as heads.
      {"num_key_value_heads", d.nKvHeads, "n_kv_heads", heads},
      {"intermediate_size", d.ffnDim, "ffn dim (w1 rows)", std::nullopt},
      {"vocab_size", d.vocab, "vocab", std::nullopt},
      {"head_dim", d.headDim(), "head dim (dim / n_heads)", d.headDim()},
  };
  for (const Dim &x : dims) {
    int64_t got = integer(x.key, x.fallback);
    if (got != x.want)
      throw CliError(at(x.key) + std::to_string(got) + ", but the model's " +
                     x.what + " is " + std::to_string(x.want));
  }
  // What meshplan's Llama computes and no model file states. transformers
  // 5 writes rope_parameters {"rope_theta", "rope_type", ...}; earlier
  // versions rope_theta and rope_scaling (null or {"rope_type", ...}).
  std::string thetaKey = "rope_theta";
  double theta = number("rope_theta", 10000.0); // transformers' default
  auto refuseScaling = [&](const std::string &key, const json::Json &v) {
    return CliError(at(key) + v.dump() +
                    ": meshplan's Llama implements plain RoPE only (no "
                    "\"llama3\", \"linear\", \"dynamic\" or other "
                    "frequency scaling); refusing rather than computing other "
                    "logits");
  };
  if (const json::Json *r = json::member(c, "rope_parameters");
      r && !r->is_null()) {
    if (!r->is_object())
      throw CliError(at("rope_parameters") + "expected an object, got " +
                     json::describe(*r));
    if (const json::Json *t = json::member(*r, "rope_type");
        t && !(t->is_string() && t->get<std::string>() == "default"))
      throw refuseScaling("rope_parameters/rope_type", *t);
    for (const auto &[key, value] : r->items())
      if (key != "rope_type" && key != "rope_theta")
        throw refuseScaling("rope_parameters/" + key, value);
    if (const json::Json *t = json::member(*r, "rope_theta")) {
      if (!t->is_number())
        throw CliError(at("rope_parameters/rope_theta") +
                       "expected a number, got " + json::describe(*t));
      theta = t->get<double>();
      thetaKey = "rope_parameters/rope_theta";
    }
  }
  if (const json::Json *s = json::member(c, "rope_scaling"); s && !s->is_null())
    throw refuseScaling("rope_scaling", *s);
  if (theta != kRopeTheta)
    throw CliError(at(thetaKey) + json::Json(theta).dump() +
                   ", but meshplan's Llama rotates with theta " +
                   json::Json(kRopeTheta).dump() +
                   " (examples/trainer/model/Llama.h); the logits would "
                   "differ");
  double eps = number("rms_norm_eps", 1e-6);
  if (float(eps) != kNormEps)
    throw CliError(at("rms_norm_eps") + json::Json(eps).dump() +
                   ", but meshplan's Llama normalizes with eps 1e-05 "
                   "(examples/trainer/model/Llama.h); the logits would "
                   "differ");
  if (const json::Json *a = json::member(c, "hidden_act");
      a && !(a->is_string() && a->get<std::string>() == "silu"))
    throw CliError(at("hidden_act") + json::describe(*a) +
                   ", but meshplan's Llama uses SwiGLU (\"silu\")");
  for (const char *bias : {"attention_bias", "mlp_bias"})
    if (boolean(bias, false))
      throw CliError(at(bias) + "true, but meshplan's Llama has no biases");
  return boolean("tie_word_embeddings", false);
}

/// The index's weight map (tensor -> file), checked.
std::map<std::string, std::string> readIndex(const std::string &path,
                                             int64_t &totalSize) {
  json::Json doc = readJsonFile(path);
  totalSize = -1;
  for (const auto &[key, value] : doc.items()) {
    if (key == "metadata") {
      if (!value.is_object())
        throw CliError(path + ": /metadata: expected an object, got " +
                       json::describe(value));
      if (const json::Json *t = json::member(value, "total_size")) {
        if (!t->is_number_integer() || t->get<int64_t>() < 0)
          throw CliError(path +
                         ": /metadata/total_size: expected a "
                         "non-negative integer, got " +
                         json::describe(*t));
        totalSize = t->get<int64_t>();
      }
    } else if (key != "weight_map") {
      throw CliError(path + ": /" + key +
                     ": unknown key; expected metadata or weight_map");
    }
  }
  const json::Json *map = json::member(doc, "weight_map");
  if (!map)
    throw CliError(path + ": missing key \"weight_map\"");
  if (!map->is_object())
    throw CliError(path + ": /weight_map: expected an object, got " +
                   json::describe(*map));
  std::map<std::string, std::string> out;
  for (const auto &[tensor, file] : map->items()) {
    std::string where = path + ": " + json::childPointer("/weight_map", tensor);
    if (!file.is_string())
      throw CliError(where + ": expected a file name, got " +
                     json::describe(file));
    std::string name = file.get<std::string>();
    if (!plainFileName(name))
      throw CliError(where + ": " + json::quote(name) +
                     " is not a file name in the index's directory");
    out[tensor] = name;
  }
  return out;
}

} // namespace

//===----------------------------------------------------------------------===//
// Opening
//===----------------------------------------------------------------------===//

std::unique_ptr<HfCheckpoint> openHfLlama(const std::string &path,
                                          const LlamaDims &dims) {
  auto hf = std::make_unique<HfCheckpoint>();
  std::error_code ec;
  std::string indexPath, singlePath;
  if (fs::is_directory(path, ec)) {
    hf->directory = path;
    if (fs::exists(joinPath(path, kIndexFile), ec))
      indexPath = joinPath(path, kIndexFile);
    else if (fs::exists(joinPath(path, kSingleFile), ec))
      singlePath = joinPath(path, kSingleFile);
    else
      throw CliError(path + ": neither " + kIndexFile + " nor " + kSingleFile +
                     " (a Hugging Face Llama directory, as save_pretrained "
                     "writes it)");
  } else if (fs::is_regular_file(path, ec)) {
    hf->directory = fs::path(path).parent_path().string();
    if (path.ends_with(".index.json"))
      indexPath = path;
    else
      singlePath = path;
  } else {
    throw CliError(path + ": no such file or directory");
  }
  hf->configPath = joinPath(hf->directory, kConfigFile);
  if (!fs::is_regular_file(hf->configPath, ec))
    throw CliError(hf->configPath +
                   ": missing (--format hf-llama checks the model's dims, "
                   "heads and RoPE against it)");
  {
    auto text = json::readFile(hf->configPath);
    if (!text)
      throw CliError(text.error().message);
    hf->configFingerprint = ckpt::fingerprintOf(*text);
  }
  hf->tied = checkConfig(hf->configPath, readJsonFile(hf->configPath), dims);

  // Every file's header; under an index, the tensors' files from it.
  std::map<std::string, std::string> weightMap; // tensor -> file name
  int64_t totalSize = -1;
  if (!indexPath.empty()) {
    weightMap = readIndex(indexPath, totalSize);
    std::set<std::string> files;
    for (const auto &[tensor, file] : weightMap)
      files.insert(file);
    for (const std::string &f : files)
      hf->paths.push_back(joinPath(hf->directory, f));
  } else {
    hf->paths.push_back(singlePath);
  }
  hf->headers.reserve(hf->paths.size());
  int64_t dataBytes = 0;
  for (const std::string &p : hf->paths) {
    if (!fs::is_regular_file(p, ec))
      throw CliError(p + ": missing, but " + indexPath + " maps tensors to it");
    auto header = ckpt::readSafetensorsHeader(p);
    if (!header)
      throw CliError(header.error().message);
    dataBytes += header->dataBytes;
    hf->headers.push_back(std::move(*header));
  }
  // tensor -> (file index, entry): every tensor of every file exactly once
  // and where the index says.
  std::map<std::string, std::pair<size_t, const ckpt::SafetensorsTensor *>>
      found;
  for (size_t f = 0; f < hf->paths.size(); ++f) {
    std::string name = fs::path(hf->paths[f]).filename().string();
    for (const ckpt::SafetensorsTensor &t : hf->headers[f].tensors) {
      if (!indexPath.empty()) {
        auto it = weightMap.find(t.name);
        if (it == weightMap.end() || it->second != name)
          throw CliError(
              hf->paths[f] + ": tensor " + json::quote(t.name) +
              (it == weightMap.end()
                   ? " is not in " + indexPath
                   : " is mapped to " + it->second + " by " + indexPath));
      }
      found[t.name] = {f, &t};
    }
  }
  if (!indexPath.empty()) {
    for (const auto &[tensor, file] : weightMap)
      if (!found.count(tensor))
        throw CliError(indexPath + ": " +
                       json::childPointer("/weight_map", tensor) + ": " + file +
                       " has no tensor " + json::quote(tensor));
    if (totalSize >= 0 && totalSize > dataBytes)
      throw CliError(indexPath + ": /metadata/total_size: " +
                     std::to_string(totalSize) + " bytes, but its files hold " +
                     std::to_string(dataBytes) + " bytes of tensors");
  }

  std::set<std::string> expected;
  for (const HfName &n : hfNamesOf(dims)) {
    std::string hfName = n.hf;
    if (n.meshplan == "output.weight" && hf->tied) {
      if (found.count(n.hf))
        throw CliError(hf->paths[found[n.hf].first] + ": tensor " +
                       json::quote(n.hf) + ", but " + hf->configPath +
                       " says tie_word_embeddings: true (the output is the "
                       "embedding)");
      hfName = "model.embed_tokens.weight";
    }
    expected.insert(hfName);
    auto it = found.find(hfName);
    if (it == found.end())
      throw CliError(
          (indexPath.empty() ? hf->paths[0] : indexPath) + ": no tensor " +
          json::quote(hfName) + " (meshplan's " + n.meshplan + ")" +
          (n.meshplan == "output.weight"
               ? "; " + hf->configPath + " says tie_word_embeddings: false"
               : ""));
    SourceTensor s;
    s.path = &hf->paths[it->second.first];
    s.header = &hf->headers[it->second.first];
    s.tensor = it->second.second;
    s.headDim = n.permutedHeads ? dims.headDim() : 0;
    hf->sources[n.meshplan] = s;
  }
  for (const auto &[name, where] : found)
    if (!expected.count(name))
      throw CliError(hf->paths[where.first] + ": tensor " + json::quote(name) +
                     " is not a tensor of LlamaForCausalLM with " +
                     hf->configPath +
                     "'s dims (no meshplan parameter "
                     "maps to it)");
  return hf;
}

//===----------------------------------------------------------------------===//
// Reading boxes
//===----------------------------------------------------------------------===//

/// `box` of a whole row-major tensor in a safetensors file: reads the byte
/// span from the box's first element to its last (one read) and copies the
/// box's rows out of it.
static std::vector<std::byte> readBox(const std::string &path,
                                      const ckpt::SafetensorsHeader &header,
                                      const ckpt::SafetensorsTensor &t,
                                      const ckpt::Box &box) {
  const int64_t eb = plan::dtypeBytes(t.dtype);
  const size_t n = t.shape.size();
  auto linear = [&](const std::vector<int64_t> &coord) {
    int64_t idx = 0;
    for (size_t d = 0; d < n; ++d)
      idx = idx * t.shape[d] + coord[d];
    return idx;
  };
  std::vector<int64_t> last(n);
  for (size_t d = 0; d < n; ++d)
    last[d] = box.offset[d] + box.shape[d] - 1;
  const int64_t first = linear(box.offset) * eb;
  const int64_t end = (linear(last) + 1) * eb;
  std::vector<std::byte> span(size_t(end - first));
  if (auto ok = ckpt::readSafetensorsBytes(path, header, t, first, span); !ok)
    throw CliError(ok.error().message);
  std::vector<std::byte> out(size_t(box.numElements() * eb));
  const int64_t row = (n ? box.shape[n - 1] : 1) * eb;
  std::vector<int64_t> coord = box.offset;
  for (int64_t at = 0; at < int64_t(out.size()); at += row) {
    std::memcpy(out.data() + at, span.data() + (linear(coord) * eb - first),
                size_t(row));
    // Next row: odometer over the outer dims.
    for (int d = int(n) - 2; d >= 0; --d) {
      if (++coord[size_t(d)] <= last[size_t(d)])
        break;
      coord[size_t(d)] = box.offset[size_t(d)];
    }
  }
  return out;
}

std::vector<std::byte> readSourceBox(const SourceTensor &s,
                                     const ckpt::Box &box) {
  const ckpt::SafetensorsTensor &t = *s.tensor;
  if (s.headDim == 0 || t.shape.size() != 2)
    return readBox(*s.path, *s.header, t, box);
  // wq / wk: each meshplan row is a whole-row slice of another HF row.
  const int64_t eb = plan::dtypeBytes(t.dtype);
  const int64_t cols = t.shape[1];
  const int64_t rowBytes = box.shape[1] * eb;
  std::vector<std::byte> out(size_t(box.numElements() * eb));
  for (int64_t r = 0; r < box.shape[0]; ++r) {
    int64_t src = hfRowOf(box.offset[0] + r, s.headDim);
    std::span<std::byte> dst(out.data() + r * rowBytes, size_t(rowBytes));
    if (auto ok = ckpt::readSafetensorsBytes(
            *s.path, *s.header, t, (src * cols + box.offset[1]) * eb, dst);
        !ok)
      throw CliError(ok.error().message);
  }
  return out;
}

//===----------------------------------------------------------------------===//
// Export
//===----------------------------------------------------------------------===//

int64_t parseByteSize(const std::string &text, const std::string &flag) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit((unsigned char)text[digits]))
    ++digits;
  std::string unit = text.substr(digits);
  static const std::map<std::string, int64_t> units = {
      {"", 1},
      {"B", 1},
      {"KB", 1000},
      {"MB", 1000'000},
      {"GB", 1000'000'000},
      {"KiB", 1024},
      {"MiB", 1 << 20},
      {"GiB", int64_t(1) << 30}};
  auto it = units.find(unit);
  if (digits == 0 || digits > 15 || it == units.end())
    throw CliError(flag + ": " + json::quote(text) +
                   ": expected a size such as 5GB, 100MB, 512KiB or a "
                   "number of bytes");
  int64_t n = std::stoll(text.substr(0, digits));
  if (n <= 0 || n > (int64_t(1) << 50) / it->second)
    throw CliError(flag + ": " + json::quote(text) +
                   ": must be positive and at most 2^50 bytes");
  return n * it->second;
}

namespace {

/// Written, fsynced and closed with every return value checked (an
/// ofstream reports neither a failed fsync nor the ENOSPC that close can
/// return on some file systems).
void writeTextFile(const std::string &outDir, const std::string &path,
                   const std::string &text) {
  if (auto ok = ckpt::writeFileDurably(path, text); !ok)
    throw CliError("-o: cannot write " + outDir + ": " + ok.error().message);
}

std::string shardName(size_t k, size_t n) {
  char name[64];
  std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", k + 1,
                n);
  return name;
}

} // namespace

HfExport exportHfLlama(const ckpt::CheckpointMetadata &meta,
                       const LlamaDims &dims, const std::string &outDir,
                       int64_t maxShardBytes) {
  // Every parameter the model has, as the checkpoint stores it.
  std::vector<HfName> names = hfNamesOf(dims);
  std::map<std::string, const ckpt::TensorEntry *> entries;
  for (const HfName &n : names) {
    const ckpt::TensorEntry *t = meta.findTensor(n.meshplan);
    if (!t || t->kind != ckpt::TensorKind::Parameter)
      throw CliError(meta.directory + ": no parameter " +
                     json::quote(n.meshplan) + " (the model's " + n.hf + ")");
    entries[n.meshplan] = t;
  }
  auto whole = [&](const ckpt::TensorEntry &t) {
    ckpt::Box box{std::vector<int64_t>(t.shape.size(), 0), t.shape};
    auto bytes = ckpt::loadBox(meta, t.name, t.shape, box, t.dtype);
    if (!bytes)
      throw CliError(bytes.error().message);
    return std::move(*bytes);
  };
  // Tied exactly when the output is bit for bit the embedding: what an
  // import of a tied model gives before any training moves them apart.
  HfExport result;
  {
    const ckpt::TensorEntry &e = *entries["tok_embeddings.weight"];
    const ckpt::TensorEntry &o = *entries["output.weight"];
    result.tied =
        e.dtype == o.dtype && e.shape == o.shape && whole(e) == whole(o);
  }
  if (result.tied)
    names.pop_back(); // lm_head.weight

  std::error_code ec;
  if (fs::exists(fs::symlink_status(outDir, ec)))
    throw CliError("-o: " + outDir + ": exists; not replacing it");
  std::string staging = ckpt::stagingDirOf(outDir);
  if (staging.empty())
    throw CliError("-o: " + outDir + ": needs a directory name");
  fs::path parent = fs::path(outDir).parent_path();
  if (!parent.empty() && !fs::is_directory(parent, ec))
    throw CliError("-o: the parent directory " + parent.string() +
                   " does not exist");
  fs::remove_all(staging, ec);
  if (!fs::create_directory(staging, ec))
    throw CliError("-o: cannot create " + staging + ": " + ec.message());
  struct Cleanup {
    std::string dir;
    bool done = false;
    ~Cleanup() {
      if (!done) {
        std::error_code ec;
        fs::remove_all(dir, ec);
      }
    }
  } cleanup{staging};

  // Shards as transformers cuts them: in order, a new one when the next
  // tensor would pass the limit (a tensor larger than it alone in one).
  std::vector<std::vector<size_t>> shards(1);
  int64_t shardBytes = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    const ckpt::TensorEntry &t = *entries[names[i].meshplan];
    int64_t bytes = plan::dtypeBytes(t.dtype);
    for (int64_t d : t.shape)
      bytes *= d;
    if (!shards.back().empty() && shardBytes + bytes > maxShardBytes) {
      shards.emplace_back();
      shardBytes = 0;
    }
    shards.back().push_back(i);
    shardBytes += bytes;
    result.bytes += bytes;
  }
  // Sorted by tensor name, as transformers writes it.
  std::map<std::string, std::string> weightMap;
  for (size_t k = 0; k < shards.size(); ++k) {
    std::string file =
        shards.size() == 1 ? kSingleFile : shardName(k, shards.size());
    std::vector<ckpt::SafetensorsEntry> st;
    for (size_t i : shards[k]) {
      const ckpt::TensorEntry &t = *entries[names[i].meshplan];
      st.push_back({names[i].hf, t.dtype, t.shape});
      weightMap[names[i].hf] = file;
    }
    auto written = ckpt::writeSafetensors(
        joinPath(staging, file), st, {{"format", "pt"}},
        [&](size_t j, std::span<std::byte> out) -> Result<void> {
          const HfName &n = names[shards[k][j]];
          const ckpt::TensorEntry &t = *entries[n.meshplan];
          std::vector<std::byte> bytes = whole(t);
          if (!n.permutedHeads) {
            std::memcpy(out.data(), bytes.data(), bytes.size());
            return {};
          }
          // HF's row hfRowOf(r) is meshplan's row r.
          const size_t rowBytes =
              size_t(t.shape[1] * plan::dtypeBytes(t.dtype));
          for (int64_t r = 0; r < t.shape[0]; ++r)
            std::memcpy(out.data() + hfRowOf(r, dims.headDim()) * rowBytes,
                        bytes.data() + r * rowBytes, rowBytes);
          return {};
        });
    if (!written)
      throw CliError("-o: cannot write " + outDir + ": " +
                     written.error().message);
  }
  result.tensors = int64_t(names.size());
  result.files = int64_t(shards.size());
  if (shards.size() > 1) {
    json::Json index = json::Json::object();
    index["metadata"] = {{"total_size", result.bytes}};
    json::Json map = json::Json::object();
    for (const auto &[tensor, file] : weightMap)
      map[tensor] = file;
    index["weight_map"] = std::move(map);
    writeTextFile(outDir, joinPath(staging, kIndexFile), index.dump(2) + "\n");
  }

  const ckpt::TensorEntry &emb = *entries["tok_embeddings.weight"];
  json::Json config = json::Json::object();
  config["architectures"] = {"LlamaForCausalLM"};
  config["model_type"] = "llama";
  config["hidden_size"] = dims.dim;
  config["intermediate_size"] = dims.ffnDim;
  config["num_hidden_layers"] = dims.nLayers;
  config["num_attention_heads"] = dims.nHeads;
  config["num_key_value_heads"] = dims.nKvHeads;
  config["head_dim"] = dims.headDim();
  config["vocab_size"] = dims.vocab;
  config["hidden_act"] = "silu";
  config["rms_norm_eps"] = 1e-05;
  config["rope_theta"] = kRopeTheta;
  config["rope_scaling"] = nullptr;
  // meshplan's RoPE has no length limit; Llama 3's context.
  config["max_position_embeddings"] = 8192;
  config["attention_bias"] = false;
  config["attention_dropout"] = 0.0;
  config["mlp_bias"] = false;
  config["tie_word_embeddings"] = result.tied;
  config["torch_dtype"] = std::string(plan::dtypeName(emb.dtype));
  config["initializer_range"] = 0.02;
  config["use_cache"] = true;
  writeTextFile(outDir, joinPath(staging, kConfigFile), config.dump(2) + "\n");

  if (::rename(staging.c_str(), outDir.c_str()) != 0)
    throw CliError("-o: cannot rename " + staging + " to " + outDir + ": " +
                   std::strerror(errno));
  cleanup.done = true;
  return result;
}

} // namespace meshplan::cli::hf

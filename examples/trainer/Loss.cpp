//===- Loss.cpp - meshplan-loss: one forward of a checkpoint's model ------===//
//
//   meshplan-loss CKPT --heads H --kv-heads K --tokens FILE
//
// Loads every parameter of a checkpoint whole (any layout; checksums
// verified) and runs meshplan-train's model (model/Llama.cpp) forward once,
// in one process on the CPU, on the bytes of FILE as tokens (FILE[t] ->
// FILE[t + 1], one sequence), printing the mean cross-entropy with 9
// significant digits. meshplan-train prints losses to 4 decimals; this
// compares an imported model with another implementation to fp32 noise
// (python/tests/test_hf_llama.py, docs/checkpoint-format.md).
//
//===----------------------------------------------------------------------===//

#include "meshplan/Checkpoint/Checkpoint.h"
#include "model/Llama.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

using namespace meshplan;
using namespace meshplan::trainer;

namespace {

int usage(const std::string &why) {
  std::fprintf(stderr,
               "meshplan-loss: error: %s\nusage: meshplan-loss CKPT --heads H "
               "--kv-heads K --tokens FILE\n",
               why.c_str());
  return 2;
}

Result<std::vector<float>> wholeTensor(const ckpt::CheckpointMetadata &meta,
                                       const std::string &name) {
  const ckpt::TensorEntry *t = meta.findTensor(name);
  if (!t)
    return makeError(meta.directory + ": no tensor \"" + name + "\"");
  if (t->dtype != plan::DType::Float32)
    return makeError(meta.directory + ": tensor \"" + name +
                     "\" is not float32 (the model computes in float32)");
  ckpt::Box whole{std::vector<int64_t>(t->shape.size(), 0), t->shape};
  std::vector<float> out(size_t(whole.numElements()));
  MESHPLAN_TRY(ckpt::loadBoxInto(meta, name, t->shape, whole, t->dtype,
                                 std::as_writable_bytes(std::span(out))));
  return out;
}

Result<float> run(const std::string &dir, int64_t heads, int64_t kvHeads,
                  const std::string &tokensPath) {
  auto meta = ckpt::readCheckpointMetadata(dir);
  MESHPLAN_TRY(meta);
  std::map<std::string, std::vector<float>> w;
  auto get = [&](const std::string &name) -> Result<const float *> {
    auto it = w.find(name);
    if (it == w.end()) {
      auto t = wholeTensor(*meta, name);
      MESHPLAN_TRY(t);
      it = w.emplace(name, std::move(*t)).first;
    }
    return it->second.data();
  };
  const ckpt::TensorEntry *emb = meta->findTensor("tok_embeddings.weight");
  const ckpt::TensorEntry *w1 =
      meta->findTensor("layers.0.feed_forward.w1.weight");
  if (!emb || emb->shape.size() != 2 || !w1 || w1->shape.size() != 2)
    return makeError(dir + ": not a Llama checkpoint (tok_embeddings.weight, "
                           "layers.0.feed_forward.w1.weight)");
  LlamaConfig c;
  c.vocab = emb->shape[0];
  c.dim = emb->shape[1];
  c.ffnDim = w1->shape[0];
  c.nHeads = heads;
  c.nKvHeads = kvHeads;
  while (meta->findTensor("layers." + std::to_string(c.nLayers) +
                          ".attention_norm.weight"))
    ++c.nLayers;

  std::ifstream in(tokensPath, std::ios::binary);
  if (!in)
    return makeError(tokensPath + ": cannot be read");
  std::string text((std::istreambuf_iterator<char>(in)), {});
  if (text.size() < 2)
    return makeError(tokensPath + ": needs at least 2 bytes");
  std::vector<int32_t> tokens, targets;
  for (size_t i = 0; i + 1 < text.size(); ++i) {
    tokens.push_back(static_cast<unsigned char>(text[i]));
    targets.push_back(static_cast<unsigned char>(text[i + 1]));
  }
  MicrobatchShape shape{1, int64_t(tokens.size())};
  TpShard shard = TpShard::whole(c);
  SoloTpGroup tp;
  MESHPLAN_TRY(checkModel(c, shard, shape, 1));
  Microbatch mb(c, shard, shape, ModelOptions{}, tp);
  MESHPLAN_TRY(mb.setData(tokens, targets));
  auto e = get("tok_embeddings.weight");
  MESHPLAN_TRY(e);
  MESHPLAN_TRY(mb.forwardEmbedding(*e));
  for (int64_t l = 0; l < c.nLayers; ++l) {
    std::string p = "layers." + std::to_string(l) + ".";
    BlockWeights b;
    const float **slots[] = {&b.attentionNorm, &b.wq, &b.wk, &b.wv, &b.wo,
                             &b.ffnNorm,       &b.w1, &b.w3, &b.w2};
    const char *names[] = {
        "attention_norm",  "attention.wq",    "attention.wk",
        "attention.wv",    "attention.wo",    "ffn_norm",
        "feed_forward.w1", "feed_forward.w3", "feed_forward.w2"};
    for (size_t i = 0; i < std::size(names); ++i) {
      auto t = get(p + names[i] + ".weight");
      MESHPLAN_TRY(t);
      *slots[i] = *t;
    }
    MESHPLAN_TRY(mb.forwardBlock(l, b));
  }
  auto norm = get("norm.weight");
  MESHPLAN_TRY(norm);
  MESHPLAN_TRY(mb.forwardFinalNorm(*norm));
  auto output = get("output.weight");
  MESHPLAN_TRY(output);
  return mb.forwardOutput(*output);
}

} // namespace

int main(int argc, char **argv) {
  std::string dir, tokens;
  int64_t heads = 0, kvHeads = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> const char * {
      return i + 1 < argc ? argv[++i] : nullptr;
    };
    if (a == "--heads" || a == "--kv-heads" || a == "--tokens") {
      const char *v = value();
      if (!v)
        return usage(a + " needs a value");
      if (a == "--tokens")
        tokens = v;
      else
        (a == "--heads" ? heads : kvHeads) = std::atoll(v);
    } else if (!a.empty() && a[0] != '-' && dir.empty()) {
      dir = a;
    } else {
      return usage("unexpected argument " + a);
    }
  }
  if (dir.empty() || tokens.empty() || heads <= 0 || kvHeads <= 0)
    return usage("CKPT, --heads, --kv-heads and --tokens are required");
  auto loss = run(dir, heads, kvHeads, tokens);
  if (!loss) {
    std::fprintf(stderr, "meshplan-loss: error: %s\n",
                 loss.error().message.c_str());
    return 2;
  }
  std::printf("loss %.9g\n", double(*loss));
  return 0;
}

//===- HfLlama.h - Hugging Face Llama checkpoints for meshplan ckpt -------===//
//
// `meshplan ckpt import|export --format hf-llama` (docs/checkpoint-format.md,
// "Hugging Face Llama"): a directory as transformers' save_pretrained
// writes it for LlamaForCausalLM (config.json, and model.safetensors or
// model-0000K-of-0000N.safetensors with model.safetensors.index.json),
// mapped onto meshplan's Llama (torchtitan's names, frontend/Presets.h).
//
// Names: model.embed_tokens <-> tok_embeddings, model.layers.N.self_attn.
// {q,k,v,o}_proj <-> layers.N.attention.{wq,wk,wv,wo}, mlp.{gate,up,down}_proj
// <-> feed_forward.{w1,w3,w2}, input_layernorm <-> attention_norm,
// post_attention_layernorm <-> ffn_norm, model.norm <-> norm, lm_head <->
// output (absent under tie_word_embeddings: output is then a copy of the
// embedding, trained on its own by meshplan).
//
// RoPE: meshplan's model rotates interleaved pairs (2i, 2i+1) of each head
// (examples/trainer/model/HostOps.cpp, Meta's and torchtitan's layout);
// transformers rotates halves (i, i + head_dim/2), and its converter
// permutes the rows of wq and wk to match (convert_llama_weights_to_hf.py:
// w.view(heads, head_dim/2, 2, dim).transpose(1, 2).reshape(...)). So row
// h*hd + 2i + p of meshplan's wq/wk is row h*hd + p*hd/2 + i of HF's:
// import reads through that map, export writes through its inverse, and
// both compute the same logits.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_TOOLS_PLANNER_HFLLAMA_H
#define MESHPLAN_TOOLS_PLANNER_HFLLAMA_H

#include "meshplan/Checkpoint/Checkpoint.h"
#include "meshplan/Checkpoint/Safetensors.h"

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace meshplan::frontend {
struct Model;
} // namespace meshplan::frontend

namespace meshplan::cli::hf {

/// meshplan's Llama hyper-parameters that no model file states: they are
/// the model's (examples/trainer/model/Llama.h, LlamaConfig), and an HF
/// config must agree with them.
inline constexpr double kRopeTheta = 500000.0;
inline constexpr float kNormEps = 1e-5f;

/// The dims of a Llama model document (torchtitan's names and shapes);
/// anything else is a CliError naming the model.
struct LlamaDims {
  int64_t dim = 0, nLayers = 0, nHeads = 0, nKvHeads = 0, ffnDim = 0, vocab = 0;
  int64_t headDim() const { return dim / nHeads; }
};
LlamaDims llamaDimsOf(const frontend::Model &model);

/// One meshplan parameter's HF tensor: its name and, for wq and wk, the
/// number of heads whose rows are permuted (0 for the others).
struct HfName {
  std::string meshplan, hf;
  int64_t permutedHeads = 0;
};
/// Every parameter in HF's order (embedding, layers, norm, lm_head).
std::vector<HfName> hfNamesOf(const LlamaDims &dims);

/// Row `row` of a meshplan wq/wk (heads of `headDim` rows) is this row of
/// HF's.
int64_t hfRowOf(int64_t row, int64_t headDim);

/// A tensor of an opened safetensors file and how to read it as meshplan
/// stores it.
struct SourceTensor {
  const std::string *path = nullptr;
  const ckpt::SafetensorsHeader *header = nullptr;
  const ckpt::SafetensorsTensor *tensor = nullptr;
  int64_t headDim = 0; ///< rows permuted in heads of headDim; 0: none
};

/// An opened HF Llama checkpoint: config checked against the model's dims,
/// every file's header read, the index consistent with the files, every
/// tensor mapped (none missing, none extra).
struct HfCheckpoint {
  std::string directory;
  std::string configPath;
  std::string configFingerprint;
  bool tied = false;
  std::vector<std::string> paths; ///< the safetensors files
  std::vector<ckpt::SafetensorsHeader> headers;
  /// meshplan parameter name -> where it is.
  std::map<std::string, SourceTensor> sources;
};
/// `path`: the directory, its model.safetensors, or its
/// model.safetensors.index.json. Bad input: a CliError naming the file and
/// the tensor or key.
std::unique_ptr<HfCheckpoint> openHfLlama(const std::string &path,
                                          const LlamaDims &dims);

/// The bytes of `box` of a source tensor, in the file's dtype, through the
/// row permutation when there is one.
std::vector<std::byte> readSourceBox(const SourceTensor &source,
                                     const ckpt::Box &box);

/// "5GB", "10MB", "500KiB", "123": bytes (decimal units as transformers'
/// max_shard_size; KiB, MiB, GiB binary). CliError naming `flag`.
int64_t parseByteSize(const std::string &text, const std::string &flag);

struct HfExport {
  int64_t tensors = 0, bytes = 0, files = 0;
  bool tied = false;
};
/// Writes `outDir` (which must not exist; its parent must): config.json and
/// the parameters of `meta` (a checkpoint of a model with `dims`) as HF
/// tensors, in one model.safetensors or, above `maxShardBytes`, shards and
/// an index. Built in a staging directory beside it and renamed into
/// place, so a failure leaves nothing.
HfExport exportHfLlama(const ckpt::CheckpointMetadata &meta,
                       const LlamaDims &dims, const std::string &outDir,
                       int64_t maxShardBytes);

} // namespace meshplan::cli::hf

#endif // MESHPLAN_TOOLS_PLANNER_HFLLAMA_H

//===- Presets.h - Built-in Llama 3 models with their published shapes ----===//
//
// A preset is a handful of hyper-parameters; its Model is generated on
// demand, with torchtitan's module names and shapes (no biases):
//
//   tok_embeddings            embedding  weight [vocab, dim]
//   layers.N                  block, for N in 0 .. n_layers-1:
//     attention_norm          norm       weight [dim]
//     attention               attention  (n_heads, n_kv_heads)
//       wq                    linear     weight [n_heads * head_dim, dim]
//       wk, wv                linear     weight [n_kv_heads * head_dim, dim]
//       wo                    linear     weight [dim, n_heads * head_dim]
//     ffn_norm                norm       weight [dim]
//     feed_forward            feed_forward
//       w1, w3                linear     weight [ffn_dim, dim]
//       w2                    linear     weight [dim, ffn_dim]
//   norm                      norm       weight [dim]
//   output                    output     weight [vocab, dim]
//
// with head_dim = dim / n_heads. Modules are listed in forward order.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_FRONTEND_PRESETS_H
#define MESHPLAN_FRONTEND_PRESETS_H

#include "meshplan/Frontend/Model.h"

#include <string>
#include <string_view>
#include <vector>

namespace meshplan::frontend {

struct TransformerConfig {
  std::string_view name;
  int64_t dim;
  int64_t nLayers;
  int64_t nHeads;
  int64_t nKvHeads;
  int64_t ffnDim;
  int64_t vocabSize;
};

/// tiny (for tests), llama3-8b, llama3-70b, llama3-405b.
const std::vector<TransformerConfig> &presetConfigs();
/// "tiny, llama3-8b, llama3-70b, llama3-405b"
std::string presetNameList();
const TransformerConfig *findPreset(std::string_view name);

/// Builds the model of a configuration (see file comment).
Model buildTransformer(const TransformerConfig &config,
                       DType dtype = DType::Float32);
/// The model of a preset; the error lists the presets and suggests the
/// closest name.
Result<Model> presetModel(std::string_view name);

} // namespace meshplan::frontend

#endif // MESHPLAN_FRONTEND_PRESETS_H

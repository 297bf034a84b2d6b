//===- Presets.cpp - Built-in Llama 3 models ------------------------------===//

#include "meshplan/Frontend/Presets.h"

#include "meshplan/Support/Json.h"

namespace meshplan::frontend {

const std::vector<TransformerConfig> &presetConfigs() {
  // Llama 3 / 3.1 shapes as published (and as torchtitan's llama3 configs
  // define them: ffn_dim_multiplier and multiple_of give these ffn dims).
  static const std::vector<TransformerConfig> configs = {
      {"tiny", 64, 2, 4, 2, 128, 256},
      {"llama3-8b", 4096, 32, 32, 8, 14336, 128256},
      {"llama3-70b", 8192, 80, 64, 8, 28672, 128256},
      {"llama3-405b", 16384, 126, 128, 8, 53248, 128256},
  };
  return configs;
}

std::string presetNameList() {
  std::string out;
  for (const TransformerConfig &config : presetConfigs())
    out += (out.empty() ? "" : ", ") + std::string(config.name);
  return out;
}

const TransformerConfig *findPreset(std::string_view name) {
  for (const TransformerConfig &config : presetConfigs())
    if (config.name == name)
      return &config;
  return nullptr;
}

static Module leaf(std::string name, ModuleKind kind,
                   std::vector<int64_t> shape, DType dtype) {
  Module module;
  module.name = std::move(name);
  module.kind = kind;
  module.params.push_back({"weight", std::move(shape), dtype});
  return module;
}

static Module container(std::string name, ModuleKind kind,
                        std::vector<Module> children) {
  Module module;
  module.name = std::move(name);
  module.kind = kind;
  module.children = std::move(children);
  return module;
}

Model buildTransformer(const TransformerConfig &c, DType dtype) {
  const int64_t headDim = c.dim / c.nHeads;
  const int64_t qDim = c.nHeads * headDim;
  const int64_t kvDim = c.nKvHeads * headDim;

  // Every layer has the same structure; build one and copy it.
  Module attention =
      container("attention", ModuleKind::Attention,
                {leaf("wq", ModuleKind::Linear, {qDim, c.dim}, dtype),
                 leaf("wk", ModuleKind::Linear, {kvDim, c.dim}, dtype),
                 leaf("wv", ModuleKind::Linear, {kvDim, c.dim}, dtype),
                 leaf("wo", ModuleKind::Linear, {c.dim, qDim}, dtype)});
  attention.nHeads = c.nHeads;
  attention.nKvHeads = c.nKvHeads;
  Module feedForward =
      container("feed_forward", ModuleKind::FeedForward,
                {leaf("w1", ModuleKind::Linear, {c.ffnDim, c.dim}, dtype),
                 leaf("w3", ModuleKind::Linear, {c.ffnDim, c.dim}, dtype),
                 leaf("w2", ModuleKind::Linear, {c.dim, c.ffnDim}, dtype)});
  Module layer = container(
      "", ModuleKind::Block,
      {leaf("attention_norm", ModuleKind::Norm, {c.dim}, dtype),
       std::move(attention), leaf("ffn_norm", ModuleKind::Norm, {c.dim}, dtype),
       std::move(feedForward)});

  Module layers = container("layers", ModuleKind::Block, {});
  layers.children.reserve(c.nLayers);
  for (int64_t i = 0; i < c.nLayers; ++i) {
    layers.children.push_back(layer);
    layers.children.back().name = std::to_string(i);
  }

  Model model;
  model.name = std::string(c.name);
  model.modules.push_back(leaf("tok_embeddings", ModuleKind::Embedding,
                               {c.vocabSize, c.dim}, dtype));
  model.modules.push_back(std::move(layers));
  model.modules.push_back(leaf("norm", ModuleKind::Norm, {c.dim}, dtype));
  model.modules.push_back(
      leaf("output", ModuleKind::Output, {c.vocabSize, c.dim}, dtype));
  return model;
}

Result<Model> presetModel(std::string_view name) {
  if (const TransformerConfig *config = findPreset(name))
    return buildTransformer(*config);
  std::vector<std::string_view> names;
  for (const TransformerConfig &config : presetConfigs())
    names.push_back(config.name);
  return makeError("unknown preset " + json::quote(name) +
                   "; expected one of " + presetNameList() +
                   json::didYouMean(name, names));
}

} // namespace meshplan::frontend

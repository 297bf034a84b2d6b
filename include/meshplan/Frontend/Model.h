//===- Model.h - A model as a tree of modules with parameters -------------===//
//
// The planner does not run a model; it needs its structure: which modules
// exist, in what order the forward pass visits them, and the name, shape and
// dtype of every parameter. A model is a tree of modules. Leaf modules
// (embedding, linear, norm, output) own parameters; container modules
// (block, attention, feed_forward) own child modules, listed in forward
// order. Names follow torchtitan's fully qualified names: a module's path is
// its ancestors' names joined with "." ("layers.3.attention.wq"), a
// parameter's full name appends its own ("layers.3.attention.wq.weight").
//
// Models come from the built-in presets (Presets.h) or from a JSON file
// (docs/spec.md, docs/model.schema.json); parseModel validates one and
// reports every problem with the JSON pointer of the offending value.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_FRONTEND_MODEL_H
#define MESHPLAN_FRONTEND_MODEL_H

#include "meshplan/Core/Result.h"

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace meshplan::frontend {

//===----------------------------------------------------------------------===//
// Element types
//===----------------------------------------------------------------------===//

/// Element types of parameters, compute and communication.
enum class DType { Float32, BFloat16, Float16 };
inline constexpr std::array<std::string_view, 3> kDTypeNames = {
    "float32", "bfloat16", "float16"};
std::string_view dtypeName(DType dtype);
std::optional<DType> parseDType(std::string_view name);
int64_t dtypeBytes(DType dtype);

//===----------------------------------------------------------------------===//
// Modules
//===----------------------------------------------------------------------===//

enum class ModuleKind {
  Embedding,
  Linear,
  Norm,
  Attention,
  FeedForward,
  Output,
  Block
};
inline constexpr std::array<std::string_view, 7> kModuleKindNames = {
    "embedding",    "linear", "norm", "attention",
    "feed_forward", "output", "block"};
std::string_view moduleKindName(ModuleKind kind);
std::optional<ModuleKind> parseModuleKind(std::string_view name);
/// Leaf kinds own parameters; the others (block, attention, feed_forward)
/// own child modules.
bool isLeafKind(ModuleKind kind);

struct Parameter {
  std::string name; ///< local name: "weight", "bias"
  std::vector<int64_t> shape;
  DType dtype = DType::Float32;

  int64_t numElements() const;
};

struct Module {
  std::string name; ///< local name: "wq", "3", "tok_embeddings"
  ModuleKind kind = ModuleKind::Block;
  std::vector<Parameter> params; ///< leaf modules only
  std::vector<Module> children;  ///< container modules only; forward order
  int64_t nHeads = 0;            ///< attention only
  int64_t nKvHeads = 0;          ///< attention only

  const Parameter *findParam(std::string_view local) const;
};

struct Model {
  std::string name;
  std::vector<Module> modules; ///< top-level modules in forward order
};

/// Visits every module in forward (pre-)order with its full path.
void forEachModule(
    const Model &model,
    const std::function<void(const std::string &path, const Module &)> &fn);

/// One module of a flattened model, in forward order.
struct ModuleEntry {
  std::string path;     ///< "layers.3.attention.wq"
  const Module *module; ///< points into the Model
  int parent = -1;      ///< index of the enclosing module, -1 at top level
};
/// Every module in forward order; pointers stay valid while the model lives
/// and is not modified.
std::vector<ModuleEntry> flattenModules(const Model &model);

/// Number of parameter elements in the model.
int64_t countParameters(const Model &model);

//===----------------------------------------------------------------------===//
// Name patterns
//===----------------------------------------------------------------------===//

/// Glob over dotted names: `*` matches any run of characters without a dot
/// (part of one name segment), `**` any run including dots (any number of
/// segments), `?` one character other than a dot; everything else matches
/// itself. "layers.*.attention.wq" matches "layers.3.attention.wq".
bool globMatch(std::string_view pattern, std::string_view name);
/// Checks a pattern's syntax: non-empty, at most 256 characters, made of
/// letters, digits, '_', '.', '*', '?'. The error says what is wrong.
Result<void> checkPattern(std::string_view pattern);

/// Indices (into flattenModules) of the modules a pattern selects: those
/// whose path matches it, and those owning a parameter whose full name
/// matches it ("layers.*.attention.wq.weight" selects the wq modules).
std::vector<int> matchModules(const std::vector<ModuleEntry> &modules,
                              std::string_view pattern);

//===----------------------------------------------------------------------===//
// JSON
//===----------------------------------------------------------------------===//

/// Parses and validates a model JSON document (see docs/spec.md). Errors
/// start with the JSON pointer of the offending value, or with "line L,
/// column C" for malformed JSON.
Result<Model> parseModel(std::string_view jsonText);
/// Reads and parses a model file; errors are prefixed with the path.
Result<Model> loadModelFile(const std::string &path);
/// The model as JSON (pretty-printed with `indent` >= 0, compact with -1);
/// parseModel(modelToJson(m)) reproduces m.
std::string modelToJson(const Model &model, int indent = 2);

} // namespace meshplan::frontend

#endif // MESHPLAN_FRONTEND_MODEL_H

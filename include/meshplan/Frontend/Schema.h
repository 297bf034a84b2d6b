//===- Schema.h - The key tables behind the spec and model parsers --------===//
//
// Every JSON object the frontend reads (the spec's sections, the model's
// modules and parameters) is described by one SectionRule: the keys it
// accepts, each with its JSON type, whether it is required, and for strings
// with a closed set of values, that set. The parsers check objects against
// these tables (unknown keys, missing keys, wrong types, unknown enum values)
// before reading them, and a unit test checks that docs/spec.schema.json and
// docs/model.schema.json list exactly the same keys, types and values, so the
// parser and its documentation cannot drift apart.
//
// A section's name is "" for the document root and otherwise the name of its
// definition under "$defs" in the JSON Schema.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_FRONTEND_SCHEMA_H
#define MESHPLAN_FRONTEND_SCHEMA_H

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace meshplan::frontend {

/// JSON value types, named as JSON Schema names them.
enum class JsonType { Object, Array, String, Integer, Number, Boolean };
std::string_view jsonTypeName(JsonType type);

struct KeyRule {
  std::string_view name;
  JsonType type = JsonType::Object;
  bool required = false;
  /// For arrays: the element type.
  std::optional<JsonType> items = std::nullopt;
  /// For objects, or arrays of objects: the section describing them.
  std::string_view section = {};
  /// For strings (or arrays of strings) with a closed set of values.
  std::vector<std::string_view> values = {};
  /// For arrays of a fixed length (e.g. AdamW's betas).
  std::optional<int> length = std::nullopt;
};

struct SectionRule {
  std::string_view name; ///< "" for the root, else the $defs name
  std::vector<KeyRule> keys;

  const KeyRule *find(std::string_view key) const;
  /// "a, b, c" in table order; used by "expected one of" messages.
  std::string keyList() const;
};

/// The spec's sections: "", mesh, mesh_axis, data_parallel, tensor_parallel,
/// tp_rule, mixed_precision, float8, optimizer.
const std::vector<SectionRule> &specSections();
/// The model's sections: "", module, parameter.
const std::vector<SectionRule> &modelSections();

/// A section by name; asserts it exists.
const SectionRule &findSection(const std::vector<SectionRule> &sections,
                               std::string_view name);

} // namespace meshplan::frontend

#endif // MESHPLAN_FRONTEND_SCHEMA_H

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

#include "meshplan/Support/Json.h"

#include <string_view>
#include <vector>

namespace meshplan::frontend {

// The rule types are the shared closed-object rules of meshplan/Support.
using json::JsonType;
using json::jsonTypeName;
using json::KeyRule;
using json::SectionRule;

/// The spec's sections: "", mesh, mesh_axis, data_parallel, tensor_parallel,
/// tp_rule, mixed_precision, float8, optimizer.
const std::vector<SectionRule> &specSections();
/// The model's sections: "", module, parameter.
const std::vector<SectionRule> &modelSections();

/// A key whose value may also have a second JSON type, besides the one in
/// its KeyRule: `data_parallel.reshard_after_forward` (a policy name, or a
/// boolean) and `data_parallel.units` (arrays of patterns, or a grouping
/// name). The JSON Schema states such a key as {"if": {"type": <type>},
/// "then": <this alternative>, "else": <the KeyRule>}.
struct KeyAlternative {
  std::string_view section;
  std::string_view key;
  JsonType type;
  std::vector<std::string_view> values = {}; ///< closed set, for strings
};
const std::vector<KeyAlternative> &specKeyAlternatives();

/// A section by name; asserts it exists.
const SectionRule &findSection(const std::vector<SectionRule> &sections,
                               std::string_view name);

} // namespace meshplan::frontend

#endif // MESHPLAN_FRONTEND_SCHEMA_H

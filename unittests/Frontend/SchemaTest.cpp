//===- SchemaTest.cpp - The JSON Schemas in docs/ match the parsers -------===//
//
// docs/spec.schema.json and docs/model.schema.json are documentation that
// editors and other tools validate against; they must say what the parsers
// do. This test checks, from the same key tables the parsers use
// (Frontend/Schema.h):
//   - both files are valid JSON and declare draft 2020-12;
//   - every object section (the root and each $defs entry the table names)
//     closes its keys (additionalProperties: false) and lists exactly the
//     table's keys, required keys, JSON types, array element types, section
//     references, closed value sets and fixed lengths; and every object
//     definition in $defs is a section of the table;
//   - with a small validator for the keywords the schemas use (it refuses
//     any other keyword, so nothing is silently ignored): every example
//     validates, and whatever the schema rejects among random mutations of a
//     valid document, the parser rejects too.
//
//===----------------------------------------------------------------------===//

#include "FrontendTestHelpers.h"

#include "meshplan/Frontend/Model.h"
#include "meshplan/Frontend/Presets.h"
#include "meshplan/Frontend/Schema.h"
#include "meshplan/Frontend/Spec.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <random>
#include <regex>
#include <set>

using namespace meshplan;
using namespace meshplan::frontend;
using Json = nlohmann::ordered_json;

namespace {

Json loadSchema(const std::string &relative) {
  std::string text = testutil::readText(testutil::sourcePath(relative));
  Json schema = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(schema.is_discarded()) << relative << " is not valid JSON";
  return schema;
}

/// The definition `name` under "$defs", or an empty object.
const Json &definition(const Json &root, const std::string &name) {
  static const Json empty = Json::object();
  if (!root.contains("$defs") || !root["$defs"].contains(name))
    return empty;
  return root["$defs"][name];
}

/// Follows "$ref": "#/$defs/name" (the only form the schemas use).
const Json &resolve(const Json &root, const Json &node) {
  if (!node.is_object() || !node.contains("$ref"))
    return node;
  std::string ref = node["$ref"].get<std::string>();
  const std::string prefix = "#/$defs/";
  EXPECT_EQ(ref.rfind(prefix, 0), 0u) << ref;
  const Json &target = definition(root, ref.substr(prefix.size()));
  EXPECT_FALSE(target.empty()) << "dangling " << ref;
  return resolve(root, target);
}

std::set<std::string> stringSet(const Json &array) {
  std::set<std::string> out;
  for (const Json &v : array)
    out.insert(v.get<std::string>());
  return out;
}

void checkSection(const Json &root, const SectionRule &section) {
  const std::string where =
      section.name.empty() ? std::string("(root)") : std::string(section.name);
  SCOPED_TRACE(where);
  const Json &node =
      section.name.empty() ? root : definition(root, std::string(section.name));
  ASSERT_FALSE(node.empty()) << "no $defs entry for section " << where;
  EXPECT_EQ(node.value("type", ""), "object");
  EXPECT_EQ(node.value("additionalProperties", true), false)
      << "unknown keys must be refused";
  ASSERT_TRUE(node.contains("properties"));
  const Json &properties = node["properties"];

  std::set<std::string> schemaKeys, tableKeys, schemaRequired, tableRequired;
  for (auto it = properties.begin(); it != properties.end(); ++it)
    schemaKeys.insert(it.key());
  for (const KeyRule &rule : section.keys) {
    tableKeys.insert(std::string(rule.name));
    if (rule.required)
      tableRequired.insert(std::string(rule.name));
  }
  if (node.contains("required"))
    schemaRequired = stringSet(node["required"]);
  EXPECT_EQ(schemaKeys, tableKeys);
  EXPECT_EQ(schemaRequired, tableRequired);

  for (const KeyRule &rule : section.keys) {
    std::string key(rule.name);
    SCOPED_TRACE(key);
    if (!properties.contains(key))
      continue;
    const Json &raw = properties[key];
    const Json *propPtr = &resolve(root, raw);
    // A key that also takes a second type (specKeyAlternatives) is written
    // {"if": {"type": alt}, "then": alt's schema, "else": the rule's}.
    const KeyAlternative *alt = nullptr;
    for (const KeyAlternative &a : specKeyAlternatives())
      if (a.section == section.name && a.key == rule.name)
        alt = &a;
    bool typed = propPtr->contains("if") && (*propPtr)["if"].contains("type");
    EXPECT_EQ(typed, alt != nullptr);
    if (alt && typed) {
      const Json &cond = (*propPtr)["if"];
      const Json &then = (*propPtr)["then"];
      EXPECT_EQ(cond.value("type", ""), jsonTypeName(alt->type));
      EXPECT_EQ(then.value("type", ""), jsonTypeName(alt->type));
      if (!alt->values.empty()) {
        ASSERT_TRUE(then.contains("enum"));
        EXPECT_EQ(
            stringSet(then["enum"]),
            std::set<std::string>(alt->values.begin(), alt->values.end()));
      }
      ASSERT_TRUE(propPtr->contains("else"));
      propPtr = &(*propPtr)["else"];
    }
    const Json &prop = *propPtr;
    EXPECT_EQ(prop.value("type", ""), jsonTypeName(rule.type));
    if (rule.type == JsonType::Object && !rule.section.empty()) {
      EXPECT_EQ(raw.value("$ref", ""), "#/$defs/" + std::string(rule.section));
    }
    if (rule.type == JsonType::String && !rule.values.empty()) {
      ASSERT_TRUE(prop.contains("enum"));
      EXPECT_EQ(stringSet(prop["enum"]),
                std::set<std::string>(rule.values.begin(), rule.values.end()));
    } else if (rule.type == JsonType::String) {
      EXPECT_FALSE(prop.contains("enum")) << "the parser has no closed set";
    }
    if (rule.type != JsonType::Array)
      continue;
    ASSERT_TRUE(prop.contains("items"));
    const Json &rawItems = prop["items"];
    const Json &items = resolve(root, rawItems);
    ASSERT_TRUE(rule.items.has_value());
    EXPECT_EQ(items.value("type", ""), jsonTypeName(*rule.items));
    if (!rule.section.empty()) {
      EXPECT_EQ(rawItems.value("$ref", ""),
                "#/$defs/" + std::string(rule.section));
    }
    if (rule.length) {
      EXPECT_EQ(prop.value("minItems", -1), *rule.length);
      EXPECT_EQ(prop.value("maxItems", -1), *rule.length);
    }
  }
}

void checkSchemaMatchesTables(const Json &schema,
                              const std::vector<SectionRule> &sections) {
  ASSERT_TRUE(schema.is_object());
  EXPECT_EQ(schema.value("$schema", ""),
            "https://json-schema.org/draft/2020-12/schema");
  std::set<std::string> sectionNames;
  for (const SectionRule &section : sections) {
    checkSection(schema, section);
    sectionNames.insert(std::string(section.name));
  }
  for (auto it = schema["$defs"].begin(); it != schema["$defs"].end(); ++it) {
    if (it.value().value("type", "") == "object") {
      EXPECT_TRUE(sectionNames.count(it.key()))
          << "$defs/" << it.key() << " is an object the parser does not know";
    }
  }
}

TEST(Schema, SpecSchemaMatchesParser) {
  checkSchemaMatchesTables(loadSchema("docs/spec.schema.json"), specSections());
}

TEST(Schema, ModelSchemaMatchesParser) {
  checkSchemaMatchesTables(loadSchema("docs/model.schema.json"),
                           modelSections());
}

//===----------------------------------------------------------------------===//
// A validator for the keywords the schemas use
//===----------------------------------------------------------------------===//

class MiniValidator {
public:
  explicit MiniValidator(Json schema) : root(std::move(schema)) {}

  /// Empty when `value` is valid; else the first violation.
  std::string validate(const Json &value) const {
    return check(root, value, "");
  }

private:
  static bool isInteger(const Json &v) {
    if (v.is_number_integer())
      return true;
    if (!v.is_number_float())
      return false;
    double d = v.get<double>();
    return std::isfinite(d) && std::floor(d) == d;
  }

  static bool hasType(const Json &v, const std::string &type) {
    if (type == "object")
      return v.is_object();
    if (type == "array")
      return v.is_array();
    if (type == "string")
      return v.is_string();
    if (type == "integer")
      return isInteger(v);
    if (type == "number")
      return v.is_number();
    if (type == "boolean")
      return v.is_boolean();
    if (type == "null")
      return v.is_null();
    ADD_FAILURE() << "unknown type " << type;
    return false;
  }

  static size_t codePoints(const std::string &s) {
    size_t n = 0;
    for (unsigned char c : s)
      n += (c & 0xC0) != 0x80;
    return n;
  }

  /// JSON equality where 1 == 1.0, as JSON Schema's const and enum want.
  static bool jsonEqual(const Json &a, const Json &b) {
    if (a.is_number() && b.is_number())
      return a.get<double>() == b.get<double>();
    return a == b;
  }

  std::string check(const Json &schema, const Json &v,
                    const std::string &at) const {
    if (schema.is_boolean())
      return schema.get<bool>() ? "" : at + ": false schema";
    static const std::set<std::string> known = {"$schema",
                                                "$id",
                                                "title",
                                                "description",
                                                "default",
                                                "$comment",
                                                "$defs",
                                                "$ref",
                                                "type",
                                                "properties",
                                                "additionalProperties",
                                                "required",
                                                "enum",
                                                "const",
                                                "items",
                                                "minItems",
                                                "maxItems",
                                                "minimum",
                                                "maximum",
                                                "exclusiveMinimum",
                                                "exclusiveMaximum",
                                                "minLength",
                                                "maxLength",
                                                "pattern",
                                                "allOf",
                                                "if",
                                                "then",
                                                "else"};
    for (auto it = schema.begin(); it != schema.end(); ++it)
      if (!known.count(it.key())) {
        ADD_FAILURE() << "the schemas use keyword " << it.key()
                      << ", which this validator does not implement";
        return at + ": unsupported keyword";
      }
    if (schema.contains("$ref")) {
      std::string r = check(resolve(root, schema), v, at);
      if (!r.empty())
        return r;
    }
    if (schema.contains("type") &&
        !hasType(v, schema["type"].get<std::string>()))
      return at + ": not " + schema["type"].get<std::string>();
    if (schema.contains("const") && !jsonEqual(schema["const"], v))
      return at + ": not the constant";
    if (schema.contains("enum")) {
      bool found = false;
      for (const Json &option : schema["enum"])
        found = found || jsonEqual(option, v);
      if (!found)
        return at + ": not in enum";
    }
    if (v.is_number()) {
      double d = v.get<double>();
      if (schema.contains("minimum") && d < schema["minimum"].get<double>())
        return at + ": below minimum";
      if (schema.contains("maximum") && d > schema["maximum"].get<double>())
        return at + ": above maximum";
      if (schema.contains("exclusiveMinimum") &&
          d <= schema["exclusiveMinimum"].get<double>())
        return at + ": not above exclusiveMinimum";
      if (schema.contains("exclusiveMaximum") &&
          d >= schema["exclusiveMaximum"].get<double>())
        return at + ": not below exclusiveMaximum";
    }
    if (v.is_string()) {
      const std::string &s = v.get_ref<const std::string &>();
      if (schema.contains("minLength") &&
          codePoints(s) < schema["minLength"].get<size_t>())
        return at + ": too short";
      if (schema.contains("maxLength") &&
          codePoints(s) > schema["maxLength"].get<size_t>())
        return at + ": too long";
      if (schema.contains("pattern") &&
          !std::regex_search(s, regexFor(schema["pattern"].get<std::string>())))
        return at + ": does not match pattern";
    }
    if (v.is_array()) {
      if (schema.contains("minItems") &&
          v.size() < schema["minItems"].get<size_t>())
        return at + ": too few items";
      if (schema.contains("maxItems") &&
          v.size() > schema["maxItems"].get<size_t>())
        return at + ": too many items";
      if (schema.contains("items"))
        for (size_t i = 0; i < v.size(); ++i) {
          std::string r =
              check(schema["items"], v[i], at + "/" + std::to_string(i));
          if (!r.empty())
            return r;
        }
    }
    if (v.is_object()) {
      if (schema.contains("required"))
        for (const Json &key : schema["required"])
          if (!v.contains(key.get<std::string>()))
            return at + ": missing " + key.get<std::string>();
      for (auto it = v.begin(); it != v.end(); ++it) {
        std::string child = at + "/" + it.key();
        if (schema.contains("properties") &&
            schema["properties"].contains(it.key())) {
          std::string r =
              check(schema["properties"][it.key()], it.value(), child);
          if (!r.empty())
            return r;
        } else if (schema.contains("additionalProperties")) {
          std::string r =
              check(schema["additionalProperties"], it.value(), child);
          if (!r.empty())
            return r;
        }
      }
    }
    if (schema.contains("allOf"))
      for (const Json &sub : schema["allOf"]) {
        std::string r = check(sub, v, at);
        if (!r.empty())
          return r;
      }
    if (schema.contains("if")) {
      bool holds = check(schema["if"], v, at).empty();
      const char *branch = holds ? "then" : "else";
      if (schema.contains(branch)) {
        std::string r = check(schema[branch], v, at);
        if (!r.empty())
          return r;
      }
    }
    return "";
  }

  const std::regex &regexFor(const std::string &pattern) const {
    auto it = regexes.find(pattern);
    if (it == regexes.end())
      it = regexes.emplace(pattern, std::regex(pattern)).first;
    return it->second;
  }

  Json root;
  mutable std::map<std::string, std::regex> regexes;
};

std::vector<std::string> exampleSpecs() {
  std::vector<std::string> out;
  for (const auto &entry : std::filesystem::directory_iterator(
           testutil::sourcePath("examples/specs")))
    if (entry.path().extension() == ".json")
      out.push_back(entry.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(Schema, ExamplesValidate) {
  MiniValidator specs(loadSchema("docs/spec.schema.json"));
  MiniValidator models(loadSchema("docs/model.schema.json"));
  for (const std::string &path : exampleSpecs()) {
    Json doc = Json::parse(testutil::readText(path));
    EXPECT_EQ(specs.validate(doc), "") << path;
  }
  Json model = Json::parse(
      testutil::readText(testutil::sourcePath("examples/models/tiny.json")));
  EXPECT_EQ(models.validate(model), "");
  for (const TransformerConfig &config : presetConfigs())
    EXPECT_EQ(
        models.validate(Json::parse(modelToJson(buildTransformer(config)))), "")
        << config.name;
}

/// Random single edits of `doc`; whenever the schema rejects the result, the
/// parser must reject it too. Returns how many the schema rejected.
template <typename Parse>
int schemaRejectionsAreParserRejections(const MiniValidator &schema,
                                        const Json &doc, Parse parse,
                                        std::mt19937 &rng, int iterations) {
  static const std::vector<Json> values = {
      nullptr,
      true,
      false,
      0,
      1,
      -1,
      2,
      0.5,
      1.0,
      1.5,
      1e300,
      "",
      "x",
      "a-b",
      "tp",
      "fsdp",
      "colwise",
      "rowwise",
      "float32",
      "bfloat16",
      "linear",
      "attention",
      "weight",
      "layers.*",
      "7",
      Json::array(),
      Json::object(),
      Json::array({"x"}),
      Json::array({1}),
      Json::array({0.5, 0.5, 0.5}),
      static_cast<uint64_t>(18446744073709551615ull)};
  static const std::vector<std::string> keys = {
      "bogus",   "name",     "size",       "kind",    "style",
      "n_heads", "children", "parameters", "enabled", "seed"};
  std::vector<std::string> pointers;
  testutil::collectPointers(doc, "", pointers);
  int rejected = 0;
  for (int iter = 0; iter < iterations; ++iter) {
    Json mutated = doc;
    const std::string &where = pointers[rng() % pointers.size()];
    Json::json_pointer ptr(where);
    switch (rng() % 3) {
    case 0:
      if (!where.empty()) {
        Json &parent = mutated[ptr.parent_pointer()];
        if (parent.is_object())
          parent.erase(ptr.back());
        else
          parent.erase(std::stoul(ptr.back()));
      }
      break;
    case 1:
      mutated[ptr] = values[rng() % values.size()];
      break;
    case 2:
      if (mutated[ptr].is_object())
        mutated[ptr][keys[rng() % keys.size()]] = values[rng() % values.size()];
      else if (mutated[ptr].is_array())
        mutated[ptr].push_back(values[rng() % values.size()]);
      break;
    }
    std::string violation = schema.validate(mutated);
    if (violation.empty())
      continue;
    ++rejected;
    auto result = parse(mutated.dump());
    EXPECT_FALSE(result.ok())
        << "the schema rejects (" << violation << ") but the parser accepts:\n"
        << mutated.dump(2);
  }
  return rejected;
}

TEST(Schema, ParserRejectsWhatTheSchemaRejects) {
  std::mt19937 rng(99);
  MiniValidator specs(loadSchema("docs/spec.schema.json"));
  int rejected = 0;
  for (const std::string &path : exampleSpecs()) {
    Json doc = Json::parse(testutil::readText(path));
    rejected += schemaRejectionsAreParserRejections(
        specs, doc, [](const std::string &text) { return parseSpec(text); },
        rng, 150);
  }
  EXPECT_GT(rejected, 300);

  MiniValidator models(loadSchema("docs/model.schema.json"));
  Json tiny = Json::parse(modelToJson(*presetModel("tiny")));
  EXPECT_GT(schemaRejectionsAreParserRejections(
                models, tiny,
                [](const std::string &text) { return parseModel(text); }, rng,
                600),
            200);
}

TEST(Schema, ParserRejectsWhatTheSchemaRejectsInPipelineSpecs) {
  // No example spec has pipeline_parallel (every example is planned, and the
  // planner does not plan pipelines yet), so these cover the section.
  const char *texts[] = {
      R"({"model": "tiny",
          "mesh": {"axes": [{"name": "dp", "size": 2}, {"name": "pp", "size": 2}]},
          "data_parallel": {"shard_axes": ["dp"]},
          "pipeline_parallel": {"axis": "pp", "schedule": "1f1b", "microbatches": 4,
                                "stages_per_rank": 1,
                                "split": [["tok_embeddings", "layers.0"],
                                          ["layers.1", "norm", "output"]]}})",
      R"({"model": "llama3-8b",
          "mesh": {"axes": [{"name": "pp", "size": 4}, {"name": "tp", "size": 2}]},
          "tensor_parallel": {"axis": "tp", "plan": [
            {"pattern": "layers.*.attention.wq", "style": "colwise"}]},
          "pipeline_parallel": {"axis": "pp", "schedule": "zbv", "microbatches": 8,
                                "split": "torchtitan"}})",
  };
  std::mt19937 rng(16);
  MiniValidator specs(loadSchema("docs/spec.schema.json"));
  int rejected = 0;
  for (const char *text : texts) {
    Json doc = Json::parse(text);
    EXPECT_EQ(specs.validate(doc), "");
    EXPECT_TRUE(parseSpec(text).ok());
    rejected += schemaRejectionsAreParserRejections(
        specs, doc, [](const std::string &t) { return parseSpec(t); }, rng,
        400);
  }
  EXPECT_GT(rejected, 150);
}

} // namespace

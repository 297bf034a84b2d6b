//===- Model.cpp - A model as a tree of modules with parameters -----------===//

#include "meshplan/Frontend/Model.h"
#include "meshplan/Core/Layout.h"

#include "meshplan/Frontend/Schema.h"
#include "meshplan/Support/Json.h"

#include <algorithm>
#include <map>

namespace meshplan::frontend {

using namespace meshplan::json;

//===----------------------------------------------------------------------===//
// Enums
//===----------------------------------------------------------------------===//

std::string_view dtypeName(DType dtype) {
  return kDTypeNames[static_cast<int>(dtype)];
}

std::optional<DType> parseDType(std::string_view name) {
  for (size_t i = 0; i < kDTypeNames.size(); ++i)
    if (kDTypeNames[i] == name)
      return static_cast<DType>(i);
  return std::nullopt;
}

int64_t dtypeBytes(DType dtype) { return dtype == DType::Float32 ? 4 : 2; }

std::string_view moduleKindName(ModuleKind kind) {
  return kModuleKindNames[static_cast<int>(kind)];
}

std::optional<ModuleKind> parseModuleKind(std::string_view name) {
  for (size_t i = 0; i < kModuleKindNames.size(); ++i)
    if (kModuleKindNames[i] == name)
      return static_cast<ModuleKind>(i);
  return std::nullopt;
}

bool isLeafKind(ModuleKind kind) {
  switch (kind) {
  case ModuleKind::Embedding:
  case ModuleKind::Linear:
  case ModuleKind::Norm:
  case ModuleKind::Output:
    return true;
  case ModuleKind::Attention:
  case ModuleKind::FeedForward:
  case ModuleKind::Block:
    return false;
  }
  return false;
}

//===----------------------------------------------------------------------===//
// Structure
//===----------------------------------------------------------------------===//

int64_t Parameter::numElements() const {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

const Parameter *Module::findParam(std::string_view local) const {
  for (const Parameter &p : params)
    if (p.name == local)
      return &p;
  return nullptr;
}

static void
visit(const Module &module, const std::string &prefix,
      const std::function<void(const std::string &, const Module &)> &fn) {
  std::string path = prefix.empty() ? module.name : prefix + "." + module.name;
  fn(path, module);
  for (const Module &child : module.children)
    visit(child, path, fn);
}

void forEachModule(
    const Model &model,
    const std::function<void(const std::string &, const Module &)> &fn) {
  for (const Module &module : model.modules)
    visit(module, "", fn);
}

static void flattenInto(const Module &module, const std::string &prefix,
                        int parent, std::vector<ModuleEntry> &out) {
  std::string path = prefix.empty() ? module.name : prefix + "." + module.name;
  int index = static_cast<int>(out.size());
  out.push_back({path, &module, parent});
  for (const Module &child : module.children)
    flattenInto(child, path, index, out);
}

std::vector<ModuleEntry> flattenModules(const Model &model) {
  std::vector<ModuleEntry> out;
  for (const Module &module : model.modules)
    flattenInto(module, "", -1, out);
  return out;
}

int64_t countParameters(const Model &model) {
  int64_t total = 0;
  forEachModule(model, [&](const std::string &, const Module &module) {
    for (const Parameter &p : module.params)
      total += p.numElements();
  });
  return total;
}

//===----------------------------------------------------------------------===//
// Patterns
//===----------------------------------------------------------------------===//

bool globMatch(std::string_view pattern, std::string_view name) {
  if (pattern.find_first_of("*?") == std::string_view::npos)
    return pattern == name;
  // Dynamic programming over (pattern position, name prefix): linear in
  // |pattern| * |name|, no backtracking blow-up on patterns like "*a*a*a*b".
  const size_t n = name.size();
  std::vector<char> cur(n + 1, 0), next(n + 1, 0);
  cur[0] = 1;
  for (size_t p = 0; p < pattern.size(); ++p) {
    char c = pattern[p];
    std::fill(next.begin(), next.end(), 0);
    if (c == '*') {
      bool doubleStar = p + 1 < pattern.size() && pattern[p + 1] == '*';
      if (doubleStar)
        ++p;
      for (size_t j = 0; j <= n; ++j) {
        next[j] = cur[j];
        if (!next[j] && j > 0 && next[j - 1] &&
            (doubleStar || name[j - 1] != '.'))
          next[j] = 1;
      }
    } else {
      for (size_t j = 1; j <= n; ++j) {
        char x = name[j - 1];
        next[j] = cur[j - 1] && (c == '?' ? x != '.' : x == c);
      }
    }
    std::swap(cur, next);
  }
  return cur[n];
}

Result<void> checkPattern(std::string_view pattern) {
  if (pattern.empty())
    return makeError("empty pattern; expected a module or parameter name, "
                     "optionally with * ** ?");
  if (pattern.size() > 256)
    return makeError("pattern longer than 256 characters");
  for (char c : pattern) {
    bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '_' ||
              c == '.' || c == '*' || c == '?';
    if (!ok) {
      std::string shown = (static_cast<unsigned char>(c) < 0x20 ||
                           static_cast<unsigned char>(c) >= 0x7f)
                              ? "a non-printable or non-ASCII character"
                              : std::string("'") + c + "'";
      return makeError("invalid character " + shown + " in pattern " +
                       quote(pattern) +
                       "; expected letters, digits, '_', '.', '*', '?'");
    }
  }
  return {};
}

std::vector<int> matchModules(const std::vector<ModuleEntry> &modules,
                              std::string_view pattern) {
  std::vector<int> out;
  std::string full;
  for (size_t i = 0; i < modules.size(); ++i) {
    const ModuleEntry &entry = modules[i];
    bool hit = globMatch(pattern, entry.path);
    for (size_t k = 0; !hit && k < entry.module->params.size(); ++k) {
      full = entry.path + "." + entry.module->params[k].name;
      hit = globMatch(pattern, full);
    }
    if (hit)
      out.push_back(static_cast<int>(i));
  }
  return out;
}

//===----------------------------------------------------------------------===//
// Parsing
//===----------------------------------------------------------------------===//

static const SectionRule &section(std::string_view name) {
  return findSection(modelSections(), name);
}

static std::string shapeString(const std::vector<int64_t> &shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

static Result<Parameter> parseParameter(const Json &value,
                                        const std::string &ptr) {
  MESHPLAN_TRY(checkObject(value, ptr, section("parameter")));
  Parameter param;
  std::string namePtr = childPointer(ptr, "name");
  auto name = readString(*member(value, "name"), namePtr);
  MESHPLAN_TRY(name);
  if (!isIdentifier(*name))
    return errorAt(namePtr, "invalid parameter name " + quote(*name) +
                                "; expected letters, digits and '_', not "
                                "starting with a digit");
  param.name = *name;
  std::string shapePtr = childPointer(ptr, "shape");
  auto shape =
      readIntArray(*member(value, "shape"), shapePtr, 1, kMaxTensorElements);
  MESHPLAN_TRY(shape);
  if (shape->empty())
    return errorAt(shapePtr, "expected at least one dim");
  if (auto ok = checkShape(*shape); !ok)
    return errorAt(shapePtr, ok.error().message);
  param.shape = *shape;
  if (const Json *dtype = member(value, "dtype"))
    param.dtype = *parseDType(dtype->get_ref<const std::string &>());
  return param;
}

/// The parameters each leaf kind has: (name, rank, required).
struct ParamSlot {
  std::string_view name;
  size_t rank;
  bool required;
  std::string_view shapeDoc;
};

static std::vector<ParamSlot> paramSlots(ModuleKind kind) {
  switch (kind) {
  case ModuleKind::Linear:
  case ModuleKind::Output:
    return {{"weight", 2, true, "[out_features, in_features]"},
            {"bias", 1, false, "[out_features]"}};
  case ModuleKind::Embedding:
    return {{"weight", 2, true, "[num_embeddings, embedding_dim]"}};
  case ModuleKind::Norm:
    return {{"weight", 1, true, "[dim]"}, {"bias", 1, false, "[dim]"}};
  default:
    return {};
  }
}

/// "an embedding", "a linear": for messages.
static std::string withArticle(ModuleKind kind) {
  std::string name(moduleKindName(kind));
  bool vowel = std::string_view("aeiou").find(name[0]) != std::string::npos;
  return (vowel ? "an " : "a ") + name;
}

static Result<void> checkLeafParams(const Module &module,
                                    const std::string &ptr) {
  std::string kind(moduleKindName(module.kind));
  std::string aKind = withArticle(module.kind);
  std::vector<ParamSlot> slots = paramSlots(module.kind);
  std::string allowed;
  for (const ParamSlot &slot : slots)
    allowed += (allowed.empty() ? "" : ", ") + std::string(slot.name);
  std::string paramsPtr = childPointer(ptr, "parameters");
  for (size_t i = 0; i < module.params.size(); ++i) {
    const Parameter &p = module.params[i];
    std::string pPtr = childPointer(paramsPtr, i);
    auto slot =
        std::find_if(slots.begin(), slots.end(),
                     [&](const ParamSlot &s) { return s.name == p.name; });
    if (slot == slots.end())
      return errorAt(childPointer(pPtr, "name"),
                     "unknown parameter " + quote(p.name) + " of " + aKind +
                         " module; expected one of " + allowed);
    if (p.shape.size() != slot->rank)
      return errorAt(childPointer(pPtr, "shape"),
                     "expected " + std::to_string(slot->rank) +
                         (slot->rank == 1 ? " dim" : " dims") + " for " +
                         aKind + " " + std::string(slot->name) + " " +
                         std::string(slot->shapeDoc) + ", got " +
                         shapeString(p.shape));
  }
  for (const ParamSlot &slot : slots) {
    if (slot.required && !module.findParam(slot.name))
      return errorAt(paramsPtr, aKind + " module needs a " + quote(slot.name) +
                                    " parameter " + std::string(slot.shapeDoc));
  }
  const Parameter *weight = module.findParam("weight");
  const Parameter *bias = module.findParam("bias");
  if (weight && bias && bias->shape[0] != weight->shape[0]) {
    size_t index = static_cast<size_t>(bias - module.params.data());
    return errorAt(childPointer(childPointer(paramsPtr, index), "shape"),
                   "bias " + shapeString(bias->shape) +
                       " does not match weight " + shapeString(weight->shape) +
                       " (expected [" + std::to_string(weight->shape[0]) +
                       "])");
  }
  return {};
}

static Result<Module> parseModule(const Json &value, const std::string &ptr);

/// Parses an array of modules with unique names.
static Result<std::vector<Module>> parseModules(const Json &value,
                                                const std::string &ptr) {
  std::vector<Module> out;
  std::map<std::string, size_t> seen;
  for (size_t i = 0; i < value.size(); ++i) {
    std::string childPtr = childPointer(ptr, i);
    auto module = parseModule(value[i], childPtr);
    MESHPLAN_TRY(module);
    auto [it, inserted] = seen.emplace(module->name, i);
    if (!inserted)
      return errorAt(childPointer(childPtr, "name"),
                     "duplicate module name " + quote(module->name) +
                         " (also at " + childPointer(ptr, it->second) + ")");
    out.push_back(std::move(*module));
  }
  return out;
}

static Result<Module> parseModule(const Json &value, const std::string &ptr) {
  MESHPLAN_TRY(checkObject(value, ptr, section("module")));
  Module module;
  std::string namePtr = childPointer(ptr, "name");
  const std::string &name =
      member(value, "name")->get_ref<const std::string &>();
  bool digits =
      !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
        return std::isdigit(static_cast<unsigned char>(c));
      });
  if (!isIdentifier(name) && !digits)
    return errorAt(namePtr,
                   "invalid module name " + quote(name) +
                       "; expected one path segment: letters, digits and "
                       "'_' not starting with a digit, or a layer number");
  module.name = name;
  module.kind =
      *parseModuleKind(member(value, "kind")->get_ref<const std::string &>());
  std::string kind(moduleKindName(module.kind));
  std::string aKind = withArticle(module.kind);

  const Json *params = member(value, "parameters");
  const Json *children = member(value, "children");
  std::string paramsPtr = childPointer(ptr, "parameters");
  std::string childrenPtr = childPointer(ptr, "children");
  if (isLeafKind(module.kind)) {
    if (children)
      return errorAt(childrenPtr,
                     aKind +
                         " module has no children; only block, attention and "
                         "feed_forward modules do");
    if (params) {
      for (size_t i = 0; i < params->size(); ++i) {
        auto p = parseParameter((*params)[i], childPointer(paramsPtr, i));
        MESHPLAN_TRY(p);
        module.params.push_back(std::move(*p));
      }
    }
    MESHPLAN_TRY(checkLeafParams(module, ptr));
  } else {
    if (params)
      return errorAt(paramsPtr, aKind + " module has no parameters of its own; "
                                        "put them in a child module");
    if (!children || children->empty())
      return errorAt(childrenPtr,
                     aKind + " module needs at least one child module");
    auto parsed = parseModules(*children, childrenPtr);
    MESHPLAN_TRY(parsed);
    module.children = std::move(*parsed);
  }

  const Json *heads = member(value, "n_heads");
  const Json *kvHeads = member(value, "n_kv_heads");
  if (module.kind == ModuleKind::Attention) {
    if (!heads)
      return errorAt(childPointer(ptr, "n_heads"),
                     "missing required key for an attention module; "
                     "expected an integer");
    if (!kvHeads)
      return errorAt(childPointer(ptr, "n_kv_heads"),
                     "missing required key for an attention module; "
                     "expected an integer");
    auto h = readInt(*heads, childPointer(ptr, "n_heads"), 1, 1 << 20);
    MESHPLAN_TRY(h);
    auto kv = readInt(*kvHeads, childPointer(ptr, "n_kv_heads"), 1, 1 << 20);
    MESHPLAN_TRY(kv);
    if (*h % *kv != 0)
      return errorAt(childPointer(ptr, "n_kv_heads"),
                     "n_kv_heads " + std::to_string(*kv) +
                         " does not divide n_heads " + std::to_string(*h));
    module.nHeads = *h;
    module.nKvHeads = *kv;
  } else {
    if (heads)
      return errorAt(childPointer(ptr, "n_heads"),
                     "only attention modules have n_heads; this is " + aKind +
                         " module");
    if (kvHeads)
      return errorAt(childPointer(ptr, "n_kv_heads"),
                     "only attention modules have n_kv_heads; this is " +
                         aKind + " module");
  }
  return module;
}

Result<Model> parseModel(std::string_view jsonText) {
  auto doc = parseJson(jsonText);
  MESHPLAN_TRY(doc);
  MESHPLAN_TRY(checkObject(*doc, "", section("")));
  Model model;
  model.name = member(*doc, "name")->get<std::string>();
  if (model.name.empty())
    return errorAt("/name", "expected a non-empty model name");
  const Json &modules = *member(*doc, "modules");
  if (modules.empty())
    return errorAt("/modules", "expected at least one module");
  auto parsed = parseModules(modules, "/modules");
  MESHPLAN_TRY(parsed);
  model.modules = std::move(*parsed);
  return model;
}

Result<Model> loadModelFile(const std::string &path) {
  auto text = readFile(path);
  MESHPLAN_TRY(text);
  auto model = parseModel(*text);
  if (!model)
    return model.error().within(path);
  return model;
}

//===----------------------------------------------------------------------===//
// Printing
//===----------------------------------------------------------------------===//

static Json moduleToJson(const Module &module) {
  Json out = Json::object();
  out["name"] = module.name;
  out["kind"] = std::string(moduleKindName(module.kind));
  if (module.kind == ModuleKind::Attention) {
    out["n_heads"] = module.nHeads;
    out["n_kv_heads"] = module.nKvHeads;
  }
  if (isLeafKind(module.kind)) {
    Json params = Json::array();
    for (const Parameter &p : module.params) {
      Json param = Json::object();
      param["name"] = p.name;
      param["shape"] = p.shape;
      param["dtype"] = std::string(dtypeName(p.dtype));
      params.push_back(std::move(param));
    }
    out["parameters"] = std::move(params);
  } else {
    Json children = Json::array();
    for (const Module &child : module.children)
      children.push_back(moduleToJson(child));
    out["children"] = std::move(children);
  }
  return out;
}

std::string modelToJson(const Model &model, int indent) {
  Json out = Json::object();
  out["name"] = model.name;
  Json modules = Json::array();
  for (const Module &module : model.modules)
    modules.push_back(moduleToJson(module));
  out["modules"] = std::move(modules);
  return out.dump(indent, ' ', false, Json::error_handler_t::replace) + "\n";
}

} // namespace meshplan::frontend

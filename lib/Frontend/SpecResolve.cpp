//===- SpecResolve.cpp - A parallelism spec checked against its model -----===//
//
// resolveSpec (Spec.h): tensor-parallel patterns and styles against the
// model's modules, float8 selection, FSDP units, optimizer.no_decay, and the
// pipeline's stages (the explicit, torchtitan and auto splits). Reading the
// document itself (parseSpec) is in Spec.cpp.
//
//===----------------------------------------------------------------------===//

#include "meshplan/Frontend/Spec.h"

#include "meshplan/Support/Json.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

namespace meshplan::frontend {

using namespace meshplan::json;

static std::string shapeString(const std::vector<int64_t> &shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

//===----------------------------------------------------------------------===//
// resolveSpec: checks against the model
//===----------------------------------------------------------------------===//

/// Module paths with layer numbers replaced by "*": the vocabulary for
/// "did you mean" on patterns.
static std::vector<std::string>
generalizedPaths(const std::vector<ModuleEntry> &modules) {
  std::set<std::string> seen;
  std::vector<std::string> out;
  for (const ModuleEntry &entry : modules) {
    std::string path, segment;
    auto flush = [&]() {
      bool digits = !segment.empty() &&
                    std::all_of(segment.begin(), segment.end(), [](char c) {
                      return std::isdigit(static_cast<unsigned char>(c));
                    });
      path += digits ? "*" : segment;
      segment.clear();
    };
    for (char c : entry.path) {
      if (c == '.') {
        flush();
        path += '.';
      } else {
        segment += c;
      }
    }
    flush();
    if (seen.insert(path).second)
      out.push_back(path);
  }
  return out;
}

static Error noMatch(const std::string &pointer, const std::string &pattern,
                     const Model &model,
                     const std::vector<ModuleEntry> &modules) {
  std::vector<std::string> paths = generalizedPaths(modules);
  std::vector<std::string_view> candidates(paths.begin(), paths.end());
  std::string hint = didYouMean(pattern, candidates);
  if (hint.empty() && !paths.empty()) {
    // Show what names look like: the first few generalized paths.
    std::vector<std::string_view> some(
        candidates.begin(),
        candidates.begin() + std::min<size_t>(candidates.size(), 6));
    hint = "; module names look like " + joinNames(some);
  }
  return errorAt(pointer, "pattern " + quote(pattern) +
                              " matches no module or parameter of model " +
                              quote(model.name) + hint);
}

/// The weight dim a TP style splits for a module kind, or nullopt if the
/// style does not apply to it.
static std::optional<int> tpDimFor(TPStyle style, ModuleKind kind) {
  switch (style) {
  case TPStyle::Colwise:
    if (kind == ModuleKind::Linear || kind == ModuleKind::Output)
      return 0;
    if (kind == ModuleKind::Embedding)
      return 1;
    return std::nullopt;
  case TPStyle::Rowwise:
    if (kind == ModuleKind::Linear || kind == ModuleKind::Output)
      return 1;
    if (kind == ModuleKind::Embedding)
      return 0;
    return std::nullopt;
  case TPStyle::SequenceParallel:
    if (kind == ModuleKind::Norm)
      return -1; // weight stays replicated; activations are split
    return std::nullopt;
  }
  return std::nullopt;
}

static std::string_view styleTargets(TPStyle style) {
  return style == TPStyle::SequenceParallel
             ? "norm modules"
             : "linear, output and embedding modules";
}

namespace {
struct Resolver {
  const Spec &spec;
  const Model &model;
  const std::vector<ModuleEntry> &modules;
  std::vector<ModuleAssignment> &assignments;

  int64_t axisSize(const std::string &name) const {
    for (const MeshAxis &axis : spec.mesh.axes)
      if (axis.name == name)
        return axis.size;
    return 1;
  }

  /// The nearest attention module enclosing module i, or -1.
  int attentionOf(int i) const {
    for (int p = modules[i].parent; p >= 0; p = modules[p].parent)
      if (modules[p].module->kind == ModuleKind::Attention)
        return p;
    return -1;
  }

  Result<void> resolveTensorParallel() {
    if (!spec.tensorParallel)
      return {};
    const TensorParallelSpec &tp = *spec.tensorParallel;
    const int64_t size = axisSize(tp.axis);
    const std::string where =
        " over " + quote(tp.axis) + " (size " + std::to_string(size) + ")";
    for (size_t r = 0; r < tp.plan.size(); ++r) {
      const TPRule &rule = tp.plan[r];
      std::string rulePtr = childPointer("/tensor_parallel/plan", r);
      std::string patternPtr = childPointer(rulePtr, "pattern");
      std::string stylePtr = childPointer(rulePtr, "style");
      std::vector<int> hits = matchModules(modules, rule.pattern);
      if (hits.empty())
        return noMatch(patternPtr, rule.pattern, model, modules);
      for (int i : hits) {
        const Module &m = *modules[i].module;
        const std::string &path = modules[i].path;
        std::optional<int> dim = tpDimFor(rule.style, m.kind);
        if (!dim)
          return errorAt(stylePtr,
                         std::string(tpStyleName(rule.style)) + " applies to " +
                             std::string(styleTargets(rule.style)) +
                             ", but pattern " + quote(rule.pattern) +
                             " selects " + std::string(moduleKindName(m.kind)) +
                             " module " + quote(path));
        ModuleAssignment &a = assignments[i];
        if (a.tpStyle)
          return errorAt(patternPtr,
                         "module " + quote(path) +
                             " is already planned by /tensor_parallel/plan/" +
                             std::to_string(a.tpRule) + " (" +
                             std::string(tpStyleName(*a.tpStyle)) + ")");
        a.tpStyle = rule.style;
        a.tpRule = static_cast<int>(r);
        if (*dim < 0)
          continue;
        for (const Parameter &p : m.params) {
          // Colwise splits the bias with the output features; rowwise
          // leaves it replicated (it is added after the reduction).
          int d = p.shape.size() == 1 ? (*dim == 0 ? 0 : -1) : *dim;
          if (d < 0 || d >= static_cast<int>(p.shape.size()))
            continue;
          if (p.shape[d] % size != 0)
            return errorAt(rulePtr,
                           std::string(tpStyleName(rule.style)) + where +
                               " splits dim " + std::to_string(d) + " of " +
                               quote(path + "." + p.name) + " (shape " +
                               shapeString(p.shape) + "), but " +
                               std::to_string(size) + " does not divide " +
                               std::to_string(p.shape[d]));
        }
      }
    }
    // Splitting an attention's projections splits its heads.
    for (size_t i = 0; i < modules.size(); ++i) {
      const ModuleAssignment &a = assignments[i];
      if (!a.tpStyle || *a.tpStyle == TPStyle::SequenceParallel)
        continue;
      int att = attentionOf(static_cast<int>(i));
      if (att < 0)
        continue;
      const Module &attention = *modules[att].module;
      for (auto [count, what] : {std::pair{attention.nHeads, "n_heads"},
                                 std::pair{attention.nKvHeads, "n_kv_heads"}}) {
        if (count % size != 0)
          return errorAt(childPointer("/tensor_parallel/plan", a.tpRule),
                         std::string(tpStyleName(*a.tpStyle)) + where + " on " +
                             quote(modules[i].path) + " splits the heads of " +
                             quote(modules[att].path) + ", but " +
                             std::to_string(size) + " does not divide its " +
                             what + " " + std::to_string(count));
      }
    }
    return {};
  }

  Result<void> resolveFloat8() {
    if (!spec.float8 || !spec.float8->enabled)
      return {};
    const Float8Spec &f8 = *spec.float8;
    std::vector<int> origin(modules.size(), -2); // -2: not selected
    if (f8.modules.empty()) {
      for (size_t i = 0; i < modules.size(); ++i)
        if (modules[i].module->kind == ModuleKind::Linear)
          origin[i] = -1;
    }
    for (size_t k = 0; k < f8.modules.size(); ++k) {
      std::string ptr = childPointer("/float8/modules", k);
      std::vector<int> hits = matchModules(modules, f8.modules[k]);
      if (hits.empty())
        return noMatch(ptr, f8.modules[k], model, modules);
      // A pattern selects the linear modules among its matches (as
      // torchao's module filter only ever sees nn.Linear); one that
      // selects no linear module asks for float8 on other weights.
      bool anyLinear = false;
      for (int i : hits) {
        if (modules[i].module->kind != ModuleKind::Linear)
          continue;
        anyLinear = true;
        if (origin[i] == -2)
          origin[i] = static_cast<int>(k);
      }
      if (!anyLinear) {
        const ModuleEntry &first = modules[hits.front()];
        ModuleKind kind = first.module->kind;
        return errorAt(ptr, "pattern " + quote(f8.modules[k]) + " selects " +
                                std::string(moduleKindName(kind)) + " module " +
                                quote(first.path) +
                                (hits.size() > 1 ? " and no linear module"
                                                 : std::string()) +
                                "; float8 applies to linear modules only" +
                                (kind == ModuleKind::Output
                                     ? " (the output projection stays in high "
                                       "precision, as in torchtitan)"
                                     : ""));
      }
    }
    for (size_t k = 0; k < f8.exclude.size(); ++k) {
      std::string ptr = childPointer("/float8/exclude", k);
      std::vector<int> hits = matchModules(modules, f8.exclude[k]);
      if (hits.empty())
        return noMatch(ptr, f8.exclude[k], model, modules);
      for (int i : hits)
        origin[i] = -2;
    }
    const int64_t tpSize =
        spec.tensorParallel ? axisSize(spec.tensorParallel->axis) : 1;
    bool any = false;
    for (size_t i = 0; i < modules.size(); ++i) {
      if (origin[i] == -2)
        continue;
      any = true;
      assignments[i].float8 = true;
      // torch._scaled_mm needs both dims of each rank's weight divisible by
      // 16.
      const Parameter *w = modules[i].module->findParam("weight");
      if (!w || w->shape.size() != 2)
        continue; // parseModel guarantees a 2-D weight; built models may not
      std::vector<int64_t> local = w->shape;
      const ModuleAssignment &a = assignments[i];
      if (a.tpStyle == TPStyle::Colwise)
        local[0] /= tpSize;
      else if (a.tpStyle == TPStyle::Rowwise)
        local[1] /= tpSize;
      if (local[0] % 16 != 0 || local[1] % 16 != 0) {
        std::string ptr = origin[i] >= 0
                              ? childPointer("/float8/modules", origin[i])
                              : std::string("/float8");
        std::string perRank =
            local != w->shape
                ? " (per tensor-parallel rank " + shapeString(local) + ")"
                : "";
        return errorAt(ptr, "linear " + quote(modules[i].path) +
                                " has weight shape " + shapeString(w->shape) +
                                perRank +
                                "; float8 matmuls need both dims divisible "
                                "by 16 (exclude it with \"exclude\")");
      }
    }
    if (!any)
      return errorAt("/float8", "float8 selects no linear module of model " +
                                    quote(model.name));
    return {};
  }
};
} // namespace

/// Whether a unit pattern selects parameter `p`: the pattern matches the
/// parameter's full name, its module's path or an ancestor's path (a unit
/// takes whole subtrees).
static bool unitPatternSelects(const std::string &pattern,
                               const ResolvedSpec &out,
                               const ParamAssignment &param) {
  if (globMatch(pattern, param.name))
    return true;
  for (int m = param.module; m >= 0; m = out.modules[m].parent)
    if (globMatch(pattern, out.modules[m].path))
      return true;
  return false;
}

/// A container whose children are all containers ("layers", holding the
/// transformer blocks): FSDP units and pipeline stages take its children
/// one by one rather than the whole.
static bool isContainerOfBlocks(const Module &m) {
  bool all = !m.children.empty();
  for (const Module &child : m.children)
    all &= !isLeafKind(child.kind);
  return all;
}

/// The FSDP units of `out` (see UnitAssignment and docs/semantics.md "FSDP
/// units").
static Result<void> resolveUnits(ResolvedSpec &out) {
  const DataParallelSpec &dp = out.spec.dataParallel;
  const std::vector<ModuleEntry> &modules = out.modules;
  std::vector<int> unitOf(out.params.size(), -1);
  std::vector<UnitAssignment> units;
  // The top-level ancestor of module i.
  auto topOf = [&](int i) {
    while (modules[i].parent >= 0)
      i = modules[i].parent;
    return i;
  };
  // A top-level container of containers ("layers") contributes each child.
  auto splits = [&](int top) {
    return isContainerOfBlocks(*modules[top].module);
  };
  // The child of top-level module `top` that holds module i.
  auto childOf = [&](int i, int top) {
    while (modules[i].parent != top)
      i = modules[i].parent;
    return i;
  };
  auto unitNamed = [&](const std::string &name) {
    for (size_t u = 0; u < units.size(); ++u)
      if (units[u].name == name)
        return static_cast<int>(u);
    units.push_back({name, {}, true, false});
    return static_cast<int>(units.size() - 1);
  };
  if (dp.units != UnitGrouping::Explicit) {
    bool titan = dp.units == UnitGrouping::Torchtitan;
    bool normOutput = false;
    if (titan) {
      bool norm = false, output = false;
      for (const ModuleEntry &entry : modules) {
        norm |= entry.parent < 0 && entry.path == "norm";
        output |= entry.parent < 0 && entry.path == "output";
      }
      normOutput = norm && output;
    }
    for (size_t p = 0; p < out.params.size(); ++p) {
      int top = topOf(out.params[p].module);
      const std::string &path = modules[top].path;
      std::string name;
      if (splits(top))
        name = modules[childOf(out.params[p].module, top)].path;
      else if (!titan || path == "tok_embeddings")
        name = path;
      else if (normOutput && (path == "norm" || path == "output"))
        name = "norm+output";
      else
        name = "root";
      unitOf[p] = unitNamed(name);
      units[unitOf[p]].root = titan && name == "root";
    }
  } else {
    const std::string unitsPtr = "/data_parallel/units";
    std::vector<std::string> unitPtrs;
    for (size_t u = 0; u < dp.unitPatterns.size(); ++u) {
      std::string unitPtr = childPointer(unitsPtr, u);
      std::string name;
      for (const std::string &pattern : dp.unitPatterns[u])
        name += (name.empty() ? "" : "+") + pattern;
      units.push_back({name, {}, true, false});
      for (size_t k = 0; k < dp.unitPatterns[u].size(); ++k) {
        const std::string &pattern = dp.unitPatterns[u][k];
        std::string ptr = childPointer(unitPtr, k);
        bool any = false;
        for (size_t p = 0; p < out.params.size(); ++p) {
          if (!unitPatternSelects(pattern, out, out.params[p]))
            continue;
          any = true;
          if (unitOf[p] == static_cast<int>(u))
            continue;
          if (unitOf[p] >= 0)
            return errorAt(ptr, "pattern " + quote(pattern) +
                                    " puts parameter " +
                                    quote(out.params[p].name) +
                                    " in a second unit; it is already in " +
                                    childPointer(unitsPtr, unitOf[p]) +
                                    "; every parameter belongs to exactly "
                                    "one unit");
          unitOf[p] = static_cast<int>(u);
        }
        if (!any)
          return noMatch(ptr, pattern, *out.model, modules);
      }
    }
    for (size_t p = 0; p < out.params.size(); ++p)
      if (unitOf[p] < 0)
        return errorAt(unitsPtr,
                       "parameter " + quote(out.params[p].name) +
                           " is in no unit; every parameter belongs to "
                           "exactly one unit (add a pattern for it, e.g. " +
                           quote(modules[topOf(out.params[p].module)].path) +
                           ")");
  }
  for (size_t p = 0; p < out.params.size(); ++p)
    units[unitOf[p]].params.push_back(static_cast<int>(p));
  // Forward order of each unit's first parameter.
  std::stable_sort(units.begin(), units.end(),
                   [](const UnitAssignment &a, const UnitAssignment &b) {
                     return a.params.front() < b.params.front();
                   });
  for (size_t u = 0; u < units.size(); ++u) {
    UnitAssignment &unit = units[u];
    switch (dp.reshardAfterForward) {
    case ReshardPolicy::Always:
      unit.reshardAfterForward = true;
      break;
    case ReshardPolicy::Never:
      unit.reshardAfterForward = false;
      break;
    case ReshardPolicy::Default:
      // torchtitan: every block, not [norm, output]; without that unit,
      // the last one (whose backward follows its forward at once).
      unit.reshardAfterForward =
          dp.units == UnitGrouping::Torchtitan &&
                  std::any_of(units.begin(), units.end(),
                              [](const UnitAssignment &x) {
                                return x.name == "norm+output";
                              })
              ? unit.name != "norm+output"
              : u + 1 != units.size();
      break;
    }
    // FSDP2 keeps the root module's parameters gathered after forward.
    if (unit.root)
      unit.reshardAfterForward = false;
  }
  out.units = std::move(units);
  return {};
}

//===----------------------------------------------------------------------===//
// Pipeline stages
//===----------------------------------------------------------------------===//

namespace {
/// What a pipeline split places: a top-level module, or one block of a
/// top-level container of blocks ("layers.3"), the pieces torchtitan's
/// pipeline_module_split keeps or drops. Each is a subtree, so its
/// parameters are a contiguous range of ResolvedSpec::params.
struct SplitPiece {
  std::string name;
  int module = -1;    ///< index into ResolvedSpec::modules
  int container = -1; ///< the container of blocks it is a child of, or -1
  int firstParam = 0; ///< [firstParam, endParam) in ResolvedSpec::params
  int endParam = 0;
  int64_t numParameters = 0;
};

/// Sums of parameter counts: a model file may hold up to 2^50 elements per
/// tensor, so sums of them can pass int64.
using Wide = __int128;

int64_t saturate(Wide v) {
  return v > INT64_MAX ? INT64_MAX : static_cast<int64_t>(v);
}
} // namespace

static std::vector<SplitPiece> splitPieces(const ResolvedSpec &out) {
  const std::vector<ModuleEntry> &modules = out.modules;
  std::vector<SplitPiece> pieces;
  std::vector<int> pieceOf(modules.size(), -1);
  for (size_t i = 0; i < modules.size(); ++i) {
    int parent = modules[i].parent;
    bool top = parent < 0;
    bool block = !top && modules[parent].parent < 0 &&
                 isContainerOfBlocks(*modules[parent].module);
    if ((top && !isContainerOfBlocks(*modules[i].module)) || block) {
      pieceOf[i] = static_cast<int>(pieces.size());
      pieces.push_back(
          {modules[i].path, static_cast<int>(i), block ? parent : -1, 0, 0, 0});
    } else if (!top) {
      pieceOf[i] = pieceOf[parent];
    }
  }
  // Forward (pre-)order keeps each subtree's parameters together.
  std::vector<Wide> counts(pieces.size(), 0);
  for (size_t p = 0; p < out.params.size(); ++p) {
    int piece = pieceOf[out.params[p].module];
    if (pieces[piece].endParam == 0) // its first parameter
      pieces[piece].firstParam = static_cast<int>(p);
    pieces[piece].endParam = static_cast<int>(p) + 1;
    Wide elements = 1;
    for (int64_t d : out.params[p].shape)
      elements *= d;
    counts[piece] += elements;
  }
  for (size_t k = 0; k < pieces.size(); ++k) {
    pieces[k].numParameters = saturate(counts[k]);
    if (pieces[k].endParam == 0) // no parameters: an empty range in order
      pieces[k].firstParam = pieces[k].endParam =
          k == 0 ? 0 : pieces[k - 1].endParam;
  }
  return pieces;
}

/// "tok_embeddings, layers.0 ... layers.31, norm, output": the pieces, with
/// runs of blocks of one container shortened.
static std::string describePieces(const std::vector<SplitPiece> &pieces) {
  std::string out;
  for (size_t k = 0; k < pieces.size();) {
    size_t end = k + 1;
    if (pieces[k].container >= 0)
      while (end < pieces.size() &&
             pieces[end].container == pieces[k].container)
        ++end;
    out += (out.empty() ? "" : ", ") + pieces[k].name;
    if (end - k == 2)
      out += ", " + pieces[k + 1].name;
    else if (end - k > 2)
      out += " ... " + pieces[end - 1].name;
    k = end;
  }
  return out;
}

/// The error for a stage entry that names no piece.
static Error unknownPiece(const std::string &ptr, const std::string &name,
                          const ResolvedSpec &out,
                          const std::vector<SplitPiece> &pieces) {
  for (size_t i = 0; i < out.modules.size(); ++i) {
    if (out.modules[i].path != name)
      continue;
    if (out.modules[i].parent < 0) { // a container of blocks
      std::vector<std::string> blocks;
      for (const SplitPiece &piece : pieces)
        if (piece.container == static_cast<int>(i))
          blocks.push_back(piece.name);
      return errorAt(ptr, "module " + quote(name) +
                              " is cut into its blocks; list them (" +
                              quote(blocks.front()) + " ... " +
                              quote(blocks.back()) + ") in the stages instead");
    }
    int top = static_cast<int>(i);
    while (out.modules[top].parent >= 0 &&
           !(out.modules[out.modules[top].parent].parent < 0 &&
             isContainerOfBlocks(*out.modules[out.modules[top].parent].module)))
      top = out.modules[top].parent;
    return errorAt(ptr, "module " + quote(name) + " is part of " +
                            quote(out.modules[top].path) +
                            "; a stage takes whole blocks and top-level "
                            "modules");
  }
  std::vector<std::string_view> names;
  for (const SplitPiece &piece : pieces)
    names.push_back(piece.name);
  return errorAt(ptr, "unknown module " + quote(name) + " of model " +
                          quote(out.model->name) + "; stages list " +
                          describePieces(pieces) + didYouMean(name, names));
}

/// The stage of each piece for an explicit split.
static Result<std::vector<int>>
explicitSplit(const PipelineParallelSpec &pp, const ResolvedSpec &out,
              const std::vector<SplitPiece> &pieces) {
  const std::string splitPtr = "/pipeline_parallel/split";
  std::map<std::string, int> index;
  for (size_t k = 0; k < pieces.size(); ++k)
    index.emplace(pieces[k].name, static_cast<int>(k));
  std::vector<int> stageOf(pieces.size(), -1);
  std::vector<std::string> listedAt(pieces.size());
  struct Listed {
    int piece;
    std::string ptr;
  };
  std::vector<Listed> listed;
  for (size_t s = 0; s < pp.stageModules.size(); ++s) {
    for (size_t i = 0; i < pp.stageModules[s].size(); ++i) {
      const std::string &name = pp.stageModules[s][i];
      std::string ptr = childPointer(childPointer(splitPtr, s), i);
      auto it = index.find(name);
      if (it == index.end())
        return unknownPiece(ptr, name, out, pieces);
      if (!listedAt[it->second].empty())
        return errorAt(ptr, "module " + quote(name) +
                                " is listed twice (also at " +
                                listedAt[it->second] +
                                "); each module runs on exactly one stage");
      listedAt[it->second] = ptr;
      stageOf[it->second] = static_cast<int>(s);
      listed.push_back({it->second, ptr});
    }
  }
  // Stages run one after the other, so listing the pieces in forward order
  // is what makes each stage a contiguous run.
  for (size_t k = 1; k < listed.size(); ++k)
    if (listed[k].piece < listed[k - 1].piece)
      return errorAt(listed[k].ptr,
                     "module " + quote(pieces[listed[k].piece].name) +
                         " is out of forward order: it runs before " +
                         quote(pieces[listed[k - 1].piece].name) + " (" +
                         listed[k - 1].ptr +
                         "), which is listed earlier; stages list the "
                         "model's modules in forward order");
  for (size_t k = 0; k < pieces.size(); ++k) {
    if (stageOf[k] >= 0)
      continue;
    std::string between;
    if (k > 0)
      between = " (it runs after " + quote(pieces[k - 1].name) + ", " +
                listedAt[k - 1] + ")";
    else
      between = " (it runs first, before " + quote(pieces[k + 1].name) + ", " +
                listedAt[k + 1] + ")";
    return errorAt(splitPtr, "module " + quote(pieces[k].name) +
                                 " is in no stage" + between +
                                 "; every top-level module and block runs "
                                 "on exactly one stage");
  }
  return stageOf;
}

/// torchtitan's default split, generate_llm_fqn_per_model_part(num_stages,
/// num_layers, input_weight=1, output_weight=1)
/// (torchtitan/distributed/pipeline_parallel.py; the weights are the
/// defaults of parallelism.pipeline_parallel_first_stage_less_layers and
/// _last_stage_less_layers): tok_embeddings and norm+output count as one
/// layer each; the num_layers + 2 "effective layers" are dealt out evenly,
/// the first (effective % num_stages) stages taking one more; stage 0 is
/// tok_embeddings and its share less one in layers, the last stage its
/// share less one in layers and then norm and output, the others their
/// share in layers.
static Result<std::vector<int>>
torchtitanSplit(int64_t numStages, const ResolvedSpec &out,
                const std::vector<SplitPiece> &pieces) {
  const std::string splitPtr = "/pipeline_parallel/split";
  // torchtitan names its pieces outright, so the model must be a Llama as
  // torchtitan writes it: anything else would be dropped from every stage
  // by pipeline_module_split.
  const int64_t layers = static_cast<int64_t>(pieces.size()) - 3;
  bool llama = layers >= 0 && pieces.front().name == "tok_embeddings" &&
               pieces[pieces.size() - 2].name == "norm" &&
               pieces.back().name == "output";
  for (int64_t l = 0; llama && l < layers; ++l)
    llama = pieces[l + 1].name == "layers." + std::to_string(l) &&
            pieces[l + 1].container >= 0;
  if (!llama)
    return errorAt(splitPtr,
                   "split \"torchtitan\" reproduces torchtitan's "
                   "generate_llm_fqn_per_model_part, which places "
                   "tok_embeddings, layers.0 ... layers.N-1, norm and output; "
                   "model " +
                       quote(out.model->name) + " has " +
                       describePieces(pieces) +
                       "; use \"auto\" or list the stages");
  std::vector<int> stageOf(pieces.size(), 0);
  if (numStages == 1)
    return stageOf;
  const int64_t effective = layers + 2;
  if (numStages > effective)
    return errorAt(splitPtr,
                   "split \"torchtitan\": torchtitan refuses " +
                       std::to_string(numStages) + " stages for " +
                       std::to_string(layers) +
                       " layers (generate_llm_fqn_per_model_part allows at "
                       "most layers + 2 = " +
                       std::to_string(effective) +
                       " stages, counting tok_embeddings and norm+output as "
                       "one layer each)");
  const int64_t perStage = effective / numStages;
  const int64_t extra = effective % numStages;
  int64_t layer = 0;
  for (int64_t s = 0; s < numStages; ++s) {
    int64_t share = perStage + (s < extra ? 1 : 0);
    if (s == 0 || s == numStages - 1)
      share -= 1; // the embedding, or the final norm and output
    for (int64_t k = 0; k < share && layer < layers; ++k, ++layer)
      stageOf[layer + 1] = static_cast<int>(s);
  }
  stageOf.front() = 0;
  stageOf[pieces.size() - 2] = stageOf.back() = static_cast<int>(numStages - 1);
  return stageOf;
}

/// The "auto" split: the pieces grouped so that what comes before the first
/// block (the embedding) and what comes after the last (the final norm and
/// output) each stay together, then cut into contiguous stages whose largest
/// parameter count is as small as possible; among such cuts, each stage in
/// turn is the one whose count is nearest an even share of what is left
/// (ties: the lighter, since earlier stages hold more microbatches in
/// flight).
static Result<std::vector<int>>
autoSplit(int64_t numStages, const ResolvedSpec &out,
          const std::vector<SplitPiece> &pieces) {
  // Groups of pieces: [groupStart[g], groupStart[g + 1]).
  std::vector<size_t> groupStart;
  size_t firstBlock = pieces.size(), lastBlock = 0;
  for (size_t k = 0; k < pieces.size(); ++k)
    if (pieces[k].container >= 0) {
      firstBlock = std::min(firstBlock, k);
      lastBlock = k;
    }
  for (size_t k = 0; k < pieces.size(); ++k) {
    bool leading = firstBlock < pieces.size() && k < firstBlock && k > 0;
    bool trailing = firstBlock < pieces.size() && k > lastBlock + 1;
    if (!leading && !trailing)
      groupStart.push_back(k);
  }
  const int64_t groups = static_cast<int64_t>(groupStart.size());
  groupStart.push_back(pieces.size());
  if (numStages > groups) {
    std::string names;
    for (int64_t g = 0; g < groups; ++g) {
      std::string name;
      for (size_t k = groupStart[g]; k < groupStart[g + 1]; ++k)
        name += (name.empty() ? "" : "+") + pieces[k].name;
      names += (names.empty() ? "" : ", ") + name;
    }
    return errorAt("/pipeline_parallel/split",
                   "split \"auto\" cannot cut model " + quote(out.model->name) +
                       " into " + std::to_string(numStages) +
                       " non-empty stages: it has " + std::to_string(groups) +
                       " pieces to place (" + names +
                       "; what comes before the first block and after the "
                       "last stays together); use fewer stages");
  }
  std::vector<Wide> prefix(groups + 1, 0);
  Wide largest = 0;
  for (int64_t g = 0; g < groups; ++g) {
    Wide cost = 0;
    for (size_t k = groupStart[g]; k < groupStart[g + 1]; ++k)
      cost += pieces[k].numParameters;
    prefix[g + 1] = prefix[g] + cost;
    largest = std::max(largest, cost);
  }
  auto cost = [&](int64_t from, int64_t to) {
    return prefix[to] - prefix[from];
  };
  // next[j]: the end of the longest run from j within `cap`; need[j]: the
  // fewest stages the groups from j take within `cap` (the greedy longest
  // runs are optimal).
  std::vector<int64_t> next(groups + 1), need(groups + 1);
  auto measure = [&](Wide cap) {
    int64_t end = 0;
    for (int64_t j = 0; j < groups; ++j) {
      end = std::max(end, j + 1);
      while (end < groups && cost(j, end + 1) <= cap)
        ++end;
      next[j] = end;
    }
    need[groups] = 0;
    for (int64_t j = groups - 1; j >= 0; --j)
      need[j] = 1 + need[next[j]];
    return need[0];
  };
  Wide low = largest, high = prefix[groups];
  while (low < high) {
    Wide mid = low + (high - low) / 2;
    if (measure(mid) <= numStages)
      high = mid;
    else
      low = mid + 1;
  }
  measure(low);
  std::vector<int> stageOfGroup(groups, 0);
  int64_t at = 0;
  for (int64_t s = 0; s < numStages; ++s) {
    const int64_t left = numStages - s; // stages still to fill, this one too
    int64_t last = std::min(next[at], groups - (left - 1));
    int64_t first = at + 1;
    while (first < last && need[first] > left - 1)
      ++first;
    // The stage's count grows with its end, so the end nearest the even
    // share is at, or just before, the first end that reaches it.
    const Wide share = cost(at, groups); // compared with left x the count
    int64_t lo = first, hi = last;
    while (lo < hi) {
      int64_t mid = lo + (hi - lo) / 2;
      if (cost(at, mid) * left >= share)
        hi = mid;
      else
        lo = mid + 1;
    }
    int64_t best = lo;
    Wide over = cost(at, lo) * left - share; // < 0: no end reaches it
    if (lo > first && over >= 0 && share - cost(at, lo - 1) * left <= over)
      best = lo - 1; // as near, and lighter
    for (int64_t g = at; g < best; ++g)
      stageOfGroup[g] = static_cast<int>(s);
    at = best;
  }
  std::vector<int> stageOf(pieces.size(), 0);
  for (int64_t g = 0; g < groups; ++g)
    for (size_t k = groupStart[g]; k < groupStart[g + 1]; ++k)
      stageOf[k] = stageOfGroup[g];
  return stageOf;
}

/// The resolved pipeline of `out` (see ResolvedPipeline); the schedule's
/// rules were checked by parseSpec.
static Result<void> resolvePipeline(ResolvedSpec &out) {
  const PipelineParallelSpec &pp = *out.spec.pipelineParallel;
  ResolvedPipeline resolved;
  resolved.axis = pp.axis;
  resolved.axisIndex = *out.mesh->findAxis(pp.axis);
  resolved.config = {pp.schedule, out.mesh->axis(resolved.axisIndex).size,
                     pp.microbatches, pp.stagesPerRank};
  resolved.placement = placementOf(pp.schedule);
  resolved.split = pp.split;
  const int64_t p = resolved.config.ranks;
  const int64_t numStages = p * resolved.config.stagesPerRank;

  std::vector<SplitPiece> pieces = splitPieces(out);
  auto stageOf = pp.split == PipelineSplit::Explicit
                     ? explicitSplit(pp, out, pieces)
                 : pp.split == PipelineSplit::Torchtitan
                     ? torchtitanSplit(numStages, out, pieces)
                     : autoSplit(numStages, out, pieces);
  MESHPLAN_TRY(stageOf);

  resolved.stages.resize(numStages);
  resolved.stageOfParam.assign(out.params.size(), -1);
  std::vector<Wide> counts(numStages, 0);
  for (size_t k = 0; k < pieces.size(); ++k) {
    int s = (*stageOf)[k];
    PipelineStageAssignment &stage = resolved.stages[s];
    stage.modules.push_back(pieces[k].name);
    for (int q = pieces[k].firstParam; q < pieces[k].endParam; ++q) {
      stage.params.push_back(q);
      stage.paramNames.push_back(out.params[q].name);
      resolved.stageOfParam[q] = s;
    }
    counts[s] += pieces[k].numParameters;
  }
  for (int64_t s = 0; s < numStages; ++s) {
    resolved.stages[s].numParameters = saturate(counts[s]);
    resolved.stages[s].rank = rankOfStage(resolved.placement, p, s);
  }
  resolved.stagesOfRank.reserve(p);
  for (int64_t r = 0; r < p; ++r)
    resolved.stagesOfRank.push_back(
        stagesOfRank(resolved.placement, p, resolved.config.stagesPerRank, r));

  // Each FSDP unit is gathered and run as one, so it must live on one
  // stage; only an explicit split, or explicit units, can cut one. The root
  // unit (what no other unit holds) is the exception: torchtitan applies
  // fully_shard to each stage's model part, so each stage has its own root,
  // holding that stage's share.
  for (const UnitAssignment &unit : out.units) {
    if (unit.root)
      continue;
    int first = resolved.stageOfParam[unit.params.front()];
    for (int q : unit.params) {
      int s = resolved.stageOfParam[q];
      if (s == first)
        continue;
      return errorAt("/pipeline_parallel/split",
                     "FSDP unit " + quote(unit.name) + " holds " +
                         quote(out.params[unit.params.front()].name) +
                         " on stage " + std::to_string(first) + " and " +
                         quote(out.params[q].name) + " on stage " +
                         std::to_string(s) +
                         "; a unit is gathered and run as one, so it lies "
                         "within one stage (put its modules on one stage, or "
                         "choose data_parallel.units that stages do not cut)");
    }
  }
  out.pipeline = std::move(resolved);
  return {};
}

Result<ResolvedSpec> resolveSpec(Spec spec,
                                 std::shared_ptr<const Model> model) {
  ResolvedSpec out;
  auto mesh = buildMesh(spec.mesh);
  if (!mesh)
    return mesh.error().within("/mesh");
  out.mesh = std::make_shared<const Mesh>(std::move(*mesh));
  out.model = std::move(model);
  out.modules = flattenModules(*out.model);
  out.assignments.assign(out.modules.size(), ModuleAssignment{});
  Resolver resolver{spec, *out.model, out.modules, out.assignments};
  MESHPLAN_TRY(resolver.resolveTensorParallel());
  MESHPLAN_TRY(resolver.resolveFloat8());

  for (size_t i = 0; i < out.modules.size(); ++i) {
    const ModuleEntry &entry = out.modules[i];
    const ModuleAssignment &a = out.assignments[i];
    for (const Parameter &p : entry.module->params) {
      ParamAssignment param;
      param.name = entry.path + "." + p.name;
      param.module = static_cast<int>(i);
      param.shape = p.shape;
      param.dtype = p.dtype;
      if (a.tpStyle && *a.tpStyle != TPStyle::SequenceParallel) {
        std::optional<int> dim = tpDimFor(*a.tpStyle, entry.module->kind);
        if (p.shape.size() == 2)
          param.tpDim = *dim;
        else if (*dim == 0)
          param.tpDim = 0; // a colwise linear's bias
      }
      param.float8 = a.float8 && p.name == "weight";
      out.params.push_back(std::move(param));
    }
  }
  out.spec = std::move(spec);
  // optimizer.no_decay: a pattern selects a parameter as a unit pattern
  // does (its full name, its module's path or an ancestor's path), so
  // "norm", "layers.*.attention_norm" and "**norm.weight" all work.
  const std::vector<std::string> &noDecay = out.spec.optimizer.noDecay;
  for (size_t k = 0; k < noDecay.size(); ++k) {
    bool any = false;
    for (ParamAssignment &param : out.params)
      if (unitPatternSelects(noDecay[k], out, param)) {
        param.noDecay = true;
        any = true;
      }
    if (!any)
      return noMatch(childPointer("/optimizer/no_decay", k), noDecay[k],
                     *out.model, out.modules);
  }
  MESHPLAN_TRY(resolveUnits(out));
  if (out.spec.pipelineParallel)
    MESHPLAN_TRY(resolvePipeline(out));
  return out;
}

} // namespace meshplan::frontend

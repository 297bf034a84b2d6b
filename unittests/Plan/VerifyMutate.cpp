//===- VerifyMutate.cpp - Single-rank plan edits against the verifier -----===//
//
// The mutation oracle's first half (issue 38; docs/reliability.md, "The
// mutation oracle"). Reads a plan directory that verifies, then applies
// single-rank edits of twelve kinds, as an adversary (or a planner bug) would:
//
//   swap          two collectives of one op and count on one rank exchange
//                 their operands (or only their inputs)
//   retarget      a collective moves to another communicator, or an
//                 instruction writes another buffer of the same shape
//   reorder       two neighbours on one stream change places
//   count         a collective's count changes by one
//   dtype         a collective's dtype, or a buffer's dtype, changes
//   tensor_id     two parameters exchange tensor ids, or one gets a new id
//   hyperparameter one field of the optimizer record changes
//   microbatch    a compute runs another microbatch
//   phase         a compute runs another phase
//   write_set     an instruction loses an output, or writes one more buffer
//   layout        a collective's output declared in another layout of the
//                 same box (another buffer's, or made partial or not)
//   accumulation  an accumulate runs twice or not at all, or a backward no
//                 longer carries the gradient so far in
//
// Each edited set goes through what `meshplan verify` runs (validatePlan on
// the edited plan, then verifyPlans on the set). A rejected edit is done
// with; an accepted one is written to OUT/<n>-<kind>/ with EDIT.txt
// describing it, for the second half (test/verify/mutation-oracle.sh) to
// run under the runtime's step-check, which must then give the reference
// results: an accepted edit that changes what is computed is a silent wrong
// result. Prints one line per kind and a total:
//
//   kind swap: tried 6, rejected 6 (validation 0, verify 6), accepted 0
//
// Usage: verify-mutate --plans DIR --out OUT [--per-kind N] [--seed S]
// Exit status 0, or 2 on bad usage or a directory that does not verify.
//
//===----------------------------------------------------------------------===//

#include "meshplan/Plan/PlanDirectory.h"
#include "meshplan/Plan/Verify.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

using namespace meshplan;
using namespace meshplan::plan;

namespace {

[[noreturn]] void usage(const std::string &why) {
  std::fprintf(stderr, "verify-mutate: %s\n", why.c_str());
  std::exit(2);
}

struct Edit {
  std::string description; ///< "" when no edit of the kind applies
};

using Rng = std::mt19937_64;

template <typename T> const T &pick(Rng &rng, const std::vector<T> &v) {
  return v[std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng)];
}

const Buffer *findBuffer(const Plan &p, const std::string &id) {
  for (const Buffer &b : p.buffers)
    if (b.id == id)
      return &b;
  return nullptr;
}

std::string at(const Plan &p, size_t i) {
  return "rank " + std::to_string(p.rank) + " /program/" + std::to_string(i) +
         " \"" + p.program[i].id + "\"";
}

std::vector<size_t>
instructionsWhere(const Plan &p, std::function<bool(const Instruction &)> f) {
  std::vector<size_t> out;
  for (size_t i = 0; i < p.program.size(); ++i)
    if (f(p.program[i]))
      out.push_back(i);
  return out;
}

Edit swapEdit(Plan &p, Rng &rng) {
  std::vector<std::pair<size_t, size_t>> pairs;
  for (size_t i = 0; i < p.program.size(); ++i)
    for (size_t j = i + 1; j < p.program.size(); ++j) {
      const Instruction &a = p.program[i], &b = p.program[j];
      if (isCollective(a.op) && !isPointToPoint(a.op) && a.op == b.op &&
          a.count == b.count && a.dtype == b.dtype &&
          (a.inputs != b.inputs || a.outputs != b.outputs))
        pairs.push_back({i, j});
    }
  if (pairs.empty())
    return {};
  auto [i, j] = pick(rng, pairs);
  Instruction &a = p.program[i], &b = p.program[j];
  if (rng() % 2 && a.inputs != b.inputs) {
    std::swap(a.inputs, b.inputs);
    return {at(p, i) + " and /program/" + std::to_string(j) + " \"" + b.id +
            "\" (" + std::string(opKindName(a.op)) + " count " +
            std::to_string(a.count) + ") swap their inputs"};
  }
  std::swap(a.inputs, b.inputs);
  std::swap(a.outputs, b.outputs);
  return {at(p, i) + " and /program/" + std::to_string(j) + " \"" + b.id +
          "\" (" + std::string(opKindName(a.op)) + " count " +
          std::to_string(a.count) + ") swap their operands"};
}

Edit retargetEdit(Plan &p, Rng &rng) {
  if (rng() % 2) {
    auto colls = instructionsWhere(p, [](const Instruction &in) {
      return isCollective(in.op) && !isPointToPoint(in.op);
    });
    if (!colls.empty() && p.communicators.size() > 1) {
      size_t i = pick(rng, colls);
      std::vector<std::string> others;
      for (const Communicator &c : p.communicators)
        if (c.id != p.program[i].comm)
          others.push_back(c.id);
      std::string to = pick(rng, others);
      std::string from = p.program[i].comm;
      p.program[i].comm = to;
      return {at(p, i) + " moves from communicator \"" + from + "\" to \"" +
              to + "\""};
    }
  }
  // An output retargeted to another buffer of the same box and dtype.
  std::vector<std::tuple<size_t, size_t, std::string>> options;
  for (size_t i = 0; i < p.program.size(); ++i) {
    const Instruction &in = p.program[i];
    for (size_t o = 0; o < in.outputs.size(); ++o) {
      const Buffer *b = findBuffer(p, in.outputs[o]);
      if (!b)
        continue;
      for (const Buffer &c : p.buffers)
        if (c.id != b->id && c.localShape == b->localShape &&
            c.dtype == b->dtype && c.kind == b->kind)
          options.push_back({i, o, c.id});
    }
  }
  if (options.empty())
    return {};
  auto [i, o, to] = pick(rng, options);
  std::string from = p.program[i].outputs[o];
  p.program[i].outputs[o] = to;
  // In-place ops name the buffer among their inputs too.
  for (std::string &in : p.program[i].inputs)
    if (in == from && p.program[i].op == OpKind::OptimizerUpdate)
      in = to;
  return {at(p, i) + " writes \"" + to + "\" instead of \"" + from + "\""};
}

Edit reorderEdit(Plan &p, Rng &rng) {
  std::vector<std::pair<size_t, size_t>> pairs;
  std::map<std::string, size_t> last;
  for (size_t i = 0; i < p.program.size(); ++i) {
    auto it = last.find(p.program[i].stream);
    if (it != last.end())
      pairs.push_back({it->second, i});
    last[p.program[i].stream] = i;
  }
  if (pairs.empty())
    return {};
  auto [i, j] = pick(rng, pairs);
  // Neither may depend on the other, or the edit is a format error only.
  std::string a = p.program[i].id, b = p.program[j].id;
  std::swap(p.program[i], p.program[j]);
  for (Instruction &in : p.program) {
    if (in.id == a)
      std::erase(in.deps, b);
    if (in.id == b)
      std::erase(in.deps, a);
  }
  return {"rank " + std::to_string(p.rank) + " \"" + a + "\" and \"" + b +
          "\" (neighbours on stream \"" + p.program[j].stream +
          "\") change places"};
}

Edit countEdit(Plan &p, Rng &rng) {
  auto colls = instructionsWhere(
      p, [](const Instruction &in) { return isCollective(in.op); });
  if (colls.empty())
    return {};
  size_t i = pick(rng, colls);
  int64_t from = p.program[i].count;
  p.program[i].count = from > 0 && rng() % 2 ? from - 1 : from + 1;
  return {at(p, i) + " count " + std::to_string(from) + " -> " +
          std::to_string(p.program[i].count)};
}

Edit dtypeEdit(Plan &p, Rng &rng) {
  auto other = [](DType d) {
    return d == DType::Float32 ? DType::BFloat16 : DType::Float32;
  };
  if (rng() % 2) {
    auto colls = instructionsWhere(p, [](const Instruction &in) {
      return isCollective(in.op) && in.dtype;
    });
    if (!colls.empty()) {
      size_t i = pick(rng, colls);
      DType from = *p.program[i].dtype;
      p.program[i].dtype = other(from);
      return {at(p, i) + " dtype " + std::string(dtypeName(from)) + " -> " +
              std::string(dtypeName(*p.program[i].dtype))};
    }
  }
  std::vector<size_t> bufs;
  for (size_t b = 0; b < p.buffers.size(); ++b)
    if (!p.buffers[b].scale)
      bufs.push_back(b);
  if (bufs.empty())
    return {};
  Buffer &b = p.buffers[pick(rng, bufs)];
  DType from = b.dtype;
  b.dtype = other(from);
  return {"rank " + std::to_string(p.rank) + " buffer \"" + b.id + "\" dtype " +
          std::string(dtypeName(from)) + " -> " +
          std::string(dtypeName(b.dtype))};
}

Edit tensorIdEdit(Plan &p, Rng &rng) {
  std::vector<size_t> params;
  int64_t maxId = -1;
  for (size_t b = 0; b < p.buffers.size(); ++b)
    if (p.buffers[b].tensorId) {
      params.push_back(b);
      maxId = std::max(maxId, *p.buffers[b].tensorId);
    }
  if (params.empty())
    return {};
  Buffer &a = p.buffers[pick(rng, params)];
  if (params.size() > 1 && rng() % 2) {
    Buffer *b = &a;
    while (b == &a)
      b = &p.buffers[pick(rng, params)];
    std::swap(a.tensorId, b->tensorId);
    return {"rank " + std::to_string(p.rank) + " \"" + a.id + "\" and \"" +
            b->id + "\" swap tensor ids"};
  }
  int64_t from = *a.tensorId;
  a.tensorId = maxId + 1;
  return {"rank " + std::to_string(p.rank) + " \"" + a.id + "\" tensor_id " +
          std::to_string(from) + " -> " + std::to_string(maxId + 1)};
}

Edit hyperparameterEdit(Plan &p, Rng &rng) {
  if (!p.optimizer)
    return {};
  OptimizerConfig &o = *p.optimizer;
  std::string what;
  switch (rng() % 7) {
  case 0:
    o.lr *= 10;
    what = "lr x 10";
    break;
  case 1:
    o.beta1 = o.beta1 > 0.5 ? o.beta1 - 0.1 : o.beta1 + 0.1;
    what = "beta1 -/+ 0.1";
    break;
  case 2:
    o.beta2 = o.beta2 > 0.5 ? o.beta2 - 0.01 : o.beta2 + 0.01;
    what = "beta2 -/+ 0.01";
    break;
  case 3:
    o.eps *= 100;
    what = "eps x 100";
    break;
  case 4:
    o.weightDecay = o.weightDecay > 0 ? 0 : 0.1;
    what = "weight_decay changed";
    break;
  case 5:
    o.seed += 1;
    what = "seed + 1";
    break;
  default:
    o.stochasticRounding = !o.stochasticRounding;
    what = "stochastic_rounding flipped";
    break;
  }
  return {"rank " + std::to_string(p.rank) + " optimizer " + what};
}

Edit microbatchEdit(Plan &p, Rng &rng) {
  auto computes = instructionsWhere(
      p, [](const Instruction &in) { return in.op == OpKind::Compute; });
  if (computes.empty())
    return {};
  size_t i = pick(rng, computes);
  int64_t from = p.program[i].microbatch;
  p.program[i].microbatch = from > 0 && rng() % 2 ? from - 1 : from + 1;
  return {at(p, i) + " microbatch " + std::to_string(from) + " -> " +
          std::to_string(p.program[i].microbatch)};
}

Edit phaseEdit(Plan &p, Rng &rng) {
  auto computes = instructionsWhere(
      p, [](const Instruction &in) { return in.op == OpKind::Compute; });
  if (computes.empty())
    return {};
  size_t i = pick(rng, computes);
  std::string from = p.program[i].phase;
  p.program[i].phase = from == "forward" ? "backward" : "forward";
  return {at(p, i) + " phase " + from + " -> " + p.program[i].phase};
}

Edit writeSetEdit(Plan &p, Rng &rng) {
  if (rng() % 2) {
    auto writers = instructionsWhere(
        p, [](const Instruction &in) { return !in.outputs.empty(); });
    if (!writers.empty()) {
      size_t i = pick(rng, writers);
      Instruction &in = p.program[i];
      size_t o =
          std::uniform_int_distribution<size_t>(0, in.outputs.size() - 1)(rng);
      std::string gone = in.outputs[o];
      in.outputs.erase(in.outputs.begin() + static_cast<long>(o));
      return {at(p, i) + " no longer writes \"" + gone + "\""};
    }
  }
  auto computes = instructionsWhere(
      p, [](const Instruction &in) { return in.op == OpKind::Compute; });
  if (computes.empty() || p.buffers.empty())
    return {};
  size_t i = pick(rng, computes);
  std::vector<std::string> candidates;
  for (const Buffer &b : p.buffers)
    if (std::find(p.program[i].outputs.begin(), p.program[i].outputs.end(),
                  b.id) == p.program[i].outputs.end())
      candidates.push_back(b.id);
  if (candidates.empty())
    return {};
  std::string extra = pick(rng, candidates);
  p.program[i].outputs.push_back(extra);
  return {at(p, i) + " also writes \"" + extra + "\""};
}

/// A collective's output declared in another layout with the same box (so
/// validatePlan cannot tell): the layout of another buffer of the same
/// global shape, local shape and offset, or the same layout made partial
/// over a mesh axis (or no longer partial).
Edit layoutEdit(Plan &p, Rng &rng) {
  auto collectives = instructionsWhere(p, [](const Instruction &in) {
    return isCollective(in.op) && !isPointToPoint(in.op) && !in.outputs.empty();
  });
  if (collectives.empty())
    return {};
  size_t i = pick(rng, collectives);
  const std::string &id = pick(rng, p.program[i].outputs);
  Buffer *b = nullptr;
  for (Buffer &x : p.buffers)
    if (x.id == id)
      b = &x;
  if (!b)
    return {};
  std::vector<std::string> layouts;
  for (const Buffer &x : p.buffers)
    if (x.layout != b->layout && x.globalShape == b->globalShape &&
        x.localShape == b->localShape && x.offset == b->offset &&
        std::find(layouts.begin(), layouts.end(), x.layout) == layouts.end())
      layouts.push_back(x.layout);
  size_t cut = b->layout.find(" partial");
  if (cut != std::string::npos)
    layouts.push_back(b->layout.substr(0, cut));
  else
    for (const MeshAxis &a : p.mesh.axes)
      if (b->layout.find(a.name) == std::string::npos)
        layouts.push_back(b->layout + " partial(sum)={" + a.name + "}");
  if (layouts.empty())
    return {};
  std::string from = b->layout;
  b->layout = pick(rng, layouts);
  return {at(p, i) + " output \"" + id + "\" layout \"" + from + "\" -> \"" +
          b->layout + "\""};
}

/// Gradient accumulation: an accumulate run twice (a copy right after it)
/// or not at all, or a backward that no longer carries the gradient so far
/// in (its gradient inputs dropped).
Edit accumulationEdit(Plan &p, Rng &rng) {
  auto accumulates = instructionsWhere(
      p, [](const Instruction &in) { return in.op == OpKind::Accumulate; });
  auto carries = instructionsWhere(p, [&](const Instruction &in) {
    if (in.op != OpKind::Compute)
      return false;
    for (const std::string &x : in.inputs)
      if (const Buffer *b = findBuffer(p, x);
          b && b->kind == BufferKind::Gradient)
        return true;
    return false;
  });
  int choice = static_cast<int>(rng() % 3);
  if (accumulates.empty() && carries.empty())
    return {};
  if (accumulates.empty())
    choice = 2;
  else if (carries.empty())
    choice = choice % 2;
  if (choice == 2) {
    size_t i = pick(rng, carries);
    Instruction &in = p.program[i];
    std::vector<std::string> kept;
    for (const std::string &x : in.inputs)
      if (const Buffer *b = findBuffer(p, x);
          !b || b->kind != BufferKind::Gradient)
        kept.push_back(x);
    in.inputs = kept;
    return {at(p, i) + " no longer carries its gradients in"};
  }
  size_t i = pick(rng, accumulates);
  std::string id = p.program[i].id;
  if (choice == 0) {
    Instruction copy = p.program[i];
    copy.id = id + ".again";
    copy.deps = {id};
    // What waited for the accumulate waits for its copy too.
    for (Instruction &in : p.program)
      if (std::find(in.deps.begin(), in.deps.end(), id) != in.deps.end())
        in.deps.push_back(copy.id);
    p.program.insert(p.program.begin() + static_cast<long>(i) + 1, copy);
    return {at(p, i) + " accumulates twice"};
  }
  std::string where = at(p, i);
  std::vector<std::string> deps = p.program[i].deps;
  p.program.erase(p.program.begin() + static_cast<long>(i));
  // What waited for it waits for what it waited for.
  for (Instruction &in : p.program) {
    auto it = std::find(in.deps.begin(), in.deps.end(), id);
    if (it == in.deps.end())
      continue;
    in.deps.erase(it);
    for (const std::string &d : deps)
      if (std::find(in.deps.begin(), in.deps.end(), d) == in.deps.end())
        in.deps.push_back(d);
  }
  return {where + " (accumulate) removed"};
}

struct Kind {
  const char *name;
  Edit (*apply)(Plan &, Rng &);
};
const Kind kKinds[] = {
    {"swap", swapEdit},
    {"retarget", retargetEdit},
    {"reorder", reorderEdit},
    {"count", countEdit},
    {"dtype", dtypeEdit},
    {"tensor_id", tensorIdEdit},
    {"hyperparameter", hyperparameterEdit},
    {"microbatch", microbatchEdit},
    {"phase", phaseEdit},
    {"write_set", writeSetEdit},
    {"layout", layoutEdit},
    {"accumulation", accumulationEdit},
};

} // namespace

int main(int argc, char **argv) {
  std::string plansDir, outDir;
  int perKind = 3;
  uint64_t seed = 1;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc)
        usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--plans")
      plansDir = next();
    else if (a == "--out")
      outDir = next();
    else if (a == "--per-kind")
      perKind = std::atoi(next().c_str());
    else if (a == "--seed")
      seed = std::strtoull(next().c_str(), nullptr, 10);
    else
      usage("unknown flag " + a);
  }
  if (plansDir.empty() || outDir.empty() || perKind < 1)
    usage("usage: verify-mutate --plans DIR --out OUT [--per-kind N] "
          "[--seed S]");
  Result<std::vector<Plan>> read = readPlanDirectory(plansDir);
  if (!read)
    usage(read.error().message);
  const std::vector<Plan> original = std::move(*read);
  Result<VerifyResult> base = verifyPlans(original);
  if (!base || !base->ok())
    usage("the unedited set does not verify: " +
          (base ? base->failure->message : base.error().message));

  Rng rng(seed);
  int64_t tried = 0, rejected = 0, accepted = 0;
  int serial = 0;
  for (const Kind &kind : kKinds) {
    int64_t kTried = 0, kValidation = 0, kVerify = 0, kAccepted = 0;
    std::set<std::string> seen;
    // Distinct edits, with a bound on attempts for kinds with few options.
    for (int attempt = 0; kTried < perKind && attempt < perKind * 20;
         ++attempt) {
      std::vector<Plan> plans = original;
      size_t index =
          std::uniform_int_distribution<size_t>(0, plans.size() - 1)(rng);
      Plan &target = plans[index];
      Edit e = kind.apply(target, rng);
      if (e.description.empty() || target == original[index] ||
          !seen.insert(e.description).second)
        continue;
      ++kTried;
      std::string message;
      if (Result<void> v = validatePlan(target); !v) {
        ++kValidation;
        message = "invalid plan: " + v.error().message;
      } else {
        Result<VerifyResult> r = verifyPlans(plans);
        if (!r) {
          ++kValidation;
          message = r.error().message;
        } else if (!r->ok()) {
          ++kVerify;
          message =
              std::string(failureKindName(r->failure->kind)) + ": " +
              r->failure->message.substr(0, r->failure->message.find('\n'));
        } else {
          ++kAccepted;
          std::string dir =
              outDir + "/" + std::to_string(++serial) + "-" + kind.name;
          std::vector<int64_t> ranks;
          for (const Plan &p : plans)
            ranks.push_back(p.rank);
          Result<void> w = writePlanDirectory(
              dir, static_cast<int64_t>(plans.size()),
              [&](int64_t rank) -> Result<Plan> {
                for (const Plan &p : plans)
                  if (p.rank == rank)
                    return p;
                return makeError("no plan for rank " + std::to_string(rank));
              },
              ranks);
          if (!w)
            usage(w.error().message);
          std::ofstream(dir + "/EDIT.txt")
              << kind.name << ": " << e.description << "\n";
          std::printf("accepted %s: %s (%s)\n", kind.name,
                      e.description.c_str(), dir.c_str());
          continue;
        }
      }
      std::printf("rejected %s: %s\n    %s\n", kind.name, e.description.c_str(),
                  message.c_str());
    }
    std::printf("kind %s: tried %lld, rejected %lld (validation %lld, verify "
                "%lld), accepted %lld\n",
                kind.name, static_cast<long long>(kTried),
                static_cast<long long>(kValidation + kVerify),
                static_cast<long long>(kValidation),
                static_cast<long long>(kVerify),
                static_cast<long long>(kAccepted));
    tried += kTried;
    rejected += kValidation + kVerify;
    accepted += kAccepted;
  }
  std::printf("total: tried %lld, rejected %lld, accepted %lld\n",
              static_cast<long long>(tried), static_cast<long long>(rejected),
              static_cast<long long>(accepted));
  return 0;
}

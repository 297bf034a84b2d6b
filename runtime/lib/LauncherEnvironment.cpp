//===- LauncherEnvironment.cpp - Who started this rank --------------------===//

#include "meshplan/Runtime/LauncherEnvironment.h"

#include <cctype>
#include <cstdlib>

/// `auto name = *(expr)`, or return the expression's error.
#define TRY_ASSIGN(name, expr)                                                 \
  auto name##Or = (expr);                                                      \
  if (!name##Or)                                                               \
    return name##Or.error();                                                   \
  auto name = *name##Or

namespace meshplan::runtime {

namespace {

/// The variables of one process, read through a lookup.
class Variables {
public:
  explicit Variables(const EnvironmentLookup &lookup) : lookup(lookup) {}

  std::optional<std::string> text(const char *name) const {
    const char *v = lookup ? lookup(name) : std::getenv(name);
    if (!v || !*v)
      return std::nullopt;
    return std::string(v);
  }
  bool has(const char *name) const { return text(name).has_value(); }

  /// NAME=VALUE as written, for messages.
  std::string shown(const char *name) const {
    return std::string(name) + "=" + text(name).value_or("");
  }

  Result<std::optional<int64_t>> integer(const char *name) const {
    std::optional<std::string> v = text(name);
    if (!v)
      return std::optional<int64_t>();
    char *end = nullptr;
    long long x = std::strtoll(v->c_str(), &end, 10);
    if (*end != '\0' || x < 0 || !std::isdigit((unsigned char)(*v)[0]))
      return makeError(std::string(name) + "=\"" + *v +
                       "\" is not a non-negative integer");
    return std::optional<int64_t>(x);
  }

private:
  const EnvironmentLookup &lookup;
};

/// A job name made of the launcher's ids: [A-Za-z0-9._-] only, as the
/// membership store's names are.
std::string jobName(std::string text) {
  for (char &c : text)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' &&
        c != '_')
      c = '_';
  return text.substr(0, 128);
}

/// Rank, world and local rank from RANK/WORLD_SIZE/LOCAL_RANK, checked
/// against srun's where a user set them next to srun's own.
Result<void> readRankVariables(const Variables &v, LauncherEnvironment &e) {
  bool torchrun = v.has("TORCHELASTIC_USE_AGENT_STORE");
  e.launcher = torchrun ? "torchrun" : "RANK/WORLD_SIZE";
  for (const char *name : {"RANK", "WORLD_SIZE"})
    if (!v.has(name))
      return makeError(std::string(name) + " is not set although " +
                       v.shown(name[0] == 'R' ? "WORLD_SIZE" : "RANK") +
                       " is (torchrun and `meshplan run` set both)");
  TRY_ASSIGN(rank, v.integer("RANK"));
  TRY_ASSIGN(world, v.integer("WORLD_SIZE"));
  TRY_ASSIGN(local, v.integer("LOCAL_RANK"));
  e.rank = *rank;
  e.worldSize = *world;
  e.localRank = local.value_or(0);
  // A per-node agent (torchrun, `meshplan run`; both set GROUP_RANK) under
  // srun is one Slurm task per node: its ranks' SLURM_* describe the agent's
  // task, not the rank. Set by hand, RANK and SLURM_PROCID must agree.
  if (v.has("GROUP_RANK") || !v.has("SLURM_PROCID"))
    return {};
  const std::pair<const char *, const char *> pairs[] = {
      {"RANK", "SLURM_PROCID"},
      {"WORLD_SIZE", "SLURM_NTASKS"},
      {"LOCAL_RANK", "SLURM_LOCALID"}};
  for (auto [ours, slurms] : pairs) {
    TRY_ASSIGN(a, v.integer(ours));
    TRY_ASSIGN(b, v.integer(slurms));
    if (a && b && *a != *b)
      return makeError(v.shown(ours) + " disagrees with srun's " +
                       v.shown(slurms) +
                       ": two launchers describe this process; unset RANK, "
                       "WORLD_SIZE and LOCAL_RANK to use srun's, or start "
                       "the ranks with one launcher");
  }
  return {};
}

Result<void> readSlurmVariables(const Variables &v, LauncherEnvironment &e) {
  e.launcher = "srun";
  e.worldSizeVariable = "SLURM_NTASKS";
  if (!v.has("SLURM_NTASKS"))
    return makeError("SLURM_NTASKS is not set although " +
                     v.shown("SLURM_PROCID") +
                     " is (srun exports both to every task; start the "
                     "program with srun, not from the batch script itself)");
  TRY_ASSIGN(rank, v.integer("SLURM_PROCID"));
  TRY_ASSIGN(world, v.integer("SLURM_NTASKS"));
  TRY_ASSIGN(local, v.integer("SLURM_LOCALID"));
  e.rank = *rank;
  e.worldSize = *world;
  e.localRank = local.value_or(0);
  return {};
}

Result<void> readStore(const Variables &v, LauncherEnvironment &e) {
  if (std::optional<std::string> named = v.text("MESHPLAN_STORE")) {
    auto address = parseStoreAddress(*named);
    if (!address)
      return address.error().within("MESHPLAN_STORE");
    e.store = *address;
    return {};
  }
  if (e.launcher == "torchrun") {
    if (v.text("TORCHELASTIC_USE_AGENT_STORE") != "True")
      return makeError(
          "MESHPLAN_STORE is not set, and torchrun's agent hosts no store "
          "for its workers here (" +
          v.shown("TORCHELASTIC_USE_AGENT_STORE") +
          ": its rendezvous backend keeps its store elsewhere); export "
          "MESHPLAN_STORE=redis://HOST:PORT or file:DIR");
    for (const char *name : {"MASTER_ADDR", "MASTER_PORT"})
      if (!v.has(name))
        return makeError(std::string(name) +
                         " is not set although torchrun's " +
                         v.shown("TORCHELASTIC_RUN_ID") +
                         " is (torchrun sets MASTER_ADDR and MASTER_PORT to "
                         "its store); or export MESHPLAN_STORE");
    TRY_ASSIGN(port, v.integer("MASTER_PORT"));
    if (*port < 1 || *port > 65535)
      return makeError(v.shown("MASTER_PORT") + " is not a port (1..65535)");
    e.store.kind = StoreAddress::Kind::Tcp;
    e.store.host = *v.text("MASTER_ADDR");
    e.store.port = static_cast<int>(*port);
    return {};
  }
  if (e.launcher == "srun")
    return makeError(
        "MESHPLAN_STORE is not set: srun (" + v.shown("SLURM_PROCID") + ", " +
        v.shown("SLURM_NTASKS") +
        ") hosts no store its tasks share; export "
        "MESHPLAN_STORE=file:DIR (a directory every node mounts) or "
        "redis://HOST:PORT before srun");
  return makeError("MESHPLAN_STORE is not set (file:DIR or "
                   "redis://HOST:PORT; `meshplan run` sets it, and under "
                   "torchrun its store at MASTER_ADDR:MASTER_PORT is used)");
}

} // namespace

Result<LauncherEnvironment>
readLauncherEnvironment(const EnvironmentLookup &lookup) {
  Variables v(lookup);
  LauncherEnvironment e;
  if (v.has("RANK") || v.has("WORLD_SIZE")) {
    MESHPLAN_TRY(readRankVariables(v, e));
  } else if (v.has("SLURM_PROCID")) {
    MESHPLAN_TRY(readSlurmVariables(v, e));
  } else {
    return makeError("RANK is not set (start the job with `meshplan run`, "
                     "torchrun or srun, which set RANK and WORLD_SIZE, or "
                     "SLURM_PROCID and SLURM_NTASKS)");
  }
  const char *rankName = e.launcher == "srun" ? "SLURM_PROCID" : "RANK";
  if (e.worldSize < 1 || e.rank >= e.worldSize)
    return makeError(v.shown(rankName) + " is not below " +
                     v.shown(e.worldSizeVariable.c_str()));
  MESHPLAN_TRY(readStore(v, e));
  if (std::optional<std::string> job = v.text("MESHPLAN_JOB"))
    e.job = *job;
  else if (e.launcher == "torchrun")
    e.job = jobName("torchrun-" + v.text("TORCHELASTIC_RUN_ID").value_or("") +
                    "-" + v.text("TORCHELASTIC_RESTART_COUNT").value_or("0"));
  else if (e.launcher == "srun" && v.has("SLURM_JOB_ID"))
    e.job = jobName("slurm-" + *v.text("SLURM_JOB_ID") + "-" +
                    v.text("SLURM_STEP_ID").value_or("0"));
  return e;
}

bool launcherEnvironmentPresent(const EnvironmentLookup &lookup) {
  Variables v(lookup);
  if (v.has("MESHPLAN_STORE"))
    return true;
  if (v.has("TORCHELASTIC_USE_AGENT_STORE") && v.has("RANK"))
    return true;
  auto tasks = v.integer("SLURM_NTASKS");
  return v.has("SLURM_PROCID") && tasks && tasks->value_or(0) > 1;
}

} // namespace meshplan::runtime

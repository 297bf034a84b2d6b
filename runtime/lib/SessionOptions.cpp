//===- SessionOptions.cpp - Session options from the environment ----------===//
//
// sessionOptionsFromEnv: what `meshplan run`, torchrun or Slurm set, read into
// SessionOptions (meshplan/Runtime/Session.h). In a file of its own so that
// the launchers' variables change in one place, apart from the executor.
//
//===----------------------------------------------------------------------===//

#include "meshplan/Runtime/Session.h"

#include "meshplan/Runtime/Backend.h"
#include "meshplan/Runtime/LauncherEnvironment.h"
#include "meshplan/Runtime/Store.h"

#include <cstdlib>
#include <string>

namespace meshplan::runtime {

//===----------------------------------------------------------------------===//
// Options
//===----------------------------------------------------------------------===//

static Result<int64_t> envInt(const char *name, bool required,
                              int64_t fallback) {
  const char *v = std::getenv(name);
  if (!v || !*v) {
    if (required)
      return makeError(std::string(name) +
                       " is not set (start the job with `meshplan run`, "
                       "torchrun or Slurm, which set it)");
    return fallback;
  }
  char *end = nullptr;
  long long x = std::strtoll(v, &end, 10);
  if (*end != '\0' || x < 0)
    return makeError(std::string(name) + "=\"" + v +
                     "\" is not a non-negative integer");
  return static_cast<int64_t>(x);
}

Result<SessionOptions> sessionOptionsFromEnv() {
  SessionOptions o;
  // meshplan run, torchrun or srun (LauncherEnvironment.h).
  auto launched = readLauncherEnvironment();
  if (!launched)
    return launched.error();
  o.rank = launched->rank;
  o.worldSize = launched->worldSize;
  o.worldSizeVariable = launched->worldSizeVariable;
  o.store = launched->store;
  o.localRank = launched->localRank;
  o.job = launched->job.value_or(o.job);
  if (const char *t = std::getenv("MESHPLAN_TIMEOUT"); t && *t) {
    char *end = nullptr;
    double s = std::strtod(t, &end);
    if (*end != '\0' || !(s > 0) || s > 86400)
      return makeError(std::string("MESHPLAN_TIMEOUT=\"") + t +
                       "\" is not a number of seconds in (0, 86400]");
    o.timeout = std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
  }
  if (const char *backend = std::getenv("MESHPLAN_BACKEND");
      backend && *backend) {
    std::string v = backend;
    if (v != "gloo" && v != "nccl")
      return makeError("MESHPLAN_BACKEND=\"" + v +
                       "\": expected \"gloo\" (CPU, the default) or "
                       "\"nccl\" (CUDA devices)");
    if (v == "nccl" && !buildHasCudaBackend())
      return makeError("MESHPLAN_BACKEND=nccl: this build has no CUDA backend "
                       "(docs/cuda.md)");
    o.backend = v;
  }
  if (const char *order = std::getenv("MESHPLAN_REDUCTION_ORDER");
      order && *order) {
    std::string v = order;
    if (v != "key" && v != "gloo")
      return makeError("MESHPLAN_REDUCTION_ORDER=\"" + v +
                       "\": expected \"key\" (sums in the members' key "
                       "order, the default) or \"gloo\" (Gloo's algorithms' "
                       "orders)");
    o.keyOrderReductions = v == "key";
  }
  // Executed-step traces for programs that take their options from here
  // (the C API, a Python session without options): docs/observability.md.
  if (const char *dir = std::getenv("MESHPLAN_TRACE"); dir && *dir) {
    StepTraceOptions t;
    t.dir = dir;
    if (const char *steps = std::getenv("MESHPLAN_TRACE_STEPS");
        steps && *steps) {
      std::string v = steps;
      char *end = nullptr;
      long long first = std::strtoll(v.c_str(), &end, 10);
      long long last = *end == ':' ? std::strtoll(end + 1, &end, 10) : 0;
      if (*end != '\0' || first < 1 || last < first)
        return makeError("MESHPLAN_TRACE_STEPS=\"" + v +
                         "\": expected A:B, the steps traced (1 <= A <= B)");
      t.firstStep = first;
      t.lastStep = last;
    }
    o.trace = t;
  } else if (const char *steps = std::getenv("MESHPLAN_TRACE_STEPS");
             steps && *steps) {
    return makeError("MESHPLAN_TRACE_STEPS is set without MESHPLAN_TRACE "
                     "(the directory to write the trace to)");
  }
  if (const char *ft = std::getenv("MESHPLAN_FT_STORE"); ft && *ft) {
    auto address = parseStoreAddress(ft);
    if (!address)
      return address.error().within("MESHPLAN_FT_STORE");
    if (address->kind != StoreAddress::Kind::Redis)
      return makeError(std::string("MESHPLAN_FT_STORE=\"") + ft +
                       "\": the membership store is a Redis server "
                       "(redis://HOST:PORT)");
    FaultToleranceOptions f;
    f.store = *address;
    auto minReplicas = envInt("MESHPLAN_FT_MIN_REPLICAS", false, 1);
    if (!minReplicas)
      return minReplicas.error();
    if (*minReplicas < 1 || *minReplicas > 1'000'000)
      return makeError("MESHPLAN_FT_MIN_REPLICAS=" +
                       std::to_string(*minReplicas) + " is not in 1..1000000");
    f.minReplicas = static_cast<int>(*minReplicas);
    auto heartbeat = envInt("MESHPLAN_FT_HEARTBEAT_MS", false, 2000);
    if (!heartbeat)
      return heartbeat.error();
    if (*heartbeat < 10 || *heartbeat > 3'600'000)
      return makeError(
          "MESHPLAN_FT_HEARTBEAT_MS=" + std::to_string(*heartbeat) +
          " is not in 10..3600000 (milliseconds)");
    f.heartbeatExpiry = std::chrono::milliseconds(*heartbeat);
    auto incarnation = envInt("MESHPLAN_FT_INCARNATION", false, 0);
    if (!incarnation)
      return incarnation.error();
    f.incarnation = *incarnation;
    o.faultTolerance = f;
  }
  return o;
}

} // namespace meshplan::runtime

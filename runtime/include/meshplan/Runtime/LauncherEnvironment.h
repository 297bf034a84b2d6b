//===- LauncherEnvironment.h - Who started this rank ------------*- C++ -*-===//
//
// A meshplan program opens its session from what its launcher exported
// (docs/runtime.md, "torchrun", "Slurm"):
//
//   meshplan run  RANK, WORLD_SIZE, LOCAL_RANK, MESHPLAN_STORE
//   torchrun      RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT,
//                 TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT,
//                 TORCHELASTIC_USE_AGENT_STORE; its agent hosts a c10d
//                 TCPStore at MASTER_ADDR:MASTER_PORT, which is the store
//                 unless MESHPLAN_STORE names another
//   srun (Slurm)  SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_JOB_ID,
//                 SLURM_STEP_ID; Slurm hosts no key-value store, so
//                 MESHPLAN_STORE (file:DIR on a shared file system, or
//                 redis://HOST:PORT) is required
//
// RANK/WORLD_SIZE win over SLURM_* when both are set by a per-node agent
// (torchrun or `meshplan run` under srun: GROUP_RANK is set); set by hand
// next to SLURM_* they must agree with them. Every error is one line that
// names the variables and their values.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_RUNTIME_LAUNCHERENVIRONMENT_H
#define MESHPLAN_RUNTIME_LAUNCHERENVIRONMENT_H

#include "meshplan/Core/Result.h"
#include "meshplan/Runtime/Store.h"

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace meshplan::runtime {

struct LauncherEnvironment {
  /// "torchrun", "srun" or "RANK/WORLD_SIZE" (meshplan run, or set by hand).
  std::string launcher;
  int64_t rank = 0;
  int64_t worldSize = 1;
  int64_t localRank = 0;
  /// The variable that gave the world size ("WORLD_SIZE", "SLURM_NTASKS"),
  /// for messages that compare it with the plan.
  std::string worldSizeVariable = "WORLD_SIZE";
  StoreAddress store;
  /// The job's namespace in the store: MESHPLAN_JOB, else one that differs
  /// per launch where the store may outlive it (torchrun's store across
  /// restarts: run id and restart count; a shared file: directory across
  /// Slurm jobs and steps: job and step id), else unset (the default).
  std::optional<std::string> job;
};

/// Reads a variable: std::getenv in a process; a map in tests.
using EnvironmentLookup = std::function<const char *(const char *)>;

/// Rank, world size, local rank, store and job from the launcher's
/// variables.
Result<LauncherEnvironment>
readLauncherEnvironment(const EnvironmentLookup &lookup = nullptr);

/// Whether some launcher started this process for a job of several ranks,
/// or named a store: MESHPLAN_STORE, torchrun's TORCHELASTIC_RUN_ID with
/// RANK, or srun's SLURM_PROCID with SLURM_NTASKS > 1. (A lone `srun -n 1`
/// rank of a one-rank plan needs no store.)
bool launcherEnvironmentPresent(const EnvironmentLookup &lookup = nullptr);

} // namespace meshplan::runtime

#endif // MESHPLAN_RUNTIME_LAUNCHERENVIRONMENT_H

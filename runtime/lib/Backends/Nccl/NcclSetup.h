//===- NcclSetup.h - The NCCL backend's host-side decisions -----*- C++ -*-===//
//
// Everything the NCCL backend decides before it calls NCCL, kept free of
// NCCL and CUDA so that it is unit-tested on machines without a GPU: the
// split arguments of a plan communicator, the order in which the lazily
// created splits are made, the world's unique id exchanged through the job's
// store, and the device a local rank uses.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_RUNTIME_LIB_BACKENDS_NCCL_NCCLSETUP_H
#define MESHPLAN_RUNTIME_LIB_BACKENDS_NCCL_NCCLSETUP_H

#include "meshplan/Runtime/Backend.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace meshplan::runtime::nccl {

/// What this rank passes to ncclCommSplit(world, color, key) for a group:
/// the plan's color and key, which every member of the group shares
/// (color) and which order the members (key), checked to fit NCCL's ints.
struct SplitArguments {
  int color = 0;
  int key = 0;
  /// Members the split must produce (checked against ncclCommCount).
  int size = 0;

  bool operator==(const SplitArguments &) const = default;
};

/// The split arguments of `group` on `rank` of a world of `worldSize`: the
/// members are distinct ranks of the world, this rank is the member with
/// the group's key, and the color is a non-negative int (NCCL reserves
/// negative colors for NCCL_SPLIT_NOCOLOR). Errors name the communicator.
Result<SplitArguments> splitArgumentsOf(const GroupSpec &group, int64_t rank,
                                        int64_t worldSize);

/// True when two specs name the same group (id, color, epoch).
bool sameGroup(const GroupSpec &a, const GroupSpec &b);

/// ncclCommSplit is collective over the whole world, so every rank must make
/// the same sequence of splits. Groups are split lazily, in the declared
/// order: to create `requested`, split every declared group before it that
/// is not split yet, then it. Returns those indices into `declared`, in
/// order (empty when `requested` is split already); an error when it was
/// never declared. `split[i]` says whether declared[i] is split.
Result<std::vector<size_t>>
splitSchedule(const std::vector<GroupSpec> &declared,
              const std::vector<bool> &split, const GroupSpec &requested);

/// A fingerprint of the declared groups that every rank of a job must share:
/// their ids and epochs, in order (colors, keys and members differ from rank
/// to rank). The backend compares it across the world before the first
/// split, so ranks whose plans name different communicators get an error
/// instead of mismatched ncclCommSplit calls.
uint64_t declarationFingerprint(const std::vector<GroupSpec> &declared);

/// The store key of the world communicator's unique id (one per epoch, so
/// that a rebuilt world never reads a stale id).
std::string uniqueIdKey(int64_t epoch);

/// Rank 0 calls `generate` (ncclGetUniqueId) and posts the id under `key`;
/// every other rank waits for it (up to the store's timeout). The id must be
/// `bytes` long on every rank. Errors say which rank waited for what.
Result<std::vector<char>>
exchangeUniqueId(Backend &store, int64_t rank, const std::string &key,
                 size_t bytes,
                 const std::function<Result<std::vector<char>>()> &generate);

/// The device of LOCAL_RANK `localRank` among `deviceCount` visible ones
/// (one process per device: NCCL refuses two ranks of one communicator on one
/// device).
Result<int> deviceOfLocalRank(int64_t localRank, int deviceCount);

} // namespace meshplan::runtime::nccl

#endif // MESHPLAN_RUNTIME_LIB_BACKENDS_NCCL_NCCLSETUP_H

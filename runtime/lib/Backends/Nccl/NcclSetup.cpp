//===- NcclSetup.cpp - The NCCL backend's host-side decisions -------------===//

#include "NcclSetup.h"

#include <climits>
#include <set>

namespace meshplan::runtime::nccl {

static std::string describe(const GroupSpec &g) {
  return "communicator \"" + g.id + "\" (color " + std::to_string(g.color) +
         ", " + std::to_string(g.ranks.size()) + " members)";
}

Result<SplitArguments> splitArgumentsOf(const GroupSpec &group, int64_t rank,
                                        int64_t worldSize) {
  auto fail = [&](const std::string &what) {
    return makeError(describe(group) + ": " + what);
  };
  if (group.ranks.empty())
    return fail("has no members");
  if (static_cast<int64_t>(group.ranks.size()) > worldSize)
    return fail("has more members than the world's " +
                std::to_string(worldSize) + " ranks");
  std::set<int64_t> seen;
  for (int64_t r : group.ranks) {
    if (r < 0 || r >= worldSize)
      return fail("member " + std::to_string(r) + " is not a rank of the " +
                  std::to_string(worldSize) + "-rank world");
    if (!seen.insert(r).second)
      return fail("member " + std::to_string(r) + " appears twice");
  }
  if (group.key < 0 || group.key >= static_cast<int64_t>(group.ranks.size()))
    return fail("key " + std::to_string(group.key) + " is not a member index");
  if (group.ranks[size_t(group.key)] != rank)
    return fail("key " + std::to_string(group.key) + " is rank " +
                std::to_string(group.ranks[size_t(group.key)]) +
                ", not this rank " + std::to_string(rank));
  if (group.color < 0 || group.color > INT_MAX)
    return fail("color " + std::to_string(group.color) +
                " does not fit ncclCommSplit's non-negative int");
  // Keys are member indices, so they fit whenever the world's size does.
  return SplitArguments{static_cast<int>(group.color),
                        static_cast<int>(group.key),
                        static_cast<int>(group.ranks.size())};
}

bool sameGroup(const GroupSpec &a, const GroupSpec &b) {
  return a.id == b.id && a.color == b.color && a.epoch == b.epoch;
}

Result<std::vector<size_t>>
splitSchedule(const std::vector<GroupSpec> &declared,
              const std::vector<bool> &split, const GroupSpec &requested) {
  size_t at = declared.size();
  for (size_t i = 0; i < declared.size(); ++i)
    if (sameGroup(declared[i], requested)) {
      at = i;
      break;
    }
  if (at == declared.size())
    return makeError(describe(requested) +
                     " was not declared: the NCCL backend splits only the "
                     "groups named by declareGroups, in that order, so that "
                     "every rank makes the same ncclCommSplit calls");
  std::vector<size_t> order;
  for (size_t i = 0; i <= at; ++i)
    if (i >= split.size() || !split[i])
      order.push_back(i);
  return order;
}

uint64_t declarationFingerprint(const std::vector<GroupSpec> &declared) {
  // FNV-1a over "<count>;<id>\0<epoch>;..." (ids cannot hold NUL).
  uint64_t h = 0xCBF29CE484222325ull;
  auto mix = [&](const std::string &text) {
    for (unsigned char c : text) {
      h ^= c;
      h *= 0x100000001B3ull;
    }
  };
  mix(std::to_string(declared.size()) + ";");
  for (const GroupSpec &g : declared) {
    mix(g.id);
    mix(std::string(1, '\0') + std::to_string(g.epoch) + ";");
  }
  return h;
}

std::string uniqueIdKey(int64_t epoch) {
  return "nccl/e" + std::to_string(epoch) + "/world-unique-id";
}

Result<std::vector<char>>
exchangeUniqueId(Backend &store, int64_t rank, const std::string &key,
                 size_t bytes,
                 const std::function<Result<std::vector<char>>()> &generate) {
  if (rank == 0) {
    auto id = generate();
    if (!id)
      return id.error().within("rank 0: creating the NCCL unique id");
    if (id->size() != bytes)
      return makeError("rank 0: the NCCL unique id has " +
                       std::to_string(id->size()) + " bytes, expected " +
                       std::to_string(bytes));
    if (auto ok = store.storeSet(key, *id); !ok)
      return ok.error().within("rank 0: posting the NCCL unique id \"" + key +
                               "\" to the store");
    return id;
  }
  auto id = store.storeGet(key);
  if (!id)
    return id.error().within("rank " + std::to_string(rank) +
                             ": waiting for rank 0's NCCL unique id \"" + key +
                             "\" in the store");
  if (id->size() != bytes)
    return makeError("rank " + std::to_string(rank) +
                     ": the NCCL unique id \"" + key + "\" in the store has " +
                     std::to_string(id->size()) + " bytes, expected " +
                     std::to_string(bytes) +
                     " (another job's key, or a different NCCL?)");
  return id;
}

Result<int> deviceOfLocalRank(int64_t localRank, int deviceCount) {
  if (deviceCount <= 0)
    return makeError("no CUDA device is visible to this process");
  if (localRank < 0 || localRank >= deviceCount)
    return makeError("LOCAL_RANK=" + std::to_string(localRank) +
                     " has no device: this process sees " +
                     std::to_string(deviceCount) +
                     " CUDA device(s) (CUDA_VISIBLE_DEVICES?); the NCCL "
                     "backend runs one rank per device");
  return static_cast<int>(localRank);
}

} // namespace meshplan::runtime::nccl

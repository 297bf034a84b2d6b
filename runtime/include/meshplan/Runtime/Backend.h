//===- Backend.h - Collectives behind one interface -----------------------===//
//
// A backend turns the communicators a plan names into process groups and runs
// collectives on them. It knows collectives and stores, nothing of plans: the
// executor packs buffers, picks the communicator and calls it. Gloo (CPU) is
// the implementation today; NCCL (CUDA) comes behind the same interface, with
// `ncclCommSplit` on (color, key).
//
// A communicator is the group of one plan communicator id on this rank:
// (id, color) keys it, so groups with one id and different colors never share
// rendezvous keys; `epoch` is part of the key too, so a later membership
// change (fault-tolerant replicas) creates fresh groups instead of reusing
// stale ones.
//
// Errors are values. A failed collective (peer gone, timeout, size mismatch)
// is reported with the backend's own words; the executor adds the
// communicator, instruction and collective number.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_RUNTIME_BACKEND_H
#define MESHPLAN_RUNTIME_BACKEND_H

#include "meshplan/Core/Layout.h"
#include "meshplan/Core/Result.h"
#include "meshplan/Plan/Plan.h"
#include "meshplan/Runtime/Store.h"

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace meshplan::runtime {

using plan::DType;

/// What identifies a group: the plan's communicator, as this rank sees it.
struct GroupSpec {
  std::string id;
  int64_t color = 0;
  /// Global ranks of the members, in key order.
  std::vector<int64_t> ranks;
  /// This rank's key (its index in `ranks`).
  int64_t key = 0;
  /// Membership generation (0 until membership changes at run time).
  int64_t epoch = 0;
};

/// One process group. Buffers are host memory; counts are elements of
/// `dtype`. Not thread-safe: the executor issues one collective at a time
/// per communicator, in plan order.
class Communicator {
public:
  virtual ~Communicator();
  virtual const GroupSpec &group() const = 0;
  int64_t size() const { return static_cast<int64_t>(group().ranks.size()); }
  int64_t key() const { return group().key; }

  /// out[k * count .. (k+1) * count) = member k's `in` (count elements).
  virtual Result<void> allGather(const void *in, void *out, int64_t count,
                                 DType dtype) = 0;
  /// in holds size() blocks of `count`; out = reduce over members of block
  /// key(). Avg divides the sum by size().
  virtual Result<void> reduceScatter(const void *in, void *out, int64_t count,
                                     DType dtype, ReduceOp op) = 0;
  /// In place over `count` elements.
  virtual Result<void> allReduce(void *data, int64_t count, DType dtype,
                                 ReduceOp op) = 0;
  /// In place; `root` is a key.
  virtual Result<void> broadcast(void *data, int64_t count, DType dtype,
                                 int64_t root) = 0;
  /// in and out hold size() blocks of `count`: block k of in goes to member
  /// k, block k of out comes from member k.
  virtual Result<void> allToAll(const void *in, void *out, int64_t count,
                                DType dtype) = 0;
  /// Point to point within the group: sends `count` elements to the member
  /// with key `sendTo` and receives `count` from key `recvFrom` (either may
  /// be -1: none). Every member calls it at the same point of the program
  /// (a permute; pipeline stages' sends and receives later).
  virtual Result<void> sendRecv(const void *send, int64_t sendTo, void *recv,
                                int64_t recvFrom, int64_t count,
                                DType dtype) = 0;
  /// Returns when every member has called it.
  virtual Result<void> barrier() = 0;

  /// Point to point on a pair (a plan's send and recv, pipeline stages):
  /// sends `count` elements to the member with key `to` / receives them from
  /// the member with key `from`. `tag` names the transfer: a send pairs with
  /// the peer's recv of the same tag, whatever else either side transfers in
  /// between (docs/plan-format.md). Blocking; a backend without transfers
  /// says so.
  virtual Result<void> send(const void *data, int64_t to, int64_t count,
                            DType dtype, std::string_view tag);
  virtual Result<void> recv(void *data, int64_t from, int64_t count,
                            DType dtype, std::string_view tag);
};

inline Result<void> Communicator::send(const void *, int64_t, int64_t, DType,
                                       std::string_view) {
  return makeError("communicator \"" + group().id +
                   "\": this backend has no point-to-point transfers");
}
inline Result<void> Communicator::recv(void *, int64_t, int64_t, DType,
                                       std::string_view) {
  return makeError("communicator \"" + group().id +
                   "\": this backend has no point-to-point transfers");
}

struct BackendOptions {
  StoreAddress store;
  /// This process's global rank and the job's world size.
  int64_t rank = 0;
  int64_t worldSize = 1;
  /// Every rendezvous and collective gives up after this long.
  std::chrono::milliseconds timeout{60000};
  /// Namespace of this job's keys in the store (several jobs may share a
  /// Redis server).
  std::string job = "meshplan";
  /// Floating-point sums and products over three or more members in the
  /// members' key order (deterministic, docs/runtime.md "Determinism"); off:
  /// Gloo's own ring and halving-doubling orders, faster for small tensors.
  bool keyOrderReductions = true;
  /// Address peers connect to; empty: 127.0.0.1 for a file store (one
  /// machine), the host name otherwise. MESHPLAN_HOSTNAME overrides.
  std::string hostname;
};

class Backend {
public:
  virtual ~Backend();
  /// "gloo" or "nccl".
  virtual std::string_view name() const = 0;
  /// Creates the group (a rendezvous of its members only: the cost grows
  /// with the group, never with the world). Every member must call it.
  virtual Result<std::unique_ptr<Communicator>>
  createCommunicator(const GroupSpec &group) = 0;

  /// The job's rendezvous store, for small out-of-band exchanges that need
  /// no communicator (a checkpoint's chunk records go to one rank through
  /// it). Keys are namespaced by the job; a key is written once.
  virtual Result<void> storeSet(const std::string &key,
                                const std::vector<char> &value) = 0;
  /// Waits up to the timeout for `key`, then returns its value.
  virtual Result<std::vector<char>> storeGet(const std::string &key) = 0;
};

/// The Gloo backend (TCP transport; FileStore or RedisStore rendezvous).
Result<std::unique_ptr<Backend>> createGlooBackend(const BackendOptions &);

} // namespace meshplan::runtime

#endif // MESHPLAN_RUNTIME_BACKEND_H

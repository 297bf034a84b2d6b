//===- Backend.h - Collectives behind one interface -----------------------===//
//
// A backend turns the communicators a plan names into process groups and runs
// collectives on them. It knows collectives and stores, nothing of plans: the
// executor packs buffers, picks the communicator and calls it. Gloo (CPU,
// host memory) is the executor's today; NCCL (CUDA devices, NcclBackend.h,
// CUDA builds only) implements the same interface with `ncclCommSplit` on
// (color, key).
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
// Memory kinds. A Gloo communicator takes host buffers and returns when the
// collective is done. A device communicator (NCCL) takes device buffers of
// this process's device, enqueues the collective on the stream given by
// setStream and returns once it is enqueued; synchronize() (or an event the
// executor records on the stream) observes completion. The interface names
// no CUDA type: a stream travels as an opaque DeviceStream, so the public
// headers, and a trainer that does not use CUDA, need no CUDA at all.
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
#include <functional>
#include <memory>
#include <optional>
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
  /// Membership generation (0 until membership changes at run time): a
  /// fault-tolerant group of a later epoch is a fresh group.
  int64_t epoch = 0;
  /// The incarnation of this rank's replica group (a fault-tolerant job's
  /// launcher restarts a failed group with the next one): the group's own
  /// communicators of a restarted group are fresh groups too, so they never
  /// meet the keys their dead predecessor left in the store.
  int64_t incarnation = 0;
  /// Avg divides by this instead of the member count when > 0: a
  /// fault-tolerant group running with some members missing still averages
  /// over its nominal size, the survivors having processed the missing
  /// members' share of the batch (docs/fault-tolerance.md).
  int64_t nominalSize = 0;
  /// Polled while the rendezvous waits for members (every few tens of
  /// milliseconds): a reason ends it with an error naming the reason. A
  /// fault-tolerant group of an epoch that ended, or one with a member
  /// known dead, would otherwise wait the whole timeout for members that
  /// never come. Unset: wait up to the timeout.
  std::function<std::optional<std::string>()> cancelled;
  /// With `cancelled`: the bound on connecting to the members once their
  /// addresses are known (0: the backend's timeout). A member that gives up
  /// the rendezvous after publishing its address never connects, and its
  /// peers would otherwise wait for it past the whole timeout.
  std::chrono::milliseconds connectTimeout{0};
};

/// Where a communicator's buffers live and when its calls complete.
enum class MemoryKind : uint8_t {
  /// Host memory; every call returns when the collective has completed.
  Host,
  /// Device memory of this process's device; every call returns once the
  /// collective is enqueued on the communicator's stream.
  Device
};

/// A device stream, opaque (a cudaStream_t for the NCCL backend); null is
/// the device's default stream.
struct DeviceStream {
  void *handle = nullptr;
};

/// One process group. Buffers are of the communicator's memoryKind(); counts
/// are elements of `dtype`. Not thread-safe: the executor issues one
/// collective at a time per communicator, in plan order.
class Communicator {
public:
  virtual ~Communicator();
  virtual const GroupSpec &group() const = 0;
  int64_t size() const { return static_cast<int64_t>(group().ranks.size()); }
  int64_t key() const { return group().key; }
  /// What Avg divides by: GroupSpec::nominalSize, or the member count.
  int64_t avgDivisor() const {
    return group().nominalSize > 0 ? group().nominalSize : size();
  }

  /// Host for Gloo, Device for NCCL.
  virtual MemoryKind memoryKind() const { return MemoryKind::Host; }
  /// Device communicators: the stream that later calls enqueue on (the
  /// executor sets its plan stream's). A host communicator refuses it.
  virtual Result<void> setStream(DeviceStream stream);
  /// Device communicators: returns when everything enqueued so far has
  /// completed, polling for the backend's asynchronous errors; past the
  /// backend's timeout the communicator is aborted and the error says so.
  /// Host communicators return at once (their calls completed already).
  virtual Result<void> synchronize();

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
  /// The all-reduce of a fault-tolerant group with members missing, whose
  /// batch shares live members processed as well (docs/fault-tolerance.md,
  /// "Exact sums"). `mine` holds this member's contributions, each
  /// `count` elements; `layout[k]` names, for the member with key k, the
  /// nominal member each of its contributions stands for (this member's
  /// own list is layout[key()], in the order of `mine`). `out` gets the
  /// left fold over the nominal members in order, then divided by the
  /// nominal size for Avg: the very sums an all-reduce over the full group
  /// takes in key order. Host memory; a backend without it says so.
  virtual Result<void>
  allReduceShares(const std::vector<const void *> &mine, void *out,
                  int64_t count, DType dtype, ReduceOp op,
                  const std::vector<std::vector<int64_t>> &layout);
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

  /// Makes the collective in progress on another thread, and every later
  /// one, fail promptly with `why` instead of waiting for the timeout (a
  /// fault-tolerant group whose epoch has moved on, its peer cut off
  /// without closing the connection). Thread-safe; the communicator is
  /// unusable afterwards. A backend that cannot abort ignores it: its
  /// calls end at the timeout as before.
  virtual void abort(const std::string &why) { (void)why; }
  /// True when this backend's abort() ends a collective in progress.
  virtual bool canAbort() const { return false; }

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
inline Result<void>
Communicator::allReduceShares(const std::vector<const void *> &, void *,
                              int64_t, DType, ReduceOp,
                              const std::vector<std::vector<int64_t>> &) {
  return makeError("communicator \"" + group().id +
                   "\": this backend cannot sum several batch shares per "
                   "member (a fault-tolerant group with members missing)");
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
  /// Gloo's own ring and halving-doubling orders (kept to compare against).
  bool keyOrderReductions = true;
  /// Address peers connect to; empty: 127.0.0.1 for a file store (one
  /// machine), the host name otherwise. MESHPLAN_HOSTNAME overrides.
  std::string hostname;
  /// This process's index on its machine (LOCAL_RANK); device backends use
  /// the device of that index.
  int64_t localRank = 0;
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
  /// The value of `key` if some rank has set it, without waiting; nullopt
  /// if none has (or the backend cannot tell). A rank whose step failed on
  /// a collective reads what a peer that failed first reported here.
  virtual Result<std::optional<std::vector<char>>>
  storePeek(const std::string &key);

  /// The memory kind of the communicators it creates.
  virtual MemoryKind memoryKind() const { return MemoryKind::Host; }
  /// Names, before any createCommunicator, every group this rank may create,
  /// in an order all ranks share (the plan's communicator list). A backend
  /// whose group creation is collective over the whole job (NCCL's
  /// ncclCommSplit) creates groups in this order, lazily, so that every rank
  /// makes the same sequence of collective calls; Gloo ignores it.
  virtual Result<void> declareGroups(const std::vector<GroupSpec> &groups);
};

/// The Gloo backend (TCP transport; FileStore or RedisStore rendezvous).
Result<std::unique_ptr<Backend>> createGlooBackend(const BackendOptions &);

/// True when this build has the CUDA kernels and the NCCL backend
/// (MESHPLAN_CUDA, docs/cuda.md). Without them, asking for the "nccl"
/// backend fails with "this build has no CUDA backend".
bool buildHasCudaBackend();

} // namespace meshplan::runtime

#endif // MESHPLAN_RUNTIME_BACKEND_H

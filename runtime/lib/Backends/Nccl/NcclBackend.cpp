//===- NcclBackend.cpp - Collectives on NCCL (CUDA devices) ---------------===//
//
// One world communicator per job, from an ncclUniqueId that rank 0 posts to
// the job's store (the same file or Redis store the Gloo backend uses; the
// store is borrowed from a Gloo backend, which creates no connection until a
// Gloo group is made). Every plan communicator is an ncclCommSplit of the
// world with the plan's color and key: no per-group unique id, no O(world)
// work on any rank. A split is collective over the whole world, so groups
// are split lazily but in the order declareGroups gave (NcclSetup.h).
//
// Every communicator runs in NCCL's non-blocking mode (config.blocking = 0):
// no NCCL call can hang the host. A call that returns ncclInProgress, and
// every synchronize(), polls ncclCommGetAsyncError (and the stream) until
// done, an error, or the backend's timeout; on an error or a timeout every
// communicator of the backend is aborted with ncclCommAbort (a stalled
// collective would otherwise keep the device busy forever) and the error
// names the communicator, its members and the collective's number on it; the
// executor adds the instruction, as on Gloo.
//
// Sums and products over three or more members are taken in the members' key
// order, as on Gloo (docs/runtime.md "Determinism"): an all-to-all and the
// key-order block reduction kernel, so NCCL and Gloo give the same bits.
//
//===----------------------------------------------------------------------===//

#include "meshplan/Runtime/NcclBackend.h"

#include "../../Kernels/Cuda/CudaKernels.h"
#include "NcclSetup.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>

namespace meshplan::runtime {

namespace {

using Clock = std::chrono::steady_clock;

std::string cudaText(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

Result<ncclDataType_t> ncclTypeOf(DType dtype) {
  switch (dtype) {
  case DType::Float32:
    return ncclFloat32;
  case DType::BFloat16:
    return ncclBfloat16;
  case DType::Float16:
    return ncclFloat16;
  case DType::Float8E4M3:
    return ncclFloat8e4m3;
  case DType::Float8E5M2:
    return ncclFloat8e5m2;
  case DType::Float64:
    return ncclFloat64;
  case DType::Int8:
    return ncclInt8;
  case DType::UInt8:
    return ncclUint8;
  case DType::Int32:
    return ncclInt32;
  case DType::Int64:
    return ncclInt64;
  }
  return makeError("dtype " + std::string(plan::dtypeName(dtype)) +
                   " has no NCCL type");
}

ncclRedOp_t ncclOpOf(ReduceOp op) {
  switch (op) {
  case ReduceOp::Sum:
    return ncclSum;
  case ReduceOp::Avg:
    return ncclAvg;
  case ReduceOp::Max:
    return ncclMax;
  case ReduceOp::Min:
    return ncclMin;
  case ReduceOp::Product:
    return ncclProd;
  }
  return ncclSum;
}

/// One NCCL communicator, shared by the backend (which aborts them all on a
/// failure) and the Communicator that uses it.
struct Handle {
  ncclComm_t comm = nullptr;
  std::string name; ///< kept alive for ncclConfig_t::commName
  /// Set by Registry::abortAll: ncclCommAbort freed the communicator (in
  /// non-blocking mode asynchronously), so nothing may touch it again.
  std::atomic<bool> aborted{false};

  ~Handle() {
    if (!comm || aborted)
      return;
    // A healthy communicator is finalized (flushing what is in flight) and
    // destroyed; a broken one can only be aborted. Finalize is non-blocking
    // here; destroy after it completes, and abort if it does not in time.
    ncclResult_t state = ncclSuccess;
    bool healthy = ncclCommGetAsyncError(comm, &state) == ncclSuccess &&
                   state == ncclSuccess;
    ncclResult_t finalize =
        healthy ? ncclCommFinalize(comm) : ncclInternalError;
    if (finalize == ncclSuccess || finalize == ncclInProgress) {
      auto deadline = Clock::now() + std::chrono::seconds(10);
      do {
        if (ncclCommGetAsyncError(comm, &state) != ncclSuccess)
          break;
        if (state != ncclInProgress)
          break;
        std::this_thread::yield();
      } while (Clock::now() < deadline);
      if (state == ncclSuccess) {
        ncclCommDestroy(comm);
        return;
      }
    }
    ncclCommAbort(comm);
  }
};

/// Every communicator of one backend, so that a failure aborts them all.
struct Registry {
  std::mutex mutex;
  std::vector<std::weak_ptr<Handle>> handles;
  std::chrono::milliseconds timeout{60000};

  void add(const std::shared_ptr<Handle> &h) {
    std::lock_guard<std::mutex> lock(mutex);
    handles.push_back(h);
  }
  void abortAll() {
    std::lock_guard<std::mutex> lock(mutex);
    for (auto &weak : handles)
      if (auto h = weak.lock(); h && h->comm && !h->aborted) {
        ncclCommAbort(h->comm);
        h->aborted = true;
      }
  }
};

std::string ncclText(ncclResult_t r, ncclComm_t comm) {
  std::string text = ncclGetErrorString(r);
  if (comm)
    if (const char *last = ncclGetLastError(comm); last && *last)
      text += ": " + std::string(last);
  return text;
}

/// Waits until `h`'s pending operation (an init, a split, an enqueue that
/// returned ncclInProgress) settles. `what` starts the error.
/// Between two polls of NCCL's state: yield for the first ones, then
/// sleep. Non-blocking NCCL completes an enqueue within microseconds, and a
/// fixed 50 us sleep made every collective cost at least that on the host
/// (the first GPU run, docs/cuda.md).
void pause(int &polls) {
  if (++polls < 2000)
    std::this_thread::yield();
  else
    std::this_thread::sleep_for(std::chrono::microseconds(20));
}

Result<void> settle(Registry &registry, Handle &h, const std::string &what) {
  auto deadline = Clock::now() + registry.timeout;
  int polls = 0;
  while (true) {
    if (h.aborted)
      return makeError(what + ": the communicator was aborted after an "
                              "earlier failure");
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(h.comm, &state);
    if (r != ncclSuccess)
      state = r;
    if (state == ncclSuccess)
      return {};
    if (state != ncclInProgress) {
      std::string text = ncclText(state, h.comm);
      registry.abortAll();
      return makeError(what + ": NCCL: " + text +
                       " (every communicator of this rank was aborted)");
    }
    if (Clock::now() > deadline) {
      registry.abortAll();
      return makeError(what + ": no progress within the timeout of " +
                       std::to_string(registry.timeout.count() / 1000.0) +
                       " s (a member missing or stalled?); every "
                       "communicator of this rank was aborted");
    }
    pause(polls);
  }
}

/// The result of an NCCL call in non-blocking mode: done, in progress
/// (settle), or failed.
Result<void> check(Registry &registry, Handle &h, ncclResult_t r,
                   const std::string &what) {
  if (r == ncclSuccess)
    return {};
  if (r == ncclInProgress)
    return settle(registry, h, what);
  std::string text = ncclText(r, h.comm);
  registry.abortAll();
  return makeError(what + ": NCCL: " + text +
                   " (every communicator of this rank was aborted)");
}

/// Waits until `stream` has run everything enqueued on it, polling `h`'s
/// asynchronous error (a peer gone shows only there) within the timeout.
Result<void> waitForStream(Registry &registry, Handle &h, cudaStream_t stream,
                           const std::string &what) {
  auto deadline = Clock::now() + registry.timeout;
  int polls = 0;
  while (true) {
    cudaError_t e = cudaStreamQuery(stream);
    if (e == cudaSuccess)
      return {};
    if (e != cudaErrorNotReady)
      return makeError(what + ": " + cudaText(e));
    if (h.aborted)
      return makeError(what + ": the communicator was aborted after an "
                              "earlier failure");
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(h.comm, &state);
    if (state != ncclSuccess && state != ncclInProgress) {
      std::string text = ncclText(state, h.comm);
      registry.abortAll();
      return makeError(what + ": NCCL: " + text +
                       " (every communicator of this rank was aborted)");
    }
    if (Clock::now() > deadline) {
      registry.abortAll();
      return makeError(what + ": not complete within the timeout of " +
                       std::to_string(registry.timeout.count() / 1000.0) +
                       " s (a member missing or stalled?); every "
                       "communicator of this rank was aborted");
    }
    pause(polls);
  }
}

ncclConfig_t nonBlockingConfig(const Handle &h) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.commName = h.name.c_str();
  return config;
}

//===----------------------------------------------------------------------===//
// Communicator
//===----------------------------------------------------------------------===//

/// Device memory the key-order reductions stage blocks in. It grows, in
/// stream order (cudaMallocAsync), to the largest collective of the first
/// step, and is reused afterwards, so later steps allocate nothing.
class Scratch {
public:
  ~Scratch() {
    if (data)
      cudaFree(data);
  }
  Result<std::byte *> get(size_t bytes, cudaStream_t stream) {
    if (bytes <= capacity)
      return data;
    if (data)
      cudaFreeAsync(data, stream);
    data = nullptr;
    capacity = 0;
    void *p = nullptr;
    if (cudaError_t e = cudaMallocAsync(&p, bytes, stream))
      return makeError("cannot allocate " + std::to_string(bytes) +
                       " bytes of device scratch: " + cudaText(e));
    data = static_cast<std::byte *>(p);
    capacity = bytes;
    return data;
  }

private:
  std::byte *data = nullptr;
  size_t capacity = 0;
};

class NcclCommunicator final : public Communicator {
public:
  NcclCommunicator(GroupSpec spec, std::shared_ptr<Handle> handle,
                   std::shared_ptr<Registry> registry, bool keyOrder)
      : spec(std::move(spec)), handle(std::move(handle)),
        registry(std::move(registry)), keyOrder(keyOrder) {}

  const GroupSpec &group() const override { return spec; }
  MemoryKind memoryKind() const override { return MemoryKind::Device; }

  Result<void> setStream(DeviceStream s) override {
    stream = static_cast<cudaStream_t>(s.handle);
    return {};
  }

  Result<void> synchronize() override {
    return waitForStream(*registry, *handle, stream,
                         where("waiting for the collective"));
  }

  Result<void> allGather(const void *in, void *out, int64_t count,
                         DType dtype) override {
    auto type = ncclTypeOf(dtype);
    if (!type)
      return type.error();
    return call("all_gather", [&] {
      return ncclAllGather(in, out, size_t(count), *type, handle->comm, stream);
    });
  }

  Result<void> reduceScatter(const void *in, void *out, int64_t count,
                             DType dtype, ReduceOp op) override {
    auto type = ncclTypeOf(dtype);
    if (!type)
      return type.error();
    if (!orderMatters(dtype, op))
      return call("reduce_scatter", [&] {
        return ncclReduceScatter(in, out, size_t(count), *type, ncclOpOf(op),
                                 handle->comm, stream);
      });
    if (count == 0)
      return {};
    // Key order: every member's block k to member k, then block 0 op block
    // 1 op ... in key order on this device.
    size_t block = size_t(count) * size_t(plan::dtypeBytes(dtype));
    auto staged = scratch.get(block * size_t(size()), stream);
    if (!staged)
      return staged.error().within(where("reduce_scatter"));
    MESHPLAN_TRY(call("reduce_scatter (all-to-all in key order)", [&] {
      return ncclAlltoAll(in, *staged, size_t(count), *type, handle->comm,
                          stream);
    }));
    return reduceLocally(*staged, out, count, dtype, op);
  }

  Result<void> allReduce(void *data, int64_t count, DType dtype,
                         ReduceOp op) override {
    auto type = ncclTypeOf(dtype);
    if (!type)
      return type.error();
    if (!orderMatters(dtype, op))
      return call("all_reduce", [&] {
        return ncclAllReduce(data, data, size_t(count), *type, ncclOpOf(op),
                             handle->comm, stream);
      });
    if (count == 0)
      return {};
    // Key order: a key-order reduce-scatter of the data padded to n equal
    // blocks, then an all-gather. Each element is combined in key order
    // whatever block it falls in, so the bits equal Gloo's.
    int64_t n = size();
    int64_t chunk = (count + n - 1) / n;
    size_t esize = size_t(plan::dtypeBytes(dtype));
    size_t padded = size_t(chunk * n) * esize;
    // [padded input | exchanged blocks | reduced chunk]
    auto staged = scratch.get(2 * padded + size_t(chunk) * esize, stream);
    if (!staged)
      return staged.error().within(where("all_reduce"));
    std::byte *input = *staged, *blocks = input + padded,
              *reduced = blocks + padded;
    size_t bytes = size_t(count) * esize;
    if (cudaError_t e = cudaMemcpyAsync(input, data, bytes,
                                        cudaMemcpyDeviceToDevice, stream))
      return makeError(where("all_reduce") + ": " + cudaText(e));
    if (padded > bytes)
      if (cudaError_t e =
              cudaMemsetAsync(input + bytes, 0, padded - bytes, stream))
        return makeError(where("all_reduce") + ": " + cudaText(e));
    MESHPLAN_TRY(call("all_reduce (all-to-all in key order)", [&] {
      return ncclAlltoAll(input, blocks, size_t(chunk), *type, handle->comm,
                          stream);
    }));
    MESHPLAN_TRY(reduceLocally(blocks, reduced, chunk, dtype, op));
    MESHPLAN_TRY(call("all_reduce (all-gather)", [&] {
      return ncclAllGather(reduced, input, size_t(chunk), *type, handle->comm,
                           stream);
    }));
    if (cudaError_t e = cudaMemcpyAsync(data, input, bytes,
                                        cudaMemcpyDeviceToDevice, stream))
      return makeError(where("all_reduce") + ": " + cudaText(e));
    return {};
  }

  Result<void> broadcast(void *data, int64_t count, DType dtype,
                         int64_t root) override {
    auto type = ncclTypeOf(dtype);
    if (!type)
      return type.error();
    if (root < 0 || root >= size())
      return makeError(where("broadcast") + ": root key " +
                       std::to_string(root) + " is not a member");
    return call("broadcast", [&] {
      return ncclBroadcast(data, data, size_t(count), *type, int(root),
                           handle->comm, stream);
    });
  }

  Result<void> allToAll(const void *in, void *out, int64_t count,
                        DType dtype) override {
    auto type = ncclTypeOf(dtype);
    if (!type)
      return type.error();
    return call("all_to_all", [&] {
      return ncclAlltoAll(in, out, size_t(count), *type, handle->comm, stream);
    });
  }

  Result<void> sendRecv(const void *send, int64_t sendTo, void *recv,
                        int64_t recvFrom, int64_t count, DType dtype) override {
    auto type = ncclTypeOf(dtype);
    if (!type)
      return type.error();
    if (sendTo >= size() || recvFrom >= size())
      return makeError(where("send/recv") + ": peer key out of range");
    return call("send/recv", [&] {
      // Both in one group, so that two members exchanging with each other
      // cannot deadlock on the order of their calls.
      ncclResult_t r = ncclGroupStart();
      if (r != ncclSuccess)
        return r;
      if (sendTo >= 0)
        r = ncclSend(send, size_t(count), *type, int(sendTo), handle->comm,
                     stream);
      if (r == ncclSuccess && recvFrom >= 0)
        r = ncclRecv(recv, size_t(count), *type, int(recvFrom), handle->comm,
                     stream);
      ncclResult_t end = ncclGroupEnd();
      return r != ncclSuccess ? r : end;
    });
  }

  /// A plan's tagged transfers (pipeline stages). NCCL matches a pair's
  /// sends and receives in issue order, not by tag; that pairs the same
  /// transfers, because the executor issues a communicator's transfers in
  /// program order and `meshplan verify` proved the plans complete under
  /// rendezvous semantics in that order (docs/plan-format.md).
  Result<void> send(const void *data, int64_t to, int64_t count, DType dtype,
                    std::string_view) override {
    if (to < 0)
      return makeError(where("send") + ": peer key out of range");
    return sendRecv(data, to, nullptr, -1, count, dtype);
  }
  Result<void> recv(void *data, int64_t from, int64_t count, DType dtype,
                    std::string_view) override {
    if (from < 0)
      return makeError(where("recv") + ": peer key out of range");
    return sendRecv(nullptr, -1, data, from, count, dtype);
  }

  Result<void> barrier() override {
    // An all-reduce of one device word, waited for: returns when every
    // member has enqueued its part and the device has run it.
    auto word = scratch.get(sizeof(float), stream);
    if (!word)
      return word.error().within(where("barrier"));
    MESHPLAN_TRY(call("barrier", [&] {
      return ncclAllReduce(*word, *word, 1, ncclFloat32, ncclSum, handle->comm,
                           stream);
    }));
    return synchronize();
  }

private:
  /// "collective #N (OP) on communicator "ID" (color C, ranks [..])".
  std::string where(const std::string &op) const {
    std::string ranks;
    for (int64_t r : spec.ranks)
      ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
    return "collective #" + std::to_string(collectives) + " (" + op +
           ") on NCCL communicator \"" + spec.id + "\" (color " +
           std::to_string(spec.color) + ", ranks [" + ranks + "])";
  }

  template <typename F> Result<void> call(const std::string &op, F &&enqueue) {
    ++collectives;
    if (handle->aborted)
      return makeError(where(op) + ": the communicator was aborted after an "
                                   "earlier failure");
    return check(*registry, *handle, enqueue(), where(op));
  }

  bool orderMatters(DType dtype, ReduceOp op) const {
    bool floating = dtype == DType::Float32 || dtype == DType::BFloat16;
    return keyOrder && size() > 2 && floating && op != ReduceOp::Max &&
           op != ReduceOp::Min;
  }

  Result<void> reduceLocally(const void *blocks, void *out, int64_t count,
                             DType dtype, ReduceOp op) {
    cuda::BlockReduce kind = op == ReduceOp::Avg ? cuda::BlockReduce::Avg
                             : op == ReduceOp::Product
                                 ? cuda::BlockReduce::Product
                                 : cuda::BlockReduce::Sum;
    if (cudaError_t e = cuda::reduceBlocksInKeyOrder(
            blocks, size(), count, out, dtype == DType::BFloat16, kind, stream))
      return makeError(where("key-order reduction") + ": " + cudaText(e));
    return {};
  }

  GroupSpec spec;
  std::shared_ptr<Handle> handle;
  std::shared_ptr<Registry> registry;
  bool keyOrder;
  cudaStream_t stream = nullptr;
  int64_t collectives = 0;
  Scratch scratch;
};

//===----------------------------------------------------------------------===//
// Backend
//===----------------------------------------------------------------------===//

class NcclBackend final : public Backend {
public:
  static Result<std::unique_ptr<Backend>> create(const BackendOptions &o) {
    int devices = 0;
    if (cudaError_t e = cudaGetDeviceCount(&devices))
      return makeError("the NCCL backend needs a CUDA device: " + cudaText(e));
    auto device = nccl::deviceOfLocalRank(o.localRank, devices);
    if (!device)
      return device.error();
    if (cudaError_t e = cudaSetDevice(*device))
      return makeError("cannot use CUDA device " + std::to_string(*device) +
                       " (LOCAL_RANK " + std::to_string(o.localRank) +
                       "): " + cudaText(e));
    auto store = createGlooBackend(o);
    if (!store)
      return store.error();
    auto backend = std::unique_ptr<NcclBackend>(new NcclBackend(o));
    backend->store = std::move(*store);
    backend->device = *device;
    backend->registry->timeout = o.timeout;
    return std::unique_ptr<Backend>(std::move(backend));
  }

  std::string_view name() const override { return "nccl"; }
  MemoryKind memoryKind() const override { return MemoryKind::Device; }

  Result<void> declareGroups(const std::vector<GroupSpec> &groups) override {
    std::lock_guard<std::mutex> lock(mutex);
    if (!declared.empty())
      return makeError("the NCCL backend's groups are declared once");
    for (const GroupSpec &g : groups)
      MESHPLAN_TRY(nccl::splitArgumentsOf(g, options.rank, options.worldSize));
    declared = groups;
    splits.assign(groups.size(), nullptr);
    return {};
  }

  Result<std::unique_ptr<Communicator>>
  createCommunicator(const GroupSpec &group) override {
    std::lock_guard<std::mutex> lock(mutex);
    // The calling thread may be any of the executor's: NCCL calls act on the
    // current device, which is per thread.
    if (cudaError_t e = cudaSetDevice(device))
      return makeError("cannot use CUDA device " + std::to_string(device) +
                       ": " + cudaText(e));
    std::vector<bool> done(splits.size());
    for (size_t i = 0; i < splits.size(); ++i)
      done[i] = splits[i] != nullptr || handedOut.count(i);
    auto order = nccl::splitSchedule(declared, done, group);
    if (!order)
      return order.error();
    // The requested group may have been split already, on the way to a
    // later one (its split waits here until someone asks for it).
    size_t at = 0;
    while (!nccl::sameGroup(declared[at], group))
      ++at;
    if (handedOut.count(at))
      return makeError("communicator \"" + group.id + "\" (color " +
                       std::to_string(group.color) + ") was created already");
    MESHPLAN_TRY(ensureWorld());
    for (size_t i : *order)
      MESHPLAN_TRY(split(i));
    handedOut.insert(at);
    return std::unique_ptr<Communicator>(std::make_unique<NcclCommunicator>(
        declared[at], std::move(splits[at]), registry,
        options.keyOrderReductions));
  }

  Result<void> storeSet(const std::string &key,
                        const std::vector<char> &value) override {
    return store->storeSet(key, value);
  }
  Result<std::vector<char>> storeGet(const std::string &key) override {
    return store->storeGet(key);
  }

private:
  explicit NcclBackend(BackendOptions o) : options(std::move(o)) {}

  Result<void> ensureWorld() {
    if (world)
      return {};
    auto id = nccl::exchangeUniqueId(
        *store, options.rank, nccl::uniqueIdKey(0), sizeof(ncclUniqueId),
        []() -> Result<std::vector<char>> {
          ncclUniqueId id;
          if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess)
            return makeError(std::string("ncclGetUniqueId: ") +
                             ncclGetErrorString(r));
          return std::vector<char>(id.internal, id.internal + sizeof id);
        });
    if (!id)
      return id.error();
    ncclUniqueId unique;
    std::memcpy(unique.internal, id->data(), sizeof unique);
    auto h = std::make_shared<Handle>();
    h->name = options.job + "/world";
    ncclConfig_t config = nonBlockingConfig(*h);
    ncclResult_t r = ncclCommInitRankConfig(&h->comm, int(options.worldSize),
                                            unique, int(options.rank), &config);
    registry->add(h);
    std::string what = "creating the NCCL world communicator (" +
                       std::to_string(options.worldSize) + " ranks, rank " +
                       std::to_string(options.rank) + ")";
    if (!h->comm && r != ncclSuccess && r != ncclInProgress)
      return makeError(what + ": NCCL: " + ncclGetErrorString(r));
    MESHPLAN_TRY(check(*registry, *h, r, what));
    world = std::move(h);
    return checkDeclarationsAgree();
  }

  /// Every rank must make the same ncclCommSplit calls: one all-reduce
  /// (MAX) of this rank's fingerprint of the declared groups and of its
  /// complement gives back both unchanged exactly when every rank has the
  /// same fingerprint.
  Result<void> checkDeclarationsAgree() {
    uint64_t mine = nccl::declarationFingerprint(declared);
    uint64_t values[2] = {mine, ~mine};
    std::string what = "checking that every rank declares the same "
                       "communicators";
    cudaStream_t stream = nullptr;
    void *device = nullptr;
    auto cleanup = [&] {
      if (device)
        cudaFree(device);
      if (stream)
        cudaStreamDestroy(stream);
    };
    cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (e == cudaSuccess)
      e = cudaMalloc(&device, sizeof values);
    // On the all-reduce's stream: a plain cudaMemcpy from pageable memory
    // may return before its bytes land, and runs on the legacy stream,
    // which the non-blocking stream does not wait for.
    if (e == cudaSuccess)
      e = cudaMemcpyAsync(device, values, sizeof values, cudaMemcpyHostToDevice,
                          stream);
    if (e != cudaSuccess) {
      cleanup();
      return makeError(what + ": " + cudaText(e));
    }
    Result<void> ok = check(*registry, *world,
                            ncclAllReduce(device, device, 2, ncclUint64,
                                          ncclMax, world->comm, stream),
                            what);
    if (ok)
      ok = waitForStream(*registry, *world, stream, what);
    if (ok &&
        (e = cudaMemcpyAsync(values, device, sizeof values,
                             cudaMemcpyDeviceToHost, stream)) == cudaSuccess)
      e = cudaStreamSynchronize(stream);
    if (ok && e != cudaSuccess)
      ok = makeError(what + ": " + cudaText(e));
    cleanup();
    MESHPLAN_TRY(ok);
    if (values[0] != mine || values[1] != ~mine) {
      std::string ids;
      for (const GroupSpec &g : declared)
        ids += (ids.empty() ? "" : ", ") + g.id;
      return makeError("the ranks declare different communicators (this "
                       "rank " +
                       std::to_string(options.rank) + ": " +
                       std::to_string(declared.size()) + " groups: " + ids +
                       "); every rank's plan must list the same "
                       "communicators in the same order");
    }
    return {};
  }

  Result<void> split(size_t index) {
    const GroupSpec &g = declared[index];
    auto args = nccl::splitArgumentsOf(g, options.rank, options.worldSize);
    if (!args)
      return args.error();
    auto h = std::make_shared<Handle>();
    h->name = options.job + "/" + g.id + "/" + std::to_string(g.color);
    ncclConfig_t config = nonBlockingConfig(*h);
    std::string what = "ncclCommSplit of communicator \"" + g.id +
                       "\" (color " + std::to_string(args->color) + ", key " +
                       std::to_string(args->key) + ")";
    ncclResult_t r =
        ncclCommSplit(world->comm, args->color, args->key, &h->comm, &config);
    // The split is an operation of the world communicator: its progress and
    // errors show there, then on the new one. In non-blocking mode NCCL
    // (2.28 and later) may return ncclSuccess while the split still runs on
    // a thread of its own, and writes the new communicator into h->comm only
    // when it is complete: wait for both (seen on the first GPU run,
    // docs/cuda.md).
    MESHPLAN_TRY(check(*registry, *world, r, what));
    MESHPLAN_TRY(settle(*registry, *world, what));
    auto deadline = Clock::now() + registry->timeout;
    while (!__atomic_load_n(&h->comm, __ATOMIC_ACQUIRE)) {
      if (Clock::now() > deadline) {
        registry->abortAll();
        // NCCL may still write into h->comm: keep it alive.
        new std::shared_ptr<Handle>(h);
        return makeError(what +
                         ": NCCL made no communicator within the "
                         "timeout of " +
                         std::to_string(registry->timeout.count() / 1000.0) +
                         " s (a member missing or stalled?); every "
                         "communicator of this rank was aborted");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    registry->add(h);
    MESHPLAN_TRY(settle(*registry, *h, what));
    int count = 0, rank = -1;
    ncclCommCount(h->comm, &count);
    ncclCommUserRank(h->comm, &rank);
    if (count != args->size || rank != args->key)
      return makeError(what + ": NCCL made a group of " +
                       std::to_string(count) + " with this rank at " +
                       std::to_string(rank) + ", but the plan says " +
                       std::to_string(args->size) + " members with key " +
                       std::to_string(args->key) +
                       " (the ranks' plans disagree on this communicator)");
    splits[index] = std::move(h);
    return {};
  }

  BackendOptions options;
  std::unique_ptr<Backend> store;
  int device = 0;
  std::shared_ptr<Registry> registry = std::make_shared<Registry>();
  std::mutex mutex;
  std::shared_ptr<Handle> world;
  std::vector<GroupSpec> declared;
  std::vector<std::shared_ptr<Handle>> splits;
  std::set<size_t> handedOut;
};

} // namespace

Result<std::unique_ptr<Backend>>
createNcclBackend(const BackendOptions &options) {
  return NcclBackend::create(options);
}

} // namespace meshplan::runtime

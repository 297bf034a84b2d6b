//===- CudaDevice.cpp - The Device contract on a CUDA GPU -----------------===//
//
// Every call first makes this device current on the calling thread: the
// session enqueues from one host thread per plan stream, and CUDA's current
// device is per thread (a kernel launched into another device's stream
// fails). Kernels are the CUDA kernels of runtime/lib/Kernels/Cuda, the
// same per-element functions as the CPU kernels.
//
//===----------------------------------------------------------------------===//

#include "meshplan/Runtime/CudaDevice.h"

#include "../../Kernels/Cuda/CudaKernels.h"
#include "meshplan/Runtime/NcclBackend.h"

#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <thread>

namespace meshplan::runtime {

namespace {

std::string cudaText(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

cudaStream_t streamOf(DeviceStream s) {
  return static_cast<cudaStream_t>(s.handle);
}

std::optional<cuda::ElementType> elementTypeOf(plan::DType t) {
  switch (t) {
  case plan::DType::Float32:
    return cuda::ElementType::Float32;
  case plan::DType::BFloat16:
    return cuda::ElementType::BFloat16;
  case plan::DType::Float8E4M3:
    return cuda::ElementType::Float8E4M3;
  case plan::DType::Float8E5M2:
    return cuda::ElementType::Float8E5M2;
  default:
    return std::nullopt;
  }
}

kernels::Fp8Format formatOf(plan::DType t) {
  return t == plan::DType::Float8E4M3 ? kernels::Fp8Format::E4M3FN
                                      : kernels::Fp8Format::E5M2;
}

class CudaDevice final : public Device {
public:
  CudaDevice(int index, std::chrono::milliseconds timeout)
      : index(index), timeout(timeout) {}

  std::string name() const override { return "cuda:" + std::to_string(index); }
  int64_t deviceIndex() const { return index; }

  Result<void *> allocate(size_t bytes) override {
    MESHPLAN_TRY(current());
    void *p = nullptr;
    if (cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 1)))
      return fail("cudaMalloc of " + std::to_string(bytes) + " bytes", e);
    return p;
  }
  void release(void *p) override {
    if (current())
      cudaFree(p);
  }
  Result<void *> allocateHost(size_t bytes) override {
    MESHPLAN_TRY(current());
    void *p = nullptr;
    if (cudaError_t e = cudaMallocHost(&p, std::max<size_t>(bytes, 1)))
      return fail("cudaMallocHost of " + std::to_string(bytes) + " bytes", e);
    return p;
  }
  void releaseHost(void *p) override { cudaFreeHost(p); }

  Result<DeviceStream> createStream() override {
    MESHPLAN_TRY(current());
    cudaStream_t s = nullptr;
    if (cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking))
      return fail("cudaStreamCreate", e);
    return DeviceStream{s};
  }
  void destroyStream(DeviceStream s) override {
    if (current()) {
      cudaStreamDestroy(streamOf(s));
      std::lock_guard<std::mutex> lock(gatesMutex);
      if (auto it = gates.find(streamOf(s)); it != gates.end()) {
        cudaFreeHost(it->second.host);
        gates.erase(it);
      }
    }
  }
  Result<DeviceEvent> createEvent() override {
    return makeEvent(cudaEventDisableTiming);
  }
  Result<DeviceEvent> createTimingEvent() override {
    return makeEvent(cudaEventDefault);
  }
  Result<void> hold(DeviceStream s) override {
    MESHPLAN_TRY(current());
    auto gate = gateOf(s);
    if (!gate)
      return gate.error();
    Gate &g = **gate;
    MESHPLAN_TRY(check("holding the stream (timing)",
                       cuda::spinUntil(g.device, g.held + 1, streamOf(s))));
    ++g.held;
    return {};
  }
  Result<void> release(DeviceStream s) override {
    auto gate = gateOf(s);
    if (!gate)
      return gate.error();
    Gate &g = **gate;
    __atomic_store_n(g.host, g.held, __ATOMIC_RELEASE);
    return {};
  }
  Result<double> elapsedSeconds(DeviceEvent from, DeviceEvent to) override {
    MESHPLAN_TRY(current());
    float ms = 0;
    if (cudaError_t r =
            cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(from.handle),
                                 static_cast<cudaEvent_t>(to.handle)))
      return fail("cudaEventElapsedTime", r);
    return double(ms) * 1e-3;
  }
  void destroyEvent(DeviceEvent e) override {
    if (current())
      cudaEventDestroy(static_cast<cudaEvent_t>(e.handle));
  }
  Result<void> record(DeviceEvent e, DeviceStream s) override {
    MESHPLAN_TRY(current());
    return check(
        "cudaEventRecord",
        cudaEventRecord(static_cast<cudaEvent_t>(e.handle), streamOf(s)));
  }
  Result<void> wait(DeviceStream s, DeviceEvent e) override {
    MESHPLAN_TRY(current());
    return check("cudaStreamWaitEvent",
                 cudaStreamWaitEvent(streamOf(s),
                                     static_cast<cudaEvent_t>(e.handle), 0));
  }
  /// Polls rather than blocks, so that work stalled behind a collective
  /// that never completes ends in an error after the timeout.
  Result<void> synchronize(DeviceStream s) override {
    MESHPLAN_TRY(current());
    auto deadline = std::chrono::steady_clock::now() + timeout;
    int spins = 0;
    while (true) {
      cudaError_t e = cudaStreamQuery(streamOf(s));
      if (e == cudaSuccess)
        return {};
      if (e != cudaErrorNotReady)
        return fail("the stream's work", e);
      if (std::chrono::steady_clock::now() > deadline)
        return makeError(name() + ": the stream's work did not finish within " +
                         std::to_string(timeout.count() / 1000.0) + " s");
      if (++spins > 1000)
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      else
        std::this_thread::yield();
    }
  }

  Result<void> copy(void *dst, const void *src, size_t bytes,
                    DeviceStream s) override {
    return memcpy("cudaMemcpyAsync (device to device)", dst, src, bytes, s);
  }
  Result<void> zero(void *dst, size_t bytes, DeviceStream s) override {
    MESHPLAN_TRY(current());
    return check("cudaMemsetAsync",
                 cudaMemsetAsync(dst, 0, bytes, streamOf(s)));
  }
  Result<void> copyToHost(void *host, const void *src, size_t bytes,
                          DeviceStream s) override {
    return memcpy("cudaMemcpyAsync (device to host)", host, src, bytes, s);
  }
  Result<void> copyFromHost(void *dst, const void *host, size_t bytes,
                            DeviceStream s) override {
    return memcpy("cudaMemcpyAsync (host to device)", dst, host, bytes, s);
  }

  Result<void> copyBox(const DeviceBoxRef &src, const DeviceBoxRef &dst,
                       std::span<const int64_t> offset,
                       std::span<const int64_t> size, const float *scale,
                       DeviceStream s) override {
    MESHPLAN_TRY(current());
    auto from = elementTypeOf(src.dtype), to = elementTypeOf(dst.dtype);
    if (!from || !to)
      return makeError(name() + ": box copy from " +
                       std::string(plan::dtypeName(src.dtype)) + " to " +
                       std::string(plan::dtypeName(dst.dtype)) +
                       " is not supported");
    cuda::DeviceBox a{src.data, *from, src.shape, src.origin};
    cuda::DeviceBox b{dst.data, *to, dst.shape, dst.origin};
    return check("copyBox",
                 cuda::copyBox(a, b, offset, size, scale, streamOf(s)));
  }
  Result<void> sumRows(const float *in, int64_t rows, int64_t n, float *out,
                       DeviceStream s) override {
    MESHPLAN_TRY(current());
    return check("sumRows", cuda::sumRows(in, rows, n, out, streamOf(s)));
  }
  Result<void> accumulate(void *acc, const void *add, plan::DType dtype,
                          int64_t n, DeviceStream s) override {
    MESHPLAN_TRY(current());
    if (dtype != plan::DType::Float32 && dtype != plan::DType::BFloat16)
      return makeError(name() + ": cannot accumulate " +
                       std::string(plan::dtypeName(dtype)));
    return check("accumulate",
                 cuda::accumulate(acc, add, n, dtype == plan::DType::BFloat16,
                                  streamOf(s)));
  }
  Result<void> amax(const void *in, plan::DType dtype, int64_t n, float *result,
                    DeviceStream s) override {
    MESHPLAN_TRY(current());
    if (dtype == plan::DType::Float32)
      return check("amax", cuda::amax(static_cast<const float *>(in), n, result,
                                      streamOf(s)));
    if (dtype == plan::DType::BFloat16)
      return check("amax", cuda::amax(static_cast<const uint16_t *>(in), n,
                                      result, streamOf(s)));
    return makeError(name() + ": amax of " +
                     std::string(plan::dtypeName(dtype)));
  }
  Result<void> fp8Scale(const float *amax, float *scale, plan::DType float8,
                        bool powerOf2, DeviceStream s) override {
    MESHPLAN_TRY(current());
    return check("fp8ScaleFromAmax",
                 cuda::fp8ScaleFromAmax(amax, scale, formatOf(float8), powerOf2,
                                        streamOf(s)));
  }
  Result<void> adamwFp32(float *param, const float *grad, float *expAvg,
                         float *expAvgSq, int64_t n,
                         const kernels::AdamWParams &hp, int64_t step,
                         DeviceStream s) override {
    MESHPLAN_TRY(current());
    return check("adamwFp32", cuda::adamwFp32(param, grad, expAvg, expAvgSq, n,
                                              hp, step, streamOf(s)));
  }
  Result<void> adamwBf16StochasticRounding(
      uint16_t *param, const float *grad, float *expAvg, float *expAvgSq,
      const kernels::AdamWParams &hp, int64_t step, uint64_t seed,
      uint64_t tensorId, std::span<const int64_t> globalShape,
      std::span<const int64_t> offset, std::span<const int64_t> localShape,
      DeviceStream s) override {
    MESHPLAN_TRY(current());
    auto index = cuda::shardIndexOf(globalShape, offset, localShape);
    if (!index)
      return makeError(name() + ": the stochastic-rounding AdamW's box lies "
                                "outside its tensor");
    int64_t n = 1;
    for (int64_t d : localShape)
      n *= d;
    return check("adamwBf16StochasticRounding",
                 cuda::adamwBf16StochasticRounding(
                     param, grad, expAvg, expAvgSq, n, hp, step, seed, tensorId,
                     *index, streamOf(s)));
  }

private:
  Result<void> current() {
    if (cudaError_t e = cudaSetDevice(index))
      return fail("cudaSetDevice", e);
    return {};
  }
  Error fail(const std::string &what, cudaError_t e) const {
    return makeError(name() + ": " + what + " failed: " + cudaText(e));
  }
  Result<void> check(const std::string &what, cudaError_t e) const {
    if (e != cudaSuccess)
      return fail(what, e);
    return {};
  }
  Result<void> memcpy(const char *what, void *dst, const void *src,
                      size_t bytes, DeviceStream s) {
    MESHPLAN_TRY(current());
    if (bytes == 0)
      return {};
    return check(
        what, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, streamOf(s)));
  }

  Result<DeviceEvent> makeEvent(unsigned flags) {
    MESHPLAN_TRY(current());
    cudaEvent_t e = nullptr;
    if (cudaError_t r = cudaEventCreateWithFlags(&e, flags))
      return fail("cudaEventCreate", r);
    return DeviceEvent{e};
  }

  /// A stream's hold counter: mapped pinned memory the spin kernel reads.
  struct Gate {
    uint32_t *host = nullptr, *device = nullptr;
    uint32_t held = 0; ///< holds enqueued
  };
  Result<Gate *> gateOf(DeviceStream s) {
    std::lock_guard<std::mutex> lock(gatesMutex);
    auto [it, fresh] = gates.try_emplace(streamOf(s));
    if (!fresh)
      return &it->second;
    Gate &g = it->second;
    void *host = nullptr, *device = nullptr;
    cudaError_t e = cudaHostAlloc(&host, sizeof(uint32_t), cudaHostAllocMapped);
    if (e == cudaSuccess)
      e = cudaHostGetDevicePointer(&device, host, 0);
    if (e != cudaSuccess) {
      if (host)
        cudaFreeHost(host);
      gates.erase(it);
      return fail("allocating a stream's hold counter", e);
    }
    g.host = static_cast<uint32_t *>(host);
    g.device = static_cast<uint32_t *>(device);
    *g.host = 0;
    return &g;
  }

  int index;
  std::chrono::milliseconds timeout;
  std::mutex gatesMutex;
  std::map<cudaStream_t, Gate> gates;
};

} // namespace

Result<std::shared_ptr<Device>>
createCudaDevice(int64_t index, std::chrono::milliseconds timeout) {
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count))
    return makeError("no CUDA device: " + cudaText(e));
  if (index < 0 || index >= count)
    return makeError("CUDA device " + std::to_string(index) +
                     " does not exist (this process sees " +
                     std::to_string(count) + ")");
  if (cudaError_t e = cudaSetDevice(int(index)))
    return makeError("cudaSetDevice(" + std::to_string(index) +
                     "): " + cudaText(e));
  return std::shared_ptr<Device>(
      std::make_shared<CudaDevice>(int(index), timeout));
}

int64_t cudaDeviceIndex(const Device &device) {
  const auto *cuda = dynamic_cast<const CudaDevice *>(&device);
  return cuda ? cuda->deviceIndex() : -1;
}

Result<SessionOptions> cudaSessionOptions(SessionOptions options) {
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e || count == 0)
    return makeError("no CUDA device: " +
                     (e ? cudaText(e) : std::string("none visible")));
  bool nccl = options.backend == "nccl";
  if (!nccl && options.backend != "gloo")
    return makeError("backend \"" + options.backend +
                     "\": unknown (expected \"gloo\" or \"nccl\")");
  // NCCL: one GPU per rank. Gloo: ranks share the visible GPUs.
  int64_t index = nccl ? options.localRank : options.localRank % count;
  auto device = createCudaDevice(index, options.timeout);
  if (!device)
    return device.error().within("LOCAL_RANK " +
                                 std::to_string(options.localRank));
  options.device = *device;
  if (nccl)
    options.makeBackend = createNcclBackend;
  return options;
}

} // namespace meshplan::runtime

//===- Gate.cu - Holding a stream until the host lets it go ---------------===//
//
// SessionOptions::deviceTiming times each instruction's work on the device
// between two events. Without a hold the device reaches the first event as
// soon as the host enqueues it and then waits for the host to enqueue the
// rest, so the span measures the host. A one-thread kernel spinning on a
// counter in mapped pinned memory holds the stream until the host has
// enqueued the instruction; the events then time the device's work alone.
//
//===----------------------------------------------------------------------===//

#include "CudaSupport.cuh"

namespace meshplan::runtime::cuda {

namespace {

__device__ __forceinline__ uint64_t nanoseconds() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/// A hold lasts at most this long: a host thread that waits for the device
/// while its stream is held (something that synchronizes the whole device,
/// as cudaFree does) would otherwise wait for ever. The first GPU run hung
/// with NCCL collectives held (docs/cuda.md); only the runtime's own
/// kernels are held now, and this bound is the safety net.
constexpr uint64_t kMaxHoldNanoseconds = 1000000000;

__global__ void spinUntilKernel(const volatile uint32_t *counter,
                                uint32_t value) {
  uint64_t start = nanoseconds();
  // Compared as a difference, so that the counter may wrap around.
  while (int32_t(*counter - value) < 0 &&
         nanoseconds() - start < kMaxHoldNanoseconds)
    __nanosleep(256);
}

} // namespace

cudaError_t spinUntil(const uint32_t *counter, uint32_t value,
                      cudaStream_t stream) {
  spinUntilKernel<<<1, 1, 0, stream>>>(counter, value);
  return detail::launched();
}

} // namespace meshplan::runtime::cuda

//===- CudaDeviceAllocator.cpp - The arena's bytes from cudaMalloc --------===//
//
// One cudaMalloc per session (DeviceMemory.h): its implicit synchronization
// happens once, at open, never during a step.
//
//===----------------------------------------------------------------------===//

#include "DeviceMemory.h"

#include <cuda_runtime_api.h>

namespace meshplan::runtime {

namespace {

class CudaAllocator final : public RawDeviceAllocator {
public:
  Result<void *> allocate(size_t bytes) override {
    void *p = nullptr;
    if (cudaError_t e = cudaMalloc(&p, bytes)) {
      size_t freeBytes = 0, totalBytes = 0;
      std::string text =
          std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
      if (cudaMemGetInfo(&freeBytes, &totalBytes) == cudaSuccess)
        text += " (" + std::to_string(freeBytes) + " of " +
                std::to_string(totalBytes) + " bytes free on the device)";
      return makeError("cudaMalloc of " + std::to_string(bytes) +
                       " bytes failed: " + text);
    }
    return p;
  }
  void release(void *pointer) override { cudaFree(pointer); }
};

} // namespace

std::shared_ptr<RawDeviceAllocator> cudaDeviceAllocator() {
  return std::make_shared<CudaAllocator>();
}

} // namespace meshplan::runtime

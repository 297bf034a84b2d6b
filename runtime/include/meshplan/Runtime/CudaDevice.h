//===- CudaDevice.h - Sessions on CUDA devices (CUDA builds only) -*- C++
//-*-===//
//
// The CUDA implementation of Device (Device.h): CUDA streams and events,
// cudaMalloc and pinned host memory, the kernels of runtime/lib/Kernels/Cuda.
// Defined in MeshplanRuntimeNccl, which exists only in builds with the CUDA
// backend (docs/cuda.md); this header names no CUDA type.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_RUNTIME_CUDADEVICE_H
#define MESHPLAN_RUNTIME_CUDADEVICE_H

#include "meshplan/Runtime/Device.h"
#include "meshplan/Runtime/Session.h"

#include <chrono>
#include <memory>

namespace meshplan::runtime {

/// CUDA device `index`. synchronize() polls the stream and gives up after
/// `timeout` with an error (a stalled collective must not hang the host).
/// Fails, saying why, when there is no such device.
Result<std::shared_ptr<Device>>
createCudaDevice(int64_t index, std::chrono::milliseconds timeout);

/// The CUDA device index of `device` (what createCudaDevice was given), or
/// -1 when it is not a CUDA device: for code of the trainer's own that must
/// run on the session's GPU.
int64_t cudaDeviceIndex(const Device &device);

/// `options` made to run on this rank's GPU:
///   - backend "nccl": the NCCL backend (createNcclBackend) on device
///     LOCAL_RANK, one GPU per rank;
///   - backend "gloo": device LOCAL_RANK modulo the visible devices, the
///     collectives staged through pinned host memory, so that several ranks
///     share one GPU (tests; NCCL refuses two ranks on one device).
/// Fails when this process sees no CUDA device.
Result<SessionOptions> cudaSessionOptions(SessionOptions options);

} // namespace meshplan::runtime

#endif // MESHPLAN_RUNTIME_CUDADEVICE_H

//===- Device.h - Where a session's buffers live and its kernels run ------===//
//
// A session runs its plan through one executor over this interface, either
// on host buffers (no SessionOptions::device: the runtime's inline host
// device, whose every call completes on host memory before it returns, one
// thread per plan stream, every instruction complete when it returns) or on
// a Device (docs/cuda.md, "Executor on devices"): every buffer of the plan
// at a fixed offset of one arena sized from the plan, every plan stream one
// device stream, every ordering the plan states across streams an event, and
// every instruction *enqueued* on its stream; the host waits only where it
// needs a value (a host communicator's input, the end of the step).
//
// Two devices implement it:
//   - createCudaDevice (meshplan/Runtime/CudaDevice.h, CUDA builds only):
//     CUDA streams and events, cudaMalloc, the CUDA kernels of
//     runtime/lib/Kernels/Cuda;
//   - createHostDevice (below): the same asynchronous contract in host
//     memory, each stream a worker thread that runs its queue in order,
//     events completed by those threads, the CPU kernels. It runs the
//     device executor on machines without a GPU, so that everything above
//     the device calls (the arena, the stream and event graph, staging,
//     callbacks on streams) is tested by real multi-process runs against the
//     host sessions' results, bit for bit.
//
// Contract (CUDA's): calls on one stream run in the order they were
// enqueued; wait(s, e) makes later work on s wait for the work enqueued on
// e's stream before the record(e) that precedes the wait, and a wait on an
// event never recorded waits for nothing (the executor never does that);
// every pointer given to a kernel is device memory of this device, except
// where a function says host. Errors at enqueue time are returned; a fault
// inside enqueued work surfaces at the stream's next synchronize().
//
// No CUDA type appears here: streams and events are opaque handles.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_RUNTIME_DEVICE_H
#define MESHPLAN_RUNTIME_DEVICE_H

#include "meshplan/Core/Result.h"
#include "meshplan/Plan/Plan.h"
#include "meshplan/Runtime/Backend.h"
#include "meshplan/Runtime/Kernels.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

namespace meshplan::runtime {

/// An event, opaque (a cudaEvent_t on CUDA).
struct DeviceEvent {
  void *handle = nullptr;
};

/// A packed box of a global tensor in device memory (what BoxRef is to the
/// host executor).
struct DeviceBoxRef {
  void *data = nullptr;
  plan::DType dtype = plan::DType::Float32;
  std::span<const int64_t> shape;  ///< local (packed) shape
  std::span<const int64_t> origin; ///< global offset of element [0, ..]
};

class Device {
public:
  virtual ~Device();
  /// "cuda:0", "host".
  virtual std::string name() const = 0;
  /// True when every enqueued call has completed, in memory the host reads
  /// and writes, by the time it returns (the inline host device a session
  /// without a device runs on). The executor then also runs what needs a
  /// value on the host (the gradient norm, clipping); elsewhere it refuses
  /// plans that need them until the device has kernels for them.
  virtual bool completesOnEnqueue() const { return false; }

  //===--- Memory --------------------------------------------------------===//
  /// Device memory (at least 256-byte aligned); released by release().
  virtual Result<void *> allocate(size_t bytes) = 0;
  virtual void release(void *pointer) = 0;
  /// Host memory the device copies to and from fastest (pinned on CUDA):
  /// the staging area of host communicators.
  virtual Result<void *> allocateHost(size_t bytes) = 0;
  virtual void releaseHost(void *pointer) = 0;

  //===--- Streams and events -------------------------------------------===//
  virtual Result<DeviceStream> createStream() = 0;
  virtual void destroyStream(DeviceStream stream) = 0;
  virtual Result<DeviceEvent> createEvent() = 0;
  virtual void destroyEvent(DeviceEvent event) = 0;
  virtual Result<void> record(DeviceEvent event, DeviceStream stream) = 0;
  virtual Result<void> wait(DeviceStream stream, DeviceEvent event) = 0;
  /// Returns when everything enqueued on `stream` so far has completed; the
  /// first error of that work, if any.
  virtual Result<void> synchronize(DeviceStream stream) = 0;

  //===--- Timing -------------------------------------------------------===//
  // SessionOptions::deviceTiming: when the device itself ran each
  // instruction, as opposed to when the host enqueued it.

  /// An event that also notes when the device reached it; record, wait and
  /// destroyEvent take it like any other.
  virtual Result<DeviceEvent> createTimingEvent() = 0;
  /// Seconds from when the device reached `from` to when it reached `to`,
  /// both recorded by timing events and completed (synchronize); negative
  /// when `to` came first.
  virtual Result<double> elapsedSeconds(DeviceEvent from, DeviceEvent to) = 0;
  /// Holds `stream` at this point of its work until release(stream): what is
  /// enqueued in between then runs back to back, and timing events around it
  /// measure the device's work rather than the host's enqueueing. Only
  /// around work whose enqueueing never waits for the stream itself (it
  /// would wait for ever); holds do not nest.
  virtual Result<void> hold(DeviceStream stream) = 0;
  virtual Result<void> release(DeviceStream stream) = 0;

  //===--- Copies (enqueued) --------------------------------------------===//
  /// Device to device.
  virtual Result<void> copy(void *dst, const void *src, size_t bytes,
                            DeviceStream stream) = 0;
  virtual Result<void> zero(void *dst, size_t bytes, DeviceStream stream) = 0;
  /// Host (`host`) to and from device; the host memory must stay valid
  /// until the stream has done the copy (synchronize, or an event).
  virtual Result<void> copyToHost(void *host, const void *src, size_t bytes,
                                  DeviceStream stream) = 0;
  virtual Result<void> copyFromHost(void *dst, const void *host, size_t bytes,
                                    DeviceStream stream) = 0;

  //===--- Kernels (enqueued) -------------------------------------------===//
  // `scale`, `amax` and `result` pointers are device memory: a float8 scale
  // goes from the amax to the cast without visiting the host.

  /// The region [offset, offset + size) of src into dst, converting dtypes as
  /// the host executor's copyBox does; `scale` (null: 1) multiplies values
  /// cast to float8 and divides values read from float8.
  virtual Result<void> copyBox(const DeviceBoxRef &src, const DeviceBoxRef &dst,
                               std::span<const int64_t> offset,
                               std::span<const int64_t> size,
                               const float *scale, DeviceStream stream) = 0;
  /// out[j] = ((0 + in[j]) + in[n + j]) + ... (float32 rows of n).
  virtual Result<void> sumRows(const float *in, int64_t rows, int64_t n,
                               float *out, DeviceStream stream) = 0;
  /// acc[i] += add[i]: float32, or bfloat16 added in float32 and rounded to
  /// nearest even.
  virtual Result<void> accumulate(void *acc, const void *add, plan::DType dtype,
                                  int64_t n, DeviceStream stream) = 0;
  /// *result = max |in[i]| of float32 or bfloat16 elements.
  virtual Result<void> amax(const void *in, plan::DType dtype, int64_t n,
                            float *result, DeviceStream stream) = 0;
  /// *scale = the tensorwise float8 scale of *amax (kernels::fp8ScaleFromAmax).
  virtual Result<void> fp8Scale(const float *amax, float *scale,
                                plan::DType float8, bool powerOf2,
                                DeviceStream stream) = 0;
  /// AdamW on fp32 master weights (kernels::adamwFp32).
  virtual Result<void> adamwFp32(float *param, const float *grad, float *expAvg,
                                 float *expAvgSq, int64_t n,
                                 const kernels::AdamWParams &hp, int64_t step,
                                 DeviceStream stream) = 0;
  /// AdamW on bf16 parameters with stochastic rounding, keyed by (seed,
  /// step, tensor id, global element index) of the box [offset, offset +
  /// localShape) of a tensor of globalShape.
  virtual Result<void> adamwBf16StochasticRounding(
      uint16_t *param, const float *grad, float *expAvg, float *expAvgSq,
      const kernels::AdamWParams &hp, int64_t step, uint64_t seed,
      uint64_t tensorId, std::span<const int64_t> globalShape,
      std::span<const int64_t> offset, std::span<const int64_t> localShape,
      DeviceStream stream) = 0;
};

/// The asynchronous host device (above): each stream a worker thread,
/// memory from the heap, the CPU kernels. For tests and for machines
/// without a GPU.
std::shared_ptr<Device> createHostDevice();

} // namespace meshplan::runtime

#endif // MESHPLAN_RUNTIME_DEVICE_H

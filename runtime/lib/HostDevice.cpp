//===- HostDevice.cpp - The device contract in host memory ----------------===//
//
// createHostDevice (meshplan/Runtime/Device.h): CUDA's stream semantics with
// host threads, so that the device executor runs, and is tested, on machines
// without a GPU. A stream is a worker thread running its queue in order; an
// event remembers the stream and the queue position of its last record; a
// wait enqueues a task that blocks until that position has completed. Work
// is described by value at enqueue time (as a kernel launch copies its
// arguments), and device scalars (a float8 scale, an amax) are read when the
// work runs, not when it is enqueued.
//
// After a task fails, the stream's later tasks are skipped but still count
// as completed (waits on them must not hang); synchronize() returns the
// first error, as CUDA reports a sticky error.
//
// createInlineHostDevice (SessionImpl.h) is the same device without the
// queues: every enqueued call runs on the calling thread before it returns,
// streams and events are empty handles, and waits, records and synchronize
// have nothing to do. A session without a device runs its plan on it, so
// that host and device sessions share one executor (Execution.cpp) while
// the host keeps its synchronous speed: no thread hand-off, no queue, no
// copy of a kernel's arguments.
//
//===----------------------------------------------------------------------===//

#include "meshplan/Runtime/Device.h"

#include "BoxCopy.h"
#include "meshplan/Runtime/Kernels.h"

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace meshplan::runtime {

Device::~Device() = default;

namespace {

namespace k = kernels;
using Task = std::function<Result<void>()>;

class HostStream {
public:
  HostStream() : worker([this] { run(); }) {}
  ~HostStream() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopping = true;
    }
    changed.notify_all();
    worker.join();
  }

  /// Enqueues a task; returns its position (1-based).
  uint64_t enqueue(Task task) {
    std::lock_guard<std::mutex> lock(mutex);
    queue.push_back(std::move(task));
    ++enqueued;
    changed.notify_all();
    return enqueued;
  }
  uint64_t position() {
    std::lock_guard<std::mutex> lock(mutex);
    return enqueued;
  }
  /// Device::hold: the stream's worker stops at a task until release().
  void hold() {
    uint64_t mine;
    {
      std::lock_guard<std::mutex> lock(mutex);
      mine = ++held;
    }
    enqueue([this, mine]() -> Result<void> {
      std::unique_lock<std::mutex> lock(mutex);
      changed.wait(lock, [&] { return released >= mine; });
      return {};
    });
  }
  void release() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      released = held;
    }
    changed.notify_all();
  }

  /// Blocks until the task at `position` (and all before it) completed.
  void waitFor(uint64_t position) {
    std::unique_lock<std::mutex> lock(mutex);
    changed.wait(lock, [&] { return completed >= position; });
  }
  Result<void> synchronize() {
    std::unique_lock<std::mutex> lock(mutex);
    uint64_t target = enqueued;
    changed.wait(lock, [&] { return completed >= target; });
    if (error)
      return *error;
    return {};
  }

private:
  void run() {
    std::unique_lock<std::mutex> lock(mutex);
    while (true) {
      changed.wait(lock, [&] { return stopping || !queue.empty(); });
      if (queue.empty())
        return; // stopping, and nothing left
      Task task = std::move(queue.front());
      queue.pop_front();
      bool skip = error.has_value();
      lock.unlock();
      Result<void> ok = skip ? Result<void>() : task();
      lock.lock();
      if (!ok && !error)
        error = ok.error();
      ++completed;
      changed.notify_all();
    }
  }

  std::mutex mutex;
  std::condition_variable changed;
  std::deque<Task> queue;
  uint64_t enqueued = 0, completed = 0;
  uint64_t held = 0, released = 0; ///< hold() / release() counts
  std::optional<Error> error;
  bool stopping = false;
  std::thread worker; // last: starts after the members above exist
};

struct HostEvent {
  std::mutex mutex;
  HostStream *stream = nullptr; ///< of the last record; null: never recorded
  uint64_t position = 0;
  /// A timing event: its last record enqueues a task that notes the time
  /// the stream's worker reached it.
  bool timing = false;
  std::optional<std::chrono::steady_clock::time_point> reached;
};

HostStream *streamOf(DeviceStream s) {
  return static_cast<HostStream *>(s.handle);
}

std::vector<int64_t> vec(std::span<const int64_t> s) {
  return {s.begin(), s.end()};
}

k::Fp8Format formatOf(plan::DType t) {
  return t == plan::DType::Float8E4M3 ? k::Fp8Format::E4M3FN
                                      : k::Fp8Format::E5M2;
}

class HostDevice final : public Device {
public:
  /// `immediate`: the inline host device (above).
  explicit HostDevice(bool immediate) : immediate(immediate) {}
  std::string name() const override { return "host"; }
  bool completesOnEnqueue() const override { return immediate; }

  Result<void *> allocate(size_t bytes) override {
    void *p = std::aligned_alloc(
        256, std::max<size_t>(256, (bytes + 255) / 256 * 256));
    if (!p)
      return makeError("host device: cannot allocate " + std::to_string(bytes) +
                       " bytes");
    return p;
  }
  void release(void *p) override { std::free(p); }
  Result<void *> allocateHost(size_t bytes) override { return allocate(bytes); }
  void releaseHost(void *p) override { std::free(p); }

  Result<DeviceStream> createStream() override {
    if (immediate)
      return DeviceStream{};
    return DeviceStream{new HostStream()};
  }
  void destroyStream(DeviceStream s) override { delete streamOf(s); }
  Result<DeviceEvent> createEvent() override {
    if (immediate)
      return DeviceEvent{};
    return DeviceEvent{new HostEvent()};
  }
  void destroyEvent(DeviceEvent e) override {
    delete static_cast<HostEvent *>(e.handle);
  }
  Result<DeviceEvent> createTimingEvent() override {
    if (immediate)
      return makeError("the inline host device has no timing events: its "
                       "work is the host's own (StepProfile)");
    auto *event = new HostEvent();
    event->timing = true;
    return DeviceEvent{event};
  }
  Result<double> elapsedSeconds(DeviceEvent from, DeviceEvent to) override {
    auto reached = [](DeviceEvent e)
        -> std::optional<std::chrono::steady_clock::time_point> {
      auto *event = static_cast<HostEvent *>(e.handle);
      std::lock_guard<std::mutex> lock(event->mutex);
      return event->timing ? event->reached : std::nullopt;
    };
    auto a = reached(from), b = reached(to);
    if (!a || !b)
      return makeError("host device: elapsedSeconds of an event that is not "
                       "a completed timing event");
    return std::chrono::duration<double>(*b - *a).count();
  }
  Result<void> hold(DeviceStream s) override {
    if (immediate)
      return {};
    streamOf(s)->hold();
    return {};
  }
  Result<void> release(DeviceStream s) override {
    if (immediate)
      return {};
    streamOf(s)->release();
    return {};
  }
  Result<void> record(DeviceEvent e, DeviceStream s) override {
    if (immediate)
      return {}; // the work before it is complete already
    auto *event = static_cast<HostEvent *>(e.handle);
    std::lock_guard<std::mutex> lock(event->mutex);
    event->stream = streamOf(s);
    if (event->timing) {
      event->reached.reset();
      event->position = streamOf(s)->enqueue([event]() -> Result<void> {
        std::lock_guard<std::mutex> lock(event->mutex);
        event->reached = std::chrono::steady_clock::now();
        return {};
      });
      return {};
    }
    event->position = streamOf(s)->position();
    return {};
  }
  Result<void> wait(DeviceStream s, DeviceEvent e) override {
    if (immediate)
      return {};
    auto *event = static_cast<HostEvent *>(e.handle);
    HostStream *on;
    uint64_t position;
    {
      std::lock_guard<std::mutex> lock(event->mutex);
      on = event->stream;
      position = event->position;
    }
    if (!on || on == streamOf(s))
      return {}; // never recorded, or stream order implies it
    streamOf(s)->enqueue([on, position]() -> Result<void> {
      on->waitFor(position);
      return {};
    });
    return {};
  }
  Result<void> synchronize(DeviceStream s) override {
    if (immediate)
      return {};
    return streamOf(s)->synchronize();
  }

  Result<void> copy(void *dst, const void *src, size_t bytes,
                    DeviceStream s) override {
    return enqueue(s, [=] { std::memmove(dst, src, bytes); });
  }
  Result<void> zero(void *dst, size_t bytes, DeviceStream s) override {
    return enqueue(s, [=] { std::memset(dst, 0, bytes); });
  }
  Result<void> copyToHost(void *host, const void *src, size_t bytes,
                          DeviceStream s) override {
    return copy(host, src, bytes, s);
  }
  Result<void> copyFromHost(void *dst, const void *host, size_t bytes,
                            DeviceStream s) override {
    return copy(dst, host, bytes, s);
  }

  Result<void> copyBox(const DeviceBoxRef &src, const DeviceBoxRef &dst,
                       std::span<const int64_t> offset,
                       std::span<const int64_t> size, const float *scale,
                       DeviceStream s) override {
    if (!canConvert(src.dtype, dst.dtype))
      return makeError("host device: cannot convert " +
                       std::string(plan::dtypeName(src.dtype)) + " to " +
                       std::string(plan::dtypeName(dst.dtype)));
    for (int64_t extent : size)
      if (extent == 0)
        return {}; // nothing to copy
    if (!boxContains(src.origin, src.shape, offset, size) ||
        !boxContains(dst.origin, dst.shape, offset, size))
      return makeError("host device: a box copy's region lies outside a box");
    if (immediate) {
      runtime::copyBox(src, dst, offset, size, scale ? *scale : 1.0f);
      return {};
    }
    // The shapes by value: the caller's spans end with the call.
    return enqueue(s, [=, srcData = src.data, srcType = src.dtype,
                       dstData = dst.data, dstType = dst.dtype,
                       srcShape = vec(src.shape), srcOrigin = vec(src.origin),
                       dstShape = vec(dst.shape), dstOrigin = vec(dst.origin),
                       at = vec(offset), extent = vec(size)] {
      BoxRef from{static_cast<std::byte *>(srcData), srcType, &srcShape,
                  &srcOrigin};
      BoxRef to{static_cast<std::byte *>(dstData), dstType, &dstShape,
                &dstOrigin};
      runtime::copyBox(from, to, at, extent, scale ? *scale : 1.0f);
    });
  }
  Result<void> sumRows(const float *in, int64_t rows, int64_t n, float *out,
                       DeviceStream s) override {
    return enqueue(s, [=] {
      for (int64_t j = 0; j < n; ++j)
        out[j] = 0.0f;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < n; ++j)
          out[j] += in[r * n + j];
    });
  }
  Result<void> accumulate(void *acc, const void *add, plan::DType dtype,
                          int64_t n, DeviceStream s) override {
    if (dtype == plan::DType::Float32)
      return enqueue(s, [=] {
        auto *d = static_cast<float *>(acc);
        auto *a = static_cast<const float *>(add);
        for (int64_t j = 0; j < n; ++j)
          d[j] += a[j];
      });
    if (dtype == plan::DType::BFloat16)
      return enqueue(s, [=] {
        auto *d = static_cast<uint16_t *>(acc);
        auto *a = static_cast<const uint16_t *>(add);
        for (int64_t j = 0; j < n; ++j)
          d[j] = k::floatToBf16(k::bf16ToFloat(d[j]) + k::bf16ToFloat(a[j]));
      });
    return makeError("host device: cannot accumulate " +
                     std::string(plan::dtypeName(dtype)));
  }
  Result<void> amax(const void *in, plan::DType dtype, int64_t n, float *result,
                    DeviceStream s) override {
    if (dtype == plan::DType::Float32)
      return enqueue(s, [=] {
        *result = k::amax({static_cast<const float *>(in), size_t(n)});
      });
    if (dtype == plan::DType::BFloat16)
      return enqueue(s, [=] {
        *result = k::amax({static_cast<const uint16_t *>(in), size_t(n)});
      });
    return makeError("host device: amax of " +
                     std::string(plan::dtypeName(dtype)));
  }
  Result<void> fp8Scale(const float *amax, float *scale, plan::DType float8,
                        bool powerOf2, DeviceStream s) override {
    k::Fp8Format f = formatOf(float8);
    return enqueue(s,
                   [=] { *scale = k::fp8ScaleFromAmax(*amax, f, powerOf2); });
  }
  Result<void> adamwFp32(float *param, const float *grad, float *expAvg,
                         float *expAvgSq, int64_t n, const k::AdamWParams &hp,
                         int64_t step, DeviceStream s) override {
    return enqueue(s, [=] {
      size_t m = size_t(n);
      k::adamwFp32({param, m}, {grad, m}, {expAvg, m}, {expAvgSq, m}, hp, step);
    });
  }
  Result<void> adamwBf16StochasticRounding(
      uint16_t *param, const float *grad, float *expAvg, float *expAvgSq,
      const k::AdamWParams &hp, int64_t step, uint64_t seed, uint64_t tensorId,
      std::span<const int64_t> globalShape, std::span<const int64_t> offset,
      std::span<const int64_t> localShape, DeviceStream s) override {
    auto runs = k::boxIndexRuns(globalShape, offset, localShape);
    if (!runs)
      return makeError("host device: the stochastic-rounding AdamW's box lies "
                       "outside its tensor");
    size_t n = 1;
    for (int64_t d : localShape)
      n *= size_t(d);
    return enqueue(s, [=, runs = std::move(*runs)] {
      k::adamwBf16StochasticRounding({param, n}, {grad, n}, {expAvg, n},
                                     {expAvgSq, n}, hp, step, seed, tensorId,
                                     runs);
    });
  }

private:
  template <typename F> Result<void> enqueue(DeviceStream s, F f) {
    if (immediate) {
      f();
      return {};
    }
    streamOf(s)->enqueue([f = std::move(f)]() -> Result<void> {
      f();
      return {};
    });
    return {};
  }

  const bool immediate;
};

} // namespace

std::shared_ptr<Device> createHostDevice() {
  return std::make_shared<HostDevice>(/*immediate=*/false);
}

std::shared_ptr<Device> createInlineHostDevice() {
  return std::make_shared<HostDevice>(/*immediate=*/true);
}

} // namespace meshplan::runtime

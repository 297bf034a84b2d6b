//===- TrainerCollectives.h - The trainer's own collectives -----*- C++ -*-===//
//
// What meshplan-train communicates besides the plan: the model's TP
// collectives on its own buffers (CommTpGroup) and the host-side ones (the
// loss, the extra axes' gradient averages, the cost model's measurements:
// HostCollectives), each over a runtime communicator, whichever memory the
// model and the communicator use.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_TRAINER_TRAINERCOLLECTIVES_H
#define MESHPLAN_TRAINER_TRAINERCOLLECTIVES_H

#include "model/Llama.h"
#include "model/ModelOps.h"

#include "meshplan/Runtime/Backend.h"
#include "meshplan/Runtime/Device.h"
#include "meshplan/Support/Timing.h"

#include <vector>

namespace meshplan::trainer {

using runtime::Communicator;
using runtime::Device;
using runtime::DeviceStream;
using runtime::DType;
using runtime::MemoryKind;

/// The TP group over a runtime communicator, on the model's buffers
/// (ModelOps memory), timing its collectives:
///   - both on the host (CPU runs): the communicator reads them directly;
///   - both on the GPU (NCCL under --device cuda): the collective is
///     enqueued on the model's stream after its kernels, then waited for
///     with the communicator's timeout, so a stalled peer is an error rather
///     than a hang in the model's next download;
///   - model on the GPU, communicator on the host (Gloo with ranks sharing
///     a GPU): staged through host copies.
class CommTpGroup final : public TpGroup {
public:
  CommTpGroup(Communicator *comm, ModelOps &ops, double &seconds)
      : comm(comm), ops(ops), seconds(seconds) {}
  int64_t size() const override { return comm->size(); }
  int64_t rank() const override { return comm->key(); }
  Result<void> allGather(const float *in, float *out, int64_t count) override {
    return timed(in, count, out, count * size(), [&](const float *i, float *o) {
      return comm->allGather(i, o, count, DType::Float32);
    });
  }
  Result<void> reduceScatter(const float *in, float *out,
                             int64_t count) override {
    return timed(in, count * size(), out, count, [&](const float *i, float *o) {
      return comm->reduceScatter(i, o, count, DType::Float32, ReduceOp::Sum);
    });
  }
  Result<void> allReduceSum(float *data, int64_t count) override {
    return timed(data, count, data, count, [&](const float *, float *o) {
      return comm->allReduce(o, count, DType::Float32, ReduceOp::Sum);
    });
  }
  Result<void> allReduceMax(float *data, int64_t count) override {
    return timed(data, count, data, count, [&](const float *, float *o) {
      return comm->allReduce(o, count, DType::Float32, ReduceOp::Max);
    });
  }

private:
  /// Runs `collective(in, out)` on buffers the communicator can read.
  template <typename Collective>
  Result<void> timed(const float *in, int64_t inCount, float *out,
                     int64_t outCount, Collective &&collective) {
    auto t = SteadyClock::now();
    Result<void> ok = run(in, inCount, out, outCount, collective);
    seconds += secondsSince(t);
    return ok;
  }
  template <typename Collective>
  Result<void> run(const float *in, int64_t inCount, float *out,
                   int64_t outCount, Collective &collective) {
    bool deviceComm = comm->memoryKind() == MemoryKind::Device;
    if (ops.hostMemory() && !deviceComm)
      return collective(in, out);
    if (!ops.hostMemory() && deviceComm) {
      MESHPLAN_TRY(comm->setStream(DeviceStream{ops.nativeStream()}));
      MESHPLAN_TRY(collective(in, out));
      return comm->synchronize();
    }
    if (ops.hostMemory())
      return makeError("the TP communicator holds device memory but the "
                       "model runs on the host");
    // out may alias in (all-reduce): stage both through one host buffer
    // when it does.
    hostIn.resize(size_t(inCount));
    MESHPLAN_TRY(
        ops.download(hostIn.data(), in, sizeof(float) * hostIn.size()));
    bool inPlace = in == out;
    if (!inPlace)
      hostOut.resize(size_t(outCount));
    float *o = inPlace ? hostIn.data() : hostOut.data();
    MESHPLAN_TRY(collective(hostIn.data(), o));
    ops.upload(out, o, sizeof(float) * size_t(outCount));
    return {};
  }

  Communicator *comm;
  ModelOps &ops;
  double &seconds;
  std::vector<float> hostIn, hostOut;
};

/// The trainer's collectives on host buffers (the loss, the extra axes'
/// gradient averages, the cost model's measurements): direct on a host
/// communicator; on a device one (NCCL), staged through device memory of
/// the session's device on a stream of their own.
class HostCollectives {
public:
  ~HostCollectives() { reset(); }
  void setDevice(Device *d) {
    reset();
    device = d;
  }

  Result<void> allReduce(Communicator *c, float *data, int64_t n, ReduceOp op) {
    if (c->memoryKind() == MemoryKind::Host)
      return c->allReduce(data, n, DType::Float32, op);
    return staged(c, data, n, data, n, [&](float *in, float *) {
      return c->allReduce(in, n, DType::Float32, op);
    });
  }
  Result<void> allGather(Communicator *c, const float *in, float *out,
                         int64_t n) {
    if (c->memoryKind() == MemoryKind::Host)
      return c->allGather(in, out, n, DType::Float32);
    return staged(c, in, n, out, n * c->size(), [&](float *i, float *o) {
      return c->allGather(i, o, n, DType::Float32);
    });
  }

private:
  template <typename Collective>
  Result<void> staged(Communicator *c, const float *in, int64_t inCount,
                      float *out, int64_t outCount, Collective &&collective) {
    if (!device)
      return makeError("a device communicator (" + c->group().id +
                       ") in a session without a device");
    if (!stream.handle) {
      auto s = device->createStream();
      if (!s)
        return s.error();
      stream = *s;
    }
    size_t inBytes = sizeof(float) * size_t(inCount),
           outBytes = sizeof(float) * size_t(outCount);
    if (capacity < inBytes + outBytes) {
      if (buffer)
        device->release(buffer);
      buffer = nullptr;
      capacity = 0;
      auto b = device->allocate(inBytes + outBytes);
      if (!b)
        return b.error();
      buffer = *b;
      capacity = inBytes + outBytes;
    }
    auto *din = static_cast<float *>(buffer);
    float *dout = in == out ? din : din + inCount;
    MESHPLAN_TRY(device->copyFromHost(din, in, inBytes, stream));
    MESHPLAN_TRY(c->setStream(stream));
    MESHPLAN_TRY(collective(din, dout));
    MESHPLAN_TRY(c->synchronize());
    MESHPLAN_TRY(device->copyToHost(out, dout, outBytes, stream));
    return device->synchronize(stream);
  }
  void reset() {
    if (device && buffer)
      device->release(buffer);
    if (device && stream.handle)
      device->destroyStream(stream);
    buffer = nullptr;
    capacity = 0;
    stream = {};
  }

  Device *device = nullptr;
  DeviceStream stream;
  void *buffer = nullptr;
  size_t capacity = 0;
};

} // namespace meshplan::trainer

#endif // MESHPLAN_TRAINER_TRAINERCOLLECTIVES_H

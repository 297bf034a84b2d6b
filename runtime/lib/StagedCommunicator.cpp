//===- StagedCommunicator.cpp - Host collectives on device buffers --------===//

#include "StagedCommunicator.h"

#include <string>

namespace meshplan::runtime {

namespace {

class StagedCommunicator final : public Communicator {
public:
  StagedCommunicator(std::unique_ptr<Communicator> host,
                     std::shared_ptr<Device> device)
      : host(std::move(host)), device(std::move(device)) {}
  ~StagedCommunicator() override {
    for (Staging *s : {&in, &out})
      if (s->data)
        device->releaseHost(s->data);
  }

  const GroupSpec &group() const override { return host->group(); }
  MemoryKind memoryKind() const override { return MemoryKind::Device; }
  Result<void> setStream(DeviceStream s) override {
    stream = s;
    return {};
  }
  Result<void> synchronize() override { return device->synchronize(stream); }

  Result<void> allGather(const void *input, void *output, int64_t count,
                         DType dtype) override {
    size_t bytes = bytesOf(count, dtype);
    return staged(
        input, bytes, output, bytes * size_t(size()),
        [&](void *i, void *o) { return host->allGather(i, o, count, dtype); });
  }
  Result<void> reduceScatter(const void *input, void *output, int64_t count,
                             DType dtype, ReduceOp op) override {
    size_t bytes = bytesOf(count, dtype);
    return staged(input, bytes * size_t(size()), output, bytes,
                  [&](void *i, void *o) {
                    return host->reduceScatter(i, o, count, dtype, op);
                  });
  }
  Result<void> allReduce(void *data, int64_t count, DType dtype,
                         ReduceOp op) override {
    size_t bytes = bytesOf(count, dtype);
    return staged(data, bytes, data, bytes, [&](void *i, void *) {
      return host->allReduce(i, count, dtype, op);
    });
  }
  Result<void> broadcast(void *data, int64_t count, DType dtype,
                         int64_t root) override {
    size_t bytes = bytesOf(count, dtype);
    return staged(data, bytes, data, bytes, [&](void *i, void *) {
      return host->broadcast(i, count, dtype, root);
    });
  }
  Result<void> allToAll(const void *input, void *output, int64_t count,
                        DType dtype) override {
    size_t bytes = bytesOf(count, dtype) * size_t(size());
    return staged(input, bytes, output, bytes, [&](void *i, void *o) {
      return host->allToAll(i, o, count, dtype);
    });
  }
  Result<void> sendRecv(const void *send, int64_t sendTo, void *recv,
                        int64_t recvFrom, int64_t count, DType dtype) override {
    size_t bytes = bytesOf(count, dtype);
    return staged(send, sendTo >= 0 ? bytes : 0, recv,
                  recvFrom >= 0 ? bytes : 0, [&](void *i, void *o) {
                    return host->sendRecv(i, sendTo, o, recvFrom, count, dtype);
                  });
  }
  Result<void> send(const void *data, int64_t to, int64_t count, DType dtype,
                    std::string_view tag) override {
    return staged(
        data, bytesOf(count, dtype), nullptr, 0,
        [&](void *i, void *) { return host->send(i, to, count, dtype, tag); });
  }
  Result<void> recv(void *data, int64_t from, int64_t count, DType dtype,
                    std::string_view tag) override {
    return staged(nullptr, 0, data, bytesOf(count, dtype),
                  [&](void *, void *o) {
                    return host->recv(o, from, count, dtype, tag);
                  });
  }
  Result<void> barrier() override { return host->barrier(); }
  void abort(const std::string &why) override { host->abort(why); }
  bool canAbort() const override { return host->canAbort(); }

private:
  struct Staging {
    void *data = nullptr;
    size_t bytes = 0;
  };

  static size_t bytesOf(int64_t count, DType dtype) {
    return size_t(count * plan::dtypeBytes(dtype));
  }

  Result<void *> reserve(Staging &s, size_t bytes) {
    if (bytes <= s.bytes)
      return s.data;
    if (s.data)
      device->releaseHost(s.data);
    s.data = nullptr;
    s.bytes = 0;
    auto p = device->allocateHost(bytes);
    if (!p)
      return p.error().within("communicator \"" + group().id +
                              "\": staging memory");
    s.data = *p;
    s.bytes = bytes;
    return s.data;
  }

  /// Device `input` (inBytes) -> host, run(hostIn, hostOut), host ->
  /// device `output` (outBytes). In-place calls pass the same pointer twice
  /// and run on the input staging.
  template <typename F>
  Result<void> staged(const void *input, size_t inBytes, void *output,
                      size_t outBytes, F run) {
    bool inPlace = input == output && input;
    auto hostIn = reserve(in, std::max<size_t>(inBytes, 1));
    if (!hostIn)
      return hostIn.error();
    void *hostOut = *hostIn;
    if (!inPlace) {
      auto o = reserve(out, std::max<size_t>(outBytes, 1));
      if (!o)
        return o.error();
      hostOut = *o;
    }
    if (inBytes) {
      MESHPLAN_TRY(device->copyToHost(*hostIn, input, inBytes, stream));
    }
    MESHPLAN_TRY(device->synchronize(stream));
    MESHPLAN_TRY(run(*hostIn, hostOut));
    if (outBytes) {
      MESHPLAN_TRY(device->copyFromHost(output, hostOut, outBytes, stream));
      // The staging is reused by the next call, possibly from another
      // stream: the copy must be done before this call returns.
      MESHPLAN_TRY(device->synchronize(stream));
    }
    return {};
  }

  std::unique_ptr<Communicator> host;
  std::shared_ptr<Device> device;
  DeviceStream stream;
  Staging in, out;
};

} // namespace

std::unique_ptr<Communicator>
stageThroughHost(std::unique_ptr<Communicator> host,
                 std::shared_ptr<Device> device) {
  return std::make_unique<StagedCommunicator>(std::move(host),
                                              std::move(device));
}

} // namespace meshplan::runtime

//===- ExecutionSetUp.cpp - Where a session's plan runs -------------------===//
//
// setUpExecutor gives every session the DeviceState its executor
// (Execution.cpp) runs on:
//
//   host buffers  the inline host device: no arena (each buffer keeps its
//                 own bytes, allocated when first written), streams and
//                 events that are empty handles, and the float8 scale
//                 slots in host memory;
//   a device      (SessionOptions::device; docs/cuda.md, "Executor on
//                 devices") every buffer at its offset of one arena that
//                 planDeviceMemory sized from the plan (a step allocates
//                 nothing, and `free` only marks the buffer dead), a device
//                 stream per plan stream, an event per ordering the stream
//                 graph (StreamGraph.h) names, per-stream packing blocks and
//                 a scale slot per (instruction, float8 buffer).
//
// Besides: waiting for a step's device work, reading the device's own
// timing, and moving bytes between the host and a device session's buffers
// between steps. The host waits for the device only where it needs a value:
// a host communicator's input (StagedCommunicator.h) and the end of the
// step.
//
//===----------------------------------------------------------------------===//

#include "SessionImpl.h"

#include "BoxCopy.h"
#include "StagedCommunicator.h"

#include <cstring>

namespace meshplan::runtime {

using plan::BufferKind;
using plan::OpKind;

namespace {

/// The arena's bytes from the session's device.
class ArenaAllocator final : public RawDeviceAllocator {
public:
  explicit ArenaAllocator(std::shared_ptr<Device> device)
      : device(std::move(device)) {}
  Result<void *> allocate(size_t bytes) override {
    return device->allocate(bytes);
  }
  void release(void *pointer) override { device->release(pointer); }

private:
  std::shared_ptr<Device> device;
};

} // namespace

DeviceState::~DeviceState() {
  // Streams first: the host device's workers drain their queues, and no
  // work may run on memory released below.
  for (DeviceStream s : streams)
    if (s.handle) {
      (void)device->synchronize(s);
      device->destroyStream(s);
    }
  for (DeviceEvent e : events)
    device->destroyEvent(e);
  for (DeviceEvent e : timingBefore)
    device->destroyEvent(e);
  for (DeviceEvent e : timingAfter)
    device->destroyEvent(e);
  for (void *p : allocations)
    device->release(p);
}

/// The stream graph, a stream per plan stream, an event per ordering the
/// graph names, and a device float per (instruction, buffer) whose float8
/// scale the instruction computes from the buffer's amax.
Result<void> Session::Impl::setUpStreams(DeviceState &state) {
  Device &device = *state.device;
  auto graph = buildStreamGraph(plan);
  if (!graph)
    return graph.error();
  state.graph = std::move(*graph);
  for (size_t i = 0; i < plan.streams.size(); ++i) {
    auto s = device.createStream();
    if (!s)
      return s.error().within("device " + device.name());
    state.streams.push_back(*s);
  }
  for (size_t i = 0; i < state.graph.eventAfter.size(); ++i) {
    auto e = device.createEvent();
    if (!e)
      return e.error().within("device " + device.name());
    state.events.push_back(*e);
  }
  std::vector<std::pair<int, int>> slots;
  for (const Bound &b : program) {
    const Instruction &in = *b.in;
    auto needScale = [&](int x) {
      if (buffers[size_t(x)].meta->scale)
        slots.push_back({b.index, x});
    };
    if (in.op == OpKind::Fp8Cast)
      for (int x : b.outputs)
        needScale(x);
    if (in.op == OpKind::Compute)
      for (int x : b.inputs)
        needScale(x);
    if (in.op == OpKind::AllGather && !b.direct)
      for (const Pair &p : b.pairs)
        needScale(p.out);
  }
  if (slots.empty())
    return {};
  auto scales = device.allocate(slots.size() * sizeof(float));
  if (!scales)
    return scales.error().within("device " + device.name());
  state.allocations.push_back(*scales);
  for (size_t i = 0; i < slots.size(); ++i)
    state.scales[slots[i]] = static_cast<float *>(*scales) + i;
  return {};
}

Result<void> Session::Impl::setUpExecutor() {
  if (!options.device) {
    // Host buffers: the inline host device, whose work is done in host
    // memory when enqueued, so everything the executor does runs there.
    auto state = std::make_unique<DeviceState>();
    state->device = createInlineHostDevice();
    MESHPLAN_TRY(setUpStreams(*state));
    dev = std::move(state);
    return {};
  }
  if (ft)
    return makeError("fault-tolerant replica groups run on host buffers "
                     "only: a session on a device with fault tolerance is not "
                     "supported yet (docs/cuda.md)");
  // The norm's exact accumulator and the skip decision run on the host
  // (Execution.cpp): a device whose work is not done in host memory when
  // enqueued would need them as device kernels.
  for (const plan::Instruction &in : plan.program)
    if ((in.op == OpKind::GradNorm || in.op == OpKind::ClipGradients) &&
        !options.device->completesOnEnqueue())
      return makeError("gradient clipping (optimizer.max_norm) runs on host "
                       "buffers only: the device executor has no grad_norm "
                       "or clip_grad kernels yet (docs/cuda.md)");
  auto state = std::make_unique<DeviceState>();
  state->device = options.device;
  Device &device = *state->device;
  auto memory = planDeviceMemory(plan);
  if (!memory)
    return memory.error().within("device memory");
  auto arena = DeviceArena::create(
      std::move(*memory), std::make_shared<ArenaAllocator>(state->device));
  if (!arena)
    return arena.error().within("device " + device.name());
  state->arena = std::move(*arena);
  MESHPLAN_TRY(setUpStreams(*state));

  if (options.deviceTiming) {
    // Each stream's hold state now, not at its first hold: setting it up
    // allocates pinned memory, which may wait for the whole device, held
    // streams included.
    for (DeviceStream s : state->streams) {
      MESHPLAN_TRY(device.hold(s));
      MESHPLAN_TRY(device.release(s));
    }
    for (size_t i = 0; i < program.size(); ++i)
      for (auto *into : {&state->timingBefore, &state->timingAfter}) {
        auto e = device.createTimingEvent();
        if (!e)
          return e.error().within("device " + device.name());
        into->push_back(*e);
      }
  }

  // Packing blocks per stream: the largest of its collectives'.
  std::vector<size_t> sendBytes(plan.streams.size(), 0),
      recvBytes(plan.streams.size(), 0);
  for (const Bound &b : program) {
    if (!plan::isCollective(b.in->op) || b.direct)
      continue;
    int st = state->graph.steps[size_t(b.index)].stream;
    auto [send, recv] = stagingBytes(b);
    sendBytes[size_t(st)] = std::max(sendBytes[size_t(st)], send);
    recvBytes[size_t(st)] = std::max(recvBytes[size_t(st)], recv);
  }
  auto allocate = [&](size_t bytes) -> Result<std::byte *> {
    if (bytes == 0)
      return static_cast<std::byte *>(nullptr);
    auto p = device.allocate(bytes);
    if (!p)
      return p.error().within("device " + device.name());
    state->allocations.push_back(*p);
    return static_cast<std::byte *>(*p);
  };
  for (size_t st = 0; st < plan.streams.size(); ++st) {
    auto send = allocate(sendBytes[st]);
    if (!send)
      return send.error();
    auto recv = allocate(recvBytes[st]);
    if (!recv)
      return recv.error();
    state->sendScratch.push_back(*send);
    state->recvScratch.push_back(*recv);
  }

  // Parameter shards and optimizer state start at zero.
  dev = std::move(state);
  DeviceStream first = dev->streams.empty() ? DeviceStream{} : dev->streams[0];
  for (size_t i = 0; i < buffers.size(); ++i)
    if (buffers[i].persistent && bytesOf(buffers[i]))
      MESHPLAN_TRY(device.zero(address(int(i)), bytesOf(buffers[i]), first));
  if (!dev->streams.empty())
    MESHPLAN_TRY(device.synchronize(first));
  return {};
}

Result<void> Session::Impl::synchronizeDevice() {
  // Device communicators first: NCCL's synchronize polls for asynchronous
  // errors within the timeout and aborts a stalled collective, where a
  // plain stream synchronization could wait forever.
  std::optional<Error> first;
  {
    std::lock_guard<std::mutex> lock(commMutex);
    for (size_t i = 0; i < comms.size(); ++i)
      if (comms[i] && comms[i]->memoryKind() == MemoryKind::Device)
        if (auto ok = comms[i]->synchronize(); !ok && !first)
          first = ok.error().within("communicator \"" +
                                    plan.communicators[i].id + "\"");
  }
  for (size_t i = 0; i < dev->streams.size(); ++i)
    if (auto ok = dev->device->synchronize(dev->streams[i]); !ok && !first)
      first = ok.error().within("stream \"" + plan.streams[i] + "\" on " +
                                dev->device->name());
  if (first)
    return *first;
  return {};
}

Result<void> Session::Impl::readDeviceTiming(StepProfile &p) {
  p.deviceStart.clear();
  p.deviceEnd.clear();
  if (dev->timingBefore.empty() || program.empty())
    return {};
  // Every event completed (synchronizeDevice); times from instruction 0's
  // start, then shifted so that the earliest start is 0.
  Device &device = *dev->device;
  DeviceEvent origin = dev->timingBefore[0];
  p.deviceStart.resize(program.size());
  p.deviceEnd.resize(program.size());
  double earliest = 0;
  for (size_t i = 0; i < program.size(); ++i) {
    auto a = device.elapsedSeconds(origin, dev->timingBefore[i]);
    if (!a)
      return a.error().within("timing instruction " + std::to_string(i));
    auto b = device.elapsedSeconds(origin, dev->timingAfter[i]);
    if (!b)
      return b.error().within("timing instruction " + std::to_string(i));
    p.deviceStart[i] = *a;
    p.deviceEnd[i] = *b;
    earliest = std::min(earliest, *a);
  }
  for (size_t i = 0; i < program.size(); ++i) {
    p.deviceStart[i] -= earliest;
    p.deviceEnd[i] -= earliest;
  }
  return {};
}

// Between steps every stream is idle; host copies use the first one.

Result<void> Session::Impl::toDevice(int buffer,
                                     std::span<const std::byte> host) {
  if (host.empty())
    return {};
  if (host.size() != bytesOf(buffers[size_t(buffer)]))
    return makeError("\"" + buffers[size_t(buffer)].meta->id + "\": " +
                     std::to_string(host.size()) + " bytes for a buffer of " +
                     std::to_string(bytesOf(buffers[size_t(buffer)])));
  DeviceStream s = dev->streams.at(0);
  MESHPLAN_TRY(
      dev->device->copyFromHost(address(buffer), host.data(), host.size(), s));
  return dev->device->synchronize(s);
}

Result<void> Session::Impl::fromDevice(const std::byte *device,
                                       std::span<std::byte> host) {
  if (host.empty())
    return {};
  DeviceStream s = dev->streams.at(0);
  MESHPLAN_TRY(dev->device->copyToHost(host.data(), device, host.size(), s));
  return dev->device->synchronize(s);
}

Result<void> Session::Impl::initOnDevice(
    const std::function<Result<void>(TensorView &)> &init) {
  for (size_t i = 0; i < buffers.size(); ++i) {
    const BufferState &st = buffers[i];
    if (st.meta->kind == BufferKind::OptimizerState) {
      if (bytesOf(st))
        MESHPLAN_TRY(dev->device->zero(address(int(i)), bytesOf(st),
                                       dev->streams.at(0)));
      continue;
    }
    if (st.meta->kind != BufferKind::ParamShard)
      continue;
    std::vector<std::byte> host(bytesOf(st));
    TensorView v;
    v.buffer = st.meta;
    v.bytes = host;
    MESHPLAN_TRY(init(v));
    MESHPLAN_TRY(toDevice(int(i), host));
  }
  return dev->streams.empty() ? Result<void>()
                              : dev->device->synchronize(dev->streams[0]);
}

Result<void> Session::computeOnHost(ComputeCall &call,
                                    const ComputeCallback &body) {
  Device *device = this->device();
  if (!device)
    return body(call);
  size_t views = call.params.size() + call.grads.size();
  std::vector<std::vector<std::byte>> host;
  std::vector<float> scales(views, 0.0f);
  host.reserve(views);
  ComputeCall onHost = call;
  size_t at = 0;
  // Wait (polling, within the session's timeout) for what the views wait
  // for first: a copy into pageable memory blocks the host until the
  // stream reaches it, with no timeout, so a stalled collective before it
  // would hang this thread instead of failing.
  MESHPLAN_TRY(device->synchronize(call.stream));
  auto mirror = [&](TensorView &v) -> Result<void> {
    host.emplace_back(v.bytes.size());
    if (!v.bytes.empty())
      MESHPLAN_TRY(device->copyToHost(host.back().data(), v.bytes.data(),
                                      v.bytes.size(), call.stream));
    if (v.deviceScale)
      MESHPLAN_TRY(device->copyToHost(&scales[at], v.deviceScale, sizeof(float),
                                      call.stream));
    ++at;
    return {};
  };
  for (TensorView &v : onHost.params)
    MESHPLAN_TRY(mirror(v));
  for (TensorView &v : onHost.grads)
    MESHPLAN_TRY(mirror(v));
  MESHPLAN_TRY(device->synchronize(call.stream));
  at = 0;
  auto repoint = [&](TensorView &v) {
    v.bytes = host[at];
    if (v.deviceScale)
      v.scale = scales[at];
    v.deviceScale = nullptr;
    v.onDevice = false;
    ++at;
  };
  for (TensorView &v : onHost.params)
    repoint(v);
  for (TensorView &v : onHost.grads)
    repoint(v);
  MESHPLAN_TRY(body(onHost));
  for (size_t g = 0; g < call.grads.size(); ++g)
    if (!call.grads[g].bytes.empty())
      MESHPLAN_TRY(device->copyFromHost(
          call.grads[g].bytes.data(), onHost.grads[g].bytes.data(),
          call.grads[g].bytes.size(), call.stream));
  return device->synchronize(call.stream);
}

} // namespace meshplan::runtime

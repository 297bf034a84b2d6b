//===- DeviceExecution.cpp - Running a bound plan on a device -------------===//
//
// A session with SessionOptions::device runs its plan here (docs/cuda.md,
// "Executor on devices"). The binding is the host executor's (Session.cpp);
// what changes is where bytes live and who waits:
//
//   memory   every buffer at its offset of one arena that planDeviceMemory
//            sized from the plan: a step allocates nothing, and `free` only
//            marks the buffer dead (its bytes were planned for reuse);
//   order    each plan stream is a device stream, and a host thread per
//            stream enqueues its instructions in program order. Before an
//            instruction it waits, on the host, only until the instructions
//            it depends on are *enqueued* (and, for a collective, until its
//            communicator's turn), then enqueues waits on the events the
//            stream graph (StreamGraph.h) names and records its own event;
//   values   a float8 scale is computed on the device from its amax, into a
//            slot of the instruction that needs it, and passed to kernels
//            and callbacks as a device pointer.
//
// The host waits for the device only where it needs a value: a host
// communicator's input (StagedCommunicator.h) and the end of the step.
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

size_t bytesOf(const BufferState &s) {
  return size_t(s.numel * plan::dtypeBytes(s.meta->dtype));
}

std::string notWritten(const BufferState &s) {
  return "reads \"" + s.meta->id + "\" before anything wrote it";
}

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

std::byte *Session::Impl::deviceAddress(int buffer) const {
  return dev->arena->address(size_t(buffer));
}

Result<void> Session::Impl::ensureOnDevice(int buffer, DeviceStream s) {
  BufferState &st = buffers[size_t(buffer)];
  if (st.live)
    return {};
  st.live = true;
  if (size_t bytes = bytesOf(st))
    return dev->device->zero(deviceAddress(buffer), bytes, s);
  return {};
}

Result<const float *> Session::Impl::deviceScale(const Bound &b, int buffer,
                                                 DeviceStream s) {
  const plan::Buffer &meta = *buffers[size_t(buffer)].meta;
  if (!meta.scale)
    return static_cast<const float *>(nullptr);
  auto slot = dev->scales.find({b.index, buffer});
  auto amax = bufferIds.find(meta.scale->amax);
  if (slot == dev->scales.end() || amax == bufferIds.end())
    return makeError("no scale slot for \"" + meta.id + "\"");
  if (!buffers[size_t(amax->second)].live)
    return makeError(notWritten(buffers[size_t(amax->second)]));
  const float *from =
      reinterpret_cast<const float *>(deviceAddress(amax->second)) +
      meta.scale->index;
  MESHPLAN_TRY(dev->device->fp8Scale(from, slot->second, meta.dtype,
                                     meta.scale->powerOf2, s));
  return static_cast<const float *>(slot->second);
}

Result<void> Session::Impl::setUpDevice() {
  if (ft)
    return makeError("fault-tolerant replica groups run on host buffers "
                     "only: a session on a device with fault tolerance is not "
                     "supported yet (docs/cuda.md)");
  // The norm's exact accumulator and the skip decision run on the host
  // today; a device session would need them as device kernels.
  for (const plan::Instruction &in : plan.program)
    if (in.op == OpKind::GradNorm || in.op == OpKind::ClipGradients)
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
  auto graph = buildStreamGraph(plan);
  if (!graph)
    return graph.error();
  state->graph = std::move(*graph);
  for (size_t i = 0; i < plan.streams.size(); ++i) {
    auto s = device.createStream();
    if (!s)
      return s.error().within("device " + device.name());
    state->streams.push_back(*s);
  }
  for (size_t i = 0; i < state->graph.eventAfter.size(); ++i) {
    auto e = device.createEvent();
    if (!e)
      return e.error().within("device " + device.name());
    state->events.push_back(*e);
  }

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

  // Packing blocks per stream, and a scale slot per (instruction, buffer).
  std::vector<size_t> sendBytes(plan.streams.size(), 0),
      recvBytes(plan.streams.size(), 0);
  std::vector<std::pair<int, int>> slots;
  for (const Bound &b : program) {
    int st = state->graph.steps[size_t(b.index)].stream;
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
    if (!plan::isCollective(in.op) || b.direct)
      continue;
    size_t one = size_t(in.count * plan::dtypeBytes(*in.dtype));
    size_t all = one * plan.communicators[size_t(b.comm)].ranks.size();
    size_t send = one, recv = one;
    if (in.op == OpKind::AllGather) {
      recv = all;
      for (const Pair &p : b.pairs)
        needScale(p.out);
    } else if (in.op == OpKind::ReduceScatter) {
      send = all;
    } else if (in.op == OpKind::AllToAll) {
      send = recv = all;
    }
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
  auto scales = allocate(slots.size() * sizeof(float));
  if (!scales)
    return scales.error();
  for (size_t i = 0; i < slots.size(); ++i)
    state->scales[slots[i]] = reinterpret_cast<float *>(*scales) + i;

  // Parameter shards and optimizer state start at zero.
  dev = std::move(state);
  DeviceStream first = dev->streams.empty() ? DeviceStream{} : dev->streams[0];
  for (size_t i = 0; i < buffers.size(); ++i)
    if (buffers[i].persistent && bytesOf(buffers[i]))
      MESHPLAN_TRY(
          device.zero(deviceAddress(int(i)), bytesOf(buffers[i]), first));
  if (!dev->streams.empty())
    MESHPLAN_TRY(device.synchronize(first));
  return {};
}

Result<void> Session::Impl::runCollectiveOnDevice(Bound &b, DeviceStream s) {
  const Instruction &in = *b.in;
  auto comm = communicator(b.comm);
  if (!comm)
    return comm.error();
  Communicator &c = **comm;
  MESHPLAN_TRY(c.setStream(s));
  Device &device = *dev->device;
  DType wire = *in.dtype;
  int64_t esize = plan::dtypeBytes(wire);
  int64_t n = c.size();
  int64_t count = in.count;
  for (int x : b.inputs)
    if (!buffers[size_t(x)].live)
      return makeError(notWritten(buffers[size_t(x)]));
  for (int x : b.outputs)
    MESHPLAN_TRY(ensureOnDevice(x, s));
  auto box = [&](int buffer) {
    const plan::Buffer &m = *buffers[size_t(buffer)].meta;
    return DeviceBoxRef{deviceAddress(buffer), m.dtype, m.localShape, m.offset};
  };
  auto chunk = [&](std::byte *stage, int64_t elementAt, const Pair &p,
                   const ShardBox &member) {
    return DeviceBoxRef{stage + elementAt * esize, wire, p.padded,
                        member.offset};
  };
  size_t bytes = size_t(count * esize);

  if (b.direct) {
    std::byte *src = deviceAddress(b.pairs[0].in);
    std::byte *dst = deviceAddress(b.pairs[0].out);
    switch (in.op) {
    case OpKind::AllGather:
      return c.allGather(src, dst, count, wire);
    case OpKind::ReduceScatter:
      return c.reduceScatter(src, dst, count, wire, *in.reduce);
    case OpKind::AllReduce:
    case OpKind::Broadcast:
      if (src != dst && bytes)
        MESHPLAN_TRY(device.copy(dst, src, bytes, s));
      if (in.op == OpKind::AllReduce)
        return c.allReduce(dst, count, wire, *in.reduce);
      return c.broadcast(dst, count, wire, in.root);
    default:
      break;
    }
  }

  int st = dev->graph.steps[size_t(b.index)].stream;
  std::byte *send = dev->sendScratch[size_t(st)];
  std::byte *recv = dev->recvScratch[size_t(st)];
  auto clear = [&](std::byte *stage, size_t length) -> Result<void> {
    return length ? device.zero(stage, length, s) : Result<void>();
  };
  switch (in.op) {
  case OpKind::AllGather: {
    MESHPLAN_TRY(clear(send, bytes));
    for (const Pair &p : b.pairs) {
      const ShardBox &mine = p.members[size_t(c.key())];
      // Copy-in: converted to the wire type with the gathered buffer's
      // scale, computed on the device.
      auto scale = deviceScale(b, p.out, s);
      if (!scale)
        return scale.error();
      MESHPLAN_TRY(device.copyBox(box(p.in), chunk(send, p.at, p, mine),
                                  mine.offset, mine.localShape, *scale, s));
    }
    MESHPLAN_TRY(c.allGather(send, recv, count, wire));
    for (const Pair &p : b.pairs)
      for (int64_t m = 0; m < n; ++m) {
        const ShardBox &theirs = p.members[size_t(m)];
        MESHPLAN_TRY(device.copyBox(chunk(recv, m * count + p.at, p, theirs),
                                    box(p.out), theirs.offset,
                                    theirs.localShape, nullptr, s));
      }
    return {};
  }
  case OpKind::ReduceScatter: {
    MESHPLAN_TRY(clear(send, bytes * size_t(n)));
    for (const Pair &p : b.pairs)
      for (int64_t m = 0; m < n; ++m) {
        const ShardBox &theirs = p.members[size_t(m)];
        MESHPLAN_TRY(
            device.copyBox(box(p.in), chunk(send, m * count + p.at, p, theirs),
                           theirs.offset, theirs.localShape, nullptr, s));
      }
    MESHPLAN_TRY(c.reduceScatter(send, recv, count, wire, *in.reduce));
    for (const Pair &p : b.pairs) {
      const ShardBox &mine = p.members[size_t(c.key())];
      MESHPLAN_TRY(device.copyBox(chunk(recv, p.at, p, mine), box(p.out),
                                  mine.offset, mine.localShape, nullptr, s));
    }
    return {};
  }
  case OpKind::AllReduce:
  case OpKind::Broadcast: {
    MESHPLAN_TRY(clear(send, bytes));
    for (const Pair &p : b.pairs) {
      const ShardBox &mine = p.members[0];
      MESHPLAN_TRY(device.copyBox(box(p.in), chunk(send, p.at, p, mine),
                                  mine.offset, mine.localShape, nullptr, s));
    }
    if (in.op == OpKind::AllReduce)
      MESHPLAN_TRY(c.allReduce(send, count, wire, *in.reduce));
    else
      MESHPLAN_TRY(c.broadcast(send, count, wire, in.root));
    for (const Pair &p : b.pairs) {
      const ShardBox &mine = p.members[0];
      MESHPLAN_TRY(device.copyBox(chunk(send, p.at, p, mine), box(p.out),
                                  mine.offset, mine.localShape, nullptr, s));
    }
    return {};
  }
  case OpKind::Permute: {
    MESHPLAN_TRY(clear(send, bytes));
    MESHPLAN_TRY(clear(recv, bytes));
    const Pair &first = b.pairs[0];
    for (const Pair &p : b.pairs) {
      const ShardBox &mine = p.inBoxes[size_t(c.key())];
      MESHPLAN_TRY(device.copyBox(box(p.in), chunk(send, p.at, p, mine),
                                  mine.offset, mine.localShape, nullptr, s));
    }
    MESHPLAN_TRY(
        c.sendRecv(send, first.sendTo, recv, first.recvFrom, count, wire));
    for (const Pair &p : b.pairs) {
      const ShardBox &theirs = p.inBoxes[size_t(p.recvFrom)];
      MESHPLAN_TRY(device.copyBox(chunk(recv, p.at, p, theirs), box(p.out),
                                  theirs.offset, theirs.localShape, nullptr,
                                  s));
    }
    return {};
  }
  case OpKind::AllToAll: {
    MESHPLAN_TRY(clear(send, bytes * size_t(n)));
    MESHPLAN_TRY(clear(recv, bytes * size_t(n)));
    int64_t me = c.key();
    // Block k: the part of my input that member k's output holds, packed
    // densely (Session.cpp's host path, same intersections).
    auto dense = [&](std::byte *stage, int64_t elementAt,
                     const ShardBox &part) {
      return DeviceBoxRef{stage + elementAt * esize, wire, part.localShape,
                          part.offset};
    };
    for (const Pair &p : b.pairs)
      for (int64_t k = 0; k < n; ++k) {
        ShardBox part = intersect(p.inBoxes[size_t(me)], p.outBoxes[size_t(k)]);
        MESHPLAN_TRY(device.copyBox(box(p.in),
                                    dense(send, k * count + p.at, part),
                                    part.offset, part.localShape, nullptr, s));
      }
    MESHPLAN_TRY(c.allToAll(send, recv, count, wire));
    for (const Pair &p : b.pairs)
      for (int64_t k = 0; k < n; ++k) {
        ShardBox part = intersect(p.inBoxes[size_t(k)], p.outBoxes[size_t(me)]);
        MESHPLAN_TRY(device.copyBox(dense(recv, k * count + p.at, part),
                                    box(p.out), part.offset, part.localShape,
                                    nullptr, s));
      }
    return {};
  }
  default:
    return makeError("unsupported collective");
  }
}

Result<void> Session::Impl::runComputeOnDevice(Bound &b, DeviceStream s) {
  ComputeCall call = callOf(b);
  call.stream = s;
  auto viewOf = [&](int x) -> Result<TensorView> {
    TensorView v = view(x);
    auto scale = deviceScale(b, x, s);
    if (!scale)
      return scale.error();
    v.deviceScale = *scale;
    return v;
  };
  // As the host executor (runCompute): parameters and activations in, amax
  // buffers only through scales, gradients accumulated across microbatches.
  std::map<std::string, int> accumulated;
  for (int x : b.inputs) {
    BufferState &st = buffers[size_t(x)];
    if (!st.live)
      return makeError(notWritten(st));
    if (st.meta->kind == BufferKind::Gradient) {
      accumulated[st.meta->tensor] = x;
      continue;
    }
    if (st.meta->tensor.empty() && st.meta->kind != BufferKind::Activation)
      continue;
    auto v = viewOf(x);
    if (!v)
      return v.error();
    call.params.push_back(*v);
  }
  for (int x : b.outputs) {
    BufferState &st = buffers[size_t(x)];
    auto from = accumulated.find(st.meta->tensor);
    if (from != accumulated.end() && from->second != x) {
      const BufferState &prev = buffers[size_t(from->second)];
      if (bytesOf(prev) != bytesOf(st))
        return makeError("accumulates \"" + prev.meta->id + "\" into \"" +
                         st.meta->id + "\", which has another size");
      if (bytesOf(st))
        MESHPLAN_TRY(dev->device->copy(
            deviceAddress(x), deviceAddress(from->second), bytesOf(st), s));
      st.live = true;
    } else if (from == accumulated.end()) {
      st.live = false; // a fresh gradient starts at zero
      MESHPLAN_TRY(ensureOnDevice(x, s));
    }
    auto v = viewOf(x);
    if (!v)
      return v.error();
    call.grads.push_back(*v);
  }
  return invoke(call);
}

Result<void> Session::Impl::runOptimizerOnDevice(Bound &b, DeviceStream s) {
  const plan::OptimizerConfig &o = *plan.optimizer;
  kernels::AdamWParams hp{stepLr(), o.beta1, o.beta2, o.eps, o.weightDecay};
  int64_t step = steps + 1;
  Device &device = *dev->device;
  for (size_t g = 0; g + 3 < b.inputs.size(); g += 4) {
    int param = b.inputs[g], grad = b.inputs[g + 1], m = b.inputs[g + 2],
        v = b.inputs[g + 3];
    if (!buffers[size_t(grad)].live)
      return makeError(notWritten(buffers[size_t(grad)]));
    const plan::Buffer &meta = *buffers[size_t(param)].meta;
    hp.weightDecay = o.weightDecayOf(meta.tensor);
    auto *ps = deviceAddress(param);
    auto *gs = reinterpret_cast<const float *>(deviceAddress(grad));
    auto *ms = reinterpret_cast<float *>(deviceAddress(m));
    auto *vs = reinterpret_cast<float *>(deviceAddress(v));
    if (o.stochasticRounding)
      MESHPLAN_TRY(device.adamwBf16StochasticRounding(
          reinterpret_cast<uint16_t *>(ps), gs, ms, vs, hp, step,
          static_cast<uint64_t>(o.seed), static_cast<uint64_t>(*meta.tensorId),
          meta.globalShape, meta.offset, meta.localShape, s));
    else
      MESHPLAN_TRY(device.adamwFp32(reinterpret_cast<float *>(ps), gs, ms, vs,
                                    buffers[size_t(param)].numel, hp, step, s));
  }
  return {};
}

Result<void> Session::Impl::executeOnDevice(Bound &b, DeviceStream s) {
  const Instruction &in = *b.in;
  Device &device = *dev->device;
  switch (in.op) {
  case OpKind::AllGather:
  case OpKind::ReduceScatter:
  case OpKind::AllReduce:
  case OpKind::Broadcast:
  case OpKind::AllToAll:
  case OpKind::Permute:
    return runCollectiveOnDevice(b, s);
  case OpKind::Send:
  case OpKind::Recv: {
    auto comm = communicator(b.comm);
    if (!comm)
      return comm.error();
    MESHPLAN_TRY((*comm)->setStream(s));
    if (in.op == OpKind::Send) {
      const BufferState &src = buffers[size_t(b.inputs[0])];
      if (!src.live)
        return makeError(notWritten(src));
      return (*comm)->send(deviceAddress(b.inputs[0]), in.peer, in.count,
                           *in.dtype, in.tag);
    }
    MESHPLAN_TRY(ensureOnDevice(b.outputs[0], s));
    return (*comm)->recv(deviceAddress(b.outputs[0]), in.peer, in.count,
                         *in.dtype, in.tag);
  }
  case OpKind::Compute:
    return runComputeOnDevice(b, s);
  case OpKind::OptimizerUpdate:
    return runOptimizerOnDevice(b, s);
  case OpKind::Free:
    // The arena planned these bytes for later buffers; nothing to release.
    for (int x : b.inputs)
      buffers[size_t(x)].live = false;
    return {};
  case OpKind::Wait:
    return {};
  default:
    break;
  }
  for (int x : b.inputs)
    if (!buffers[size_t(x)].live)
      return makeError(notWritten(buffers[size_t(x)]));
  // An elementwise conversion of n elements, as convertElements: both
  // buffers seen as one flat row.
  auto convert = [&](int from, int to, const float *scale) -> Result<void> {
    const BufferState &src = buffers[size_t(from)], &dst = buffers[size_t(to)];
    std::vector<int64_t> shape{src.numel}, origin{0};
    if (src.numel == 0)
      return {};
    return device.copyBox({deviceAddress(from), src.meta->dtype, shape, origin},
                          {deviceAddress(to), dst.meta->dtype, shape, origin},
                          origin, shape, scale, s);
  };
  switch (in.op) {
  case OpKind::Cast:
  case OpKind::Fp8Cast:
    for (size_t i = 0; i < b.outputs.size(); ++i) {
      const BufferState &src = buffers[size_t(b.inputs[i])],
                        &dst = buffers[size_t(b.outputs[i])];
      if (src.numel != dst.numel ||
          !canConvert(src.meta->dtype, dst.meta->dtype))
        return makeError("cannot cast \"" + src.meta->id + "\" into \"" +
                         dst.meta->id + "\"");
      MESHPLAN_TRY(ensureOnDevice(b.outputs[i], s));
      const float *scale = nullptr;
      if (in.op == OpKind::Fp8Cast) {
        auto sc = deviceScale(b, b.outputs[i], s);
        if (!sc)
          return sc.error();
        scale = *sc;
      }
      MESHPLAN_TRY(convert(b.inputs[i], b.outputs[i], scale));
    }
    return {};
  case OpKind::Sum:
    for (size_t i = 0; i < b.inputs.size(); ++i) {
      const BufferState &src = buffers[size_t(b.inputs[i])],
                        &dst = buffers[size_t(b.outputs[i])];
      if (src.meta->dtype != DType::Float32 ||
          dst.meta->dtype != DType::Float32 || dst.numel == 0 ||
          src.numel % dst.numel != 0)
        return makeError("cannot sum the rows of \"" + src.meta->id +
                         "\" into \"" + dst.meta->id + "\"");
      MESHPLAN_TRY(ensureOnDevice(b.outputs[i], s));
      MESHPLAN_TRY(device.sumRows(
          reinterpret_cast<const float *>(deviceAddress(b.inputs[i])),
          src.numel / dst.numel, dst.numel,
          reinterpret_cast<float *>(deviceAddress(b.outputs[i])), s));
    }
    return {};
  case OpKind::Accumulate:
    for (size_t i = 0; i < b.outputs.size(); ++i) {
      const BufferState &acc = buffers[size_t(b.inputs[2 * i])],
                        &add = buffers[size_t(b.inputs[2 * i + 1])];
      if (acc.numel != add.numel || acc.meta->dtype != add.meta->dtype)
        return makeError("cannot add \"" + add.meta->id + "\" into \"" +
                         acc.meta->id + "\"");
      if (acc.numel)
        MESHPLAN_TRY(device.accumulate(deviceAddress(b.inputs[2 * i]),
                                       deviceAddress(b.inputs[2 * i + 1]),
                                       acc.meta->dtype, acc.numel, s));
    }
    return {};
  case OpKind::Fp8Amax: {
    if (b.outputs.size() != 1)
      return makeError("fp8_amax needs one output");
    const BufferState &out = buffers[size_t(b.outputs[0])];
    if (out.meta->dtype != DType::Float32 ||
        out.numel != static_cast<int64_t>(b.inputs.size()))
      return makeError("fp8_amax's output must hold one float32 per input");
    MESHPLAN_TRY(ensureOnDevice(b.outputs[0], s));
    auto *a = reinterpret_cast<float *>(deviceAddress(b.outputs[0]));
    for (size_t i = 0; i < b.inputs.size(); ++i) {
      const BufferState &src = buffers[size_t(b.inputs[i])];
      MESHPLAN_TRY(device.amax(deviceAddress(b.inputs[i]), src.meta->dtype,
                               src.numel, a + i, s));
    }
    return {};
  }
  default:
    return makeError("unsupported op " + std::string(plan::opKindName(in.op)));
  }
}

PassOutcome Session::Impl::runDevicePass(StepState &state) {
  Device &device = *dev->device;
  return runPass(state, streams, /*soft=*/false, [&](Bound &b) -> Result<void> {
    const StreamGraph::Step &g = dev->graph.steps[size_t(b.index)];
    DeviceStream s = dev->streams[size_t(g.stream)];
    // The instructions these events follow are enqueued already: they are
    // this one's deps or its communicator's earlier collectives, which
    // runPass waited for.
    for (int e : g.waits)
      MESHPLAN_TRY(device.wait(s, dev->events[size_t(e)]));
    bool timed = !dev->timingBefore.empty();
    if (!timed) {
      MESHPLAN_TRY(executeOnDevice(b, s));
    } else {
      // Held until enqueued, where enqueueing never waits for the stream,
      // so that the events time the device's work (Device::hold).
      bool held = holdsForTiming(b);
      if (held)
        MESHPLAN_TRY(device.hold(s));
      Result<void> done = device.record(dev->timingBefore[size_t(b.index)], s);
      if (done)
        done = executeOnDevice(b, s);
      if (done)
        done = device.record(dev->timingAfter[size_t(b.index)], s);
      if (held)
        if (auto let = device.release(s); !let && done)
          done = let;
      MESHPLAN_TRY(done);
    }
    if (g.record >= 0)
      MESHPLAN_TRY(device.record(dev->events[size_t(g.record)], s));
    return Result<void>();
  });
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

bool Session::Impl::holdsForTiming(const Bound &b) {
  // The runtime's own kernels: enqueueing them calls nothing but the
  // device's kernels and copies. Not a compute callback (computeOnHost waits
  // for its stream), nor a collective: a host backend's (Gloo's, staged)
  // waits for the stream before it can send, and NCCL's enqueue hung held
  // on the first GPU run (it may wait for the device inside; docs/cuda.md).
  switch (b.in->op) {
  case OpKind::Cast:
  case OpKind::Fp8Cast:
  case OpKind::Sum:
  case OpKind::Accumulate:
  case OpKind::Fp8Amax:
  case OpKind::OptimizerUpdate:
    return true;
  default:
    return false;
  }
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
  MESHPLAN_TRY(dev->device->copyFromHost(deviceAddress(buffer), host.data(),
                                         host.size(), s));
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
        MESHPLAN_TRY(dev->device->zero(deviceAddress(int(i)), bytesOf(st),
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

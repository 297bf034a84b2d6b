//===- Session.cpp - The session API and its steps ------------------------===//
//
// Session's public functions, the pass that runs a step's instructions and
// the host executor. The rest of a session lives beside it: plan binding
// (Binding.cpp), fault tolerance (FaultTolerance.cpp), checkpoints
// (SessionCheckpoint.cpp), options from the environment (SessionOptions.cpp)
// and the executor on devices (DeviceExecution.cpp); SessionImpl.h holds the
// state they share.
//
// Execution: one thread per stream runs that stream's instructions in
// program order. An instruction starts when its deps have completed and, for
// a collective, when every earlier collective of its communicator (program
// order) has completed, so all members issue a communicator's collectives in
// the order the verifier checked. Every wait is bounded by the session's
// timeout; the first failure stops all streams.
//
//===----------------------------------------------------------------------===//

#include "meshplan/Runtime/Session.h"

#include "BoxCopy.h"
#include "SessionImpl.h"
#include "StagedCommunicator.h"

#include "meshplan/Core/Layout.h"
#include "meshplan/Core/MeshView.h"
#include "meshplan/Plan/Template.h"
#include "meshplan/Runtime/Kernels.h"
#include "meshplan/Runtime/Membership.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include <sys/mman.h>

namespace meshplan::runtime {

using plan::BufferKind;
using plan::DType;
using plan::Instruction;
using plan::OpKind;
namespace k = kernels;

int64_t TensorView::numElements() const { return product(buffer->localShape); }

std::string Session::Impl::describe(const Bound &b) const {
  std::string s = "instruction \"" + b.in->id + "\"";
  if (!b.in->label.empty())
    s += " (" + b.in->label + ")";
  return s;
}

/// The store key of a step's first failure (docs/runtime.md, "When a rank
/// fails").
static constexpr const char *kFailureKey = "step-failure";

void Session::Impl::reportFailure(bool onCommunicator, Error &error) {
  if (ft)
    return; // the replica groups' protocol handles failures
  stepFailed = true;
  if (onCommunicator) {
    auto peer = backend->storePeek(kFailureKey);
    if (peer && *peer && !(*peer)->empty())
      error = Error{"a peer failed first: " +
                    std::string((*peer)->begin(), (*peer)->end()) +
                    "; that ended this rank's step: " + error.message};
  } else {
    (void)backend->storeSet(
        kFailureKey,
        std::vector<char>(error.message.begin(), error.message.end()));
  }
  // A communicator being created holds commMutex through its rendezvous,
  // which abort cannot end: skip them then (they end at their timeout).
  std::unique_lock<std::mutex> lock(commMutex, std::try_to_lock);
  if (!lock.owns_lock())
    return;
  for (auto &comm : comms)
    if (comm)
      comm->abort(error.message);
  for (auto &[id, comm] : trainerComms)
    comm->abort(error.message);
}

TensorView Session::Impl::view(int buffer) {
  BufferState &s = buffers[buffer];
  TensorView v;
  v.buffer = s.meta;
  if (dev) {
    // Device memory; a float8 scale is a device value (deviceScale).
    v.bytes =
        std::span<std::byte>(deviceAddress(buffer),
                             size_t(s.numel * plan::dtypeBytes(s.meta->dtype)));
    v.onDevice = true;
    return v;
  }
  v.bytes = std::span<std::byte>(s.data.data(), s.data.size());
  if (s.meta->scale)
    v.scale = scaleOf(buffers, bufferIds, *s.meta);
  return v;
}

/// Allocates (zeroed) a buffer about to be written.
void Session::Impl::ensure(int buffer) {
  BufferState &s = buffers[buffer];
  if (!s.live) {
    s.data.assign(size_t(s.numel * plan::dtypeBytes(s.meta->dtype)),
                  std::byte{0});
    s.live = true;
  }
}

Result<Communicator *> Session::Impl::communicator(int index) {
  std::lock_guard<std::mutex> lock(commMutex);
  if (!comms[index]) {
    auto comm = backend->createCommunicator(groupSpecOf(index));
    if (!comm)
      return comm.error();
    comms[index] = std::move(*comm);
    // On a device, a host backend's collectives go through host memory.
    if (dev && comms[index]->memoryKind() == MemoryKind::Host)
      comms[index] = stageThroughHost(std::move(comms[index]), dev->device);
  }
  return comms[index].get();
}

/// A plan communicator as this rank creates it. A fault_tolerant one is the
/// group over the current quorum's live groups (core's groupOf with live
/// members), of the quorum's epoch, still averaging over its nominal size; the
/// others are the plan's, of this rank's group's incarnation.
GroupSpec Session::Impl::groupSpecOf(int index) {
  const plan::Communicator &c = plan.communicators[size_t(index)];
  GroupSpec g{c.id, c.color, c.ranks, c.key, 0};
  g.incarnation = incarnation();
  if (!ft) {
    // A rendezvous under way when this rank's step fails ends at once
    // (reportFailure) rather than at its timeout.
    g.cancelled = [this]() -> std::optional<std::string> {
      if (!stepFailed.load())
        return std::nullopt;
      return std::string("this rank's step failed");
    };
  }
  if (!ft || !c.faultTolerant)
    return g;
  LiveMembers live;
  std::vector<int64_t> groups(ft->quorum.members.begin(),
                              ft->quorum.members.end());
  auto set = live.set(*mesh, ft->axis, groups);
  auto derived = set ? plan::deriveGroup(*mesh, c.axes, plan.rank, &live)
                     : Result<plan::DerivedGroup>(set.error());
  // Checked at open: the communicator has axes and this rank is live.
  if (derived) {
    g.ranks = derived->ranks;
    g.color = derived->color;
    g.key = derived->key;
  }
  g.epoch = ft->quorum.epoch;
  g.incarnation = 0; // spans groups of different incarnations
  // A member that died before the group's rendezvous never comes: the
  // rendezvous ends once the job has moved on (the watcher beside the step
  // proposes the next epoch when a group's heartbeat expires).
  g.cancelled = [m = ft->membership.get(),
                 epoch = g.epoch]() -> std::optional<std::string> {
    if (!m->epochChangedSince(epoch))
      return std::nullopt;
    return "epoch " + std::to_string(epoch) +
           " ended (the job moved to epoch " +
           std::to_string(m->observedEpoch()) + ")";
  };
  g.nominalSize = static_cast<int64_t>(c.ranks.size());
  return g;
}

bool Session::Impl::sharing(const Bound &b) const {
  return ft && !ft->shareLayout.empty() && b.comm >= 0 &&
         plan.communicators[size_t(b.comm)].faultTolerant;
}

/// A fault_tolerant all-reduce while groups are missing (FaultTolerance::
/// sharesApart): in every pass but this rank's last, keeps the packed input
/// of the pass's share; in the last, sums every share of every member in
/// group order into `data`. True once `data` holds the sum.
Result<bool> Session::Impl::allReduceShare(const Bound &b, Communicator &c,
                                           std::byte *data, int64_t count,
                                           DType wire) {
  FaultTolerance &f = *ft;
  size_t bytes = size_t(count * plan::dtypeBytes(wire));
  std::lock_guard<std::mutex> lock(*f.stashMutex);
  std::vector<std::vector<std::byte>> &kept = f.shareStash[b.index];
  if (f.sharePass + 1 < f.dataRanks.size()) {
    kept.emplace_back(data, data + bytes);
    return false;
  }
  std::vector<const void *> mine;
  for (const std::vector<std::byte> &k : kept)
    mine.push_back(k.data());
  mine.push_back(data);
  MESHPLAN_TRY(
      c.allReduceShares(mine, data, count, wire, *b.in->reduce, f.shareLayout));
  kept.clear();
  return true;
}

Result<void> Session::Impl::runCollective(Bound &b) {
  const Instruction &in = *b.in;
  auto comm = communicator(b.comm);
  if (!comm)
    return comm.error();
  Communicator &c = **comm;
  DType wire = *in.dtype;
  int64_t esize = plan::dtypeBytes(wire);
  int64_t n = c.size();
  int64_t count = in.count;
  auto box = [&](int buffer) {
    BufferState &s = buffers[buffer];
    return BoxRef{s.data.data(), s.meta->dtype, &s.meta->localShape,
                  &s.meta->offset};
  };
  auto chunkRef = [&](std::vector<std::byte> &stage, int64_t elementAt,
                      const Pair &p, const ShardBox &member) {
    return BoxRef{stage.data() + elementAt * esize, wire, &p.padded,
                  &member.offset};
  };
  for (int x : b.inputs)
    if (!buffers[x].live)
      return makeError("reads \"" + buffers[x].meta->id +
                       "\" before anything wrote it");
  for (int x : b.outputs)
    ensure(x);

  if (b.direct) {
    std::byte *src = buffers[b.pairs[0].in].data.data();
    std::byte *dst = buffers[b.pairs[0].out].data.data();
    switch (in.op) {
    case OpKind::AllGather:
      return c.allGather(src, dst, count, wire);
    case OpKind::ReduceScatter:
      return c.reduceScatter(src, dst, count, wire, *in.reduce);
    case OpKind::AllReduce:
      if (src != dst)
        std::memcpy(dst, src, size_t(count * esize));
      if (sharing(b)) {
        auto summed = allReduceShare(b, c, dst, count, wire);
        return summed ? Result<void>() : Result<void>(summed.error());
      }
      return c.allReduce(dst, count, wire, *in.reduce);
    case OpKind::Broadcast:
      if (src != dst)
        std::memcpy(dst, src, size_t(count * esize));
      return c.broadcast(dst, count, wire, in.root);
    default:
      break;
    }
  }

  switch (in.op) {
  case OpKind::AllGather: {
    std::vector<std::byte> send(size_t(count * esize), std::byte{0});
    std::vector<std::byte> recv(size_t(count * n * esize));
    for (const Pair &p : b.pairs) {
      const ShardBox &mine = p.members[size_t(c.key())];
      // Copy-in: the shard converted to the wire type (fp32 -> bf16, or
      // -> float8 with the gathered buffer's scale).
      float scale = scaleOf(buffers, bufferIds, *buffers[p.out].meta);
      copyBox(box(p.in), chunkRef(send, p.at, p, mine), mine.offset,
              mine.localShape, scale);
    }
    MESHPLAN_TRY(c.allGather(send.data(), recv.data(), count, wire));
    for (const Pair &p : b.pairs)
      for (int64_t m = 0; m < n; ++m) {
        const ShardBox &theirs = p.members[size_t(m)];
        copyBox(chunkRef(recv, m * count + p.at, p, theirs), box(p.out),
                theirs.offset, theirs.localShape);
      }
    return {};
  }
  case OpKind::ReduceScatter: {
    std::vector<std::byte> send(size_t(count * n * esize), std::byte{0});
    std::vector<std::byte> recv(size_t(count * esize));
    for (const Pair &p : b.pairs)
      for (int64_t m = 0; m < n; ++m) {
        const ShardBox &theirs = p.members[size_t(m)];
        copyBox(box(p.in), chunkRef(send, m * count + p.at, p, theirs),
                theirs.offset, theirs.localShape);
      }
    MESHPLAN_TRY(
        c.reduceScatter(send.data(), recv.data(), count, wire, *in.reduce));
    for (const Pair &p : b.pairs) {
      const ShardBox &mine = p.members[size_t(c.key())];
      copyBox(chunkRef(recv, p.at, p, mine), box(p.out), mine.offset,
              mine.localShape);
    }
    return {};
  }
  case OpKind::AllReduce:
  case OpKind::Broadcast: {
    std::vector<std::byte> data(size_t(count * esize), std::byte{0});
    for (const Pair &p : b.pairs) {
      const ShardBox &mine = p.members[0];
      copyBox(box(p.in), chunkRef(data, p.at, p, mine), mine.offset,
              mine.localShape);
    }
    if (in.op == OpKind::AllReduce && sharing(b)) {
      auto summed = allReduceShare(b, c, data.data(), count, wire);
      if (!summed)
        return summed.error();
      if (!*summed)
        return {}; // deferred to the last share's pass
    } else if (in.op == OpKind::AllReduce) {
      MESHPLAN_TRY(c.allReduce(data.data(), count, wire, *in.reduce));
    } else {
      MESHPLAN_TRY(c.broadcast(data.data(), count, wire, in.root));
    }
    for (const Pair &p : b.pairs) {
      const ShardBox &mine = p.members[0];
      copyBox(chunkRef(data, p.at, p, mine), box(p.out), mine.offset,
              mine.localShape);
    }
    return {};
  }
  case OpKind::Permute: {
    std::vector<std::byte> send(size_t(count * esize), std::byte{0});
    std::vector<std::byte> recv(size_t(count * esize));
    const Pair &first = b.pairs[0];
    for (const Pair &p : b.pairs) {
      const ShardBox &mine = p.inBoxes[size_t(c.key())];
      copyBox(box(p.in), chunkRef(send, p.at, p, mine), mine.offset,
              mine.localShape);
    }
    MESHPLAN_TRY(c.sendRecv(send.data(), first.sendTo, recv.data(),
                            first.recvFrom, count, wire));
    for (const Pair &p : b.pairs) {
      const ShardBox &theirs = p.inBoxes[size_t(p.recvFrom)];
      copyBox(chunkRef(recv, p.at, p, theirs), box(p.out), theirs.offset,
              theirs.localShape);
    }
    return {};
  }
  case OpKind::AllToAll: {
    std::vector<std::byte> send(size_t(count * n * esize), std::byte{0});
    std::vector<std::byte> recv(size_t(count * n * esize));
    int64_t me = c.key();
    // Block k carries the part of my input that member k's output holds,
    // packed densely; both sides compute the same intersection.
    auto dense = [&](std::vector<std::byte> &stage, int64_t elementAt,
                     const ShardBox &part) {
      return BoxRef{stage.data() + elementAt * esize, wire, &part.localShape,
                    &part.offset};
    };
    for (const Pair &p : b.pairs)
      for (int64_t k = 0; k < n; ++k) {
        ShardBox part = intersect(p.inBoxes[size_t(me)], p.outBoxes[size_t(k)]);
        copyBox(box(p.in), dense(send, k * count + p.at, part), part.offset,
                part.localShape);
      }
    MESHPLAN_TRY(c.allToAll(send.data(), recv.data(), count, wire));
    for (const Pair &p : b.pairs)
      for (int64_t k = 0; k < n; ++k) {
        ShardBox part = intersect(p.inBoxes[size_t(k)], p.outBoxes[size_t(me)]);
        copyBox(dense(recv, k * count + p.at, part), box(p.out), part.offset,
                part.localShape);
      }
    return {};
  }
  default:
    return makeError("unsupported collective");
  }
}

Result<void> Session::Impl::runTransfer(Bound &b) {
  const Instruction &in = *b.in;
  auto comm = communicator(b.comm);
  if (!comm)
    return comm.error();
  if (in.op == OpKind::Send) {
    BufferState &src = buffers[b.inputs[0]];
    if (!src.live)
      return makeError("sends \"" + src.meta->id +
                       "\" before anything wrote it");
    return (*comm)->send(src.data.data(), in.peer, in.count, *in.dtype, in.tag);
  }
  ensure(b.outputs[0]);
  return (*comm)->recv(buffers[b.outputs[0]].data.data(), in.peer, in.count,
                       *in.dtype, in.tag);
}

ComputeCall Session::Impl::callOf(const Bound &b) const {
  const Instruction &in = *b.in;
  ComputeCall call;
  call.phase = in.phase;
  call.unit = in.unit;
  call.microbatch = in.microbatch;
  call.step = steps + 1;
  call.session = self;
  if (ft && !ft->shareLayout.empty())
    call.shares = {int64_t(ft->sharePass)};
  else if (ft)
    for (size_t k = 0; k < ft->dataRanks.size(); ++k)
      call.shares.push_back(int64_t(k));
  return call;
}

Result<void> Session::Impl::invoke(ComputeCall &call) {
  auto it = callbacks.find({call.phase, call.unit});
  const ComputeCallback *fn =
      it != callbacks.end() ? &it->second : (fallback ? &fallback : nullptr);
  if (!fn)
    return makeError("no compute callback for " + call.phase + " " + call.unit +
                     " (register one with onCompute)");
  Result<void> ok = (*fn)(call);
  if (!ok)
    return ok.error().within("the " + call.phase + " callback of " + call.unit);
  return {};
}

Result<void> Session::Impl::runCompute(Bound &b) {
  ComputeCall call = callOf(b);
  // Inputs: parameters, then (accumulating microbatches) the gradients so
  // far; amax buffers only feed the scales.
  std::map<std::string, int> accumulated;
  for (int x : b.inputs) {
    BufferState &s = buffers[x];
    if (!s.live)
      return makeError("reads \"" + s.meta->id + "\" before anything wrote it");
    if (s.meta->kind == BufferKind::Gradient) {
      accumulated[s.meta->tensor] = x;
      continue;
    }
    // An amax: its values reach the callback as scales. A pipeline stage's
    // activation (docs/pipeline.md, "Planning") is passed in its place among
    // the inputs, as is the activation a compute writes among the outputs.
    if (s.meta->tensor.empty() && s.meta->kind != BufferKind::Activation)
      continue;
    call.params.push_back(view(x));
  }
  for (int x : b.outputs) {
    BufferState &s = buffers[x];
    auto from = accumulated.find(s.meta->tensor);
    if (from != accumulated.end() && from->second != x) {
      const BufferState &prev = buffers[from->second];
      if (prev.data.size() != size_t(s.numel * plan::dtypeBytes(s.meta->dtype)))
        return makeError("accumulates \"" + prev.meta->id + "\" into \"" +
                         s.meta->id + "\", which has another size");
      s.data = prev.data;
      s.live = true;
    } else if (from == accumulated.end()) {
      s.live = false; // a fresh gradient starts at zero
      ensure(x);
    }
    call.grads.push_back(view(x));
  }
  return invoke(call);
}

double Session::Impl::stepLr() const {
  return lrOverride ? *lrOverride : plan.optimizer->lrAt(steps + 1);
}

Result<void> Session::Impl::runOptimizer(Bound &b) {
  const plan::OptimizerConfig &o = *plan.optimizer;
  // A non-finite gradient norm skips every update of the step; every rank
  // of the norm's group reduced the same integers, so all skip alike.
  if (skipUpdates)
    return {};
  k::AdamWParams hp{stepLr(), o.beta1, o.beta2, o.eps, o.weightDecay};
  int64_t step = steps + 1;
  for (size_t g = 0; g + 3 < b.inputs.size(); g += 4) {
    BufferState &param = buffers[b.inputs[g]];
    hp.weightDecay = o.weightDecayOf(param.meta->tensor);
    BufferState &grad = buffers[b.inputs[g + 1]];
    BufferState &m = buffers[b.inputs[g + 2]];
    BufferState &v = buffers[b.inputs[g + 3]];
    if (!grad.live)
      return makeError("reads \"" + grad.meta->id +
                       "\" before anything wrote it");
    size_t n = size_t(param.numel);
    std::span<const float> gs(reinterpret_cast<const float *>(grad.data.data()),
                              n);
    std::span<float> ms(reinterpret_cast<float *>(m.data.data()), n);
    std::span<float> vs(reinterpret_cast<float *>(v.data.data()), n);
    if (o.stochasticRounding) {
      auto runs = k::boxIndexRuns(param.meta->globalShape, param.meta->offset,
                                  param.meta->localShape);
      if (!runs)
        return makeError("\"" + param.meta->id + "\": bad box");
      k::adamwBf16StochasticRounding(
          {reinterpret_cast<uint16_t *>(param.data.data()), n}, gs, ms, vs, hp,
          step, static_cast<uint64_t>(o.seed),
          static_cast<uint64_t>(*param.meta->tensorId), *runs);
    } else {
      k::adamwFp32({reinterpret_cast<float *>(param.data.data()), n}, gs, ms,
                   vs, hp, step);
    }
  }
  return {};
}

Result<void> Session::Impl::execute(Bound &b) {
  const Instruction &in = *b.in;
  switch (in.op) {
  case OpKind::AllGather:
  case OpKind::ReduceScatter:
  case OpKind::AllReduce:
  case OpKind::Broadcast:
  case OpKind::AllToAll:
  case OpKind::Permute:
    return runCollective(b);
  case OpKind::Send:
  case OpKind::Recv:
    return runTransfer(b);
  case OpKind::Compute:
    return runCompute(b);
  case OpKind::OptimizerUpdate:
    return runOptimizer(b);
  case OpKind::Free:
    for (int x : b.inputs) {
      buffers[x].data = {};
      buffers[x].live = false;
    }
    return {};
  case OpKind::Wait:
    return {};
  default:
    break;
  }
  // Local elementwise ops.
  for (int x : b.inputs)
    if (!buffers[x].live)
      return makeError("reads \"" + buffers[x].meta->id +
                       "\" before anything wrote it");
  switch (in.op) {
  case OpKind::Cast:
    for (size_t i = 0; i < b.inputs.size(); ++i) {
      BufferState &src = buffers[b.inputs[i]], &dst = buffers[b.outputs[i]];
      if (src.numel != dst.numel ||
          !canConvert(src.meta->dtype, dst.meta->dtype))
        return makeError("cannot cast \"" + src.meta->id + "\" into \"" +
                         dst.meta->id + "\"");
      ensure(b.outputs[i]);
      convertElements(src.data.data(), src.meta->dtype, dst.data.data(),
                      dst.meta->dtype, src.numel, 1.0f);
    }
    return {};
  case OpKind::Sum:
    for (size_t i = 0; i < b.inputs.size(); ++i) {
      BufferState &src = buffers[b.inputs[i]], &dst = buffers[b.outputs[i]];
      if (src.meta->dtype != DType::Float32 ||
          dst.meta->dtype != DType::Float32 || dst.numel == 0 ||
          src.numel % dst.numel != 0)
        return makeError("cannot sum the rows of \"" + src.meta->id +
                         "\" into \"" + dst.meta->id + "\"");
      ensure(b.outputs[i]);
      auto *s = reinterpret_cast<const float *>(src.data.data());
      auto *d = reinterpret_cast<float *>(dst.data.data());
      std::fill(d, d + dst.numel, 0.0f);
      for (int64_t r = 0; r < src.numel / dst.numel; ++r)
        for (int64_t j = 0; j < dst.numel; ++j)
          d[j] += s[r * dst.numel + j];
    }
    return {};
  case OpKind::Accumulate:
    // Per tensor: inputs (accumulator, addend), added in place (the reader
    // checked shapes and dtypes). bfloat16 adds in float32 and rounds to
    // nearest even, once per addition.
    for (size_t i = 0; i < b.outputs.size(); ++i) {
      BufferState &acc = buffers[b.inputs[2 * i]];
      const BufferState &add = buffers[b.inputs[2 * i + 1]];
      if (acc.numel != add.numel || acc.meta->dtype != add.meta->dtype)
        return makeError("cannot add \"" + add.meta->id + "\" into \"" +
                         acc.meta->id + "\"");
      if (acc.meta->dtype == DType::Float32) {
        auto *d = reinterpret_cast<float *>(acc.data.data());
        auto *s = reinterpret_cast<const float *>(add.data.data());
        for (int64_t j = 0; j < acc.numel; ++j)
          d[j] += s[j];
      } else if (acc.meta->dtype == DType::BFloat16) {
        auto *d = reinterpret_cast<uint16_t *>(acc.data.data());
        auto *s = reinterpret_cast<const uint16_t *>(add.data.data());
        for (int64_t j = 0; j < acc.numel; ++j)
          d[j] = k::floatToBf16(k::bf16ToFloat(d[j]) + k::bf16ToFloat(s[j]));
      } else {
        return makeError("cannot accumulate a " +
                         std::string(plan::dtypeName(acc.meta->dtype)) +
                         " buffer");
      }
    }
    return {};
  case OpKind::GradNorm: {
    // The exact partial norm of the gradients this rank counts (core's
    // accumulator; the reader checked the buffer's dtype and length).
    BufferState &out = buffers[b.outputs[0]];
    ensure(b.outputs[0]);
    std::span<int64_t> acc(reinterpret_cast<int64_t *>(out.data.data()),
                           size_t(out.numel));
    std::fill(acc.begin(), acc.end(), 0);
    for (int x : b.inputs) {
      const BufferState &g = buffers[x];
      accumulateGradNorm(
          plan.optimizer->normType,
          {reinterpret_cast<const float *>(g.data.data()), size_t(g.numel)},
          acc);
    }
    return {};
  }
  case OpKind::ClipGradients: {
    const plan::OptimizerConfig &o = *plan.optimizer;
    const BufferState &reduced = buffers[b.inputs[0]];
    double norm = gradNormOf(
        o.normType, {reinterpret_cast<const int64_t *>(reduced.data.data()),
                     size_t(reduced.numel)});
    gradNorm = norm;
    skipUpdates = !std::isfinite(norm);
    clipCoefficient =
        skipUpdates ? 1.0f : meshplan::clipCoefficient(*o.maxNorm, norm);
    if (skipUpdates || clipCoefficient == 1.0f)
      return {};
    for (size_t i = 1; i < b.inputs.size(); ++i) {
      BufferState &g = buffers[b.inputs[i]];
      auto *d = reinterpret_cast<float *>(g.data.data());
      for (int64_t j = 0; j < g.numel; ++j)
        d[j] *= clipCoefficient;
    }
    return {};
  }
  case OpKind::Fp8Amax: {
    if (b.outputs.size() != 1)
      return makeError("fp8_amax needs one output");
    BufferState &out = buffers[b.outputs[0]];
    if (out.meta->dtype != DType::Float32 ||
        out.numel != static_cast<int64_t>(b.inputs.size()))
      return makeError("fp8_amax's output must hold one float32 per input");
    ensure(b.outputs[0]);
    auto *a = reinterpret_cast<float *>(out.data.data());
    for (size_t i = 0; i < b.inputs.size(); ++i) {
      BufferState &s = buffers[b.inputs[i]];
      size_t n = size_t(s.numel);
      if (s.meta->dtype == DType::Float32)
        a[i] = k::amax({reinterpret_cast<const float *>(s.data.data()), n});
      else if (s.meta->dtype == DType::BFloat16)
        a[i] = k::amax({reinterpret_cast<const uint16_t *>(s.data.data()), n});
      else
        return makeError("fp8_amax of a " +
                         std::string(plan::dtypeName(s.meta->dtype)) +
                         " buffer");
    }
    return {};
  }
  case OpKind::Fp8Cast:
    for (size_t i = 0; i < b.outputs.size(); ++i) {
      BufferState &src = buffers[b.inputs[i]], &dst = buffers[b.outputs[i]];
      if (!canConvert(src.meta->dtype, dst.meta->dtype))
        return makeError("cannot cast \"" + src.meta->id + "\" to float8");
      ensure(b.outputs[i]);
      convertElements(src.data.data(), src.meta->dtype, dst.data.data(),
                      dst.meta->dtype, src.numel,
                      scaleOf(buffers, bufferIds, *dst.meta));
    }
    return {};
  default:
    return makeError("unsupported op " + std::string(plan::opKindName(in.op)));
  }
}

//===----------------------------------------------------------------------===//
// Session
//===----------------------------------------------------------------------===//

Session::Session(std::unique_ptr<Impl> i) : impl(std::move(i)) {
  impl->self = this;
}
Session::~Session() { (void)close(); }

Result<void> Session::close() {
  Impl &m = *impl;
  if (m.closed)
    return {};
  m.closed = true;
  if (m.broken)
    return {};
  std::lock_guard<std::mutex> lock(m.commMutex);
  for (size_t i = 0; i < m.comms.size(); ++i)
    if (m.comms[i])
      if (auto ok = m.comms[i]->barrier(); !ok)
        return ok.error().within("closing communicator \"" +
                                 m.plan.communicators[i].id + "\"");
  for (auto &[id, comm] : m.trainerComms)
    if (auto ok = comm->barrier(); !ok)
      return ok.error().within("closing trainer communicator \"" + id + "\"");
  return {};
}

Result<std::unique_ptr<Session>> Session::open(plan::Plan p,
                                               const SessionOptions &options) {
  auto impl = std::make_unique<Impl>();
  impl->plan = std::move(p);
  impl->options = options;
  MESHPLAN_TRY(impl->bind());
  BackendOptions bo;
  bo.store = options.store;
  bo.rank = options.rank;
  bo.worldSize = options.worldSize;
  bo.timeout = options.timeout;
  bo.job = options.job;
  bo.keyOrderReductions = options.keyOrderReductions;
  bo.localRank = options.localRank;
  Result<std::unique_ptr<Backend>> backend = makeError("no backend");
  if (options.makeBackend) {
    backend = options.makeBackend(bo);
  } else if (options.backend == "nccl") {
    // The NCCL backend lives in MeshplanRuntimeNccl (CUDA builds), which a
    // program links to run on GPUs; this library alone has no CUDA.
    if (!buildHasCudaBackend())
      return makeError("backend \"nccl\": this build has no CUDA backend "
                       "(configure with the CUDA toolkit installed and "
                       "MESHPLAN_CUDA=AUTO or ON; docs/cuda.md)");
    return makeError("backend \"nccl\": this program does not link the CUDA "
                     "backend (link MeshplanRuntimeNccl and open the session "
                     "with cudaSessionOptions from meshplan/Runtime/"
                     "CudaDevice.h; docs/cuda.md)");
  } else if (options.backend == "gloo") {
    backend = createGlooBackend(bo);
  } else {
    return makeError("backend \"" + options.backend +
                     "\": unknown (expected \"gloo\" or \"nccl\")");
  }
  if (!backend)
    return backend.error().within("store " + options.store.text());
  if ((*backend)->memoryKind() == MemoryKind::Device && !options.device)
    return makeError("backend \"" + std::string((*backend)->name()) +
                     "\" runs on device buffers: the session needs a device "
                     "(SessionOptions::device; docs/cuda.md)");
  impl->backend = std::move(*backend);
  if (options.faultTolerance)
    MESHPLAN_TRY(impl->setUpFaultTolerance());
  if (options.device)
    MESHPLAN_TRY(impl->setUpDevice());
  // Every group this session may create, in the plan's communicator order
  // (the same on every rank): the plan's, then the trainer's separate ones
  // over the same members (trainerCommunicator). A backend whose group
  // creation is collective over the whole job (NCCL) creates them in this
  // order; Gloo ignores it.
  std::vector<GroupSpec> groups;
  for (const plan::Communicator &c : impl->plan.communicators)
    groups.push_back({c.id, c.color, c.ranks, c.key, 0});
  for (const plan::Communicator &c : impl->plan.communicators)
    groups.push_back({"trainer/" + c.id, c.color, c.ranks, c.key, 0});
  MESHPLAN_TRY(impl->backend->declareGroups(groups));
  return std::unique_ptr<Session>(new Session(std::move(impl)));
}

Result<std::unique_ptr<Session>>
Session::openPath(const std::string &path, const SessionOptions &options) {
  std::string file = path;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    file = (std::filesystem::path(path) /
            ("rank" + std::to_string(options.rank) + ".json"))
               .string();
  auto p = plan::readPlanFile(file);
  if (!p)
    return p.error();
  auto s = open(std::move(*p), options);
  if (!s)
    return s.error().within(file);
  return s;
}

Result<std::unique_ptr<Session>>
Session::openTemplate(const plan::PreparedTemplate &tmpl,
                      const SessionOptions &options) {
  if (options.rank < 0 || options.rank >= tmpl.mesh().size())
    return makeError("rank " + std::to_string(options.rank) +
                     " is not in the template's mesh of " +
                     std::to_string(tmpl.mesh().size()) + " ranks");
  auto p = tmpl.instantiate(options.rank, /*withEstimates=*/false);
  if (!p)
    return p.error();
  return open(std::move(*p), options);
}

void Session::onCompute(ComputeCallback callback) {
  impl->fallback = std::move(callback);
}
void Session::onCompute(const std::string &phase, const std::string &unit,
                        ComputeCallback callback) {
  impl->callbacks[{phase, unit}] = std::move(callback);
}

Result<void>
Session::initParameters(const std::function<Result<void>(TensorView &)> &init) {
  if (impl->dev)
    return impl->initOnDevice(init);
  for (size_t i = 0; i < impl->buffers.size(); ++i) {
    BufferState &s = impl->buffers[i];
    if (s.meta->kind == BufferKind::OptimizerState) {
      std::fill(s.data.begin(), s.data.end(), std::byte{0});
      continue;
    }
    if (s.meta->kind != BufferKind::ParamShard)
      continue;
    TensorView v = impl->view(static_cast<int>(i));
    MESHPLAN_TRY(init(v));
  }
  return {};
}

Result<void> Session::copyIn(const std::string &id,
                             std::span<const std::byte> whole) {
  auto it = impl->bufferIds.find(id);
  if (it == impl->bufferIds.end() || !impl->buffers[it->second].persistent)
    return makeError("no persistent buffer \"" + id + "\" in the plan");
  BufferState &s = impl->buffers[it->second];
  int64_t bytes =
      product(s.meta->globalShape) * plan::dtypeBytes(s.meta->dtype);
  if (static_cast<int64_t>(whole.size()) != bytes)
    return makeError("\"" + id + "\": " + std::to_string(whole.size()) +
                     " bytes given, the whole tensor has " +
                     std::to_string(bytes));
  std::vector<int64_t> zero(s.meta->globalShape.size(), 0);
  BoxRef src{const_cast<std::byte *>(whole.data()), s.meta->dtype,
             &s.meta->globalShape, &zero};
  std::vector<std::byte> staging;
  std::byte *into = s.data.data();
  if (impl->dev) {
    staging.resize(size_t(s.numel * plan::dtypeBytes(s.meta->dtype)));
    into = staging.data();
  }
  BoxRef dst{into, s.meta->dtype, &s.meta->localShape, &s.meta->offset};
  copyBox(src, dst, s.meta->offset, s.meta->localShape);
  if (impl->dev)
    return impl->toDevice(it->second, staging);
  return {};
}

Result<void> Session::copyOut(const TensorView &view,
                              std::span<std::byte> host) {
  if (host.size() != view.bytes.size())
    return makeError(
        "copyOut of \"" + view.id() + "\": " + std::to_string(host.size()) +
        " bytes given, the view has " + std::to_string(view.bytes.size()));
  if (!view.onDevice) {
    if (!host.empty())
      std::memcpy(host.data(), view.bytes.data(), host.size());
    return {};
  }
  if (!impl->dev)
    return makeError("copyOut of \"" + view.id() +
                     "\": a device view, but this session has no device");
  return impl->fromDevice(view.bytes.data(), host);
}

Result<void> Session::copyInto(const TensorView &view,
                               std::span<const std::byte> host) {
  auto it = impl->bufferIds.find(view.id());
  if (it == impl->bufferIds.end() || !impl->buffers[it->second].persistent)
    return makeError("no persistent buffer \"" + view.id() + "\" in the plan");
  if (host.size() != view.bytes.size())
    return makeError(
        "copyInto \"" + view.id() + "\": " + std::to_string(host.size()) +
        " bytes given, the shard has " + std::to_string(view.bytes.size()));
  if (impl->dev)
    return impl->toDevice(it->second, host);
  if (!host.empty())
    std::memcpy(impl->buffers[it->second].data.data(), host.data(),
                host.size());
  return {};
}

Device *Session::device() const {
  return impl->dev ? impl->dev->device.get() : nullptr;
}

namespace detail {
using SpanClock = std::chrono::steady_clock;
using Span = std::pair<SpanClock::time_point, SpanClock::time_point>;

/// Total length of the union of intervals (sorted in place).
double unionSeconds(std::vector<Span> &spans) {
  std::sort(spans.begin(), spans.end());
  double total = 0;
  SpanClock::time_point start{}, end{};
  bool open = false;
  for (const Span &s : spans) {
    if (open && s.first <= end) {
      end = std::max(end, s.second);
      continue;
    }
    if (open)
      total += std::chrono::duration<double>(end - start).count();
    start = s.first;
    end = s.second;
    open = true;
  }
  if (open)
    total += std::chrono::duration<double>(end - start).count();
  return total;
}

/// Where a step's time went, from each instruction's span. `streams` and
/// `commSequence` give the orders an instruction waits on besides its deps
/// (StepProfile::instructionReady).
StepProfile profileOf(const std::vector<Bound> &program,
                      const std::vector<Span> &spans,
                      const std::vector<std::vector<int>> &streams,
                      const std::vector<std::vector<int>> &commSequence,
                      SpanClock::time_point start, SpanClock::time_point end) {
  StepProfile p;
  p.wall = std::chrono::duration<double>(end - start).count();
  std::vector<Span> comm, work, all;
  for (size_t i = 0; i < program.size(); ++i) {
    const Span &s = spans[i];
    double seconds = std::chrono::duration<double>(s.second - s.first).count();
    plan::OpKind op = program[i].in->op;
    if (op == plan::OpKind::Free || op == plan::OpKind::Wait)
      continue;
    all.push_back(s);
    if (isCollective(op)) {
      comm.push_back(s);
      continue;
    }
    work.push_back(s);
    (op == plan::OpKind::Compute ? p.callbacks : p.kernels) += seconds;
  }
  p.collectives = unionSeconds(comm);
  double busy = unionSeconds(all);
  p.exposedCollectives = std::max(0.0, busy - unionSeconds(work));
  p.overhead = std::max(0.0, p.wall - busy);
  p.instructionStart.assign(program.size(), 0.0);
  p.instructionEnd.assign(program.size(), 0.0);
  for (size_t i = 0; i < program.size() && i < spans.size(); ++i) {
    const Span &s = spans[i];
    if (s.first == SpanClock::time_point{} || s.second < s.first)
      continue; // did not run
    p.instructionStart[i] =
        std::chrono::duration<double>(s.first - start).count();
    p.instructionEnd[i] =
        std::chrono::duration<double>(s.second - start).count();
  }
  // Ready: the latest end of what the executor made it wait for.
  std::vector<int> before(program.size(), -1); // previous on its stream
  for (const std::vector<int> &stream : streams)
    for (size_t k = 1; k < stream.size(); ++k)
      before[size_t(stream[k])] = stream[k - 1];
  p.instructionReady.assign(program.size(), 0.0);
  for (size_t i = 0; i < program.size() && i < spans.size(); ++i) {
    const Bound &b = program[i];
    if (p.instructionEnd[i] == 0 && p.instructionStart[i] == 0)
      continue;
    double ready = 0;
    auto after = [&](int j) {
      if (j >= 0 && size_t(j) < program.size())
        ready = std::max(ready, p.instructionEnd[size_t(j)]);
    };
    after(before[i]);
    for (int d : b.deps)
      after(d);
    if (b.comm >= 0 && b.sequence > 0)
      after(commSequence[size_t(b.comm)][size_t(b.sequence - 1)]);
    p.instructionReady[i] = std::min(ready, p.instructionStart[i]);
  }
  return p;
}
} // namespace detail

PassOutcome
Session::Impl::runPass(StepState &state,
                       const std::vector<std::vector<int>> &order, bool soft,
                       const std::function<Result<void>(Bound &)> &run) {
  state.running.assign(state.done.size(), 0);
  // One condition variable per stream, woken only when the instruction that
  // stream waits for has become ready (or the pass failed): a finished
  // instruction wakes no thread that would go straight back to sleep. On
  // oversubscribed cores each needless wake-up can preempt the thread that
  // finished, which then waits a scheduler slice before its next
  // instruction (docs/runtime.md, "Waking only the stream that can run").
  std::mutex mutex;
  std::vector<std::condition_variable> wake(order.size());
  // Per stream: the instruction it waits for, -1 while it runs or is done.
  std::vector<int> waitingFor(order.size(), -1);
  PassOutcome out;
  auto ready = [&](const Bound &b) {
    if (out.failure)
      return true;
    for (int d : b.deps)
      if (!state.done[size_t(d)])
        return false;
    return b.comm < 0 ||
           commSequence[size_t(b.comm)][size_t(state.turn[size_t(b.comm)])] ==
               b.index;
  };
  // Under `mutex`: the streams other than `self` whose instruction is now
  // ready (all of them after a failure). Notified after the lock is released.
  auto readyStreams = [&](size_t self) {
    std::vector<size_t> runnable;
    for (size_t s = 0; s < waitingFor.size(); ++s)
      if (s != self && waitingFor[s] >= 0 &&
          ready(program[size_t(waitingFor[s])]))
        runnable.push_back(s);
    return runnable;
  };
  auto wakeAll = [&] {
    for (std::condition_variable &cv : wake)
      cv.notify_all();
  };
  auto deadline = [&] { return Clock::now() + options.timeout; };
  auto faultTolerantComm = [&](const Bound &b) {
    return soft && b.comm >= 0 &&
           plan.communicators[size_t(b.comm)].faultTolerant;
  };
  auto whereOf = [&](const Bound &b) {
    std::string where = describe(b);
    if (b.comm >= 0) {
      const plan::Communicator &c = plan.communicators[size_t(b.comm)];
      std::string ranks;
      for (int64_t r : c.ranks)
        ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
      where = "collective #" + std::to_string(b.sequence + 1) + " of step " +
              std::to_string(steps + 1) + " on communicator \"" + c.id +
              "\" (ranks [" + ranks + "]), " + where;
    }
    return "rank " + std::to_string(plan.rank) + ": " + where;
  };

  auto worker = [&](size_t self) {
    for (int index : order[self]) {
      Bound &b = program[size_t(index)];
      bool skip = false;
      {
        std::unique_lock<std::mutex> lock(mutex);
        waitingFor[self] = index;
        bool first = true;
        bool inTime = false;
        while (true) {
          inTime = wake[self].wait_until(lock, deadline(), [&] {
            bool now = ready(b);
            state.needlessWakeups += !now && !first;
            first = false;
            return now;
          });
          // While some instruction runs (a collective waiting for a peer,
          // perhaps the one this waits for through others) its own timeout
          // reports, naming the communicator and the peers: a better error
          // than this wait's. Only a wait with nothing running is stuck.
          // Fault-tolerant sessions keep the plain timeout: their protocol
          // (docs/fault-tolerance.md) was proven with it, and a cut-off
          // group must give up its step on time.
          if (ft && !inTime)
            break;
          bool anyRunning = false;
          for (char r : state.running)
            anyRunning = anyRunning || r;
          if (inTime || !anyRunning)
            break;
        }
        waitingFor[self] = -1;
        if (!inTime) {
          std::string waiting;
          for (int d : b.deps)
            if (!state.done[size_t(d)])
              waiting += (waiting.empty() ? "" : ", ") +
                         ("\"" + program[size_t(d)].in->id + "\"");
          out.failure = makeError(
              describe(b) + " waited " +
              std::to_string(options.timeout.count() / 1000.0) + " s for " +
              (waiting.empty()
                   ? "its turn on communicator \"" + b.in->comm + "\""
                   : "its deps " + waiting));
          lock.unlock();
          wakeAll();
          return;
        }
        if (out.failure)
          return;
        // After a fault-tolerant failure the step cannot commit: its
        // later fault-tolerant collectives are skipped (their peers may be
        // gone), everything else runs so that this rank's own group's
        // collectives still complete for its peers.
        skip = faultTolerantComm(b) && out.faultTolerantFailure.has_value();
        state.running[size_t(index)] = 1;
      }
      state.spans[size_t(index)].first = Clock::now();
      Result<void> ok = skip ? Result<void>() : run ? run(b) : execute(b);
      state.spans[size_t(index)].second = Clock::now();
      std::unique_lock<std::mutex> lock(mutex);
      if (!ok) {
        if (faultTolerantComm(b)) {
          if (!out.faultTolerantFailure)
            out.faultTolerantFailure = ok.error().within(whereOf(b));
        } else {
          if (!out.failure) {
            out.failure = ok.error().within(whereOf(b));
            reportFailure(b.comm >= 0, *out.failure);
          }
          lock.unlock();
          wakeAll();
          return;
        }
      }
      state.done[size_t(index)] = 1;
      state.running[size_t(index)] = 0;
      if (b.comm >= 0)
        ++state.turn[size_t(b.comm)];
      std::vector<size_t> runnable = readyStreams(self);
      lock.unlock();
      for (size_t s : runnable)
        wake[s].notify_one();
    }
  };

  std::vector<std::thread> threads;
  for (size_t s = 1; s < order.size(); ++s)
    threads.emplace_back(worker, s);
  if (!order.empty())
    worker(0);
  for (std::thread &t : threads)
    t.join();
  return out;
}

Result<void> Session::step() {
  Impl &m = *impl;
  if (m.broken)
    return makeError("an earlier step failed; this session cannot run more");
  if (m.closed)
    return makeError("the session is closed");
  if (m.ft)
    return m.faultTolerantStep();
  size_t n = m.program.size();
  Clock::time_point stepStart = Clock::now();
  StepState state{
      std::vector<std::pair<Clock::time_point, Clock::time_point>>(n),
      std::vector<char>(n, 0), std::vector<int>(m.commSequence.size(), 0)};
  PassOutcome out = m.dev ? m.runDevicePass(state)
                          : m.runPass(state, m.streams, /*soft=*/false);
  if (m.dev) {
    // The step ends when the device is done with it; report the first
    // failure, the host's (enqueueing) before the device's.
    Result<void> done = m.synchronizeDevice();
    if (!out.failure && !done)
      out.failure =
          done.error().within("rank " + std::to_string(m.plan.rank) +
                              ": step " + std::to_string(m.steps + 1));
  }
  if (out.failure) {
    m.broken = true;
    return *out.failure;
  }
  ++m.steps;
  m.profile = profileOf(m.program, state.spans, m.streams, m.commSequence,
                        stepStart, Clock::now());
  m.profile.needlessWakeups = state.needlessWakeups;
  m.reportOptimizerStep(m.profile);
  if (m.dev)
    if (auto timed = m.readDeviceTiming(m.profile); !timed) {
      m.broken = true;
      return timed.error().within("rank " + std::to_string(m.plan.rank) +
                                  ": step " + std::to_string(m.steps));
    }
  return {};
}

int64_t Session::stepsDone() const { return impl->steps; }

void Session::Impl::reportOptimizerStep(StepProfile &p) {
  p.gradNorm = gradNorm;
  p.clipCoefficient = clipCoefficient;
  p.updateSkipped = skipUpdates;
  gradNorm.reset();
  clipCoefficient = 1.0f;
  skipUpdates = false;
}

std::optional<double> Session::lr() const {
  if (!impl->plan.optimizer)
    return std::nullopt;
  return impl->stepLr();
}

Result<void> Session::setLr(std::optional<double> lr) {
  if (!impl->plan.optimizer)
    return makeError("the plan has no optimizer, so no learning rate");
  if (lr && !(*lr >= 0 && *lr <= 1e6))
    return makeError("a learning rate must be in [0, 1e6], got " +
                     std::to_string(*lr));
  impl->lrOverride = lr;
  return {};
}

Result<void> Session::resumeAfter(int64_t steps) {
  if (steps < 0)
    return makeError("resumeAfter: steps must be >= 0, not " +
                     std::to_string(steps));
  if (impl->steps != 0)
    return makeError("resumeAfter: this session has already run " +
                     std::to_string(impl->steps) + " steps");
  impl->steps = steps;
  return {};
}

const StepProfile &Session::lastStepProfile() const { return impl->profile; }

Result<TensorView> Session::tensor(const std::string &id) {
  auto it = impl->bufferIds.find(id);
  if (it == impl->bufferIds.end() || !impl->buffers[it->second].persistent)
    return makeError("no persistent buffer \"" + id + "\" in the plan");
  return impl->view(it->second);
}

std::vector<TensorView> Session::parameters() {
  std::vector<TensorView> out;
  for (size_t i = 0; i < impl->buffers.size(); ++i)
    if (impl->buffers[i].meta->kind == BufferKind::ParamShard)
      out.push_back(impl->view(static_cast<int>(i)));
  return out;
}

std::vector<TensorView> Session::optimizerState() {
  std::vector<TensorView> out;
  for (size_t i = 0; i < impl->buffers.size(); ++i)
    if (impl->buffers[i].meta->kind == BufferKind::OptimizerState)
      out.push_back(impl->view(static_cast<int>(i)));
  return out;
}

Result<Communicator *> Session::trainerCommunicator(const std::string &id) {
  std::lock_guard<std::mutex> lock(impl->commMutex);
  auto it = impl->trainerComms.find(id);
  if (it != impl->trainerComms.end())
    return it->second.get();
  const plan::Communicator *c = impl->plan.findCommunicator(id);
  if (!c)
    return makeError("the plan has no communicator \"" + id + "\"");
  GroupSpec g{"trainer/" + c->id, c->color, c->ranks, c->key, 0};
  g.incarnation = impl->incarnation();
  auto comm = impl->backend->createCommunicator(g);
  if (!comm)
    return comm.error();
  Communicator *raw = comm->get();
  impl->trainerComms[id] = std::move(*comm);
  return raw;
}

Result<Communicator *> Session::planCommunicator(const std::string &id) {
  for (size_t i = 0; i < impl->plan.communicators.size(); ++i)
    if (impl->plan.communicators[i].id == id)
      return impl->communicator(static_cast<int>(i));
  return makeError("the plan has no communicator \"" + id + "\"");
}

const plan::Plan &Session::plan() const { return impl->plan; }
int64_t Session::rank() const { return impl->plan.rank; }

std::vector<std::string> Session::createdCommunicators() const {
  std::lock_guard<std::mutex> lock(impl->commMutex);
  std::vector<std::string> out;
  for (size_t i = 0; i < impl->comms.size(); ++i)
    if (impl->comms[i])
      out.push_back(impl->plan.communicators[i].id);
  return out;
}

} // namespace meshplan::runtime

//===- Session.cpp - Binding a plan and executing its steps ---------------===//
//
// open() binds the plan once: every buffer's layout is parsed with core, and
// every collective gets, per (input, output) pair, the boxes its members hold
// (core's shardOf over the communicator's ranks) and the padded chunk it
// packs to; the packed total must equal the plan's count. step() then only
// moves bytes.
//
// Execution: one thread per stream runs that stream's instructions in
// program order. An instruction starts when its deps have completed and, for
// a collective, when every earlier collective of its communicator (program
// order) has completed, so all members issue a communicator's collectives in
// the order the verifier checked. Every wait is bounded by the session's
// timeout; the first failure stops all streams.
//
// This file runs plans on host buffers; a session with a device runs the
// same bound plan through DeviceExecution.cpp (SessionImpl.h holds the
// state both share).
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

//===----------------------------------------------------------------------===//
// Bound plan
//===----------------------------------------------------------------------===//

namespace detail {
/// The intersection of two boxes (empty when they do not overlap).
ShardBox intersect(const ShardBox &a, const ShardBox &b) {
  ShardBox r;
  for (size_t d = 0; d < a.offset.size(); ++d) {
    int64_t lo = std::max(a.offset[d], b.offset[d]);
    int64_t hi =
        std::min(a.offset[d] + a.localShape[d], b.offset[d] + b.localShape[d]);
    r.offset.push_back(lo);
    r.localShape.push_back(std::max<int64_t>(0, hi - lo));
  }
  r.paddedShape = r.localShape;
  return r;
}

bool sameBox(const ShardBox &a, const ShardBox &b) {
  return a.offset == b.offset && a.localShape == b.localShape;
}

/// Row-major index of `offset` inside a packed box, and whether the region
/// [offset, offset + size) is one contiguous run of it.
std::pair<int64_t, bool> packedStart(const plan::Buffer &b,
                                     const std::vector<int64_t> &offset,
                                     const std::vector<int64_t> &size) {
  int64_t index = 0;
  bool contiguous = true;
  bool outer = true; // all dims so far have size 1 in the region
  for (size_t d = 0; d < offset.size(); ++d) {
    index = index * b.localShape[d] + (offset[d] - b.offset[d]);
    if (!outer && size[d] != b.localShape[d])
      contiguous = false;
    if (size[d] != 1)
      outer = false;
  }
  // Once a dim has more than one element, every later dim must be whole.
  return {index, contiguous};
}

float scaleOf(const std::vector<BufferState> &buffers,
              const std::unordered_map<std::string, int> &ids,
              const plan::Buffer &b) {
  if (!b.scale)
    return 1.0f;
  const BufferState &amax = buffers[ids.at(b.scale->amax)];
  float a = reinterpret_cast<const float *>(amax.data.data())[b.scale->index];
  return k::fp8ScaleFromAmax(a,
                             b.dtype == DType::Float8E4M3 ? k::Fp8Format::E4M3FN
                                                          : k::Fp8Format::E5M2,
                             b.scale->powerOf2);
}

} // namespace detail

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

Result<void> Session::Impl::bind() {
  const plan::Plan &p = plan;
  if (p.rank != options.rank)
    return makeError("the plan is for rank " + std::to_string(p.rank) +
                     ", but this process is rank " +
                     std::to_string(options.rank));
  auto meshOr = Mesh::create(p.mesh.axes, p.mesh.deviceOrder);
  if (!meshOr)
    return meshOr.error().within("plan mesh");
  mesh = std::make_shared<const Mesh>(std::move(*meshOr));
  if (mesh->size() != options.worldSize)
    return makeError("the plan's mesh has " + std::to_string(mesh->size()) +
                     " ranks, but WORLD_SIZE is " +
                     std::to_string(options.worldSize));
  root = View::root(mesh);
  AxisNamespace names(mesh);

  buffers.resize(p.buffers.size());
  for (size_t i = 0; i < p.buffers.size(); ++i) {
    const plan::Buffer &b = p.buffers[i];
    BufferState &s = buffers[i];
    s.meta = &b;
    auto layout = parseLayout(*root, names, b.layout);
    if (!layout)
      return layout.error().within("buffer \"" + b.id + "\": layout");
    s.layout = std::move(*layout);
    s.numel = product(b.localShape);
    s.persistent = b.kind == BufferKind::ParamShard ||
                   b.kind == BufferKind::OptimizerState;
    bufferIds[b.id] = static_cast<int>(i);
    if (s.persistent && options.device)
      s.live = true; // in the device arena (setUpDevice zeroes it)
    else if (s.persistent)
      ensure(static_cast<int>(i));
  }

  std::unordered_map<std::string, int> ids, streamIds, commIds;
  for (size_t i = 0; i < p.streams.size(); ++i)
    streamIds[p.streams[i]] = static_cast<int>(i);
  for (size_t i = 0; i < p.communicators.size(); ++i)
    commIds[p.communicators[i].id] = static_cast<int>(i);
  for (size_t i = 0; i < p.program.size(); ++i)
    ids[p.program[i].id] = static_cast<int>(i);
  streams.assign(p.streams.size(), {});
  commSequence.assign(p.communicators.size(), {});
  comms.resize(p.communicators.size());
  program.resize(p.program.size());
  for (size_t i = 0; i < p.program.size(); ++i) {
    Bound &b = program[i];
    b.in = &p.program[i];
    b.index = static_cast<int>(i);
    for (const std::string &x : b.in->inputs)
      b.inputs.push_back(bufferIds.at(x));
    for (const std::string &x : b.in->outputs)
      b.outputs.push_back(bufferIds.at(x));
    for (const std::string &x : b.in->deps)
      b.deps.push_back(ids.at(x));
    streams[streamIds.at(b.in->stream)].push_back(b.index);
    if (b.in->op == OpKind::Free)
      for (int x : b.inputs)
        if (buffers[x].persistent)
          return makeError(describe(b) + " frees \"" + buffers[x].meta->id +
                           "\", which lives for the whole run");
    if (plan::isPointToPoint(b.in->op)) {
      // A transfer takes its turn on its communicator like a collective
      // (the plan verifier assumes exactly this order); its one buffer
      // was checked against count and dtype by validatePlan.
      b.comm = commIds.at(b.in->comm);
      b.sequence = static_cast<int>(commSequence[b.comm].size());
      commSequence[b.comm].push_back(b.index);
      continue;
    }
    if (plan::isCollective(b.in->op)) {
      b.comm = commIds.at(b.in->comm);
      b.sequence = static_cast<int>(commSequence[b.comm].size());
      commSequence[b.comm].push_back(b.index);
      if (auto ok = bindCollective(b); !ok)
        return ok.error().within(describe(b));
    }
  }
  return {};
}

Result<void> Session::Impl::bindCollective(Bound &b) {
  const Instruction &in = *b.in;
  const plan::Communicator &c = plan.communicators[b.comm];
  DType wire = *in.dtype;
  int64_t n = static_cast<int64_t>(c.ranks.size());
  int64_t at = 0;
  for (size_t i = 0; i < b.inputs.size(); ++i) {
    Pair pair;
    pair.in = b.inputs[i];
    pair.out = b.outputs[i];
    const BufferState &src = buffers[pair.in], &dst = buffers[pair.out];
    if (src.meta->globalShape != dst.meta->globalShape)
      return makeError("\"" + src.meta->id + "\" and \"" + dst.meta->id +
                       "\" are not the same tensor (global shapes differ)");
    if (!canConvert(src.meta->dtype, wire) ||
        !canConvert(wire, dst.meta->dtype))
      return makeError(
          "cannot move " + std::string(plan::dtypeName(src.meta->dtype)) +
          " through " + std::string(plan::dtypeName(wire)) + " into " +
          std::string(plan::dtypeName(dst.meta->dtype)));
    const BufferState &packed =
        in.op == OpKind::ReduceScatter ? dst : src; // whose boxes are chunks
    pair.padded = paddedShapeOf(packed.layout, packed.meta->globalShape);
    pair.chunk = product(pair.padded);
    bool exchange = in.op == OpKind::AllToAll || in.op == OpKind::Permute;
    if (!exchange) {
      pair.at = at;
      at += pair.chunk;
    }
    if (in.op == OpKind::AllToAll || in.op == OpKind::Permute) {
      for (int64_t r : c.ranks) {
        auto a = shardOf(*root, src.layout, src.meta->globalShape, r);
        auto z = shardOf(*root, dst.layout, dst.meta->globalShape, r);
        if (!a)
          return a.error();
        if (!z)
          return z.error();
        pair.inBoxes.push_back(std::move(*a));
        pair.outBoxes.push_back(std::move(*z));
      }
      int64_t me = c.key;
      if (in.op == OpKind::AllToAll) {
        // A block is the largest part one member's input shares with one
        // member's output (the same on every member; plan-format.md).
        pair.chunk = 0;
        for (int64_t a = 0; a < n; ++a)
          for (int64_t z = 0; z < n; ++z)
            pair.chunk =
                std::max(pair.chunk, product(intersect(pair.inBoxes[size_t(a)],
                                                       pair.outBoxes[size_t(z)])
                                                 .localShape));
      } else {
        // Whose output box is my input box, and whose input box is my
        // output box; members with equal boxes pair up in key order.
        auto match = [&](const std::vector<ShardBox> &from,
                         const std::vector<ShardBox> &to,
                         int64_t key) -> int64_t {
          int64_t rank = 0;
          for (int64_t k = 0; k < key; ++k)
            rank += sameBox(from[size_t(k)], from[size_t(key)]);
          for (int64_t k = 0; k < n; ++k)
            if (sameBox(to[size_t(k)], from[size_t(key)]) && rank-- == 0)
              return k;
          return -1;
        };
        pair.sendTo = match(pair.inBoxes, pair.outBoxes, me);
        pair.recvFrom = match(pair.outBoxes, pair.inBoxes, me);
        if (pair.sendTo < 0 || pair.recvFrom < 0)
          return makeError("\"" + src.meta->id + "\" -> \"" + dst.meta->id +
                           "\" is not a permutation of the group's shards");
        if (!b.pairs.empty() && (b.pairs[0].sendTo != pair.sendTo ||
                                 b.pairs[0].recvFrom != pair.recvFrom))
          return makeError("its pairs permute to different peers");
      }
      pair.at = at;
      at += pair.chunk;
    }
    bool allMembers =
        in.op == OpKind::AllGather || in.op == OpKind::ReduceScatter;
    if (in.op == OpKind::AllToAll || in.op == OpKind::Permute) {
      b.pairs.push_back(std::move(pair));
      continue;
    }
    for (int64_t r : c.ranks) {
      if (!allMembers && r != plan.rank)
        continue;
      auto box = shardOf(*root, packed.layout, packed.meta->globalShape, r);
      if (!box)
        return box.error();
      // The chunk of each member must fit the buffer it comes from or goes
      // to: an all-gather's output and a reduce-scatter's input hold every
      // member's box.
      const plan::Buffer &whole =
          in.op == OpKind::AllGather ? *dst.meta : *src.meta;
      if (allMembers && !boxContains(whole.offset, whole.localShape,
                                     box->offset, box->localShape))
        return makeError("rank " + std::to_string(r) + "'s box of \"" +
                         packed.meta->id + "\" lies outside \"" + whole.id +
                         "\"");
      pair.members.push_back(std::move(*box));
    }
    b.pairs.push_back(std::move(pair));
  }
  if (at != in.count)
    return makeError("count " + std::to_string(in.count) +
                     ", but its buffers pack to " + std::to_string(at) +
                     " elements");

  // Direct execution when the buffers are already the packed blocks.
  if (b.pairs.size() == 1) {
    const Pair &pair = b.pairs[0];
    const BufferState &src = buffers[pair.in], &dst = buffers[pair.out];
    int64_t n = static_cast<int64_t>(c.ranks.size());
    bool sameType = src.meta->dtype == wire && dst.meta->dtype == wire;
    auto blocksInKeyOrder = [&](const BufferState &whole) {
      if (whole.numel != n * pair.chunk)
        return false;
      for (int64_t k = 0; k < n; ++k) {
        const ShardBox &m = pair.members[size_t(k)];
        if (m.localShape != pair.padded)
          return false;
        auto [start, contiguous] =
            packedStart(*whole.meta, m.offset, m.localShape);
        if (!contiguous || start != k * pair.chunk)
          return false;
      }
      return true;
    };
    if (in.op == OpKind::AllGather)
      b.direct = sameType && src.numel == pair.chunk && blocksInKeyOrder(dst);
    else if (in.op == OpKind::ReduceScatter)
      b.direct = sameType && dst.numel == pair.chunk && blocksInKeyOrder(src);
    else if (in.op == OpKind::AllReduce || in.op == OpKind::Broadcast)
      b.direct = sameType && src.numel == pair.chunk &&
                 dst.numel == pair.chunk &&
                 src.meta->offset == dst.meta->offset;
  }
  return {};
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

namespace {
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
} // namespace

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

//===----------------------------------------------------------------------===//
// Fault tolerance (docs/fault-tolerance.md)
//===----------------------------------------------------------------------===//

namespace {
bool containsGroup(const std::vector<int> &groups, int g) {
  return std::binary_search(groups.begin(), groups.end(), g);
}
std::string groupList(const std::vector<int> &groups) {
  std::string s;
  for (int g : groups)
    s += (s.empty() ? "" : ", ") + std::to_string(g);
  return s;
}
} // namespace

/// A store call retried while it fails (the store unreachable from a
/// partitioned group, or restarting) until `deadline`; then its last error,
/// which names the store. A store that lost the job's state is not retried.
template <typename F>
auto untilDeadline(const Membership &store, Clock::time_point deadline,
                   F &&call) -> decltype(call()) {
  while (true) {
    auto r = call();
    if (r || Clock::now() >= deadline || store.lostState())
      return r;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

Result<void> Session::Impl::setUpFaultTolerance() {
  const FaultToleranceOptions &o = *options.faultTolerance;
  FaultTolerance f;
  for (int a = 0; a < mesh->numAxes(); ++a) {
    if (!mesh->axis(a).managed)
      continue;
    if (f.axis >= 0)
      return makeError("fault tolerance: the plan's mesh has two managed "
                       "axes (\"" +
                       mesh->axis(f.axis).name + "\", \"" + mesh->axis(a).name +
                       "\"); the replica groups are one axis's coordinates");
    f.axis = a;
  }
  if (f.axis < 0)
    return makeError("fault tolerance: the plan's mesh has no managed axis "
                     "(the spec's managed_axes), so nothing names the "
                     "replica groups");
  auto position = mesh->positionOf(plan.rank);
  if (!position)
    return position.error();
  f.group = static_cast<int>(mesh->coordinateAt(*position, f.axis));
  f.numGroups = mesh->axis(f.axis).size;
  f.groupRanks = mesh->size() / f.numGroups;
  auto ref = makeAxisRef(*mesh, f.axis, 1, f.numGroups);
  if (!ref)
    return ref.error();
  auto along = groupOf(*mesh, AxisRefList{*ref}, plan.rank);
  if (!along)
    return along.error();
  f.alongAxis = std::move(*along);

  // A fault_tolerant communicator changes members between epochs: only
  // collectives whose counts do not depend on the member count can run on
  // it, and all of them must come before the commit (the optimizer
  // updates), or a failed step could not be discarded.
  size_t n = program.size();
  f.afterCommit.assign(n, 0);
  // The gradient norm and the clip read the reduced gradients and decide
  // the update: they belong to the committed part of the step, with it.
  for (size_t i = 0; i < n; ++i)
    if (program[i].in->op == OpKind::OptimizerUpdate ||
        program[i].in->op == OpKind::GradNorm ||
        program[i].in->op == OpKind::ClipGradients)
      f.afterCommit[i] = 1;
  for (bool changed = true; changed;) {
    changed = false;
    auto mark = [&](int i) {
      if (!f.afterCommit[size_t(i)]) {
        f.afterCommit[size_t(i)] = 1;
        changed = true;
      }
    };
    // Everything after a post-commit instruction in its stream's or its
    // communicator's order, and everything that depends on one.
    for (const auto *orders : {&streams, &commSequence})
      for (const std::vector<int> &order : *orders) {
        bool seen = false;
        for (int i : order) {
          if (f.afterCommit[size_t(i)])
            seen = true;
          else if (seen)
            mark(i);
        }
      }
    for (size_t i = 0; i < n; ++i)
      for (int d : program[i].deps)
        if (f.afterCommit[size_t(d)])
          mark(static_cast<int>(i));
  }
  for (size_t i = 0; i < n; ++i) {
    const Bound &b = program[i];
    if (b.comm < 0 || !plan.communicators[size_t(b.comm)].faultTolerant)
      continue;
    const plan::Communicator &c = plan.communicators[size_t(b.comm)];
    if (c.axes.empty())
      return makeError("fault tolerance: communicator \"" + c.id +
                       "\" is fault_tolerant but names no axes, so its live "
                       "members cannot be derived");
    if (b.in->op != OpKind::AllReduce)
      return makeError("fault tolerance: " + describe(b) + " is a " +
                       std::string(plan::opKindName(b.in->op)) +
                       " on fault_tolerant communicator \"" + c.id +
                       "\"; only all_reduce runs on one (a managed axis only "
                       "replicates)");
    if (f.afterCommit[i])
      return makeError("fault tolerance: " + describe(b) +
                       " on fault_tolerant communicator \"" + c.id +
                       "\" runs after an optimizer update, so a failed step "
                       "could not be discarded");
  }
  f.beforeOrder.assign(streams.size(), {});
  f.afterOrder.assign(streams.size(), {});
  for (size_t s = 0; s < streams.size(); ++s)
    for (int i : streams[s])
      (f.afterCommit[size_t(i)] ? f.afterOrder : f.beforeOrder)[s].push_back(i);
  f.sharesApart = true;
  for (size_t i = 0; i < n && f.sharesApart; ++i) {
    const Bound &b = program[i];
    if (f.afterCommit[i])
      continue;
    for (int x : b.outputs)
      if (buffers[size_t(x)].persistent)
        f.sharesApart = false;
    if (b.comm < 0 || !plan.communicators[size_t(b.comm)].faultTolerant)
      continue;
    const plan::Communicator &c = plan.communicators[size_t(b.comm)];
    if (c.axes.size() != 1 || c.axes[0] != mesh->axis(f.axis).name ||
        (b.in->reduce != ReduceOp::Sum && b.in->reduce != ReduceOp::Avg))
      f.sharesApart = false;
    for (size_t j = 0; j < n; ++j)
      if (j != i && !f.afterCommit[j] && program[j].in->op != OpKind::Free)
        for (int x : program[j].inputs)
          if (std::find(b.outputs.begin(), b.outputs.end(), x) !=
              b.outputs.end())
            f.sharesApart = false;
  }

  MembershipOptions mo;
  mo.host = o.store.host;
  mo.port = o.store.port;
  mo.job = options.job;
  mo.replicaGroup = f.group;
  mo.numGroups = static_cast<int>(f.numGroups);
  mo.minReplicas = o.minReplicas;
  mo.heartbeatExpiry = o.heartbeatExpiry;
  auto membership = Membership::connect(mo);
  if (!membership)
    return membership.error();
  MESHPLAN_TRY((*membership)->registerRank(plan.rank));
  MESHPLAN_TRY((*membership)->startHeartbeat());
  f.membership = std::move(*membership);
  ft = std::move(f);
  return {};
}

Result<void> Session::Impl::ensureQuorum(bool moveOn) {
  FaultTolerance &f = *ft;
  // A rank in a quorum keeps its epoch until a step is discarded: every rank
  // sees the same outcome of the same vote, so all ranks of a group (and of
  // the job) change epochs at the same step. They then walk to the next
  // epoch, E + 1, whatever the store's latest is: the successor of E is
  // unique, the latest is not the same for two ranks reading at different
  // times.
  if (f.quorum.epoch > 0 && !moveOn)
    return {};
  Membership &store = *f.membership;
  const auto expiry = options.faultTolerance->heartbeatExpiry;
  const auto poll = std::chrono::milliseconds(10);
  Clock::time_point start = Clock::now(), deadline = start + options.timeout;
  // The first quorum waits for every group to be live, a group that moves on
  // with nobody dead (a transient failure) for a dead group's heartbeat to
  // expire first, at most this long.
  Clock::time_point grace = start + 2 * expiry;
  std::optional<Error> noQuorum;
  while (true) {
    auto q =
        untilDeadline(store, deadline, [&] { return store.currentQuorum(); });
    if (!q)
      return q.error();
    Clock::time_point now = Clock::now();
    bool propose = false;
    if (f.quorum.epoch > 0) {
      int64_t next = f.quorum.epoch + 1;
      if (q->epoch >= next) {
        auto members = untilDeadline(store, deadline,
                                     [&] { return store.membersOf(next); });
        if (!members)
          return members.error();
        if (containsGroup(*members, f.group))
          return adopt(Quorum{next, *members});
        // The group was left out of the next epoch (it looked dead): it
        // joins again as a new member, and heals.
        f.quorum = Quorum{};
        continue;
      }
      auto dead =
          untilDeadline(store, deadline, [&] { return store.deadGroups(*q); });
      if (!dead)
        return dead.error();
      propose = !dead->empty() || now >= grace;
    } else if (q->epoch > 0 && containsGroup(q->members, f.group)) {
      return adopt(*q);
    } else if (q->epoch == 0) {
      auto live =
          untilDeadline(store, deadline, [&] { return store.liveGroups(); });
      if (!live)
        return live.error();
      propose = int64_t(live->size()) == f.numGroups || now >= grace;
    } else {
      propose = true; // this group joins
    }
    if (propose) {
      auto proposal = store.proposeNextEpoch(q->epoch);
      if (proposal)
        continue; // won or lost, the store has moved on: read it again
      if (proposal.error().message.rfind("no quorum", 0) == 0)
        noQuorum = proposal.error();
      else if (now >= deadline)
        return proposal.error();
    }
    if (now >= deadline)
      return makeError("fault tolerance: replica group " +
                       std::to_string(f.group) + " found no quorum within " +
                       std::to_string(options.timeout.count() / 1000.0) +
                       " s (epoch " + std::to_string(q->epoch) + ")" +
                       (noQuorum ? ": " + noQuorum->message : std::string()));
    std::this_thread::sleep_for(poll);
  }
}

Result<void> Session::Impl::adopt(const Quorum &q) {
  FaultTolerance &f = *ft;
  // The sources: the members the store recorded, with the epoch, as
  // holding the committed state (Membership::syncedOf); the others heal.
  auto synced = untilDeadline(*f.membership, Clock::now() + options.timeout,
                              [&] { return f.membership->syncedOf(q.epoch); });
  if (!synced)
    return synced.error();
  std::vector<int> sources, joiners;
  for (int g : q.members)
    (containsGroup(*synced, g) ? sources : joiners).push_back(g);
  {
    // Only what changed is rebuilt: the fault_tolerant communicators of the
    // old epoch; every other group stays connected.
    std::lock_guard<std::mutex> lock(commMutex);
    for (size_t i = 0; i < comms.size(); ++i)
      if (plan.communicators[i].faultTolerant)
        comms[i].reset();
  }
  f.quorum = q;
  f.healFailure.reset();
  // The first quorum's members all start from the trainer's initial
  // parameters: nobody heals.
  if (joiners.empty())
    return {};
  if (sources.empty())
    return makeError("fault tolerance: epoch " + std::to_string(q.epoch) +
                     " has no group holding the committed state to heal its "
                     "groups " +
                     groupList(joiners) +
                     " from (every group that held it was lost)");
  // A heal that fails (a source or a joiner died mid-transfer) may leave the
  // joiner's buffers half written, which nothing reads: the joiner is no
  // source in the next epoch (it never voted a step of this one ok) and
  // trains only after a heal that succeeded. This rank votes the step failed,
  // so that nobody commits it, and moves the job to the next epoch, where the
  // heal starts again from the groups then live: a joiner whose counter never
  // arrived votes on a step number of its own, which nobody else waits for. It
  // first gives a dead peer's heartbeat the time to expire (at most twice the
  // expiry, as ensureQuorum does), so that the next epoch leaves the dead
  // source out instead of waiting for it in the heal group's rendezvous.
  Result<void> healed = heal(q, sources, joiners);
  if (!healed) {
    f.healFailure = healed.error();
    Clock::time_point until =
        Clock::now() + 2 * options.faultTolerance->heartbeatExpiry;
    while (Clock::now() < until) {
      auto dead = f.membership->deadGroups(q);
      if (!dead || !dead->empty())
        break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    (void)f.membership->proposeNextEpoch(q.epoch);
  }
  return {};
}

/// Test hook (test/trainer/fault-tolerance.sh, case 7):
/// MESHPLAN_TEST_KILL_HEAL_SOURCE_AFTER = N makes a rank that is a heal's
/// source kill itself with SIGKILL once it has sent N buffers, in the middle
/// of the transfer. Not for production use.
static void maybeKillHealSourceForTests(int64_t buffersSent) {
  static const int64_t after = [] {
    const char *v = std::getenv("MESHPLAN_TEST_KILL_HEAL_SOURCE_AFTER");
    return v && *v ? std::max<int64_t>(0, std::atoll(v)) : int64_t(-1);
  }();
  if (after >= 0 && buffersSent >= after)
    std::raise(SIGKILL);
}

Result<void> Session::Impl::heal(const Quorum &q,
                                 const std::vector<int> &sources,
                                 const std::vector<int> &joiners) {
  FaultTolerance &f = *ft;
  // The heal group: this rank's peers along the managed axis (the ranks
  // holding the same shards) over the new epoch's groups, from core.
  LiveMembers live;
  MESHPLAN_TRY(live.set(
      *mesh, f.axis, std::vector<int64_t>(q.members.begin(), q.members.end())));
  auto derived =
      plan::deriveGroup(*mesh, {mesh->axis(f.axis).name}, plan.rank, &live);
  if (!derived)
    return derived.error();
  GroupSpec spec{"heal", derived->color, derived->ranks, derived->key, q.epoch};
  // A source or joiner that died before the rendezvous never comes: the
  // heal ends (and fails) once the epoch has moved or one of its groups'
  // heartbeat has expired, looked up at most every 200 ms.
  spec.cancelled =
      [&f, &q, next = Clock::now()]() mutable -> std::optional<std::string> {
    if (f.membership->epochChangedSince(q.epoch))
      return "epoch " + std::to_string(q.epoch) + " ended";
    if (Clock::now() < next)
      return std::nullopt;
    next = Clock::now() + std::chrono::milliseconds(200);
    auto dead = f.membership->deadGroups(q);
    if (dead && !dead->empty())
      return "replica groups " + groupList(*dead) + " of epoch " +
             std::to_string(q.epoch) + " died";
    return std::nullopt;
  };
  auto comm = backend->createCommunicator(spec);
  if (!comm)
    return comm.error().within("healing in epoch " + std::to_string(q.epoch));
  Communicator &c = **comm;
  auto keyOf = [&](int group) {
    return int64_t(std::lower_bound(q.members.begin(), q.members.end(), group) -
                   q.members.begin());
  };
  bool joining = containsGroup(joiners, f.group);
  std::vector<int> persistent;
  for (size_t i = 0; i < buffers.size(); ++i)
    if (buffers[i].persistent)
      persistent.push_back(static_cast<int>(i));
  auto where = [&](int source, const std::string &what) {
    return "healing " + what + " from rank " +
           std::to_string(f.alongAxis[size_t(source)]) + " in epoch " +
           std::to_string(q.epoch);
  };
  // The step counter first (the optimizer's bias correction and the
  // stochastic rounding's key), from the first source.
  int64_t count = steps;
  if (joining) {
    auto got = c.recv(&count, keyOf(sources[0]), 1, DType::Int64, "heal steps");
    if (!got)
      return got.error().within(where(sources[0], "the step counter"));
  } else if (f.group == sources[0]) {
    for (int j : joiners)
      if (auto sent = c.send(&count, keyOf(j), 1, DType::Int64, "heal steps");
          !sent)
        return sent.error().within("healing group " + std::to_string(j));
  }
  // Striped: buffer i comes from source group i mod |sources|; each source
  // sends its buffers to every joiner in buffer order, and every joiner
  // receives in buffer order, so no two transfers wait on each other.
  //
  // A joiner receives straight into its buffers: its state means nothing
  // until a heal succeeds (a joiner whose heal failed is no source in the
  // next epoch, Membership::syncedOf, and never commits a step of this one),
  // so staging 1 GiB to keep it would only cost a second copy and the
  // page faults. The checksums run on a helper thread beside the transfers:
  // on a source ahead of the sends, on a joiner one buffer behind the
  // receives.
  std::vector<size_t> mine;
  for (size_t i = 0; i < persistent.size(); ++i)
    if (joining || sources[i % sources.size()] == f.group)
      mine.push_back(i);
  std::vector<uint32_t> crcs(persistent.size(), 0);
  std::mutex crcMutex;
  std::condition_variable crcReady;
  size_t crcDone = 0, crcQueued = joining ? 0 : mine.size();
  bool crcStop = false;
  std::thread crcWorker([&] {
    for (size_t k = 0; k < mine.size(); ++k) {
      {
        std::unique_lock<std::mutex> lock(crcMutex);
        crcReady.wait(lock, [&] { return crcStop || k < crcQueued; });
        if (crcStop)
          return;
      }
      const BufferState &b = buffers[size_t(persistent[mine[k]])];
      uint32_t crc = ckpt::crc32c(b.data.data(), b.data.size());
      std::lock_guard<std::mutex> lock(crcMutex);
      crcs[mine[k]] = crc;
      crcDone = k + 1;
      crcReady.notify_all();
    }
  });
  auto stopWorker = [&] {
    {
      std::lock_guard<std::mutex> lock(crcMutex);
      crcStop = true;
    }
    crcReady.notify_all();
    crcWorker.join();
  };
  std::vector<uint32_t> expected(persistent.size(), 0);
  int64_t buffersSent = 0;
  for (size_t k = 0; k < mine.size(); ++k) {
    size_t i = mine[k];
    BufferState &s = buffers[size_t(persistent[i])];
    int source = sources[i % sources.size()];
    std::string tag = "heal " + s.meta->id;
    if (joining) {
      auto got = c.recv(s.data.data(), keyOf(source), int64_t(s.data.size()),
                        DType::UInt8, tag);
      if (got)
        got = c.recv(&expected[i], keyOf(source), 4, DType::UInt8,
                     tag + " crc32c");
      if (!got) {
        stopWorker();
        return got.error().within(where(source, "\"" + s.meta->id + "\""));
      }
      std::lock_guard<std::mutex> lock(crcMutex);
      crcQueued = k + 1;
      crcReady.notify_all();
      continue;
    }
    maybeKillHealSourceForTests(buffersSent++);
    uint32_t crc;
    {
      std::unique_lock<std::mutex> lock(crcMutex);
      crcReady.wait(lock, [&] { return crcDone > k; });
      crc = crcs[i];
    }
    for (int j : joiners) {
      auto sent = c.send(s.data.data(), keyOf(j), int64_t(s.data.size()),
                         DType::UInt8, tag);
      if (sent)
        sent = c.send(&crc, keyOf(j), 4, DType::UInt8, tag + " crc32c");
      if (!sent) {
        stopWorker();
        return sent.error().within("healing group " + std::to_string(j));
      }
    }
  }
  crcWorker.join();
  if (joining) {
    for (size_t i : mine)
      if (crcs[i] != expected[i])
        return makeError(
            where(sources[i % sources.size()],
                  "\"" + buffers[size_t(persistent[i])].meta->id + "\"") +
            ": checksum mismatch (crc32c " + std::to_string(crcs[i]) +
            ", the source's " + std::to_string(expected[i]) + ")");
    // Everything arrived and checked: the counter last.
    steps = count;
  }
  ++f.heals;
  return {};
}

Result<bool> Session::Impl::awaitCommit(int64_t epoch, int64_t step) {
  FaultTolerance &f = *ft;
  Membership &store = *f.membership;
  int64_t expected = f.groupRanks * int64_t(f.quorum.members.size());
  Clock::time_point start = Clock::now(), deadline = start + options.timeout;
  Clock::time_point nextDeadCheck = start + std::chrono::milliseconds(20);
  auto pause = std::chrono::microseconds(20);
  std::optional<Error> noQuorum;
  int64_t votes = 0;
  while (true) {
    auto t = untilDeadline(store, deadline,
                           [&] { return store.stepTally(epoch, step); });
    if (!t)
      return t.error();
    if (t->failed)
      return false;
    if (t->okVotes >= expected)
      return true;
    // The epoch moved: no vote can be added any more, and some are missing.
    if (t->epoch != epoch)
      return false;
    votes = t->okVotes;
    Clock::time_point now = Clock::now();
    if (now >= nextDeadCheck) {
      // A rank that never votes is dead, and so, once its heartbeat has
      // expired, is its group: any waiter then installs the next epoch,
      // which makes this step's votes final.
      auto dead = untilDeadline(store, deadline,
                                [&] { return store.deadGroups(f.quorum); });
      if (!dead)
        return dead.error();
      if (!dead->empty()) {
        auto proposal = store.proposeNextEpoch(epoch);
        if (!proposal)
          noQuorum = proposal.error();
      }
      nextDeadCheck = now + std::chrono::milliseconds(20);
    }
    if (now >= deadline)
      return makeError(
          "fault tolerance: step " + std::to_string(step) + " of epoch " +
          std::to_string(epoch) + ": " + std::to_string(votes) + " of " +
          std::to_string(expected) + " ranks voted within " +
          std::to_string(options.timeout.count() / 1000.0) + " s" +
          (noQuorum ? " (" + noQuorum->message + ")" : std::string()));
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2,
                                                std::chrono::microseconds(500));
  }
}

void Session::Impl::watchEpoch(int64_t epoch, Stop &stop) {
  FaultTolerance &f = *ft;
  Membership &store = *f.membership;
  const auto tick = std::chrono::milliseconds(10);
  const auto deadCheck = std::chrono::milliseconds(200);
  Clock::time_point nextDeadCheck = Clock::now() + deadCheck;
  bool aborted = false;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(stop.mutex);
      if (stop.wake.wait_for(lock, tick, [&] { return stop.stopped; }))
        return;
    }
    // The heartbeat thread reads the epoch every period, and a proposal
    // below records what it installs: no store call here.
    if (!aborted && store.epochChangedSince(epoch)) {
      std::string why = "epoch " + std::to_string(epoch) +
                        " ended (the job moved to epoch " +
                        std::to_string(store.observedEpoch()) + ")";
      // A communicator being created holds commMutex through its
      // rendezvous, which abort cannot end: try again at the next tick.
      std::unique_lock<std::mutex> lock(commMutex, std::try_to_lock);
      if (!lock.owns_lock())
        continue;
      for (size_t i = 0; i < comms.size(); ++i)
        if (comms[i] && plan.communicators[i].faultTolerant)
          comms[i]->abort(why);
      aborted = true;
    }
    if (!aborted && Clock::now() >= nextDeadCheck) {
      auto dead = store.deadGroups(f.quorum);
      if (dead && !dead->empty())
        (void)store.proposeNextEpoch(epoch);
      nextDeadCheck = Clock::now() + deadCheck;
    }
  }
}

Result<void> Session::Impl::faultTolerantStep() {
  FaultTolerance &f = *ft;
  int64_t step = steps + 1;
  auto fail = [&](const Error &e) -> Result<void> {
    // This rank's own group cannot go on (a peer of the group failed, or
    // the store is gone): the group leaves now rather than at the expiry.
    broken = true;
    (void)f.membership->leaveGroup();
    return e;
  };
  bool moveOn = false;
  while (true) {
    if (auto ok = ensureQuorum(moveOn); !ok)
      return fail(ok.error());
    moveOn = false;
    step = steps + 1; // a heal may have moved the counter
    int64_t epoch = f.quorum.epoch;
    // This step's data: each group missing from the quorum is processed
    // by one live group, chosen from the step and the live set; the ranks
    // of that group process the missing ranks' with their own coordinates.
    std::vector<int> missing;
    for (int g = 0; g < int(f.numGroups); ++g)
      if (!containsGroup(f.quorum.members, g))
        missing.push_back(g);
    f.dataRanks = {plan.rank};
    for (size_t i = 0; i < missing.size(); ++i) {
      size_t live = f.quorum.members.size();
      int assigned = f.quorum.members[(i + size_t(step)) % live];
      if (assigned == f.group)
        f.dataRanks.push_back(f.alongAxis[size_t(missing[i])]);
    }
    // With groups missing and shares kept apart: who brings which share to
    // the fault_tolerant all-reduces (every member computes the same), and
    // one pass per share of this rank's.
    f.shareLayout.clear();
    f.shareStash.clear();
    if (f.sharesApart && !missing.empty()) {
      size_t live = f.quorum.members.size();
      for (int g : f.quorum.members)
        f.shareLayout.push_back({int64_t(g)});
      for (size_t i = 0; i < missing.size(); ++i)
        f.shareLayout[(i + size_t(step)) % live].push_back(missing[i]);
    }
    size_t passes = f.shareLayout.empty() ? 1 : f.dataRanks.size();
    size_t n = program.size();
    Clock::time_point start = Clock::now();
    auto freshState = [&] {
      // A fresh attempt or share: no step-local buffer survives.
      for (BufferState &s : buffers)
        if (!s.persistent) {
          s.data = {};
          s.live = false;
        }
      return StepState{
          std::vector<std::pair<Clock::time_point, Clock::time_point>>(n),
          std::vector<char>(n, 0), std::vector<int>(commSequence.size(), 0)};
    };
    StepState state = freshState();
    // A peer cut off without closing its connections (a partition) would
    // hold a collective until the timeout; the watcher ends it as soon as
    // the job has moved to another epoch.
    Stop stop;
    std::thread watcher([&] { watchEpoch(epoch, stop); });
    PassOutcome before;
    for (f.sharePass = 0; f.sharePass < passes; ++f.sharePass) {
      if (f.sharePass > 0)
        state = freshState();
      before = runPass(state, f.beforeOrder, /*soft=*/true);
      if (before.failure || before.faultTolerantFailure)
        break;
    }
    f.sharePass = 0;
    {
      std::lock_guard<std::mutex> lock(stop.mutex);
      stop.stopped = true;
    }
    stop.wake.notify_all();
    watcher.join();
    if (before.failure)
      return fail(*before.failure);
    bool ok = !before.faultTolerantFailure && !f.healFailure;
    auto voted =
        untilDeadline(*f.membership, Clock::now() + options.timeout, [&] {
          return f.membership->voteStep(epoch, step, plan.rank, ok,
                                        f.groupRanks *
                                            int64_t(f.quorum.members.size()));
        });
    if (!voted)
      return fail(voted.error());
    Result<bool> commit = *voted ? awaitCommit(epoch, step) : false;
    if (!commit)
      return fail(commit.error());
    if (!*commit) {
      ++f.discarded;
      moveOn = true;
      continue;
    }
    PassOutcome after = runPass(state, f.afterOrder, /*soft=*/false);
    if (after.failure)
      return fail(*after.failure);
    ++steps;
    profile = profileOf(program, state.spans, streams, commSequence, start,
                        Clock::now());
    profile.needlessWakeups = state.needlessWakeups;
    reportOptimizerStep(profile);
    return {};
  }
}

std::optional<FaultToleranceState> Session::faultTolerance() const {
  if (!impl->ft)
    return std::nullopt;
  const FaultTolerance &f = *impl->ft;
  FaultToleranceState s;
  s.epoch = f.quorum.epoch;
  s.liveGroups = f.quorum.members;
  s.numGroups = f.numGroups;
  s.group = f.group;
  s.dataRanks =
      f.dataRanks.empty() ? std::vector<int64_t>{impl->plan.rank} : f.dataRanks;
  s.stepsDiscarded = f.discarded;
  s.heals = f.heals;
  return s;
}

Result<void> Session::checkMembershipStore() {
  if (!impl->ft)
    return {};
  Membership &m = *impl->ft->membership;
  auto q = m.currentQuorum();
  // A connection the store's restart closed fails once; the reconnect
  // then finds out whether the store still holds the job.
  if (!q && !m.lostState())
    q = m.currentQuorum();
  if (!q)
    return q.error();
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

//===----------------------------------------------------------------------===//
// Checkpoints
//===----------------------------------------------------------------------===//

namespace {
using nlohmann::json;

std::vector<char> recordsToBytes(const ckpt::RankRecords &r) {
  json chunks = json::array();
  for (const ckpt::ChunkRecord &c : r.chunks) {
    json j{{"tensor", c.tensor},
           {"kind", std::string(ckpt::tensorKindName(c.kind))},
           {"dtype", std::string(plan::dtypeName(c.dtype))},
           {"global_shape", c.globalShape},
           {"layout", c.layout},
           {"declaration_only", c.declarationOnly},
           {"offset", c.chunk.box.offset},
           {"shape", c.chunk.box.shape},
           {"file", c.chunk.file},
           {"byte_offset", c.chunk.byteOffset},
           {"length", c.chunk.length},
           {"crc32c", c.chunk.crc32c}};
    if (c.tensorId)
      j["tensor_id"] = *c.tensorId;
    chunks.push_back(std::move(j));
  }
  json j{{"rank", r.rank},
         {"file", r.file},
         {"file_bytes", r.fileBytes},
         {"block_bytes", r.blockBytes},
         {"chunks", std::move(chunks)}};
  std::string text = "ok" + j.dump();
  return {text.begin(), text.end()};
}

/// The records a rank put in the store, or the error it put there instead.
/// The values come from this job's own ranks; a malformed one is still an
/// error, not a crash.
Result<ckpt::RankRecords> recordsFromBytes(const std::vector<char> &bytes,
                                           int64_t rank) {
  std::string text(bytes.begin(), bytes.end());
  std::string who = "rank " + std::to_string(rank) + ": ";
  if (!text.starts_with("ok"))
    return makeError(who + text);
  json j = json::parse(text.begin() + 2, text.end(), nullptr, false);
  auto bad = [&] {
    return makeError(who + "malformed checkpoint records in the store");
  };
  if (j.is_discarded() || !j.is_object())
    return bad();
  ckpt::RankRecords r;
  try {
    r.rank = j.at("rank").get<int64_t>();
    r.file = j.at("file").get<std::string>();
    r.fileBytes = j.at("file_bytes").get<int64_t>();
    r.blockBytes = j.at("block_bytes").get<int64_t>();
    for (const json &c : j.at("chunks")) {
      ckpt::ChunkRecord rec;
      rec.tensor = c.at("tensor").get<std::string>();
      std::string kind = c.at("kind").get<std::string>();
      rec.kind = kind == ckpt::tensorKindName(ckpt::TensorKind::Parameter)
                     ? ckpt::TensorKind::Parameter
                     : ckpt::TensorKind::OptimizerState;
      auto dtype = plan::parseDType(c.at("dtype").get<std::string>());
      if (!dtype)
        return bad();
      rec.dtype = *dtype;
      rec.globalShape = c.at("global_shape").get<std::vector<int64_t>>();
      rec.layout = c.at("layout").get<std::string>();
      rec.declarationOnly = c.at("declaration_only").get<bool>();
      if (c.contains("tensor_id"))
        rec.tensorId = c.at("tensor_id").get<int64_t>();
      rec.chunk.box.offset = c.at("offset").get<std::vector<int64_t>>();
      rec.chunk.box.shape = c.at("shape").get<std::vector<int64_t>>();
      rec.chunk.file = c.at("file").get<std::string>();
      rec.chunk.byteOffset = c.at("byte_offset").get<int64_t>();
      rec.chunk.length = c.at("length").get<int64_t>();
      rec.chunk.crc32c = c.at("crc32c").get<std::vector<uint32_t>>();
      r.chunks.push_back(std::move(rec));
    }
  } catch (const std::exception &) {
    return bad();
  }
  return r;
}

std::vector<char> statusBytes(const Result<void> &ok) {
  std::string text = ok ? "ok" : "error: " + ok.error().message;
  return {text.begin(), text.end()};
}

/// Test hook (test/trainer/checkpoint-kill.sh):
/// MESHPLAN_TEST_SLOW_CHECKPOINT_MS = N makes saveCheckpoint sleep N ms at each
/// of its phase boundaries (after the staging directory is made, after a rank's
/// data file is written, after the staged metadata and after the rename), so
/// that a test can kill -9 a rank at a chosen point. Not for production use.
void slowCheckpointForTests() {
  static const int64_t ms = [] {
    const char *v = std::getenv("MESHPLAN_TEST_SLOW_CHECKPOINT_MS");
    return v ? std::max<int64_t>(0, std::atoll(v)) : int64_t(0);
  }();
  if (ms > 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

/// loadCheckpoint stages every box before copying any into the session's
/// buffers (all or nothing), in one region that the session keeps for its
/// next load. Fresh anonymous memory costs a page fault and the kernel's
/// zeroing per 4 KiB page on first touch, which cost more than loading the
/// bytes into it (docs/performance.md, section G): the region is populated in
/// one call (MADV_POPULATE_WRITE, no fault per page) and, between loads,
/// handed to the kernel as lazily freeable (MADV_FREE): the kernel takes the
/// pages back under memory pressure without writing them anywhere, and a load
/// that finds them still there reuses them with no fault and no zeroing (it
/// overwrites every byte, so pages that were taken back and come back zeroed
/// are as good). Not transparent huge pages: on a VM whose free 2 MiB blocks
/// are reported to the host, their first touch was slower and erratic.
Result<std::byte *> stagingFor(std::shared_ptr<std::byte> &region,
                               size_t &regionBytes, size_t bytes) {
  if (bytes == 0)
    return static_cast<std::byte *>(nullptr);
  if (region && regionBytes == bytes)
    return region.get();
  region.reset();
  regionBytes = 0;
  void *p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return makeError("checkpoint: cannot allocate " + std::to_string(bytes) +
                     " bytes to stage the load: " + std::strerror(errno));
#ifdef MADV_POPULATE_WRITE
  // Advice only (EINVAL before Linux 5.14): without it the pages fault in
  // one by one.
  (void)::madvise(p, bytes, MADV_POPULATE_WRITE);
#endif
  region =
      std::shared_ptr<std::byte>(static_cast<std::byte *>(p),
                                 [bytes](std::byte *q) { ::munmap(q, bytes); });
  regionBytes = bytes;
  return region.get();
}

/// Marks the staging region lazily freeable when a load returns, whether it
/// succeeded or not.
struct LazyFree {
  std::byte *data;
  size_t bytes;
  ~LazyFree() {
#ifdef MADV_FREE
    if (data)
      (void)::madvise(data, bytes, MADV_FREE);
#endif
  }
};

Result<void> statusFrom(const std::vector<char> &bytes) {
  std::string text(bytes.begin(), bytes.end());
  if (text == "ok")
    return {};
  return makeError(text.starts_with("error: ") ? text.substr(7) : text);
}
} // namespace

Result<void> Session::saveCheckpoint(const std::string &dir,
                                     ckpt::CheckpointInfo info) {
  Impl &m = *impl;
  if (m.broken)
    return makeError("an earlier step failed; this session cannot save");
  auto boxes = ckpt::persistentBoxesOf(m.plan);
  if (!boxes)
    return boxes.error();
  if (info.training.step == 0)
    info.training.step = m.steps;
  if (info.mesh.empty() && m.mesh)
    info.mesh = m.mesh->str();
  int64_t rank = m.plan.rank, world = m.options.worldSize;
  std::string base = "ckpt/" + std::to_string(m.checkpointsSaved++) + "/";
  // The ranks that save, in rank order; the first of them coordinates.
  std::vector<int64_t> savers;
  if (m.ft) {
    // Fault-tolerant: the live groups' ranks. A box the layout replicates
    // over the managed axis is written by the lowest live group (below),
    // and the keys name the epoch and step, which every live rank shares
    // (a healed rank's save count does not).
    const FaultTolerance &f = *m.ft;
    if (m.plan.mesh.pipelineAxis)
      return makeError("checkpoint: a fault-tolerant pipelined layout cannot "
                       "be saved yet");
    for (int64_t r = 0; r < world; ++r) {
      auto position = m.mesh->positionOf(r);
      if (position && containsGroup(f.quorum.members, int(m.mesh->coordinateAt(
                                                          *position, f.axis))))
        savers.push_back(r);
    }
    base = "ckpt/e" + std::to_string(f.quorum.epoch) + "/s" +
           std::to_string(m.steps) + "/";
  } else {
    for (int64_t r = 0; r < world; ++r)
      savers.push_back(r);
  }
  int64_t coordinator = savers.front();
  Backend &store = *m.backend;
  // 1. The coordinator makes a fresh staging directory; the others wait.
  if (rank == coordinator) {
    Result<void> begun = ckpt::beginCheckpoint(dir);
    slowCheckpointForTests();
    MESHPLAN_TRY(store.storeSet(base + "begin", statusBytes(begun)));
    MESHPLAN_TRY(begun);
  } else {
    auto begun = store.storeGet(base + "begin");
    if (!begun)
      return begun.error();
    MESHPLAN_TRY(statusFrom(*begun));
  }
  // 2. Every rank writes what it owns, in parallel, and posts its records.
  std::vector<ckpt::SaveBox> save;
  // On a device the shards are written from host copies.
  std::vector<std::vector<std::byte>> fromDevice;
  fromDevice.reserve(boxes->size());
  for (ckpt::PersistentBox &b : *boxes) {
    auto it = m.bufferIds.find(b.bufferId);
    if (it == m.bufferIds.end())
      return makeError("checkpoint: no buffer \"" + b.bufferId + "\"");
    const BufferState &s = m.buffers[size_t(it->second)];
    if (m.ft) {
      // Coordinate 0 of the managed axis may be dead: the lowest live
      // group's rank writes instead (core's owner rule, the managed axis
      // skipped).
      auto owns = ckpt::ownsShard(*m.root, s.layout, rank, m.ft->axis);
      if (!owns)
        return owns.error();
      b.owned = *owns && !b.box.empty() &&
                m.ft->group == m.ft->quorum.members.front();
    }
    if (m.dev) {
      fromDevice.emplace_back(
          size_t(s.numel * plan::dtypeBytes(s.meta->dtype)));
      MESHPLAN_TRY(
          m.fromDevice(m.deviceAddress(it->second), fromDevice.back()));
      save.push_back({&b, std::span<const std::byte>(fromDevice.back())});
      continue;
    }
    save.push_back({&b, std::span<const std::byte>(s.data)});
  }
  auto records = ckpt::writeRankData(dir, rank, save);
  slowCheckpointForTests();
  MESHPLAN_TRY(store.storeSet(base + "rank" + std::to_string(rank),
                              records ? recordsToBytes(*records)
                                      : statusBytes(records.error().within(
                                            "rank " + std::to_string(rank)))));
  if (!records)
    return records.error();
  // 3. The coordinator gathers every saver's records (the metadata lists
  // them all) and commits; everyone returns what the commit did.
  if (rank == coordinator) {
    std::vector<ckpt::RankRecords> all;
    Result<void> committed;
    for (int64_t r : savers) {
      if (!committed)
        break;
      auto bytes = store.storeGet(base + "rank" + std::to_string(r));
      if (!bytes) {
        committed = bytes.error();
        break;
      }
      auto rec = recordsFromBytes(*bytes, r);
      if (!rec)
        committed = rec.error();
      else
        all.push_back(std::move(*rec));
    }
    if (committed) {
      // ckpt::commitCheckpoint, in its steps (the test hook goes between).
      auto meta = ckpt::assembleMetadata(info, all);
      if (!meta)
        committed = meta.error();
      else
        committed = ckpt::writeStagedMetadata(dir, *meta);
      if (committed) {
        slowCheckpointForTests();
        committed = ckpt::publishCheckpoint(dir);
      }
      if (committed)
        slowCheckpointForTests();
    }
    MESHPLAN_TRY(store.storeSet(base + "done", statusBytes(committed)));
    return committed;
  }
  auto done = store.storeGet(base + "done");
  if (!done)
    return done.error();
  return statusFrom(*done);
}

Result<ckpt::TrainingState> Session::loadCheckpoint(const std::string &dir) {
  Impl &m = *impl;
  auto meta = ckpt::readCheckpointMetadata(dir);
  if (!meta)
    return meta.error();
  auto boxes = ckpt::persistentBoxesOf(m.plan);
  if (!boxes)
    return boxes.error();
  MESHPLAN_TRY(ckpt::checkLoadable(*meta, *boxes));
  // Everything into one staging region first (every byte of it is
  // overwritten): a failure changes nothing.
  struct Loaded {
    int index;
    size_t offset, size;
  };
  std::vector<Loaded> loaded;
  size_t total = 0;
  for (const ckpt::PersistentBox &b : *boxes) {
    auto it = m.bufferIds.find(b.bufferId);
    if (it == m.bufferIds.end())
      return makeError("checkpoint: no buffer \"" + b.bufferId + "\"");
    const BufferState &s = m.buffers[size_t(it->second)];
    size_t size = size_t(s.numel * plan::dtypeBytes(s.meta->dtype));
    int64_t want = b.box.numElements() * plan::dtypeBytes(b.dtype);
    if (want < 0 || size_t(want) != size)
      return makeError("checkpoint: " + b.tensor + " loads " +
                       std::to_string(want) + " bytes into buffer \"" +
                       b.bufferId + "\" of " + std::to_string(size));
    loaded.push_back({it->second, total, size});
    // Each box cache-line aligned (any dtype's alignment).
    total += (size + 63) & ~size_t(63);
  }
  auto staging = stagingFor(m.loadStaging, m.loadStagingBytes, total);
  if (!staging)
    return staging.error();
  LazyFree lazyFree{*staging, total};
  for (size_t i = 0; i < loaded.size(); ++i) {
    const ckpt::PersistentBox &b = (*boxes)[i];
    MESHPLAN_TRY(
        ckpt::loadBoxInto(*meta, b.tensor, b.globalShape, b.box, b.dtype,
                          {*staging + loaded[i].offset, loaded[i].size}));
  }
  // Copied into the existing buffers (same sizes, checked above), so that
  // the data pointers handed out earlier (TensorView, the C API's
  // mp_tensor) stay valid.
  for (const Loaded &l : loaded)
    if (l.size && m.dev)
      MESHPLAN_TRY(m.toDevice(l.index, {*staging + l.offset, l.size}));
    else if (l.size)
      std::memcpy(m.buffers[size_t(l.index)].data.data(), *staging + l.offset,
                  l.size);
  return meta->training;
}

} // namespace meshplan::runtime

//===- Binding.cpp - Binding a plan to its buffers ------------------------===//
//
// open() binds the plan once: every buffer's layout is parsed with core, and
// every collective gets, per (input, output) pair, the boxes its members hold
// (core's shardOf over the communicator's ranks) and the padded chunk it
// packs to; the packed total must equal the plan's count. step() then only
// moves bytes.
//
//===----------------------------------------------------------------------===//

#include "BoxCopy.h"
#include "SessionImpl.h"

#include "meshplan/Core/Layout.h"
#include "meshplan/Core/MeshView.h"
#include "meshplan/Runtime/Kernels.h"

#include <algorithm>
#include <map>
#include <string>

namespace meshplan::runtime {

using plan::BufferKind;
using plan::DType;
using plan::Instruction;
using plan::OpKind;
namespace k = kernels;

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
                     " ranks, but " + options.worldSizeVariable + " is " +
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
      s.live = true; // in the device arena (setUpExecutor zeroes it)
    else if (s.persistent)
      ensureOnHost(static_cast<int>(i));
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

} // namespace meshplan::runtime

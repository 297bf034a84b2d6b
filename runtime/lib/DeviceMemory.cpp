//===- DeviceMemory.cpp - The plan's device memory, sized once ------------===//

#include "DeviceMemory.h"

#include <algorithm>
#include <map>
#include <string>

namespace meshplan::runtime {

using plan::OpKind;

//===----------------------------------------------------------------------===//
// Happens-before
//===----------------------------------------------------------------------===//

Result<HappensBefore> HappensBefore::of(const plan::Plan &plan) {
  size_t n = plan.program.size();
  std::map<std::string, size_t> position;
  for (size_t i = 0; i < n; ++i)
    position[plan.program[i].id] = i;
  // Direct predecessors: the previous instruction of the same stream, the
  // deps, and the previous collective or transfer of the same communicator
  // (the executor takes both in the communicator's program order).
  std::vector<std::vector<size_t>> preds(n);
  std::map<std::string, size_t> lastOfStream, lastOfComm;
  for (size_t i = 0; i < n; ++i) {
    const plan::Instruction &in = plan.program[i];
    if (auto it = lastOfStream.find(in.stream); it != lastOfStream.end())
      preds[i].push_back(it->second);
    lastOfStream[in.stream] = i;
    if (plan::isCollective(in.op) || plan::isPointToPoint(in.op)) {
      if (auto it = lastOfComm.find(in.comm); it != lastOfComm.end())
        preds[i].push_back(it->second);
      lastOfComm[in.comm] = i;
    }
    for (const std::string &d : in.deps) {
      auto it = position.find(d);
      if (it == position.end())
        return makeError("instruction \"" + in.id + "\": unknown dep \"" + d +
                         "\"");
      if (it->second == i)
        return makeError("instruction \"" + in.id + "\" depends on itself");
      preds[i].push_back(it->second);
    }
  }
  // A topological order (Kahn); plans list deps before their users, but
  // nothing here relies on it.
  std::vector<std::vector<size_t>> succs(n);
  std::vector<size_t> indegree(n, 0);
  for (size_t i = 0; i < n; ++i)
    for (size_t p : preds[i]) {
      succs[p].push_back(i);
      ++indegree[i];
    }
  std::vector<size_t> order;
  order.reserve(n);
  for (size_t i = 0; i < n; ++i)
    if (indegree[i] == 0)
      order.push_back(i);
  for (size_t k = 0; k < order.size(); ++k)
    for (size_t s : succs[order[k]])
      if (--indegree[s] == 0)
        order.push_back(s);
  if (order.size() != n)
    return makeError("the program's dependencies form a cycle");
  HappensBefore hb;
  hb.wordCount = (n + 63) / 64;
  hb.reach.assign(n, std::vector<uint64_t>(hb.wordCount, 0));
  // Reverse topological order: what a node reaches is its successors and
  // what they reach.
  for (size_t k = n; k-- > 0;) {
    size_t i = order[k];
    std::vector<uint64_t> &r = hb.reach[i];
    for (size_t s : succs[i]) {
      r[s / 64] |= uint64_t(1) << (s % 64);
      const std::vector<uint64_t> &rs = hb.reach[s];
      for (size_t w = 0; w < hb.wordCount; ++w)
        r[w] |= rs[w];
    }
  }
  return hb;
}

bool HappensBefore::beforeAll(size_t a,
                              const std::vector<uint64_t> &set) const {
  const std::vector<uint64_t> &r = reach[a];
  for (size_t w = 0; w < wordCount; ++w)
    if (set[w] & ~r[w])
      return false;
  return true;
}

//===----------------------------------------------------------------------===//
// Placement
//===----------------------------------------------------------------------===//

namespace {

/// One live stretch of a buffer: the instructions that touch it, ended by a
/// free.
struct Segment {
  std::vector<uint64_t> uses; ///< bitset over instructions
  size_t free = 0;
};

int64_t roundUp(int64_t x, int64_t alignment) {
  return (x + alignment - 1) / alignment * alignment;
}

} // namespace

Result<DeviceMemoryPlan> planDeviceMemory(const plan::Plan &plan,
                                          int64_t alignment) {
  if (alignment <= 0 || (alignment & (alignment - 1)) != 0)
    return makeError("the alignment must be a power of two");
  auto hb = HappensBefore::of(plan);
  if (!hb)
    return hb.error();
  size_t nb = plan.buffers.size();
  std::map<std::string, size_t> index;
  for (size_t b = 0; b < nb; ++b)
    index[plan.buffers[b].id] = b;

  DeviceMemoryPlan m;
  m.bytes.resize(nb);
  m.offsets.assign(nb, 0);
  m.persistent.assign(nb, false);
  for (size_t b = 0; b < nb; ++b) {
    const plan::Buffer &buffer = plan.buffers[b];
    int64_t bytes = plan::dtypeBytes(buffer.dtype);
    for (int64_t d : buffer.localShape)
      if (d < 0 || __builtin_mul_overflow(bytes, d, &bytes))
        return makeError("buffer \"" + buffer.id + "\" has an invalid size");
    m.bytes[b] = bytes;
    m.totalBytes += bytes;
    m.persistent[b] = buffer.kind == plan::BufferKind::ParamShard ||
                      buffer.kind == plan::BufferKind::OptimizerState;
  }

  // Segments, in program order; a segment still open at the end of the
  // program makes its buffer persistent (its value may be read by the next
  // step, or after it).
  std::vector<std::vector<Segment>> segments(nb);
  std::vector<bool> open(nb, false);
  auto lookup = [&](const plan::Instruction &in,
                    const std::string &id) -> Result<size_t> {
    auto it = index.find(id);
    if (it == index.end())
      return makeError("instruction \"" + in.id + "\": unknown buffer \"" + id +
                       "\"");
    return it->second;
  };
  int64_t live = 0;
  std::vector<bool> counted(nb, false);
  for (size_t i = 0; i < plan.program.size(); ++i) {
    const plan::Instruction &in = plan.program[i];
    for (const auto *list : {&in.inputs, &in.outputs})
      for (const std::string &id : *list) {
        auto b = lookup(in, id);
        if (!b)
          return b.error();
        if (in.op == OpKind::Free) {
          if (open[*b]) {
            segments[*b].back().free = i;
            open[*b] = false;
          }
          if (counted[*b]) {
            live -= m.bytes[*b];
            counted[*b] = false;
          }
          continue;
        }
        if (!open[*b]) {
          segments[*b].push_back({std::vector<uint64_t>(hb->words(), 0), 0});
          open[*b] = true;
        }
        segments[*b].back().uses[i / 64] |= uint64_t(1) << (i % 64);
        if (!counted[*b] && !m.persistent[*b]) {
          live += m.bytes[*b];
          counted[*b] = true;
        }
      }
    m.programOrderPeakBytes = std::max(m.programOrderPeakBytes, live);
  }
  for (size_t b = 0; b < nb; ++b)
    if (open[b])
      m.persistent[b] = true;
  int64_t persistentBytes = 0;
  for (size_t b = 0; b < nb; ++b)
    if (m.persistent[b])
      persistentBytes += m.bytes[b];
  // The program-order peak counted transient buffers only.
  m.programOrderPeakBytes += persistentBytes;

  // Persistent buffers first, one after another.
  int64_t top = 0;
  for (size_t b = 0; b < nb; ++b)
    if (m.persistent[b] && m.bytes[b] > 0) {
      m.offsets[b] = top;
      top = roundUp(top + m.bytes[b], alignment);
    }
  int64_t base = top;
  m.arenaBytes = top;

  // Transient buffers, largest first, each at the lowest offset above the
  // persistent ones where no buffer it may be live with is placed.
  auto conflict = [&](size_t x, size_t y) {
    for (const Segment &a : segments[x])
      for (const Segment &b : segments[y])
        if (!hb->beforeAll(a.free, b.uses) && !hb->beforeAll(b.free, a.uses))
          return true;
    return false;
  };
  std::vector<size_t> transient;
  for (size_t b = 0; b < nb; ++b)
    if (!m.persistent[b] && m.bytes[b] > 0)
      transient.push_back(b);
  std::stable_sort(transient.begin(), transient.end(),
                   [&](size_t a, size_t b) { return m.bytes[a] > m.bytes[b]; });
  std::vector<size_t> placed;
  for (size_t y : transient) {
    std::vector<std::pair<int64_t, int64_t>> taken; // [begin, end)
    for (size_t x : placed)
      if (conflict(x, y))
        taken.push_back({m.offsets[x], m.offsets[x] + m.bytes[x]});
    std::sort(taken.begin(), taken.end());
    int64_t at = base;
    for (auto [begin, end] : taken) {
      if (at + m.bytes[y] <= begin)
        break;
      at = std::max(at, roundUp(end, alignment));
    }
    m.offsets[y] = at;
    m.arenaBytes = std::max(m.arenaBytes, at + m.bytes[y]);
    placed.push_back(y);
  }
  m.arenaBytes = roundUp(m.arenaBytes, alignment);
  return m;
}

//===----------------------------------------------------------------------===//
// The arena
//===----------------------------------------------------------------------===//

RawDeviceAllocator::~RawDeviceAllocator() = default;

Result<std::unique_ptr<DeviceArena>>
DeviceArena::create(DeviceMemoryPlan plan,
                    std::shared_ptr<RawDeviceAllocator> raw) {
  std::byte *base = nullptr;
  if (plan.arenaBytes > 0) {
    auto p = raw->allocate(size_t(plan.arenaBytes));
    if (!p)
      return p.error().within("allocating the plan's " +
                              std::to_string(plan.arenaBytes) +
                              " bytes of device memory");
    base = static_cast<std::byte *>(*p);
  }
  return std::unique_ptr<DeviceArena>(
      new DeviceArena(std::move(plan), std::move(raw), base));
}

DeviceArena::~DeviceArena() {
  if (base)
    raw->release(base);
}

std::byte *DeviceArena::address(size_t index) const {
  if (index >= memory.bytes.size() || memory.bytes[index] == 0)
    return nullptr;
  return base + memory.offsets[index];
}

} // namespace meshplan::runtime

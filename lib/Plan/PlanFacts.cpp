//===- PlanFacts.cpp - Interned buffers, operands and callbacks -----------===//

#include "meshplan/Plan/PlanFacts.h"

#include <algorithm>

namespace meshplan::plan {

std::string_view phaseName(Phase phase) {
  switch (phase) {
  case Phase::None:
    return "";
  case Phase::Forward:
    return "forward";
  case Phase::Backward:
    return "backward";
  case Phase::BackwardInput:
    return "backward_input";
  case Phase::BackwardWeight:
    return "backward_weight";
  }
  return "";
}

namespace {

Phase parsePhase(std::string_view s) {
  if (s == "forward")
    return Phase::Forward;
  if (s == "backward")
    return Phase::Backward;
  if (s == "backward_input")
    return Phase::BackwardInput;
  if (s == "backward_weight")
    return Phase::BackwardWeight;
  return Phase::None;
}

uint64_t mixHash(uint64_t h, uint64_t x) {
  h ^= x + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  return h;
}

uint64_t hashOf(const BufferFacts &b) {
  uint64_t h = 0;
  h = mixHash(h, static_cast<uint64_t>(b.id));
  h = mixHash(h, static_cast<uint64_t>(b.tensor));
  h = mixHash(h, static_cast<uint64_t>(b.layout));
  h = mixHash(h, static_cast<uint64_t>(b.kind));
  h = mixHash(h, static_cast<uint64_t>(b.dtype));
  h = mixHash(h, b.tensorId ? static_cast<uint64_t>(*b.tensorId) + 1 : 0);
  for (int64_t d : b.globalShape)
    h = mixHash(h, static_cast<uint64_t>(d));
  h = mixHash(h, static_cast<uint64_t>(b.scaleAmax));
  h = mixHash(h, static_cast<uint64_t>(b.scaleIndex));
  return mixHash(h, b.scalePowerOf2);
}

/// Interns BufferFacts by value (hash, then equality).
struct BufferTable {
  std::vector<BufferFacts> &items;
  std::unordered_map<uint64_t, int32_t> &byHash;
  std::vector<int32_t> &next;

  int32_t intern(BufferFacts &&b) {
    uint64_t h = hashOf(b);
    auto [it, fresh] = byHash.emplace(h, static_cast<int32_t>(items.size()));
    if (!fresh) {
      int32_t i = it->second;
      for (;;) {
        if (items[i] == b)
          return i;
        if (next[i] < 0)
          break;
        i = next[i];
      }
      next[i] = static_cast<int32_t>(items.size());
    }
    next.push_back(-1);
    items.push_back(std::move(b));
    return static_cast<int32_t>(items.size() - 1);
  }
};

} // namespace

int32_t FactsBuilder::internString(std::string_view s) {
  auto it = stringIds.find(s);
  if (it != stringIds.end())
    return it->second;
  strings.emplace_back(s);
  int32_t id = static_cast<int32_t>(strings.size() - 1);
  stringIds.emplace(strings.back(), id);
  return id;
}

int32_t FactsBuilder::internStringAt(std::string_view s, int32_t guess) {
  if (guess >= 0 && strings[guess] == s)
    return guess;
  return internString(s);
}

bool FactsBuilder::describes(int32_t sig, const Buffer &b) const {
  const BufferFacts &c = buffers[sig];
  bool scaleSame = b.scale ? c.scaleAmax >= 0 &&
                                 strings[c.scaleAmax] == b.scale->amax &&
                                 c.scaleIndex == b.scale->index &&
                                 c.scalePowerOf2 == b.scale->powerOf2
                           : c.scaleAmax < 0;
  return c.kind == b.kind && c.dtype == b.dtype && c.tensorId == b.tensorId &&
         c.globalShape == b.globalShape && strings[c.id] == b.id &&
         strings[c.layout] == b.layout &&
         (c.tensor < 0 ? b.tensor.empty() : strings[c.tensor] == b.tensor) &&
         scaleSame;
}

int32_t FactsBuilder::internBuffer(const Buffer &b, int32_t guess) {
  // The previous plan's buffer at this position, compared in place.
  if (guess >= 0 && describes(guess, b))
    return guess;
  int32_t id = internString(b.id);
  // Else most buffers are described as the previous plan described the
  // buffer of the same id: compare with that description in place, without
  // interning its strings again (a thousand plans of 1,876 buffers each).
  if (static_cast<size_t>(id) < lastOfId.size() && lastOfId[id] >= 0 &&
      describes(lastOfId[id], b))
    return lastOfId[id];
  BufferFacts f;
  f.id = id;
  f.tensor = b.tensor.empty() ? -1 : internString(b.tensor);
  f.layout = internString(b.layout);
  f.kind = b.kind;
  f.dtype = b.dtype;
  f.tensorId = b.tensorId;
  f.globalShape = b.globalShape;
  if (b.scale) {
    f.scaleAmax = internString(b.scale->amax);
    f.scaleIndex = b.scale->index;
    f.scalePowerOf2 = b.scale->powerOf2;
  }
  int32_t sig =
      BufferTable{buffers, bufferByHash, nextBuffer}.intern(std::move(f));
  if (lastOfId.size() <= static_cast<size_t>(id))
    lastOfId.resize(strings.size(), -1);
  lastOfId[id] = sig;
  return sig;
}

void FactsBuilder::add(size_t index, const Plan &plan,
                       const std::vector<int32_t> *operandBuffers) {
  PlanFacts f;
  f.buffers.reserve(plan.buffers.size());
  // Buffer ids are unique within a plan (validatePlan); operands name them.
  // By interned string id, stamped with this plan's number (no clearing).
  ++generation;
  auto localOf = [&](int32_t s) -> int32_t {
    if (static_cast<size_t>(s) >= localIndex.size() ||
        localStamp[s] != generation)
      return -1;
    return localIndex[s];
  };
  prevBuffers.resize(plan.buffers.size(), -1);
  for (size_t b = 0; b < plan.buffers.size(); ++b) {
    int32_t sig = internBuffer(plan.buffers[b], prevBuffers[b]);
    prevBuffers[b] = sig;
    f.buffers.push_back(sig);
    int32_t s = buffers[sig].id;
    if (localIndex.size() <= static_cast<size_t>(s)) {
      localIndex.resize(strings.size(), -1);
      localStamp.resize(strings.size(), 0);
    }
    localIndex[s] = static_cast<int32_t>(b);
    localStamp[s] = generation;
  }
  size_t n = plan.program.size();
  if (operandBuffers) {
    f.operands = *operandBuffers;
  } else {
    f.operands.reserve(prevOperands.size());
  }
  f.operandStart.reserve(n + 1);
  f.inputCount.reserve(n);
  f.label.reserve(n);
  f.unit.reserve(n);
  f.phase.reserve(n);
  f.microbatch.reserve(n);
  f.operandStart.push_back(0);
  // Operand k resolves to the previous plan's buffer index at k when that
  // buffer of this plan has the operand's id (ids are unique in a plan).
  auto operand = [&](const std::string &b) {
    size_t k = f.operands.size();
    if (k < prevOperands.size()) {
      int32_t guess = prevOperands[k];
      if (guess >= 0 && static_cast<size_t>(guess) < plan.buffers.size() &&
          plan.buffers[guess].id == b)
        return guess;
    }
    auto it = stringIds.find(b);
    return it == stringIds.end() ? -1 : localOf(it->second);
  };
  prevLabel.resize(n, -1);
  prevUnit.resize(n, -1);
  int32_t operandEnd = 0;
  for (size_t i = 0; i < n; ++i) {
    const Instruction &in = plan.program[i];
    if (!operandBuffers) {
      for (const std::string &b : in.inputs)
        f.operands.push_back(operand(b));
      for (const std::string &b : in.outputs)
        f.operands.push_back(operand(b));
    }
    operandEnd += static_cast<int32_t>(in.inputs.size() + in.outputs.size());
    f.operandStart.push_back(operandEnd);
    f.inputCount.push_back(static_cast<int32_t>(in.inputs.size()));
    f.label.push_back(
        in.label.empty() ? -1 : internStringAt(in.label, prevLabel[i]));
    f.unit.push_back(in.unit.empty() ? -1
                                     : internStringAt(in.unit, prevUnit[i]));
    prevLabel[i] = f.label.back() >= 0 ? f.label.back() : prevLabel[i];
    prevUnit[i] = f.unit.back() >= 0 ? f.unit.back() : prevUnit[i];
    f.phase.push_back(parsePhase(in.phase));
    f.microbatch.push_back(in.microbatch);
  }
  if (!operandBuffers)
    prevOperands = f.operands;
  if (plan.optimizer) {
    auto it = std::find(optimizers.begin(), optimizers.end(), *plan.optimizer);
    f.optimizer = static_cast<int32_t>(it - optimizers.begin());
    if (it == optimizers.end())
      optimizers.push_back(*plan.optimizer);
  }
  added.emplace_back(index, std::move(f));
}

PlanSetFacts mergeFacts(std::vector<FactsBuilder> &builders, size_t plans) {
  PlanSetFacts out;
  out.plans.resize(plans);
  std::unordered_map<std::string_view, int32_t> stringIds;
  std::deque<std::string> storage;
  std::unordered_map<uint64_t, int32_t> bufferByHash;
  std::vector<int32_t> nextBuffer;
  BufferTable table{out.buffers, bufferByHash, nextBuffer};
  for (FactsBuilder &b : builders) {
    std::vector<int32_t> strMap(b.strings.size());
    for (size_t s = 0; s < b.strings.size(); ++s) {
      auto it = stringIds.find(b.strings[s]);
      if (it == stringIds.end()) {
        storage.push_back(std::move(b.strings[s]));
        it = stringIds
                 .emplace(storage.back(),
                          static_cast<int32_t>(out.strings.size()))
                 .first;
        out.strings.push_back(storage.back());
      }
      strMap[s] = it->second;
    }
    auto str = [&](int32_t s) { return s < 0 ? s : strMap[s]; };
    std::vector<int32_t> bufMap(b.buffers.size());
    for (size_t i = 0; i < b.buffers.size(); ++i) {
      BufferFacts f = std::move(b.buffers[i]);
      f.id = str(f.id);
      f.tensor = str(f.tensor);
      f.layout = str(f.layout);
      f.scaleAmax = str(f.scaleAmax);
      bufMap[i] = table.intern(std::move(f));
    }
    std::vector<int32_t> optMap(b.optimizers.size());
    for (size_t i = 0; i < b.optimizers.size(); ++i) {
      auto it = std::find(out.optimizers.begin(), out.optimizers.end(),
                          b.optimizers[i]);
      optMap[i] = static_cast<int32_t>(it - out.optimizers.begin());
      if (it == out.optimizers.end())
        out.optimizers.push_back(b.optimizers[i]);
    }
    for (auto &[index, f] : b.added) {
      for (int32_t &x : f.buffers)
        x = bufMap[x];
      for (int32_t &x : f.label)
        x = str(x);
      for (int32_t &x : f.unit)
        x = str(x);
      if (f.optimizer >= 0)
        f.optimizer = optMap[f.optimizer];
      if (index < plans)
        out.plans[index] = std::move(f);
    }
    b = FactsBuilder();
  }
  return out;
}

PlanSetFacts factsOf(const std::vector<Plan> &plans) {
  std::vector<FactsBuilder> one(1);
  for (size_t i = 0; i < plans.size(); ++i)
    one[0].add(i, plans[i]);
  return mergeFacts(one, plans.size());
}

} // namespace meshplan::plan

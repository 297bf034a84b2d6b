//===- StreamGraph.cpp - A plan's order as streams and events -------------===//

#include "StreamGraph.h"

#include <algorithm>
#include <map>

namespace meshplan::runtime {

Result<StreamGraph> buildStreamGraph(const plan::Plan &plan) {
  size_t n = plan.program.size(), ns = plan.streams.size();
  std::map<std::string, int> streamIndex;
  for (size_t s = 0; s < ns; ++s)
    streamIndex[plan.streams[s]] = int(s);
  std::map<std::string, size_t> position;

  StreamGraph g;
  g.steps.resize(n);
  // For each instruction: its stream's sequence number (1-based) and the
  // vector clock after it completes.
  std::vector<int64_t> sequence(n, 0);
  std::vector<std::vector<int64_t>> clockAfter(n);
  // Each stream's current clock (what has completed before its next
  // instruction may start) and how many instructions it has.
  std::vector<std::vector<int64_t>> clock(ns, std::vector<int64_t>(ns, 0));
  std::vector<int64_t> issued(ns, 0);
  std::map<std::string, size_t> lastCollective;

  for (size_t i = 0; i < n; ++i) {
    const plan::Instruction &in = plan.program[i];
    auto s = streamIndex.find(in.stream);
    if (s == streamIndex.end())
      return makeError("instruction \"" + in.id + "\": unknown stream \"" +
                       in.stream + "\"");
    int stream = s->second;
    g.steps[i].stream = stream;
    std::vector<size_t> before;
    for (const std::string &d : in.deps) {
      auto it = position.find(d);
      if (it == position.end())
        return makeError("instruction \"" + in.id + "\": dep \"" + d +
                         "\" is not an earlier instruction");
      before.push_back(it->second);
    }
    // A communicator's collectives and transfers, in program order (the
    // executor's turns; NCCL needs one order on every member).
    if (plan::isCollective(in.op) || plan::isPointToPoint(in.op)) {
      if (auto it = lastCollective.find(in.comm); it != lastCollective.end())
        before.push_back(it->second);
      lastCollective[in.comm] = i;
    }
    std::vector<int64_t> &mine = clock[size_t(stream)];
    // Latest first: waiting for it may imply the others.
    std::sort(before.begin(), before.end(), std::greater<size_t>());
    before.erase(std::unique(before.begin(), before.end()), before.end());
    for (size_t d : before) {
      int other = g.steps[d].stream;
      if (other == stream)
        continue; // stream order
      ++g.crossStreamOrderings;
      if (mine[size_t(other)] >= sequence[d])
        continue; // implied by an earlier wait
      if (g.steps[d].record < 0) {
        g.steps[d].record = int(g.eventAfter.size());
        g.eventAfter.push_back(d);
      }
      g.steps[i].waits.push_back(g.steps[d].record);
      ++g.waits;
      for (size_t t = 0; t < ns; ++t)
        mine[t] = std::max(mine[t], clockAfter[d][t]);
    }
    sequence[i] = ++issued[size_t(stream)];
    mine[size_t(stream)] = sequence[i];
    clockAfter[i] = mine;
    position[in.id] = i;
  }
  return g;
}

} // namespace meshplan::runtime

//===- Trace.cpp - Timeline simulation and Chrome trace export ------------===//

#include "meshplan/Plan/Trace.h"

#include "meshplan/Support/Json.h"

#include <algorithm>
#include <cmath>
#include <string_view>
#include <unordered_map>
#include <utility>

namespace meshplan::plan {

using json::quote;

namespace {

using Interval = std::pair<double, double>;

/// Sorted, disjoint union of intervals (empty ones dropped).
std::vector<Interval> unite(std::vector<Interval> list) {
  std::sort(list.begin(), list.end());
  std::vector<Interval> out;
  for (const Interval &iv : list) {
    if (!(iv.second > iv.first))
      continue;
    if (!out.empty() && iv.first <= out.back().second)
      out.back().second = std::max(out.back().second, iv.second);
    else
      out.push_back(iv);
  }
  return out;
}

double measure(const std::vector<Interval> &list) {
  double total = 0;
  for (const Interval &iv : list)
    total += iv.second - iv.first;
  return total;
}

/// Measure of the intersection of two sorted disjoint interval lists.
double overlap(const std::vector<Interval> &a, const std::vector<Interval> &b) {
  double total = 0;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    double lo = std::max(a[i].first, b[j].first);
    double hi = std::min(a[i].second, b[j].second);
    if (hi > lo)
      total += hi - lo;
    if (a[i].second < b[j].second)
      ++i;
    else
      ++j;
  }
  return total;
}

std::string where(const Plan &plan, size_t i) {
  return "/program/" + std::to_string(i) + " " + quote(plan.program[i].id);
}

} // namespace

Result<Schedule> simulate(const Plan &plan, const std::vector<double> &flops,
                          const CostModel &model) {
  MESHPLAN_TRY(checkCostModel(model));
  const size_t n = plan.program.size();
  if (!flops.empty() && flops.size() != n)
    return makeError("flops has " + std::to_string(flops.size()) +
                     " entries but the program has " + std::to_string(n) +
                     " instructions");
  for (size_t i = 0; i < flops.size(); ++i)
    if (!std::isfinite(flops[i]) || flops[i] < 0)
      return makeError(where(plan, i) + ": flops " + std::to_string(flops[i]) +
                       " is not a finite number >= 0");

  std::unordered_map<std::string_view, int> streams;
  for (size_t s = 0; s < plan.streams.size(); ++s)
    streams.emplace(plan.streams[s], static_cast<int>(s));
  std::unordered_map<std::string_view, const Communicator *> comms;
  for (const Communicator &c : plan.communicators)
    comms.emplace(c.id, &c);
  std::unordered_map<std::string_view, int64_t> bufferBytes;
  for (const Buffer &b : plan.buffers) {
    int64_t elems = 1;
    for (int64_t d : b.localShape)
      elems *= d;
    bufferBytes.emplace(b.id, elems * dtypeBytes(b.dtype));
  }
  std::unordered_map<std::string_view, size_t> ids;
  ids.reserve(n);
  for (size_t i = 0; i < n; ++i)
    ids.emplace(plan.program[i].id, i);

  Schedule s;
  s.model = model;
  s.start.assign(n, 0);
  s.end.assign(n, 0);
  s.bytes.assign(n, 0);
  s.streamIndex.assign(n, -1);
  s.streamBusySeconds.assign(plan.streams.size(), 0);
  if (auto it = streams.find("compute"); it != streams.end())
    s.computeStream = it->second;
  else if (!plan.streams.empty())
    s.computeStream = 0;

  // Durations, and the graph: stream order plus deps.
  std::vector<double> duration(n, 0);
  std::vector<std::vector<size_t>> preds(n), succs(n);
  std::vector<size_t> lastOnStream(plan.streams.size(), n);
  for (size_t i = 0; i < n; ++i) {
    const Instruction &in = plan.program[i];
    auto st = streams.find(in.stream);
    if (st == streams.end())
      return makeError(where(plan, i) + ": unknown stream " + quote(in.stream));
    s.streamIndex[i] = st->second;
    const Communicator *comm = nullptr;
    if (isCollective(in.op)) {
      auto c = comms.find(in.comm);
      if (c == comms.end())
        return makeError(where(plan, i) + ": unknown communicator " +
                         quote(in.comm));
      comm = c->second;
      if (in.dtype)
        s.bytes[i] = bytesSent(in.op, *in.dtype, in.count,
                               static_cast<int64_t>(comm->ranks.size()));
    } else {
      for (const auto *list : {&in.inputs, &in.outputs})
        for (const std::string &b : *list)
          if (auto it = bufferBytes.find(b); it != bufferBytes.end())
            s.bytes[i] += it->second;
    }
    duration[i] = durationSeconds(in, comm, flops.empty() ? 0 : flops[i], model,
                                  isCollective(in.op) ? 0 : s.bytes[i]);
    s.streamBusySeconds[st->second] += duration[i];
    if (size_t prev = lastOnStream[st->second]; prev != n) {
      preds[i].push_back(prev);
      succs[prev].push_back(i);
    }
    lastOnStream[st->second] = i;
    for (const std::string &d : in.deps) {
      auto it = ids.find(d);
      if (it == ids.end())
        return makeError(where(plan, i) + ": unknown dep " + quote(d));
      preds[i].push_back(it->second);
      succs[it->second].push_back(i);
    }
  }

  // Longest path by Kahn's algorithm; what is left over lies on or behind a
  // cycle.
  std::vector<size_t> pending(n), ready;
  for (size_t i = 0; i < n; ++i)
    if ((pending[i] = preds[i].size()) == 0)
      ready.push_back(i);
  size_t done = 0;
  while (!ready.empty()) {
    size_t u = ready.back();
    ready.pop_back();
    ++done;
    s.end[u] = s.start[u] + duration[u];
    for (size_t v : succs[u]) {
      s.start[v] = std::max(s.start[v], s.end[u]);
      if (--pending[v] == 0)
        ready.push_back(v);
    }
  }
  if (done < n) {
    // Every stuck instruction has a stuck predecessor: walk back until one
    // repeats, then report that cycle.
    size_t u = 0;
    while (pending[u] == 0)
      ++u;
    std::vector<size_t> seenAt(n, n), path;
    while (seenAt[u] == n) {
      seenAt[u] = path.size();
      path.push_back(u);
      for (size_t p : preds[u])
        if (pending[p] != 0) {
          u = p;
          break;
        }
    }
    std::string msg = "wait cycle among the instructions of rank " +
                      std::to_string(plan.rank) + ":";
    // path[k] waits for path[k + 1]; the last one waits for u.
    for (size_t k = seenAt[u]; k < path.size(); ++k)
      msg += " " + where(plan, path[k]) + " waits for";
    msg += " " + where(plan, u);
    return makeError(msg);
  }

  std::vector<Interval> commIntervals, computeIntervals;
  for (size_t i = 0; i < n; ++i) {
    s.stepSeconds = std::max(s.stepSeconds, s.end[i]);
    if (isCollective(plan.program[i].op))
      commIntervals.push_back({s.start[i], s.end[i]});
    else if (s.streamIndex[i] == s.computeStream)
      computeIntervals.push_back({s.start[i], s.end[i]});
  }
  std::vector<Interval> comm = unite(std::move(commIntervals));
  s.exposedCommSeconds =
      measure(comm) - overlap(comm, unite(std::move(computeIntervals)));
  if (s.exposedCommSeconds < 0)
    s.exposedCommSeconds = 0;
  return s;
}

std::string chromeTrace(const Plan &plan, const Schedule &schedule) {
  using Json = json::Json;
  constexpr double kUs = 1e6;
  auto finite = [](double v) { return std::isfinite(v) ? v : 0.0; };
  Json events = Json::array();
  events.push_back(
      Json{{"name", "process_name"},
           {"ph", "M"},
           {"pid", plan.rank},
           {"tid", 0},
           {"args", {{"name", "rank " + std::to_string(plan.rank)}}}});
  for (size_t t = 0; t < plan.streams.size(); ++t) {
    events.push_back(Json{{"name", "thread_name"},
                          {"ph", "M"},
                          {"pid", plan.rank},
                          {"tid", t},
                          {"args", {{"name", plan.streams[t]}}}});
    events.push_back(Json{{"name", "thread_sort_index"},
                          {"ph", "M"},
                          {"pid", plan.rank},
                          {"tid", t},
                          {"args", {{"sort_index", t}}}});
  }
  size_t n =
      std::min({plan.program.size(), schedule.start.size(), schedule.end.size(),
                schedule.bytes.size(), schedule.streamIndex.size()});
  for (size_t i = 0; i < n; ++i) {
    const Instruction &in = plan.program[i];
    Json args = Json::object();
    args["id"] = in.id;
    args["op"] = opKindName(in.op);
    if (isCollective(in.op))
      args["comm"] = in.comm;
    if (in.dtype)
      args["dtype"] = dtypeName(*in.dtype);
    args["count"] = in.count;
    args["bytes"] = schedule.bytes[i];
    if (!in.label.empty())
      args["label"] = in.label;
    double start = finite(schedule.start[i]);
    double dur = std::max(0.0, finite(schedule.end[i]) - start);
    events.push_back(Json{{"name", in.label.empty() ? in.id : in.label},
                          {"cat", isCollective(in.op) ? "collective" : "local"},
                          {"ph", "X"},
                          {"ts", start * kUs},
                          {"dur", dur * kUs},
                          {"pid", plan.rank},
                          {"tid", schedule.streamIndex[i]},
                          {"args", std::move(args)}});
  }
  const CostModel &m = schedule.model;
  Json other = Json::object();
  other["generator"] = "meshplan";
  other["rank"] = plan.rank;
  other["step_seconds"] = finite(schedule.stepSeconds);
  other["exposed_comm_seconds"] = finite(schedule.exposedCommSeconds);
  other["peak_flops_per_second"] = finite(m.peakFlopsPerSecond);
  other["mfu"] = finite(m.mfu);
  other["intra_node_bytes_per_second"] = finite(m.intraNodeBytesPerSecond);
  other["inter_node_bytes_per_second"] = finite(m.interNodeBytesPerSecond);
  other["intra_node_latency_seconds"] = finite(m.intraNodeLatencySeconds);
  other["inter_node_latency_seconds"] = finite(m.interNodeLatencySeconds);
  other["hbm_bytes_per_second"] = finite(m.hbmBytesPerSecond);
  other["ranks_per_node"] = m.ranksPerNode;
  Json doc = Json::object();
  doc["traceEvents"] = std::move(events);
  doc["displayTimeUnit"] = "ms";
  doc["otherData"] = std::move(other);
  return doc.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
}

} // namespace meshplan::plan

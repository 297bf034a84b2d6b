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

namespace {

/// The instructions of one plan as nodes [offset, offset + n) of a timing
/// graph: durations, and edges for stream order and deps.
struct TimingGraph {
  /// Per node: the wait between ready and start (the cost model's
  /// dispatchSeconds; idle, not busy), then the instruction's duration.
  std::vector<double> delay, duration;
  std::vector<std::vector<size_t>> preds, succs;

  void edge(size_t from, size_t to) {
    preds[to].push_back(from);
    succs[from].push_back(to);
  }
};

/// Checks `flops` and `seconds`, sizes `s` for `plan` and appends its nodes
/// to `g`. With `recvWaitsForSend`, a recv costs nothing here: the caller
/// adds an edge from the matching send, which carries the transfer's
/// duration. `seconds`: empty, or measured durations replacing the model's
/// where >= 0 (simulateTogether).
Result<void> addPlan(const Plan &plan, const std::vector<double> &flops,
                     const CostModel &model, bool recvWaitsForSend, Schedule &s,
                     TimingGraph &g, const std::vector<double> &seconds = {}) {
  const size_t n = plan.program.size(), offset = g.duration.size();
  if (!flops.empty() && flops.size() != n)
    return makeError("flops has " + std::to_string(flops.size()) +
                     " entries but the program has " + std::to_string(n) +
                     " instructions");
  for (size_t i = 0; i < flops.size(); ++i)
    if (!std::isfinite(flops[i]) || flops[i] < 0)
      return makeError(where(plan, i) + ": flops " + std::to_string(flops[i]) +
                       " is not a finite number >= 0");
  if (!seconds.empty() && seconds.size() != n)
    return makeError("seconds has " + std::to_string(seconds.size()) +
                     " entries but the program has " + std::to_string(n) +
                     " instructions");
  for (size_t i = 0; i < seconds.size(); ++i)
    if (!std::isfinite(seconds[i]))
      return makeError(where(plan, i) + ": seconds " +
                       std::to_string(seconds[i]) + " is not a finite number");

  std::unordered_map<std::string_view, int> streams;
  for (size_t st = 0; st < plan.streams.size(); ++st)
    streams.emplace(plan.streams[st], static_cast<int>(st));
  std::unordered_map<std::string_view, const Communicator *> comms;
  for (const Communicator &c : plan.communicators)
    comms.emplace(c.id, &c);
  std::unordered_map<std::string_view, int64_t> bufferBytes =
      localBufferBytes(plan);
  std::unordered_map<std::string_view, size_t> ids;
  ids.reserve(n);
  for (size_t i = 0; i < n; ++i)
    ids.emplace(plan.program[i].id, i);

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

  g.delay.resize(offset + n, 0);
  g.duration.resize(offset + n, 0);
  g.preds.resize(offset + n);
  g.succs.resize(offset + n);
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
    double d = durationSeconds(in, comm, flops.empty() ? 0 : flops[i], model,
                               isCollective(in.op) ? 0 : s.bytes[i]);
    if (!seconds.empty() && seconds[i] >= 0)
      d = seconds[i];
    g.delay[offset + i] = model.dispatchSeconds;
    if (recvWaitsForSend && in.op == OpKind::Recv)
      d = g.delay[offset + i] = 0;
    g.duration[offset + i] = d;
    s.streamBusySeconds[st->second] += d;
    if (size_t prev = lastOnStream[st->second]; prev != n)
      g.edge(offset + prev, offset + i);
    lastOnStream[st->second] = i;
    for (const std::string &dep : in.deps) {
      auto it = ids.find(dep);
      if (it == ids.end())
        return makeError(where(plan, i) + ": unknown dep " + quote(dep));
      g.edge(offset + it->second, offset + i);
    }
  }
  return {};
}

/// Longest paths by Kahn's algorithm: start and end of every node. Returns
/// the nodes left over (on or behind a cycle), empty when all ran.
std::vector<size_t> longestPaths(const TimingGraph &g,
                                 std::vector<double> &start,
                                 std::vector<double> &end,
                                 std::vector<size_t> &pending) {
  const size_t n = g.duration.size();
  start.assign(n, 0);
  end.assign(n, 0);
  pending.assign(n, 0);
  std::vector<size_t> ready;
  for (size_t i = 0; i < n; ++i)
    if ((pending[i] = g.preds[i].size()) == 0)
      ready.push_back(i);
  size_t done = 0;
  while (!ready.empty()) {
    size_t u = ready.back();
    ready.pop_back();
    ++done;
    start[u] += g.delay[u];
    end[u] = start[u] + g.duration[u];
    for (size_t v : g.succs[u]) {
      start[v] = std::max(start[v], end[u]);
      if (--pending[v] == 0)
        ready.push_back(v);
    }
  }
  std::vector<size_t> stuck;
  if (done < n)
    for (size_t i = 0; i < n; ++i)
      if (pending[i] != 0)
        stuck.push_back(i);
  return stuck;
}

/// A cycle among the stuck nodes: every stuck node has a stuck predecessor,
/// so walking back from one repeats. Returns it with path[k] waiting for
/// path[k + 1] and the last waiting for the first.
std::vector<size_t> waitCycle(const TimingGraph &g,
                              const std::vector<size_t> &pending, size_t from) {
  std::vector<size_t> seenAt(g.duration.size(), g.duration.size()), path;
  size_t u = from;
  while (seenAt[u] == g.duration.size()) {
    seenAt[u] = path.size();
    path.push_back(u);
    for (size_t p : g.preds[u])
      if (pending[p] != 0) {
        u = p;
        break;
      }
  }
  return {path.begin() + std::ptrdiff_t(seenAt[u]), path.end()};
}

/// Step time and exposed communication of a laid-out schedule.
void summarize(const Plan &plan, Schedule &s) {
  std::vector<Interval> commIntervals, computeIntervals;
  for (size_t i = 0; i < plan.program.size(); ++i) {
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
}

} // namespace

Result<Schedule> simulate(const Plan &plan, const std::vector<double> &flops,
                          const CostModel &model) {
  MESHPLAN_TRY(checkCostModel(model));
  Schedule s;
  TimingGraph g;
  MESHPLAN_TRY(addPlan(plan, flops, model, /*recvWaitsForSend=*/false, s, g));
  std::vector<double> start, end;
  std::vector<size_t> pending;
  std::vector<size_t> stuck = longestPaths(g, start, end, pending);
  if (!stuck.empty()) {
    std::string msg = "wait cycle among the instructions of rank " +
                      std::to_string(plan.rank) + ":";
    std::vector<size_t> cycle = waitCycle(g, pending, stuck.front());
    for (size_t u : cycle)
      msg += " " + where(plan, u) + " waits for";
    msg += " " + where(plan, cycle.front());
    return makeError(msg);
  }
  s.start = std::move(start);
  s.end = std::move(end);
  summarize(plan, s);
  return s;
}

Result<std::vector<Schedule>>
simulateTogether(const std::vector<const Plan *> &plans,
                 const std::vector<std::vector<double>> &flops,
                 const CostModel &model,
                 const std::vector<std::vector<double>> &seconds) {
  MESHPLAN_TRY(checkCostModel(model));
  if (flops.size() != plans.size())
    return makeError("flops lists " + std::to_string(flops.size()) +
                     " plans but there are " + std::to_string(plans.size()));
  if (!seconds.empty() && seconds.size() != plans.size())
    return makeError("seconds lists " + std::to_string(seconds.size()) +
                     " plans but there are " + std::to_string(plans.size()));
  std::vector<Schedule> out(plans.size());
  const std::vector<double> noSeconds;
  std::vector<size_t> offsets;
  TimingGraph g;
  std::unordered_map<int64_t, size_t> planOfRank;
  for (size_t p = 0; p < plans.size(); ++p) {
    offsets.push_back(g.duration.size());
    if (!planOfRank.emplace(plans[p]->rank, p).second)
      return makeError("two plans of rank " + std::to_string(plans[p]->rank));
    if (auto ok = addPlan(*plans[p], flops[p], model,
                          /*recvWaitsForSend=*/true, out[p], g,
                          seconds.empty() ? noSeconds : seconds[p]);
        !ok)
      return ok.error().within("rank " + std::to_string(plans[p]->rank));
  }
  // A send's transfer ends where its recv may end: an edge from every send
  // to the recv of the same tag on the peer's plan, when that plan is one
  // of these (a peer outside the set is taken to be on time).
  std::unordered_map<std::string, size_t> recvOfTag; // "<rank>/<tag>"
  for (size_t p = 0; p < plans.size(); ++p)
    for (size_t i = 0; i < plans[p]->program.size(); ++i)
      if (plans[p]->program[i].op == OpKind::Recv)
        recvOfTag.emplace(std::to_string(plans[p]->rank) + "/" +
                              plans[p]->program[i].tag,
                          offsets[p] + i);
  for (size_t p = 0; p < plans.size(); ++p) {
    std::unordered_map<std::string_view, const Communicator *> comms;
    for (const Communicator &c : plans[p]->communicators)
      comms.emplace(c.id, &c);
    for (size_t i = 0; i < plans[p]->program.size(); ++i) {
      const Instruction &in = plans[p]->program[i];
      if (in.op != OpKind::Send)
        continue;
      auto c = comms.find(in.comm);
      if (c == comms.end() || in.peer < 0 ||
          size_t(in.peer) >= c->second->ranks.size())
        continue; // validatePlan refuses these
      int64_t peerRank = c->second->ranks[size_t(in.peer)];
      auto r = recvOfTag.find(std::to_string(peerRank) + "/" + in.tag);
      if (r != recvOfTag.end())
        g.edge(offsets[p] + i, r->second);
    }
  }
  std::vector<double> start, end;
  std::vector<size_t> pending;
  std::vector<size_t> stuck = longestPaths(g, start, end, pending);
  auto name = [&](size_t node) {
    size_t p = size_t(std::upper_bound(offsets.begin(), offsets.end(), node) -
                      offsets.begin()) -
               1;
    return "rank " + std::to_string(plans[p]->rank) + " " +
           where(*plans[p], node - offsets[p]);
  };
  if (!stuck.empty()) {
    std::vector<size_t> cycle = waitCycle(g, pending, stuck.front());
    std::string msg = "wait cycle across the plans:";
    for (size_t u : cycle)
      msg += " " + name(u) + " waits for";
    msg += " " + name(cycle.front());
    return makeError(msg);
  }
  for (size_t p = 0; p < plans.size(); ++p) {
    size_t n = plans[p]->program.size();
    out[p].start.assign(start.begin() + std::ptrdiff_t(offsets[p]),
                        start.begin() + std::ptrdiff_t(offsets[p] + n));
    out[p].end.assign(end.begin() + std::ptrdiff_t(offsets[p]),
                      end.begin() + std::ptrdiff_t(offsets[p] + n));
    summarize(*plans[p], out[p]);
  }
  return out;
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
  other["dispatch_seconds"] = finite(m.dispatchSeconds);
  other["ranks_per_node"] = m.ranksPerNode;
  Json doc = Json::object();
  doc["traceEvents"] = std::move(events);
  doc["displayTimeUnit"] = "ms";
  doc["otherData"] = std::move(other);
  return doc.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
}

std::unordered_map<std::string_view, int64_t>
localBufferBytes(const Plan &plan) {
  std::unordered_map<std::string_view, int64_t> bytes;
  for (const Buffer &b : plan.buffers) {
    int64_t elems = 1;
    for (int64_t d : b.localShape)
      elems *= d;
    bytes.emplace(b.id, elems * dtypeBytes(b.dtype));
  }
  return bytes;
}

} // namespace meshplan::plan

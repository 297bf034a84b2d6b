//===- ExecutedTrace.cpp - What a run did, per rank, and merged -----------===//

#include "meshplan/Plan/ExecutedTrace.h"

#include "meshplan/Plan/CostModel.h"
#include "meshplan/Support/Hash.h"
#include "meshplan/Support/Json.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iomanip>
#include <set>
#include <sstream>
#include <string_view>
#include <tuple>
#include <unordered_map>

namespace meshplan::plan {

using json::Json;
using json::quote;

namespace {

constexpr double kUs = 1e6;

using Interval = std::pair<double, double>;

double unionLength(std::vector<Interval> list) {
  std::sort(list.begin(), list.end());
  double total = 0, lo = 0, hi = -1;
  for (const Interval &iv : list) {
    if (!(iv.second > iv.first))
      continue;
    if (iv.first > hi) {
      if (hi > lo)
        total += hi - lo;
      lo = iv.first;
      hi = iv.second;
    } else {
      hi = std::max(hi, iv.second);
    }
  }
  if (hi > lo)
    total += hi - lo;
  return total;
}

/// Length of `a`'s union not covered by `b`'s union.
double uncovered(const std::vector<Interval> &a,
                 const std::vector<Interval> &b) {
  std::vector<Interval> both = a;
  both.insert(both.end(), b.begin(), b.end());
  return unionLength(both) - unionLength(b);
}

bool ran(const ExecutedStep &s, size_t i) {
  return i < s.end.size() && (s.end[i] > 0 || s.begin[i] > 0);
}

double finiteOr0(double v) { return std::isfinite(v) ? v : 0; }

} // namespace

//===----------------------------------------------------------------------===//
// Recording
//===----------------------------------------------------------------------===//

std::string planDigest(const Plan &plan) {
  Plan copy = plan;
  copy.estimates.reset();
  return fnv1a64Hex(writePlan(copy));
}

RankTrace rankTraceOf(const Plan &plan) {
  RankTrace t;
  t.planDigest = planDigest(plan);
  t.rank = plan.rank;
  t.worldSize = 1;
  for (const MeshAxis &a : plan.mesh.axes)
    t.worldSize *= a.size;
  t.streams = plan.streams;
  std::unordered_map<std::string_view, int> streams;
  for (size_t s = 0; s < plan.streams.size(); ++s)
    streams.emplace(plan.streams[s], int(s));
  std::unordered_map<std::string_view, const Communicator *> comms;
  for (const Communicator &c : plan.communicators) {
    t.communicators[c.id] = c.ranks;
    comms.emplace(c.id, &c);
  }
  std::unordered_map<std::string_view, int64_t> bufferBytes =
      localBufferBytes(plan);
  std::map<std::string, int64_t> turns;
  for (const Instruction &in : plan.program) {
    TracedInstruction ti;
    ti.id = in.id;
    ti.op = opKindName(in.op);
    if (auto s = streams.find(in.stream); s != streams.end())
      ti.stream = s->second;
    ti.label = in.label;
    if (isCollective(in.op)) {
      ti.comm = in.comm;
      auto c = comms.find(in.comm);
      if (in.dtype && c != comms.end())
        ti.bytes = bytesSent(in.op, *in.dtype, in.count,
                             int64_t(c->second->ranks.size()));
      // Point-to-point transfers pair by tag, not by turn.
      if (!isPointToPoint(in.op))
        ti.ordinal = turns[in.comm]++;
    } else {
      for (const auto *list : {&in.inputs, &in.outputs})
        for (const std::string &b : *list)
          if (auto it = bufferBytes.find(b); it != bufferBytes.end())
            ti.bytes += it->second;
    }
    t.instructions.push_back(std::move(ti));
  }
  return t;
}

const std::vector<int64_t> &RankTrace::membersOf(const std::string &comm,
                                                 int64_t epoch) const {
  if (auto e = epochCommunicators.find(epoch); e != epochCommunicators.end())
    if (auto c = e->second.find(comm); c != e->second.end())
      return c->second;
  return communicators.at(comm);
}

std::string rankTraceFileName(const RankTrace &t) {
  std::string name = "rank" + std::to_string(t.rank);
  if (t.faultTolerant)
    name += ".inc" + std::to_string(t.incarnation);
  return name + ".json";
}

namespace {

/// The rank file without its steps ("steps":[] last).
std::string headerText(const RankTrace &t) {
  Json doc = Json::object();
  doc["format"] = kExecutedTraceFormat;
  doc["version"] = kExecutedTraceVersion;
  doc["run"] = t.run;
  doc["plan_digest"] = t.planDigest;
  doc["rank"] = t.rank;
  doc["world_size"] = t.worldSize;
  doc["host"] = t.host;
  doc["clock"] = Json{{"offset_seconds", finiteOr0(t.clockOffset)},
                      {"uncertainty_seconds", finiteOr0(t.clockUncertainty)},
                      {"method", t.clockMethod}};
  if (t.faultTolerant) {
    doc["fault_tolerant"] = true;
    doc["incarnation"] = t.incarnation;
  }
  doc["streams"] = t.streams;
  Json comms = Json::object();
  for (const auto &[id, members] : t.communicators)
    comms[id] = members;
  doc["communicators"] = std::move(comms);

  Json ins = Json::array();
  for (const TracedInstruction &i : t.instructions) {
    Json j = Json::object();
    j["id"] = i.id;
    j["op"] = i.op;
    j["stream"] = i.stream;
    if (!i.comm.empty())
      j["comm"] = i.comm;
    if (i.ordinal >= 0)
      j["ordinal"] = i.ordinal;
    j["bytes"] = i.bytes;
    if (!i.label.empty())
      j["label"] = i.label;
    ins.push_back(std::move(j));
  }
  doc["instructions"] = std::move(ins);
  doc["steps"] = Json::array();
  return doc.dump(-1, ' ', false, Json::error_handler_t::replace);
}

} // namespace

std::string writeRankTraceStep(const RankTrace &t, const ExecutedStep &s) {
  Json j = Json::object();
  j["step"] = s.step;
  if (t.faultTolerant) {
    j["epoch"] = s.epoch;
    j["committed"] = s.committed;
    // The epoch's fault_tolerant communicators: in the step, not the
    // header, so that a recorder can append steps to a finished file.
    if (auto e = t.epochCommunicators.find(s.epoch);
        e != t.epochCommunicators.end()) {
      Json members = Json::object();
      for (const auto &[id, ranks] : e->second)
        members[id] = ranks;
      j["members"] = std::move(members);
    }
  }
  j["start_seconds"] = finiteOr0(s.start);
  j["wall_seconds"] = finiteOr0(s.wall);
  // Times from the step's start in microseconds, 3 decimals: what a
  // trace viewer shows, and a third of the text of full doubles.
  auto list = [](const std::vector<double> &v) {
    Json a = Json::array();
    for (double x : v)
      a.push_back(std::round(finiteOr0(x) * kUs * 1e3) / 1e3);
    return a;
  };
  j["ready_us"] = list(s.ready);
  j["begin_us"] = list(s.begin);
  j["end_us"] = list(s.end);
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string writeRankTraceWith(const RankTrace &header,
                               const std::vector<std::string> &steps) {
  // The header's text ends in "steps":[]}; the steps go between the
  // brackets.
  std::string text = headerText(header);
  size_t size = text.size() + 1;
  for (const std::string &step : steps)
    size += step.size() + 1;
  std::string out;
  out.reserve(size);
  out.append(text, 0, text.size() - 2);
  for (size_t k = 0; k < steps.size(); ++k) {
    if (k)
      out += ',';
    out += steps[k];
  }
  out += "]}\n";
  return out;
}

std::string writeRankTrace(const RankTrace &t) {
  std::vector<std::string> steps;
  for (const ExecutedStep &s : t.steps)
    steps.push_back(writeRankTraceStep(t, s));
  return writeRankTraceWith(t, steps);
}

//===----------------------------------------------------------------------===//
// Reading
//===----------------------------------------------------------------------===//

namespace {

using json::childPointer;
using json::JsonType;
using json::KeyRule;
using json::SectionRule;

const SectionRule kRootRule = {
    "",
    {{"format", JsonType::String, true},
     {"version", JsonType::Integer, true},
     {"run", JsonType::String, true},
     {"plan_digest", JsonType::String, true},
     {"rank", JsonType::Integer, true},
     {"world_size", JsonType::Integer, true},
     {"host", JsonType::String, true},
     {"clock", JsonType::Object, true},
     {"fault_tolerant", JsonType::Boolean},
     {"incarnation", JsonType::Integer},
     {"streams", JsonType::Array, true, JsonType::String},
     {"communicators", JsonType::Object, true},
     {"instructions", JsonType::Array, true, JsonType::Object},
     {"steps", JsonType::Array, true, JsonType::Object}}};
const SectionRule kClockRule = {
    "clock",
    {{"offset_seconds", JsonType::Number, true},
     {"uncertainty_seconds", JsonType::Number, true},
     {"method", JsonType::String, true}}};
const SectionRule kInstructionRule = {"instruction",
                                      {{"id", JsonType::String, true},
                                       {"op", JsonType::String, true},
                                       {"stream", JsonType::Integer, true},
                                       {"comm", JsonType::String},
                                       {"ordinal", JsonType::Integer},
                                       {"bytes", JsonType::Integer, true},
                                       {"label", JsonType::String}}};
const SectionRule kStepRule = {
    "step",
    {{"step", JsonType::Integer, true},
     {"epoch", JsonType::Integer},
     {"committed", JsonType::Boolean},
     {"members", JsonType::Object},
     {"start_seconds", JsonType::Number, true},
     {"wall_seconds", JsonType::Number, true},
     {"ready_us", JsonType::Array, true, JsonType::Number},
     {"begin_us", JsonType::Array, true, JsonType::Number},
     {"end_us", JsonType::Array, true, JsonType::Number}}};

/// The optional member `key` of `j` (at JSON pointer `ptr`), read by
/// `read(value, pointer)` into `out`; left as it is when absent.
template <typename T, typename Read>
Result<void> readOptional(const Json &j, const std::string &ptr,
                          const char *key, T &out, Read read) {
  const Json *member = json::member(j, key);
  if (!member)
    return {};
  auto value = read(*member, childPointer(ptr, key));
  if (!value)
    return value.error();
  out = std::move(*value);
  return {};
}
auto readCount = [](const Json &v, const std::string &p) {
  return json::readInt(v, p, 0);
};
auto readFlag = [](const Json &v, const std::string &p) {
  return json::readBool(v, p);
};
auto readText = [](const Json &v, const std::string &p) {
  return json::readString(v, p);
};

/// The rank file's "steps" into `t`, whose header is read.
Result<void> parseSteps(const Json &steps, RankTrace &t) {
  int64_t previous = 0;
  for (size_t k = 0; k < steps.size(); ++k) {
    std::string ptr = childPointer("/steps", k);
    const Json &j = steps[k];
    MESHPLAN_TRY(json::checkObject(j, ptr, kStepRule));
    ExecutedStep s;
    MESHPLAN_TRY(readOptional(j, ptr, "epoch", s.epoch, readCount));
    MESHPLAN_TRY(readOptional(j, ptr, "committed", s.committed, readFlag));
    if (const Json *groups = json::member(j, "members")) {
      // Every attempt of one epoch names the same members.
      std::string mptr = childPointer(ptr, "members");
      std::map<std::string, std::vector<int64_t>> members;
      for (const auto &[id, list] : groups->items()) {
        std::string p = childPointer(mptr, id);
        if (!t.communicators.count(id))
          return json::errorAt(p, "unknown communicator " + quote(id));
        auto ranks = json::readIntArray(list, p, 0, t.worldSize - 1);
        if (!ranks)
          return ranks.error();
        members[id] = *ranks;
      }
      auto [at, fresh] = t.epochCommunicators.emplace(s.epoch, members);
      if (!fresh && at->second != members)
        return json::errorAt(mptr, "other members than an earlier step of "
                                   "epoch " +
                                       std::to_string(s.epoch));
    }
    // A discarded attempt is redone under the same number in a later
    // epoch; otherwise steps increase.
    const ExecutedStep *last = t.steps.empty() ? nullptr : &t.steps.back();
    bool redo = last && !last->committed;
    auto step = json::readInt(j["step"], childPointer(ptr, "step"),
                              redo ? previous : previous + 1);
    if (!step)
      return Error{step.error().message +
                   (redo ? " (a step is redone or followed by later ones)"
                         : " (steps increase)")};
    if (redo && *step == previous && s.epoch <= last->epoch)
      return json::errorAt(childPointer(ptr, "epoch"),
                           "step " + std::to_string(*step) +
                               " is redone in epoch " +
                               std::to_string(s.epoch) +
                               ", not after its discarded attempt's epoch " +
                               std::to_string(last->epoch));
    s.step = previous = *step;
    MESHPLAN_ASSIGN(s.start,
                    json::readNumber(j["start_seconds"],
                                     childPointer(ptr, "start_seconds")));
    MESHPLAN_ASSIGN(
        s.wall,
        json::readNumber(j["wall_seconds"], childPointer(ptr, "wall_seconds")));
    for (auto [key, out] :
         {std::pair{"ready_us", &s.ready}, std::pair{"begin_us", &s.begin},
          std::pair{"end_us", &s.end}}) {
      std::string p = childPointer(ptr, key);
      const Json &a = j[key];
      if (a.size() != t.instructions.size())
        return json::errorAt(p, "has " + std::to_string(a.size()) +
                                    " entries but the trace has " +
                                    std::to_string(t.instructions.size()) +
                                    " instructions");
      out->reserve(a.size());
      for (size_t i = 0; i < a.size(); ++i) {
        auto v = json::readNumber(a[i], childPointer(p, i));
        if (!v)
          return v.error();
        out->push_back(*v / kUs);
      }
    }
    t.steps.push_back(std::move(s));
  }
  return {};
}

Result<RankTrace> parseDocument(const Json &doc) {
  MESHPLAN_TRY(json::checkObject(doc, "", kRootRule));
  RankTrace t;
  auto format = json::readString(doc["format"], "/format");
  if (!format)
    return format.error();
  if (*format != kExecutedTraceFormat)
    return json::errorAt("/format", "expected " + quote(kExecutedTraceFormat) +
                                        ", got " + quote(*format) +
                                        ": not an executed-step trace");
  auto version = json::readInt(doc["version"], "/version");
  if (!version)
    return version.error();
  if (*version < 1 || *version > kExecutedTraceVersion)
    return json::errorAt("/version",
                         "version " + std::to_string(*version) +
                             " is not supported (this build reads 1 to " +
                             std::to_string(kExecutedTraceVersion) + ")");
  auto str = [&](const char *key, std::string &out) -> Result<void> {
    auto v = json::readString(doc[key], std::string("/") + key);
    if (!v)
      return v.error();
    out = *v;
    return {};
  };
  MESHPLAN_TRY(str("run", t.run));
  MESHPLAN_TRY(str("plan_digest", t.planDigest));
  MESHPLAN_TRY(str("host", t.host));
  auto world = json::readInt(doc["world_size"], "/world_size", 1);
  if (!world)
    return world.error();
  t.worldSize = *world;
  auto rank = json::readInt(doc["rank"], "/rank", 0, t.worldSize - 1);
  if (!rank)
    return rank.error();
  t.rank = *rank;
  const Json &clock = doc["clock"];
  MESHPLAN_TRY(json::checkObject(clock, "/clock", kClockRule));
  MESHPLAN_ASSIGN(t.clockOffset, json::readNumber(clock["offset_seconds"],
                                                  "/clock/offset_seconds"));
  MESHPLAN_ASSIGN(t.clockUncertainty,
                  json::readNumber(clock["uncertainty_seconds"],
                                   "/clock/uncertainty_seconds"));
  MESHPLAN_ASSIGN(t.clockMethod,
                  json::readString(clock["method"], "/clock/method"));
  auto streams = json::readStringArray(doc["streams"], "/streams");
  if (!streams)
    return streams.error();
  t.streams = *streams;
  for (const auto &[id, members] : doc["communicators"].items()) {
    std::string ptr = childPointer("/communicators", id);
    auto ranks = json::readIntArray(members, ptr, 0, t.worldSize - 1);
    if (!ranks)
      return ranks.error();
    t.communicators[id] = *ranks;
  }
  MESHPLAN_TRY(
      readOptional(doc, "", "fault_tolerant", t.faultTolerant, readFlag));
  MESHPLAN_TRY(readOptional(doc, "", "incarnation", t.incarnation, readCount));
  const Json &ins = doc["instructions"];
  for (size_t i = 0; i < ins.size(); ++i) {
    std::string ptr = childPointer("/instructions", i);
    const Json &j = ins[i];
    MESHPLAN_TRY(json::checkObject(j, ptr, kInstructionRule));
    TracedInstruction ti;
    auto id = json::readString(j["id"], childPointer(ptr, "id"));
    auto op = json::readString(j["op"], childPointer(ptr, "op"));
    auto stream = json::readInt(j["stream"], childPointer(ptr, "stream"), 0,
                                int64_t(t.streams.size()) - 1);
    auto bytes = json::readInt(j["bytes"], childPointer(ptr, "bytes"), 0);
    if (!id)
      return id.error();
    if (!op)
      return op.error();
    if (!stream)
      return stream.error();
    if (!bytes)
      return bytes.error();
    ti.id = *id;
    ti.op = *op;
    ti.stream = int(*stream);
    ti.bytes = *bytes;
    if (const Json *c = json::member(j, "comm")) {
      auto comm = json::readString(*c, childPointer(ptr, "comm"));
      if (!comm)
        return comm.error();
      if (!t.communicators.count(*comm))
        return json::errorAt(childPointer(ptr, "comm"),
                             "unknown communicator " + quote(*comm));
      ti.comm = *comm;
    }
    MESHPLAN_TRY(readOptional(j, ptr, "ordinal", ti.ordinal, readCount));
    MESHPLAN_TRY(readOptional(j, ptr, "label", ti.label, readText));
    t.instructions.push_back(std::move(ti));
  }
  MESHPLAN_TRY(parseSteps(doc["steps"], t));
  return t;
}

} // namespace

Result<RankTrace> parseRankTrace(std::string_view text,
                                 const std::string &path) {
  auto doc = json::parseJson(text);
  if (!doc)
    return doc.error().within(path);
  auto t = parseDocument(*doc);
  if (!t)
    return t.error().within(path);
  return t;
}

Result<std::vector<RankTrace>> readTraceDirectory(const std::string &dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return makeError(dir + ": not a directory of executed-step traces");
  // (rank, incarnation or -1 for rank<R>.json) -> path
  std::vector<std::pair<std::pair<int64_t, int64_t>, std::string>> files;
  auto number = [](std::string_view digits) -> std::optional<int64_t> {
    // Decimal without leading zeros.
    if (digits.empty() || digits.size() > 9 ||
        (digits.size() > 1 && digits[0] == '0') ||
        !std::all_of(digits.begin(), digits.end(),
                     [](char c) { return c >= '0' && c <= '9'; }))
      return std::nullopt;
    return std::stoll(std::string(digits));
  };
  for (const fs::directory_entry &e : fs::directory_iterator(dir, ec)) {
    // rank<R>.json, or rank<R>.inc<I>.json (a fault-tolerant process).
    std::string base = e.path().filename().string();
    std::string_view name(base);
    if (!name.starts_with("rank") || !name.ends_with(".json"))
      continue;
    name = name.substr(4, name.size() - 9);
    std::optional<int64_t> rank, incarnation = -1;
    if (size_t dot = name.find(".inc"); dot != std::string_view::npos) {
      rank = number(name.substr(0, dot));
      incarnation = number(name.substr(dot + 4));
    } else {
      rank = number(name);
    }
    if (!rank || !incarnation)
      continue;
    files.push_back({{*rank, *incarnation}, e.path().string()});
  }
  if (ec)
    return makeError(dir + ": " + ec.message());
  if (files.empty())
    return makeError(dir +
                     ": no rank<R>.json trace file (record one with "
                     "meshplan-train --trace " +
                     dir + ")");
  std::sort(files.begin(), files.end());
  std::vector<RankTrace> out;
  std::string text;
  for (const auto &[key, path] : files) {
    const auto &[r, inc] = key;
    MESHPLAN_TRY(json::readFileInto(path, text));
    auto t = parseRankTrace(text, path);
    if (!t)
      return t.error();
    if (t->rank != r)
      return makeError(path + ": /rank: the file holds rank " +
                       std::to_string(t->rank) + "'s trace");
    if ((inc >= 0) != t->faultTolerant || (inc >= 0 && t->incarnation != inc))
      return makeError(
          path + ": /incarnation: the file holds " +
          (t->faultTolerant
               ? "incarnation " + std::to_string(t->incarnation) +
                     " of a fault-tolerant rank (rank<R>.inc<I>.json)"
               : std::string("a rank without fault tolerance (rank<R>.json)")));
    if (!out.empty()) {
      const RankTrace &first = out.front();
      if (t->run != first.run)
        return makeError(path + ": /run: " + quote(t->run) +
                         " is another run than " + files.front().second +
                         "'s " + quote(first.run) +
                         "; merge the files of one run");
      if (t->worldSize != first.worldSize)
        return makeError(
            path + ": /world_size: " + std::to_string(t->worldSize) + " but " +
            files.front().second + " has " + std::to_string(first.worldSize));
    }
    out.push_back(std::move(*t));
  }
  return out;
}

std::vector<int64_t> missingRanks(const std::vector<RankTrace> &traces) {
  std::vector<int64_t> missing;
  if (traces.empty())
    return missing;
  std::set<int64_t> have;
  for (const RankTrace &t : traces)
    have.insert(t.rank);
  for (int64_t r = 0; r < traces.front().worldSize; ++r)
    if (!have.count(r))
      missing.push_back(r);
  return missing;
}

//===----------------------------------------------------------------------===//
// Matching collectives across ranks
//===----------------------------------------------------------------------===//

namespace {

/// One execution of a collective on one member.
struct Arrival {
  size_t trace; ///< index into the traces
  size_t step;  ///< index into its steps
  size_t instr; ///< index into its program
  double begin; ///< aligned seconds
  double end;
};

/// (epoch, step number, communicator id, members, ordinal) -> members'
/// arrivals. The epoch keeps a redone step's attempts apart; the members are
/// the epoch's (a fault_tolerant communicator's change between epochs), so
/// only members of one epoch's group are linked.
using InstanceKey =
    std::tuple<int64_t, int64_t, std::string, std::vector<int64_t>, int64_t>;

struct Instance {
  std::vector<Arrival> arrivals; ///< in rank order
  size_t straggler = 0;          ///< index into arrivals: the last to begin
  double waited = 0;             ///< sum over members of (last begin - begin)
};

Result<std::map<InstanceKey, Instance>>
matchCollectives(const std::vector<RankTrace> &traces) {
  std::map<InstanceKey, Instance> out;
  for (size_t t = 0; t < traces.size(); ++t) {
    const RankTrace &rt = traces[t];
    for (size_t s = 0; s < rt.steps.size(); ++s) {
      const ExecutedStep &st = rt.steps[s];
      for (size_t i = 0; i < rt.instructions.size(); ++i) {
        const TracedInstruction &in = rt.instructions[i];
        if (in.ordinal < 0 || !ran(st, i))
          continue;
        const std::vector<int64_t> &members = rt.membersOf(in.comm, st.epoch);
        Instance &inst = out[{st.epoch, st.step, in.comm, members, in.ordinal}];
        if (!inst.arrivals.empty()) {
          const Arrival &a = inst.arrivals.front();
          const TracedInstruction &other =
              traces[a.trace].instructions[a.instr];
          if (other.op != in.op || other.bytes != in.bytes)
            return makeError("rank " + std::to_string(rt.rank) +
                             "'s trace is of another "
                             "plan than rank " +
                             std::to_string(traces[a.trace].rank) +
                             "'s: collective #" + std::to_string(in.ordinal) +
                             " of step " + std::to_string(st.step) + " on " +
                             quote(in.comm) + " is " + in.op + " of " +
                             std::to_string(in.bytes) + " bytes (" +
                             quote(in.id) + ") on one and " + other.op +
                             " of " + std::to_string(other.bytes) + " bytes (" +
                             quote(other.id) + ") on the other");
        }
        inst.arrivals.push_back(
            {t, s, i, st.start + st.begin[i], st.start + st.end[i]});
      }
    }
  }
  for (auto &[key, inst] : out) {
    double last = -INFINITY;
    for (size_t a = 0; a < inst.arrivals.size(); ++a)
      if (inst.arrivals[a].begin > last) {
        last = inst.arrivals[a].begin;
        inst.straggler = a;
      }
    for (const Arrival &a : inst.arrivals)
      inst.waited += last - a.begin;
  }
  return out;
}

std::string nameOf(const TracedInstruction &in) {
  return in.label.empty() ? in.id : in.label;
}

} // namespace

//===----------------------------------------------------------------------===//
// Merging
//===----------------------------------------------------------------------===//

namespace {

/// A process per rank, its tracks named. The incarnations of a
/// fault-tolerant rank (a file each) share its process and tracks: one
/// starts after the previous one died. Fills otherData's `incarnations`
/// (per rank) and `clockUnknown` (the processes whose clock offset is not
/// known).
void addProcesses(Json &events, const std::vector<RankTrace> &traces,
                  Json &incarnations, Json &clockUnknown) {
  auto meta = [&](const char *name, int64_t pid, int64_t tid, Json args) {
    events.push_back(Json{{"name", name},
                          {"ph", "M"},
                          {"pid", pid},
                          {"tid", tid},
                          {"args", std::move(args)}});
  };
  std::map<int64_t, std::vector<const RankTrace *>> byRank;
  for (const RankTrace &rt : traces)
    byRank[rt.rank].push_back(&rt);
  for (const auto &[rank, list] : byRank) {
    const RankTrace &first = *list.front();
    std::string name = "rank " + std::to_string(rank) +
                       (first.host.empty() ? "" : " (" + first.host + ")");
    if (first.faultTolerant) {
      Json incs = Json::array();
      std::string text;
      for (const RankTrace *rt : list) {
        incs.push_back(rt->incarnation);
        text += (text.empty() ? "" : ", ") + std::to_string(rt->incarnation);
        if (rt->clockUnknown()) {
          clockUnknown.push_back(
              Json{{"rank", rank}, {"incarnation", rt->incarnation}});
          text += " (clock unknown)";
        }
      }
      incarnations[std::to_string(rank)] = std::move(incs);
      name +=
          list.size() > 1 ? ", incarnations " + text : ", incarnation " + text;
    }
    meta("process_name", rank, 0, {{"name", name}});
    meta("process_sort_index", rank, 0, {{"sort_index", rank}});
    for (size_t s = 0; s < first.streams.size(); ++s) {
      meta("thread_name", rank, int64_t(s), {{"name", first.streams[s]}});
      meta("thread_sort_index", rank, int64_t(s), {{"sort_index", s}});
    }
    int64_t stepTid = int64_t(first.streams.size());
    meta("thread_name", rank, stepTid, {{"name", "steps"}});
    meta("thread_sort_index", rank, stepTid, {{"sort_index", -1}});
  }
}

} // namespace

namespace {

/// The cost model beside the measurement: process world + rank, starting
/// where the rank's first traced step did (`origin`: the merged trace's
/// time 0 on the aligned clock).
Result<void> addPredictions(Json &events, const std::vector<RankTrace> &traces,
                            const std::map<int64_t, Prediction> &predictions,
                            double origin) {
  int64_t world = traces.front().worldSize;
  auto us = [&](double aligned) { return (aligned - origin) * kUs; };
  auto meta = [&](const char *name, int64_t pid, int64_t tid, Json args) {
    events.push_back(Json{{"name", name},
                          {"ph", "M"},
                          {"pid", pid},
                          {"tid", tid},
                          {"args", std::move(args)}});
  };
  for (const auto &[rank, p] : predictions) {
    auto own = std::find_if(traces.begin(), traces.end(),
                            [&](const RankTrace &t) { return t.rank == rank; });
    if (own == traces.end())
      return makeError("--predict: rank " + std::to_string(rank) +
                       " has no trace file to compare with");
    if (!p.plan)
      return makeError("internal error: a prediction without its plan");
    std::string digest = planDigest(*p.plan);
    if (digest != own->planDigest)
      return makeError("rank " + std::to_string(rank) +
                       ": the trace was recorded from another plan (digest " +
                       own->planDigest + ") than the one predicted (" + digest +
                       "); give the spec and flags the run was planned with");
    int64_t pid = world + rank;
    meta(
        "process_name", pid, 0,
        {{"name", "rank " + std::to_string(rank) + " predicted (cost model)"}});
    meta("process_sort_index", pid, 0, {{"sort_index", pid}});
    for (size_t s = 0; s < p.plan->streams.size(); ++s)
      meta("thread_name", pid, int64_t(s), {{"name", p.plan->streams[s]}});
    double at = own->steps.empty() ? origin : own->steps.front().start;
    const Schedule &sc = p.schedule;
    for (size_t i = 0; i < p.plan->program.size() && i < sc.start.size(); ++i) {
      const Instruction &in = p.plan->program[i];
      events.push_back(
          Json{{"name", in.label.empty() ? in.id : in.label},
               {"cat", "predicted"},
               {"ph", "X"},
               {"ts", us(at) + sc.start[i] * kUs},
               {"dur", std::max(0.0, (sc.end[i] - sc.start[i]) * kUs)},
               {"pid", pid},
               {"tid", sc.streamIndex[i]},
               {"args", {{"id", in.id}, {"op", opKindName(in.op)}}}});
    }
  }
  return {};
}

} // namespace

Result<std::string>
mergeTraces(const std::vector<RankTrace> &traces,
            const std::map<int64_t, Prediction> &predictions) {
  if (traces.empty())
    return makeError("no rank traces to merge");
  auto instances = matchCollectives(traces);
  if (!instances)
    return instances.error();
  double origin = INFINITY;
  for (const RankTrace &t : traces)
    for (const ExecutedStep &s : t.steps)
      origin = std::min(origin, s.start);
  if (!std::isfinite(origin))
    origin = 0;
  auto us = [&](double aligned) { return (aligned - origin) * kUs; };

  // Per (trace, step, instruction): the instance it belongs to.
  std::map<std::tuple<size_t, size_t, size_t>, const Instance *> instanceOf;
  for (const auto &[key, inst] : *instances)
    for (const Arrival &a : inst.arrivals)
      instanceOf[{a.trace, a.step, a.instr}] = &inst;

  Json events = Json::array();
  auto meta = [&](const char *name, int64_t pid, int64_t tid, Json args) {
    events.push_back(Json{{"name", name},
                          {"ph", "M"},
                          {"pid", pid},
                          {"tid", tid},
                          {"args", std::move(args)}});
  };
  int64_t world = traces.front().worldSize;
  Json incarnations = Json::object(), clockUnknown = Json::array();
  addProcesses(events, traces, incarnations, clockUnknown);
  int64_t discarded = 0;
  for (size_t t = 0; t < traces.size(); ++t) {
    const RankTrace &rt = traces[t];
    int64_t stepTid = int64_t(rt.streams.size());
    if (rt.faultTolerant && !rt.steps.empty())
      events.push_back(Json{
          {"name", "incarnation " + std::to_string(rt.incarnation) +
                       (rt.clockUnknown() ? " (clock unknown: times on its "
                                            "own clock)"
                                          : "")},
          {"cat", "incarnation"},
          {"ph", "i"},
          {"s", "p"},
          {"ts", us(rt.steps.front().start)},
          {"pid", rt.rank},
          {"tid", stepTid}});
    for (size_t s = 0; s < rt.steps.size(); ++s) {
      const ExecutedStep &st = rt.steps[s];
      // A fault-tolerant step's attempts: "step 4 (epoch 1): DISCARDED",
      // then "step 4 (epoch 2)".
      std::string stepName = "step " + std::to_string(st.step);
      Json stepArgs{{"step", st.step}};
      if (rt.faultTolerant) {
        stepName += " (epoch " + std::to_string(st.epoch) + ")";
        stepArgs["epoch"] = st.epoch;
        stepArgs["committed"] = st.committed;
        stepArgs["incarnation"] = rt.incarnation;
      }
      if (!st.committed) {
        stepName += ": DISCARDED";
        ++discarded;
      }
      const char *discardedCat = st.committed ? "" : ",discarded";
      events.push_back(Json{{"name", stepName},
                            {"cat", std::string("step") + discardedCat},
                            {"ph", "X"},
                            {"ts", us(st.start)},
                            {"dur", st.wall * kUs},
                            {"pid", rt.rank},
                            {"tid", stepTid},
                            {"args", std::move(stepArgs)}});
      for (size_t i = 0; i < rt.instructions.size(); ++i) {
        if (!ran(st, i))
          continue;
        const TracedInstruction &in = rt.instructions[i];
        Json args = Json::object();
        args["id"] = in.id;
        args["op"] = in.op;
        args["step"] = st.step;
        if (rt.faultTolerant) {
          args["epoch"] = st.epoch;
          args["committed"] = st.committed;
        }
        if (!in.comm.empty())
          args["comm"] = in.comm;
        args["bytes"] = in.bytes;
        args["handoff_us"] = std::max(0.0, (st.begin[i] - st.ready[i]) * kUs);
        auto found = instanceOf.find({t, s, i});
        if (found != instanceOf.end()) {
          const Instance &inst = *found->second;
          const Arrival &last = inst.arrivals[inst.straggler];
          args["waited_for_peers_us"] =
              (last.begin - (st.start + st.begin[i])) * kUs;
          args["last_to_arrive"] = traces[last.trace].rank;
          const std::vector<int64_t> &members = rt.membersOf(in.comm, st.epoch);
          if (inst.arrivals.size() < members.size()) {
            Json absent = Json::array();
            std::set<int64_t> here;
            for (const Arrival &a : inst.arrivals)
              here.insert(traces[a.trace].rank);
            for (int64_t m : members)
              if (!here.count(m))
                absent.push_back(m);
            args["members_without_trace"] = std::move(absent);
          }
        }
        events.push_back(
            Json{{"name", nameOf(in)},
                 {"cat",
                  std::string(in.ordinal >= 0 || !in.comm.empty() ? "collective"
                                                                  : "local") +
                      discardedCat},
                 {"ph", "X"},
                 {"ts", us(st.start + st.begin[i])},
                 {"dur", std::max(0.0, (st.end[i] - st.begin[i]) * kUs)},
                 {"pid", rt.rank},
                 {"tid", in.stream},
                 {"args", std::move(args)}});
      }
    }
  }
  // Flow events: each collective's members, in rank order, one arrow chain.
  int64_t flowId = 0;
  for (const auto &[key, inst] : *instances) {
    if (inst.arrivals.size() < 2)
      continue;
    ++flowId;
    for (size_t a = 0; a < inst.arrivals.size(); ++a) {
      const Arrival &ar = inst.arrivals[a];
      const RankTrace &rt = traces[ar.trace];
      const char *ph = a == 0 ? "s" : a + 1 == inst.arrivals.size() ? "f" : "t";
      Json e{{"name", rt.instructions[ar.instr].op},
             {"cat", "collective"},
             {"ph", ph},
             {"id", flowId},
             {"ts", us(ar.begin)},
             {"pid", rt.rank},
             {"tid", rt.instructions[ar.instr].stream}};
      if (a != 0)
        e["bp"] = "e";
      events.push_back(std::move(e));
    }
  }
  // Gaps: ranks of the world with no file.
  std::vector<int64_t> missing = missingRanks(traces);
  for (int64_t r : missing)
    meta("process_name", r, 0,
         {{"name", "rank " + std::to_string(r) + ": NO TRACE FILE"}});
  MESHPLAN_TRY(addPredictions(events, traces, predictions, origin));
  Json other = Json::object();
  other["generator"] = "meshplan trace --merge";
  other["run"] = traces.front().run;
  other["world_size"] = world;
  other["ranks_traced"] = int64_t(traces.size());
  other["missing_ranks"] = missing;
  if (!incarnations.empty()) {
    other["incarnations"] = std::move(incarnations);
    other["discarded_attempts"] = discarded;
    other["clock_unknown"] = std::move(clockUnknown);
  }
  double uncertainty = 0;
  for (const RankTrace &t : traces)
    if (!t.clockUnknown())
      uncertainty = std::max(uncertainty, t.clockUncertainty);
  other["clock_uncertainty_us"] = uncertainty * kUs;
  Json doc = Json::object();
  doc["traceEvents"] = std::move(events);
  doc["displayTimeUnit"] = "ms";
  doc["otherData"] = std::move(other);
  return doc.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
}

//===----------------------------------------------------------------------===//
// Summary
//===----------------------------------------------------------------------===//

namespace {

double median(std::vector<double> v) {
  if (v.empty())
    return 0;
  std::sort(v.begin(), v.end());
  size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

std::string ms(double seconds, int precision = 2) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(precision) << seconds * 1e3;
  return o.str();
}

std::string ranksText(const std::vector<int64_t> &ranks) {
  std::string s = "[";
  for (size_t i = 0; i < ranks.size(); ++i)
    s += (i ? "," : "") + std::to_string(ranks[i]);
  return s + "]";
}

} // namespace

std::string summarizeTraces(const std::vector<RankTrace> &traces) {
  std::ostringstream out;
  if (traces.empty())
    return "no traces\n";
  auto instances = matchCollectives(traces);
  // Only committed steps count below; a fault-tolerant run's discarded
  // attempts are listed on their own.
  int64_t firstStep = INT64_MAX, lastStep = 0;
  std::vector<std::string> discardedText;
  std::map<int64_t, std::vector<const RankTrace *>> byRank;
  for (const RankTrace &t : traces) {
    byRank[t.rank].push_back(&t);
    for (const ExecutedStep &s : t.steps) {
      if (!s.committed) {
        discardedText.push_back("rank " + std::to_string(t.rank) + " step " +
                                std::to_string(s.step) + " (epoch " +
                                std::to_string(s.epoch) + ", incarnation " +
                                std::to_string(t.incarnation) + ")");
        continue;
      }
      firstStep = std::min(firstStep, s.step);
      lastStep = std::max(lastStep, s.step);
    }
  }
  out << "run " << traces.front().run << ": " << byRank.size() << " of "
      << traces.front().worldSize << " ranks traced";
  if (lastStep > 0)
    out << ", steps " << firstStep << ".." << lastStep;
  out << "\n";
  if (traces.front().faultTolerant) {
    std::string restarted;
    for (const auto &[rank, list] : byRank)
      if (list.size() > 1 || list.front()->incarnation > 0) {
        restarted += (restarted.empty() ? "" : "; ") + std::string("rank ") +
                     std::to_string(rank) + ":";
        for (const RankTrace *t : list)
          restarted += " " + std::to_string(t->incarnation);
      }
    out << "fault tolerant: " << traces.size() << " process files";
    if (!restarted.empty())
      out << "; incarnations of restarted ranks: " << restarted;
    out << "\n";
    out << "discarded attempts (not counted below): " << discardedText.size();
    for (size_t k = 0; k < discardedText.size(); ++k)
      out << (k ? ", " : ": ") << discardedText[k];
    out << "\n";
  }
  std::vector<int64_t> missing = missingRanks(traces);
  if (!missing.empty())
    out << "GAP: no trace file for ranks " << ranksText(missing)
        << "; their collectives' waits are not counted\n";
  double uncertainty = 0;
  std::string unknown;
  for (const RankTrace &t : traces) {
    if (t.clockUnknown())
      unknown += (unknown.empty() ? "" : ", ") + std::string("rank ") +
                 std::to_string(t.rank) + " incarnation " +
                 std::to_string(t.incarnation);
    else
      uncertainty = std::max(uncertainty, t.clockUncertainty);
  }
  out << "clocks aligned to rank 0's within " << ms(uncertainty, 3) << " ms";
  if (!unknown.empty())
    out << "; NOT ALIGNED (restarted on another host than rank 0's): "
        << unknown << ": their waits compare times of two clocks";
  out << "\n\n";

  // Per rank (per step medians).
  out << "per rank (median per step, ms):\n"
      << "  rank       step    compute  collectives    exposed\n";
  for (const auto &[rank, list] : byRank) {
    const RankTrace &t = *list.front();
    std::vector<double> wall, compute, coll, exposed;
    int computeStream = 0;
    for (size_t s = 0; s < t.streams.size(); ++s)
      if (t.streams[s] == "compute")
        computeStream = int(s);
    std::vector<const ExecutedStep *> committed;
    for (const RankTrace *inc : list)
      for (const ExecutedStep &st : inc->steps)
        if (st.committed)
          committed.push_back(&st);
    for (const ExecutedStep *stp : committed) {
      const ExecutedStep &st = *stp;
      std::vector<Interval> c, local, onCompute;
      for (size_t i = 0; i < t.instructions.size(); ++i) {
        if (!ran(st, i))
          continue;
        const TracedInstruction &in = t.instructions[i];
        Interval iv{st.begin[i], st.end[i]};
        if (!in.comm.empty())
          c.push_back(iv);
        else if (in.stream == computeStream)
          onCompute.push_back(iv);
        if (in.op == "compute")
          local.push_back(iv);
      }
      wall.push_back(st.wall);
      compute.push_back(unionLength(local));
      coll.push_back(unionLength(c));
      exposed.push_back(uncovered(c, onCompute));
    }
    char line[160];
    std::snprintf(line, sizeof line, "  %4" PRId64 " %10s %10s %12s %10s\n",
                  t.rank, ms(median(wall)).c_str(), ms(median(compute)).c_str(),
                  ms(median(coll)).c_str(), ms(median(exposed)).c_str());
    out << line;
  }
  if (!instances) {
    out << "\ncollectives not compared: " << instances.error().message << "\n";
    return out.str();
  }
  // Per communicator group: time, waits, stragglers.
  struct GroupStats {
    int64_t collectives = 0;
    double time = 0, waited = 0;
    std::map<int64_t, std::pair<int64_t, double>> lastCount; // rank -> n, wait
    std::set<std::pair<int64_t, int64_t>> steps;             // (epoch, step)
  };
  auto committedInstance = [&](const Instance &inst) {
    const Arrival &a = inst.arrivals.front();
    return traces[a.trace].steps[a.step].committed;
  };
  std::map<std::pair<std::string, std::vector<int64_t>>, GroupStats> groups;
  for (const auto &[key, inst] : *instances) {
    if (!committedInstance(inst))
      continue;
    const auto &[epoch, step, comm, members, ordinal] = key;
    GroupStats &g = groups[{comm, members}];
    ++g.collectives;
    g.steps.emplace(epoch, step);
    for (const Arrival &a : inst.arrivals)
      g.time += a.end - a.begin;
    g.waited += inst.waited;
    if (inst.arrivals.size() > 1) {
      auto &[n, w] =
          g.lastCount[traces[inst.arrivals[inst.straggler].trace].rank];
      ++n;
      w += inst.waited;
    }
  }
  out << "\nper communicator (ms per step, summed over the members traced):\n";
  for (const auto &[key, g] : groups) {
    const auto &[comm, members] = key;
    // A fault_tolerant communicator's member sets each count the steps
    // they ran in.
    int64_t steps = std::max<int64_t>(1, int64_t(g.steps.size()));
    out << "  " << comm << " " << ranksText(members) << ": "
        << g.collectives / steps << " collectives, " << ms(g.time / steps)
        << " in them, " << ms(g.waited / steps) << " waiting for the last";
    auto worst = std::max_element(g.lastCount.begin(), g.lastCount.end(),
                                  [](const auto &a, const auto &b) {
                                    return a.second.second < b.second.second;
                                  });
    if (worst != g.lastCount.end())
      out << "; straggler: rank " << worst->first << " (last in "
          << worst->second.first << " of " << g.collectives
          << ", others waited " << ms(worst->second.second / steps) << ")";
    out << "\n";
  }
  // The longest single waits.
  std::vector<std::pair<double, const Instance *>> worst;
  std::map<const Instance *, const InstanceKey *> keyOf;
  for (const auto &[key, inst] : *instances)
    if (inst.arrivals.size() > 1 && committedInstance(inst)) {
      worst.emplace_back(inst.waited, &inst);
      keyOf[&inst] = &key;
    }
  std::sort(worst.begin(), worst.end(),
            [](const auto &a, const auto &b) { return a.first > b.first; });
  if (!worst.empty()) {
    out << "\nlongest waits (collective: straggler, others' total wait, ms):\n";
    for (size_t k = 0; k < worst.size() && k < 5; ++k) {
      const Instance &inst = *worst[k].second;
      const auto &[epoch, step, comm, members, ordinal] = *keyOf[&inst];
      const Arrival &last = inst.arrivals[inst.straggler];
      const RankTrace &lt = traces[last.trace];
      out << "  step " << step;
      if (epoch > 0)
        out << " (epoch " << epoch << ")";
      out << " " << comm << " #" << ordinal << " "
          << quote(nameOf(lt.instructions[last.instr])) << ": rank " << lt.rank
          << ", " << ms(worst[k].first, 3) << "\n";
    }
  }
  return out.str();
}

} // namespace meshplan::plan

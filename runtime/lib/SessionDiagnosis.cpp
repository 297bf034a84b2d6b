//===- SessionDiagnosis.cpp - Naming the rank a failure comes from --------===//
//
// Two checks that turn a hang or an abort into an error naming its cause
// (docs/runtime.md, "When a rank fails" and "Plans the verifier would
// reject"):
//
// - checkCollectiveSequence: when a communicator is created, its members
//   all-gather the collectives each will issue on it (the fields `meshplan
//   verify` matches: op, dtype, count, reduce op, root). Plans that disagree
//   would otherwise hang, or end in an exception on Gloo's own thread that
//   nothing can catch (a message of another size than the receiver posted:
//   std::terminate, SIGABRT); now every member fails at once, naming the
//   communicator, the collective and the field.
// - diagnosePeers: a rank whose collective failed (a timeout, a connection
//   closed) or whose wait timed out writes where it stands to the store and
//   reads where the communicator's other members stand. A member that wrote
//   nothing within a short window is the one that did not arrive: stopped,
//   hung or dead. Only the failure path pays for this.
//
//===----------------------------------------------------------------------===//

#include "SessionImpl.h"

#include "meshplan/Plan/Verify.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <sstream>
#include <thread>

namespace meshplan::runtime {

using plan::DType;
using plan::Instruction;
using plan::OpKind;

namespace {

/// One collective as the members compare it (plan::sameCollective's fields).
constexpr int64_t kFields = 5;

void encode(const Instruction &in, int64_t *out) {
  out[0] = int64_t(in.op);
  out[1] = in.dtype ? int64_t(*in.dtype) : -1;
  out[2] = in.count;
  out[3] = in.reduce ? int64_t(*in.reduce) : -1;
  out[4] = in.op == OpKind::Broadcast ? in.root : 0;
}

Instruction decode(const int64_t *f) {
  Instruction in;
  in.op = OpKind(f[0]);
  if (f[1] >= 0)
    in.dtype = DType(f[1]);
  in.count = f[2];
  if (f[3] >= 0)
    in.reduce = ReduceOp(f[3]);
  in.root = f[4];
  return in;
}

std::string rankList(const std::vector<int64_t> &ranks) {
  std::string s;
  for (int64_t r : ranks)
    s += (s.empty() ? "" : ",") + std::to_string(r);
  return s;
}

/// "rank 3" or, on a job of several nodes (meshplan run and torchrun set
/// GROUP_WORLD_SIZE and LOCAL_WORLD_SIZE; ranks are numbered node by
/// node), "rank 3 (node 1)".
std::string rankName(int64_t rank) {
  const char *nodes = std::getenv("GROUP_WORLD_SIZE");
  const char *local = std::getenv("LOCAL_WORLD_SIZE");
  std::string s = "rank " + std::to_string(rank);
  if (!nodes || !local)
    return s;
  long n = std::strtol(nodes, nullptr, 10), l = std::strtol(local, nullptr, 10);
  if (n > 1 && l > 0)
    s += " (node " + std::to_string(rank / l) + ")";
  return s;
}

/// A trainer communicator (Session::trainerCommunicator) whose failures are
/// diagnosed like the plan's collectives': the trainer's collectives run
/// inside compute callbacks and between steps (the loss's all-reduce), where
/// an error alone cannot tell a peer that never came from a fault of one's
/// own.
class WatchedCommunicator final : public Communicator {
public:
  WatchedCommunicator(std::unique_ptr<Communicator> inner,
                      Session::Impl &session, int index)
      : inner(std::move(inner)), session(session), index(index) {}

  const GroupSpec &group() const override { return inner->group(); }
  MemoryKind memoryKind() const override { return inner->memoryKind(); }
  Result<void> setStream(DeviceStream s) override {
    return inner->setStream(s);
  }
  Result<void> synchronize() override { return note(inner->synchronize()); }
  Result<void> allGather(const void *in, void *out, int64_t count,
                         DType dtype) override {
    return note(inner->allGather(in, out, count, dtype));
  }
  Result<void> reduceScatter(const void *in, void *out, int64_t count,
                             DType dtype, ReduceOp op) override {
    return note(inner->reduceScatter(in, out, count, dtype, op));
  }
  Result<void> allReduce(void *data, int64_t count, DType dtype,
                         ReduceOp op) override {
    return note(inner->allReduce(data, count, dtype, op));
  }
  Result<void>
  allReduceShares(const std::vector<const void *> &mine, void *out,
                  int64_t count, DType dtype, ReduceOp op,
                  const std::vector<std::vector<int64_t>> &layout) override {
    return note(inner->allReduceShares(mine, out, count, dtype, op, layout));
  }
  Result<void> broadcast(void *data, int64_t count, DType dtype,
                         int64_t root) override {
    return note(inner->broadcast(data, count, dtype, root));
  }
  Result<void> allToAll(const void *in, void *out, int64_t count,
                        DType dtype) override {
    return note(inner->allToAll(in, out, count, dtype));
  }
  Result<void> sendRecv(const void *send, int64_t sendTo, void *recv,
                        int64_t recvFrom, int64_t count, DType dtype) override {
    return note(inner->sendRecv(send, sendTo, recv, recvFrom, count, dtype));
  }
  Result<void> barrier() override { return note(inner->barrier()); }
  void abort(const std::string &why) override { inner->abort(why); }
  bool canAbort() const override { return inner->canAbort(); }
  Result<void> send(const void *data, int64_t to, int64_t count, DType dtype,
                    std::string_view tag) override {
    return note(inner->send(data, to, count, dtype, tag));
  }
  Result<void> recv(void *data, int64_t from, int64_t count, DType dtype,
                    std::string_view tag) override {
    return note(inner->recv(data, from, count, dtype, tag));
  }

private:
  Result<void> note(Result<void> r) {
    if (r)
      return r;
    Error e = r.error();
    session.trainerCollectiveFailed = true;
    session.diagnosePeers(nullptr, index, e);
    return e;
  }
  std::unique_ptr<Communicator> inner;
  Session::Impl &session;
  int index;
};

} // namespace

std::unique_ptr<Communicator>
Session::Impl::watchTrainerCommunicator(std::unique_ptr<Communicator> comm,
                                        int index) {
  return std::make_unique<WatchedCommunicator>(std::move(comm), *this, index);
}

Result<void> Session::Impl::checkCollectiveSequence(int index,
                                                    Communicator &c) {
  const plan::Communicator &pc = plan.communicators[size_t(index)];
  std::vector<int> mine;
  for (int i : commSequence[size_t(index)])
    if (!plan::isPointToPoint(program[size_t(i)].in->op))
      mine.push_back(i);
  int64_t n = c.size();
  int64_t count = int64_t(mine.size());
  std::vector<int64_t> counts(size_t(n), 0);
  MESHPLAN_TRY(c.allGather(&count, counts.data(), 1, DType::Int64));
  int64_t longest = *std::max_element(counts.begin(), counts.end());
  if (longest == 0)
    return {};
  std::vector<int64_t> send(size_t(longest * kFields), -1);
  for (size_t k = 0; k < mine.size(); ++k)
    encode(*program[size_t(mine[k])].in, &send[k * kFields]);
  std::vector<int64_t> all(size_t(n * longest * kFields));
  MESHPLAN_TRY(
      c.allGather(send.data(), all.data(), longest * kFields, DType::Int64));
  std::string head = "the plans of communicator \"" + pc.id + "\" (ranks [" +
                     rankList(pc.ranks) + "]) disagree";
  std::string tail = "; `meshplan verify` rejects such a plan set";
  for (int64_t pos = 0; pos < longest; ++pos)
    for (int64_t m = 0; m < n; ++m) {
      if (m == c.key())
        continue;
      bool theirs = pos < counts[size_t(m)], ours = pos < count;
      std::string other = "rank " + std::to_string(pc.ranks[size_t(m)]);
      std::string number = "collective #" + std::to_string(pos + 1);
      if (ours && theirs) {
        Instruction t = decode(&all[size_t((m * longest + pos) * kFields)]);
        const Instruction &o = *program[size_t(mine[size_t(pos)])].in;
        if (plan::sameCollective(o, t))
          continue;
        auto [a, b] = plan::firstCollectiveDifference(o, t);
        return makeError(head + ": this rank's " + number + " on it, " +
                         describe(program[size_t(mine[size_t(pos)])]) +
                         ", has " + a + ", but " + other + "'s has " + b +
                         " (this rank: " + plan::describeCollective(o) + "; " +
                         other + ": " + plan::describeCollective(t) + ")" +
                         tail);
      }
      if (ours == theirs)
        continue;
      std::string issues =
          ours ? "this rank issues " + std::to_string(count) +
                     " collectives "
                     "on it and " +
                     other + " only " + std::to_string(counts[size_t(m)])
               : other + " issues " + std::to_string(counts[size_t(m)]) +
                     " collectives on it and this rank only " +
                     std::to_string(count);
      std::string first =
          ours ? "this rank's " + number + " is " +
                     describe(program[size_t(mine[size_t(pos)])])
               : other + "'s " + number + " is " +
                     plan::describeCollective(
                         decode(&all[size_t((m * longest + pos) * kFields)]));
      return makeError(head + ": " + issues + " (" + first + ")" + tail);
    }
  return {};
}

std::string Session::Impl::progressKey(int64_t step, int64_t rank) const {
  return "progress/i" + std::to_string(incarnation()) + "/s" +
         std::to_string(step) + "/r" + std::to_string(rank);
}

/// Where this rank stands in the step: per communicator with a collective
/// still to come, its number (1-based) and whether it runs now. One line
/// each: "ID<TAB>NUMBER<TAB>running|waiting".
static std::string positionOf(const Session::Impl &m, const StepState &state) {
  std::string text;
  for (size_t c = 0; c < m.commSequence.size(); ++c) {
    size_t turn = size_t(state.turn[c]);
    if (turn >= m.commSequence[c].size())
      continue;
    bool running = size_t(m.commSequence[c][turn]) < state.running.size() &&
                   state.running[size_t(m.commSequence[c][turn])];
    text += m.plan.communicators[c].id + "\t" + std::to_string(turn + 1) +
            "\t" + (running ? "running" : "waiting") + "\n";
  }
  // What else runs: a compute callback may be inside the trainer's own
  // collective.
  for (size_t i = 0; i < state.running.size(); ++i)
    if (state.running[i] && m.program[i].comm < 0)
      text += "\t\t" + m.describe(m.program[i]) + "\n";
  return text;
}

std::string Session::Impl::holdUp(const std::string &commId, int64_t member,
                                  int64_t step, Clock::time_point until) {
  const plan::Communicator *c = plan.findCommunicator(commId);
  if (!c || c->axes.empty() || !mesh)
    return "";
  auto group = plan::deriveGroup(*mesh, c->axes, member);
  if (!group)
    return "";
  // The group's members hit their own timeouts a moment after this rank's
  // peers did: wait for them as for this communicator's members, so that
  // one that reports late is not named silent.
  std::vector<int64_t> waiting;
  for (int64_t r : group->ranks)
    if (r != member && r != plan.rank)
      waiting.push_back(r);
  while (true) {
    std::erase_if(waiting, [&](int64_t r) {
      auto got = backend->storePeek(progressKey(step, r));
      return got && *got;
    });
    if (waiting.empty() || Clock::now() >= until)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::string silent;
  for (int64_t r : waiting)
    silent += (silent.empty() ? "" : ", ") + rankName(r);
  std::string text = "; it is inside \"" + commId + "\" with ranks [" +
                     rankList(group->ranks) + "]";
  if (!silent.empty())
    text += ", where " + silent + " reported nothing (stopped, hung or dead)";
  return text;
}

void Session::Impl::diagnosePeers(const StepState *state, int comm,
                                  Error &error) {
  if (ft || comm < 0)
    return;
  // Once per session: the first failure is the one to explain (a session
  // is broken after it; later errors are its consequences, the aborts).
  // Two of this rank's streams can fail at the same moment (a callback's
  // trainer collective and a plan collective, on the same stalled peer),
  // and either error may be the one the rank reports: the second waits for
  // the first's diagnosis and carries it too.
  std::unique_lock<std::mutex> lock(diagnosisMutex);
  if (!diagnosisStarted) {
    diagnosisStarted = true;
    lock.unlock();
    std::string text = diagnosisOf(state, comm);
    lock.lock();
    diagnosis = std::move(text);
    diagnosisReady.notify_all();
  } else {
    diagnosisReady.wait_for(lock, options.timeout + std::chrono::seconds(10),
                            [&] { return diagnosis.has_value(); });
  }
  if (diagnosis && !diagnosis->empty())
    error = Error{error.message + " [" + *diagnosis + "]"};
}

std::string Session::Impl::diagnosisOf(const StepState *state, int comm) {
  bool inCallback = state == nullptr;
  // A peer's own failure (a callback's error) is already the cause.
  if (auto peer = backend->storePeek("step-failure"); peer && *peer)
    return "";
  int64_t step = steps + 1;
  // A trainer's collective: where the plan stands is not known here.
  std::string mine =
      state ? positionOf(*this, *state)
            : "@" + plan.communicators[size_t(comm)].id + "\t\trunning\n";
  (void)backend->storeSet(progressKey(step, plan.rank),
                          std::vector<char>(mine.begin(), mine.end()));
  const plan::Communicator &pc = plan.communicators[size_t(comm)];
  size_t turn = state ? size_t(state->turn[size_t(comm)]) : 0;
  int64_t number = int64_t(turn) + 1;
  // Members that wrote where they stand; the others get a short window,
  // long enough for peers that hit the same failure a moment later on a
  // loaded machine (a fifth of a 10 s timeout, 2 s, once named a live member
  // silent beside two spinning processes). Only the failure path waits.
  auto window = std::clamp(options.timeout / 3, std::chrono::milliseconds(1000),
                           std::chrono::milliseconds(5000));
  auto until = Clock::now() + window;
  std::vector<std::optional<std::string>> seen(pc.ranks.size());
  while (true) {
    bool all = true;
    for (size_t k = 0; k < pc.ranks.size(); ++k) {
      if (pc.ranks[k] == plan.rank || seen[k])
        continue;
      auto got = backend->storePeek(progressKey(step, pc.ranks[k]));
      if (got && *got)
        seen[k] = std::string((*got)->begin(), (*got)->end());
      else
        all = false;
    }
    if (all || Clock::now() >= until)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::vector<int64_t> silent, inIt;
  std::vector<std::string> elsewhere;
  for (size_t k = 0; k < pc.ranks.size(); ++k) {
    if (pc.ranks[k] == plan.rank)
      continue;
    if (!seen[k]) {
      silent.push_back(pc.ranks[k]);
      continue;
    }
    // The member's line for this communicator.
    std::istringstream lines(*seen[k]);
    std::string line, state2 = "done", busy;
    std::vector<std::string> runningOn; // other communicators it is inside
    int64_t at = -1;
    bool inTrainerCollective = false; // its trainer's collective on pc
    while (std::getline(lines, line)) {
      std::istringstream fields(line);
      std::string id, num, st;
      std::getline(fields, id, '\t');
      std::getline(fields, num, '\t');
      std::getline(fields, st, '\t');
      if (id.empty() && num.empty())
        busy += (busy.empty() ? "" : ", ") + st;
      if (!id.empty() && id[0] == '@' && id.substr(1) == pc.id) {
        inTrainerCollective = true;
      } else if (!id.empty() && id[0] == '@') {
        busy +=
            (busy.empty() ? "" : ", ") +
            ("the trainer's collective on \"trainer/" + id.substr(1) + "\"");
        runningOn.push_back(id.substr(1));
      } else if (!id.empty() && id != pc.id && st == "running") {
        runningOn.push_back(id);
      }
      if (id == pc.id) {
        at = std::strtoll(num.c_str(), nullptr, 10);
        state2 = st;
      }
    }
    // In a trainer's collective, a member in it reports "@ID"; one that
    // reported from elsewhere (its own plan collective timed out) is not in
    // it, and where it is explains the wait.
    if (inCallback ? inTrainerCollective
                   : at == number && state2 == "running") {
      inIt.push_back(pc.ranks[k]);
      continue;
    }
    std::string where =
        inCallback ? "is not in it"
        : at < 0
            ? "has no collective left on it in step " + std::to_string(step)
        : at == number
            ? "has not started it (its deps or an earlier collective "
              "hold it)"
            : "is at collective #" + std::to_string(at) + " (" + state2 + ")";
    if (!busy.empty())
      where += "; it runs " + busy;
    // One step further: the members of the group the member is stuck in
    // (core derives any rank's group from the mesh) that reported nothing.
    Clock::time_point groupUntil = Clock::now() + window;
    for (const std::string &d : runningOn)
      if (d != pc.id)
        where += holdUp(d, pc.ranks[k], step, groupUntil);
    elsewhere.push_back(rankName(pc.ranks[k]) + " " + where);
  }
  if (silent.empty() && elsewhere.empty() && inIt.empty())
    return "";
  std::string text = inCallback
                         ? "members of \"trainer/" + pc.id +
                               "\" (the trainer's own collectives) in step " +
                               std::to_string(step) + ": "
                         : "members of \"" + pc.id + "\" at its collective #" +
                               std::to_string(number) + " of step " +
                               std::to_string(step) + ": ";
  std::string parts;
  if (!silent.empty()) {
    std::string names;
    for (int64_t r : silent)
      names += (names.empty() ? "" : ", ") + rankName(r);
    parts += names + (silent.size() == 1 ? " has" : " have") +
             " not arrived and reported nothing within " +
             std::to_string(window.count() / 1000.0).substr(0, 3) +
             " s (stopped, hung or dead)";
  }
  for (const std::string &e : elsewhere)
    parts += (parts.empty() ? "" : "; ") + e;
  if (silent.empty() && elsewhere.empty())
    parts += "every member reported, so what holds it up is outside this "
             "communicator";
  if (!inIt.empty())
    parts += std::string("; rank") + (inIt.size() == 1 ? " " : "s ") +
             rankList(inIt) +
             (inCallback         ? " reported"
              : inIt.size() == 1 ? " waits in it too"
                                 : " wait in it too");
  return text + parts;
}

} // namespace meshplan::runtime

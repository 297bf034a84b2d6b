//===- CollectiveSweep.cpp - Every collective op against whole tensors ----===//
//
// runtime.CollectiveSweep: for small meshes (1-D and 2-D, up to 6 ranks),
// uneven shapes and pairs of layouts, core's planRedistribute plans the
// collectives from one layout to the other; each case becomes one plan per
// rank (one instruction per step: all_gather, reduce_scatter, all_reduce,
// all_to_all, permute; communicators from core's groupOf/splitKeyOf), which
// real Gloo processes (forked here) execute. Every rank then checks its final
// box against the global tensor, element by element. A partial start holds
// the value on the partial group's first member and zeros elsewhere, so sums
// are exact. Cases with a local slice are skipped (no plan op slices).
//
// With --device host every session runs on the host device (the device
// executor: arena, device streams, packing on the device, Gloo staged
// through host memory; docs/cuda.md), as ctest's runtime.device.
// CollectiveSweep does. Shards go in with copyIn and come out with copyOut
// in both modes.
//
//===----------------------------------------------------------------------===//

#include "meshplan/Core/Redistribute.h"
#include "meshplan/Plan/Plan.h"
#include "meshplan/Plan/Template.h"
#include "meshplan/Runtime/Session.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <vector>

using namespace meshplan;
using namespace meshplan::runtime;
namespace pl = meshplan::plan;

namespace {

/// Set by --device host: the device every session runs on.
bool onHostDevice = false;

void useDevice(SessionOptions &o) {
  if (onHostDevice)
    o.device = createHostDevice();
}

/// The shard of persistent buffer `id` as floats on the host.
std::vector<float> readShard(Session &s, const std::string &id) {
  auto t = s.tensor(id);
  std::vector<float> out(t ? t->bytes.size() / sizeof(float) : 0);
  if (!t || !s.copyOut(*t, std::as_writable_bytes(std::span(out)))) {
    std::fprintf(stderr, "rank %lld: cannot read %s\n",
                 static_cast<long long>(s.rank()), id.c_str());
    _exit(1);
  }
  return out;
}

/// Fills persistent buffer `id` from its whole tensor.
void writeWhole(Session &s, const std::string &id,
                const std::vector<float> &whole) {
  if (auto ok = s.copyIn(id, std::as_bytes(std::span(whole))); !ok) {
    std::fprintf(stderr, "rank %lld: %s\n", static_cast<long long>(s.rank()),
                 ok.error().message.c_str());
    _exit(1);
  }
}

struct Case {
  std::string mesh; ///< "x=2,y=3"
  std::vector<int64_t> shape;
  std::string from, to;
};

int64_t numel(const std::vector<int64_t> &s) {
  int64_t n = 1;
  for (int64_t d : s)
    n *= d;
  return n;
}

/// The plan of `rank` for the steps, or why the case is skipped ("").
Result<pl::Plan> planFor(const Mesh &mesh, const View &view,
                         const std::vector<RedistributeStep> &steps,
                         const Layout &from, const std::vector<int64_t> &shape,
                         int64_t rank) {
  pl::Plan p;
  p.mesh.axes = mesh.getAxes();
  p.rank = rank;
  p.streams = {"comm"};
  auto addBuffer = [&](const std::string &id, const Layout &layout,
                       pl::BufferKind kind) -> Result<void> {
    auto box = shardOf(view, layout, shape, rank);
    if (!box)
      return box.error();
    pl::Buffer b{id,
                 kind,
                 pl::DType::Float32,
                 shape,
                 box->localShape,
                 box->offset,
                 formatLayout(mesh, layout),
                 "",
                 {},
                 {}};
    p.buffers.push_back(std::move(b));
    return {};
  };
  MESHPLAN_TRY(addBuffer("b0", from, pl::BufferKind::OptimizerState));
  std::set<std::string> comms;
  for (size_t i = 0; i < steps.size(); ++i) {
    const RedistributeStep &s = steps[i];
    std::string out = "b" + std::to_string(i + 1);
    // The result stays readable after the step: a persistent buffer.
    MESHPLAN_TRY(addBuffer(out, s.after,
                           i + 1 == steps.size()
                               ? pl::BufferKind::OptimizerState
                               : pl::BufferKind::Scratch));
    std::vector<std::string> axes;
    for (const AxisRef &r : s.axes)
      axes.push_back(formatAxisRef(mesh, r));
    std::string comm;
    for (const std::string &a : axes)
      comm += (comm.empty() ? "" : "_") + a;
    for (char &ch : comm)
      if (!std::isalnum(static_cast<unsigned char>(ch)))
        ch = '_';
    if (comms.insert(comm).second) {
      auto g = pl::deriveGroup(mesh, axes, rank);
      if (!g)
        return g.error();
      p.communicators.push_back(
          {comm, g->ranks, g->color, g->key, axes, std::nullopt, false});
    }
    pl::Instruction in;
    in.id = "s" + std::to_string(i);
    in.stream = "comm";
    in.comm = comm;
    in.dtype = pl::DType::Float32;
    in.inputs = {"b" + std::to_string(i)};
    in.outputs = {out};
    std::vector<int64_t> padIn = paddedShapeOf(s.before, shape);
    std::vector<int64_t> padOut = paddedShapeOf(s.after, shape);
    switch (s.kind) {
    case StepKind::AllGather:
      in.op = pl::OpKind::AllGather;
      in.count = numel(padIn);
      break;
    case StepKind::ReduceScatter:
      in.op = pl::OpKind::ReduceScatter;
      in.count = numel(padOut);
      in.reduce = s.op;
      break;
    case StepKind::AllReduce:
      in.op = pl::OpKind::AllReduce;
      in.count = numel(padIn);
      in.reduce = s.op;
      break;
    case StepKind::Permute:
      in.op = pl::OpKind::Permute;
      in.count = numel(padIn);
      break;
    case StepKind::AllToAll: {
      // The largest part one member's input shares with one member's
      // output (plan-format.md).
      in.op = pl::OpKind::AllToAll;
      auto group = groupOf(mesh, s.axes, rank);
      if (!group)
        return group.error();
      int64_t block = 0;
      for (int64_t a : *group)
        for (int64_t z : *group) {
          auto x = shardOf(view, s.before, shape, a);
          auto y = shardOf(view, s.after, shape, z);
          if (!x || !y)
            return makeError("shardOf");
          int64_t n = 1;
          for (size_t d = 0; d < shape.size(); ++d) {
            int64_t lo = std::max(x->offset[d], y->offset[d]);
            int64_t hi = std::min(x->offset[d] + x->localShape[d],
                                  y->offset[d] + y->localShape[d]);
            n *= std::max<int64_t>(0, hi - lo);
          }
          block = std::max(block, n);
        }
      in.count = block;
      break;
    }
    default:
      return makeError("");
    }
    p.program.push_back(std::move(in));
  }
  MESHPLAN_TRY(pl::validatePlan(p));
  return p;
}

/// The same plan as a rank-independent template (communicators by axes,
/// buffers by layout), for Session::openTemplate.
Result<pl::PreparedTemplate> templateOf(const pl::Plan &p, const View &view,
                                        const AxisNamespace &names) {
  pl::ProgramTemplate t;
  t.mesh = p.mesh;
  for (const pl::Communicator &c : p.communicators)
    t.comms.push_back({c.id, c.axes, c.view, c.faultTolerant});
  for (const pl::Buffer &b : p.buffers) {
    auto layout = parseLayout(view, names, b.layout);
    if (!layout)
      return layout.error();
    pl::BufferTemplate bt;
    bt.id = b.id;
    bt.kind = b.kind;
    bt.dtype = b.dtype;
    bt.globalShape = b.globalShape;
    bt.layout = *layout;
    bt.persistent = b.kind == pl::BufferKind::OptimizerState;
    t.buffers.push_back(std::move(bt));
  }
  t.streams = p.streams;
  t.program = p.program;
  return pl::PreparedTemplate::prepare(std::move(t));
}

/// Runs one case on `world` forked processes; returns the number of failed
/// ranks (0 when the case is skipped).
int runCase(const Case &c, bool viaTemplate, int &skipped, std::string &kinds) {
  auto axes = parseMeshAxes(c.mesh);
  auto mesh = Mesh::create(*axes);
  auto shared = std::make_shared<const Mesh>(*mesh);
  View view = View::root(shared);
  AxisNamespace names(shared);
  auto from = parseLayout(view, names, c.from);
  auto to = parseLayout(view, names, c.to);
  if (!from || !to) {
    std::fprintf(stderr, "bad case layout %s -> %s\n", c.from.c_str(),
                 c.to.c_str());
    return 1;
  }
  auto planned = planRedistribute(view, *from, *to, c.shape);
  if (!planned) {
    std::fprintf(stderr, "%s: %s -> %s: %s\n", c.mesh.c_str(), c.from.c_str(),
                 c.to.c_str(), planned.error().message.c_str());
    return 1;
  }
  for (const RedistributeStep &s : planned->steps)
    if (!s.isCollective() || s.kind == StepKind::Broadcast) {
      ++skipped;
      return 0;
    }
  for (const RedistributeStep &s : planned->steps)
    kinds += std::string(stepKindName(s.kind)) + " ";
  int64_t world = mesh->size();
  char tmpl[] = "/tmp/meshplan-sweep-XXXXXX";
  if (!mkdtemp(tmpl))
    return 1;
  std::vector<pid_t> pids;
  for (int64_t rank = 0; rank < world; ++rank) {
    pid_t pid = fork();
    if (pid != 0) {
      pids.push_back(pid);
      continue;
    }
    auto p = planFor(*mesh, view, planned->steps, *from, c.shape, rank);
    if (!p) {
      std::fprintf(stderr, "rank %lld: plan: %s\n",
                   static_cast<long long>(rank), p.error().message.c_str());
      _exit(1);
    }
    SessionOptions o;
    o.rank = rank;
    o.worldSize = world;
    o.store = {StoreAddress::Kind::File, tmpl, "", 0};
    o.timeout = std::chrono::milliseconds(20000);
    useDevice(o);
    // Every other case runs the plan instantiated in-process from a
    // template instead of the plan itself.
    Result<std::unique_ptr<Session>> s = makeError("");
    if (viaTemplate) {
      auto prepared = templateOf(*p, view, names);
      if (!prepared) {
        std::fprintf(stderr, "rank %lld: template: %s\n",
                     static_cast<long long>(rank),
                     prepared.error().message.c_str());
        _exit(1);
      }
      s = Session::openTemplate(*prepared, o);
    } else {
      s = Session::open(std::move(*p), o);
    }
    if (!s) {
      std::fprintf(stderr, "rank %lld: %s\n", static_cast<long long>(rank),
                   s.error().message.c_str());
      _exit(1);
    }
    // The global tensor's value at g is g + 1; a partial start holds it on
    // the first member of the partial group only.
    bool holder = true;
    for (const AxisRef &r : from->partial)
      holder &=
          r.coordinateAt(*mesh, rank) == 0; // default order: position = rank
    std::vector<float> whole(size_t(numel(c.shape)));
    for (size_t g = 0; g < whole.size(); ++g)
      whole[g] = holder ? float(g + 1) : 0.0f;
    writeWhole(**s, "b0", whole);
    if (auto ok = (*s)->step(); !ok) {
      std::fprintf(stderr, "rank %lld: %s\n", static_cast<long long>(rank),
                   ok.error().message.c_str());
      _exit(1);
    }
    std::string resultId = "b" + std::to_string(planned->steps.size());
    auto result = (*s)->tensor(resultId);
    const plan::Buffer &r = *result->buffer;
    std::vector<float> got = readShard(**s, resultId);
    for (int64_t l = 0; l < numel(r.localShape); ++l) {
      int64_t g = 0, rem = l;
      std::vector<int64_t> at(r.localShape.size());
      for (size_t d = r.localShape.size(); d-- > 0;) {
        at[d] = rem % r.localShape[d];
        rem /= r.localShape[d];
      }
      for (size_t d = 0; d < at.size(); ++d)
        g = g * r.globalShape[d] + r.offset[d] + at[d];
      if (got[size_t(l)] != float(g + 1)) {
        std::fprintf(stderr, "rank %lld: %s[%lld] = %g, expected %g\n",
                     static_cast<long long>(rank), r.id.c_str(),
                     static_cast<long long>(g), double(got[size_t(l)]),
                     double(g + 1));
        _exit(1);
      }
    }
    if (auto ok = (*s)->close(); !ok) {
      std::fprintf(stderr, "rank %lld: %s\n", static_cast<long long>(rank),
                   ok.error().message.c_str());
      _exit(1);
    }
    _exit(0);
  }
  int failed = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  std::filesystem::remove_all(tmpl);
  if (failed)
    std::fprintf(stderr, "FAILED: mesh %s shape %zu-D %s -> %s\n",
                 c.mesh.c_str(), c.shape.size(), c.from.c_str(), c.to.c_str());
  return failed;
}

/// Pipeline transfers (send / recv on pair communicators, matched by tag)
/// on `world` real processes: a chain of stages, each receiving the previous
/// stage's activation and sending its own, then the gradients back; every
/// rank checks what it received element by element.
int runPipelineChain(int64_t world, int64_t elements) {
  char tmpl[] = "/tmp/meshplan-sweep-XXXXXX";
  if (!mkdtemp(tmpl))
    return 1;
  auto value = [](int64_t from, char what, int64_t l) {
    return float(from * 1000 + (what == 'F' ? 0 : 500) + l);
  };
  std::vector<pid_t> pids;
  for (int64_t rank = 0; rank < world; ++rank) {
    pid_t pid = fork();
    if (pid != 0) {
      pids.push_back(pid);
      continue;
    }
    pl::Plan p;
    p.mesh.axes = {{"pp", world, false}};
    p.rank = rank;
    p.streams = {"main"};
    auto buffer = [&](const std::string &id) {
      // Persistent, so the values can be read after the step.
      p.buffers.push_back({id,
                           pl::BufferKind::OptimizerState,
                           pl::DType::Float32,
                           {elements},
                           {elements},
                           {0},
                           "[{}]",
                           "",
                           {},
                           {}});
    };
    auto pair = [&](int64_t peer) {
      std::string id = "pp." + std::to_string(std::min(rank, peer)) + "-" +
                       std::to_string(std::max(rank, peer));
      for (const pl::Communicator &c : p.communicators)
        if (c.id == id)
          return id;
      p.communicators.push_back({id,
                                 {std::min(rank, peer), std::max(rank, peer)},
                                 0,
                                 rank < peer ? 0 : 1,
                                 {},
                                 std::nullopt,
                                 false});
      return id;
    };
    auto transfer = [&](pl::OpKind op, int64_t peer, std::string tag,
                        std::string buf) {
      pl::Instruction in;
      in.id = std::string(op == pl::OpKind::Send ? "send " : "recv ") + tag;
      in.stream = "main";
      in.op = op;
      in.comm = pair(peer);
      in.peer = rank < peer ? 1 : 0;
      in.tag = tag;
      in.dtype = pl::DType::Float32;
      in.count = elements;
      (op == pl::OpKind::Send ? in.inputs : in.outputs).push_back(buf);
      p.program.push_back(in);
    };
    buffer("act");
    buffer("grad");
    buffer("act.in");
    buffer("grad.in");
    if (rank > 0)
      transfer(pl::OpKind::Recv, rank - 1, "F" + std::to_string(rank - 1),
               "act.in");
    if (rank + 1 < world) {
      transfer(pl::OpKind::Send, rank + 1, "F" + std::to_string(rank), "act");
      transfer(pl::OpKind::Recv, rank + 1, "B" + std::to_string(rank + 1),
               "grad.in");
    }
    if (rank > 0)
      transfer(pl::OpKind::Send, rank - 1, "B" + std::to_string(rank), "grad");
    SessionOptions o;
    o.rank = rank;
    o.worldSize = world;
    o.store = {StoreAddress::Kind::File, tmpl, "", 0};
    o.timeout = std::chrono::milliseconds(20000);
    useDevice(o);
    auto s = Session::open(std::move(p), o);
    if (!s) {
      std::fprintf(stderr, "rank %lld: %s\n", static_cast<long long>(rank),
                   s.error().message.c_str());
      _exit(1);
    }
    for (char what : {'F', 'B'}) {
      std::vector<float> whole(static_cast<size_t>(elements));
      for (int64_t l = 0; l < elements; ++l)
        whole[size_t(l)] = value(rank, what, l);
      writeWhole(**s, what == 'F' ? "act" : "grad", whole);
    }
    if (auto ok = (*s)->step(); !ok) {
      std::fprintf(stderr, "rank %lld: %s\n", static_cast<long long>(rank),
                   ok.error().message.c_str());
      _exit(1);
    }
    for (auto [id, from, what] : {std::tuple{"act.in", rank - 1, 'F'},
                                  std::tuple{"grad.in", rank + 1, 'B'}}) {
      if (from < 0 || from >= world)
        continue;
      std::vector<float> got = readShard(**s, id);
      for (int64_t l = 0; l < elements; ++l)
        if (got[size_t(l)] != value(from, what, l)) {
          std::fprintf(stderr, "rank %lld: %s[%lld] = %g, expected %g\n",
                       static_cast<long long>(rank), id,
                       static_cast<long long>(l), double(got[size_t(l)]),
                       double(value(from, what, l)));
          _exit(1);
        }
    }
    if (auto ok = (*s)->close(); !ok)
      _exit(1);
    _exit(0);
  }
  int failed = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  std::filesystem::remove_all(tmpl);
  if (failed)
    std::fprintf(stderr,
                 "FAILED: pipeline chain of %lld stages, %lld "
                 "elements\n",
                 static_cast<long long>(world),
                 static_cast<long long>(elements));
  return failed;
}

} // namespace

int main(int argc, char **argv) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--device" && i + 1 < argc && std::string(argv[i + 1]) == "host") {
      onHostDevice = true;
      ++i;
    } else {
      std::fprintf(stderr, "usage: RuntimeCollectiveSweep [--device host]\n");
      return 2;
    }
  }
  std::vector<Case> cases;
  auto add = [&](std::string mesh, std::vector<int64_t> shape,
                 std::vector<std::pair<std::string, std::string>> pairs) {
    for (auto &[a, b] : pairs)
      cases.push_back({mesh, shape, a, b});
  };
  for (std::vector<int64_t> shape :
       {std::vector<int64_t>{7, 5}, {6, 4}, {2, 3}, {9, 1}})
    for (const char *mesh : {"x=2", "x=3", "x=4"})
      add(mesh, shape,
          {{"[{x}, {}]", "[{}, {}]"},
           {"[{}, {}] partial(sum)={x}", "[{x}, {}]"},
           {"[{}, {}] partial(sum)={x}", "[{}, {}]"},
           {"[{}, {}] partial(max)={x}", "[{}, {}]"},
           {"[{x}, {}]", "[{}, {x}]"},
           {"[{}, {x}]", "[{}, {}]"}});
  for (std::vector<int64_t> shape :
       {std::vector<int64_t>{7, 5}, {8, 6}, {3, 2}})
    for (const char *mesh : {"x=2,y=2", "x=2,y=3", "x=3,y=2"})
      add(mesh, shape,
          {{"[{x, y}, {}]", "[{}, {}]"},
           {"[{x}, {y}]", "[{}, {}]"},
           {"[{x}, {y}]", "[{y}, {x}]"},
           {"[{x}, {}]", "[{y}, {}]"},
           {"[{x, y}, {}]", "[{y, x}, {}]"},
           {"[{}, {}] partial(sum)={x, y}", "[{x}, {y}]"},
           {"[{x}, {}] partial(sum)={y}", "[{x}, {}]"},
           {"[{(x, y)}, {}]", "[{}, {}]"}});
  int failed = 0, skipped = 0, ran = 0;
  std::string kinds;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case &c = cases[i];
    int before = skipped;
    failed += runCase(c, i % 2 == 1, skipped, kinds) != 0;
    ran += skipped == before;
  }
  std::set<std::string> seen;
  size_t start = 0;
  while (start < kinds.size()) {
    size_t sp = kinds.find(' ', start);
    seen.insert(kinds.substr(start, sp - start));
    start = sp + 1;
  }
  std::string kindList;
  for (const std::string &k : seen)
    kindList += (kindList.empty() ? "" : ", ") + k;
  std::printf("%d cases run on real Gloo%s, every other one from a template "
              "(%d skipped: local slices), collectives used: %s\n",
              ran, onHostDevice ? " through the host device" : "", skipped,
              kindList.c_str());
  std::printf("%d passed, %d failed\n", ran - failed, failed);
  // Point to point: chains of 2 and 4 stages, small and 1 MiB messages.
  int chainsFailed = 0;
  for (int64_t world : {2, 4})
    for (int64_t elements : {int64_t(5), int64_t(1) << 18})
      chainsFailed += runPipelineChain(world, elements) != 0;
  std::printf("pipeline send/recv chains: %d passed, %d failed\n",
              4 - chainsFailed, chainsFailed);
  return failed || chainsFailed ? 1 : 0;
}

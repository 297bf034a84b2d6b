//===- bench-runtime-collectives.cpp - The runtime's collectives vs raw Gloo
//===//
//
// 4 processes (forked here) on one Gloo FileStore. For each collective
// (all_gather, reduce_scatter, all_reduce; float32) and each tensor size from
// 4 KiB to 64 MiB, rank 0 times, alternately in the same run:
//   runtime: Session::step() of a one-instruction plan (binding, buffer
//            checks, packing and the collective through the Gloo backend);
//   raw:     Gloo's own algorithm on the runtime communicator's own Gloo
//            context (the same connections):
//            gloo::allgather, gloo::allreduce (ring), and the
//            ReduceScatterHalvingDoubling algorithm.
// Each measurement is a batch of back-to-back calls (about 128 MiB of tensor,
// 4..64 calls); it prints the median time per call over the batches and
// runtime / raw; PASS when every ratio is <= 1.10.
//
// Not a Google Benchmark program: the four processes must issue the same
// collectives in the same order, which the library's adaptive iteration
// counts and random interleaving would break; batches are fixed and
// alternate runtime and raw so that load from the machine hits both alike.
//
//   build/bin/bench-runtime-collectives [--reps N] [--reduction-order key|gloo]
//                                       [--only
//                                       all_gather|reduce_scatter|all_reduce]
//                                       [--from-kib K]
//
//===----------------------------------------------------------------------===//

#include "meshplan/Runtime/Session.h"

#include "ForkedRanks.h"

#include "../runtime/lib/Backends/Gloo/GlooBackend.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/reduce_scatter.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

using namespace meshplan;
using namespace meshplan::runtime;
namespace pl = meshplan::plan;

namespace {

constexpr int kRanks = 4;

enum class Op { AllGather, ReduceScatter, AllReduce };
const char *opName(Op op) {
  return op == Op::AllGather       ? "all_gather"
         : op == Op::ReduceScatter ? "reduce_scatter"
                                   : "all_reduce";
}

/// One rank's plan with a single collective on a float32 tensor of n
/// elements over dp (n divisible by 4).
pl::Plan onePlan(Op op, int64_t n, int64_t rank) {
  pl::Plan p;
  p.mesh.axes = {MeshAxis{"dp", kRanks, false}};
  p.rank = rank;
  std::vector<int64_t> all = {0, 1, 2, 3};
  p.communicators.push_back({"dp", all, 0, rank, {"dp"}, "slice(dp)", false});
  int64_t shard = n / kRanks;
  std::vector<int64_t> g = {n};
  pl::Buffer whole{"whole",
                   pl::BufferKind::OptimizerState,
                   pl::DType::Float32,
                   g,
                   g,
                   {0},
                   "[{}]",
                   "",
                   {},
                   {}};
  pl::Buffer part{"part",
                  pl::BufferKind::OptimizerState,
                  pl::DType::Float32,
                  g,
                  {shard},
                  {rank * shard},
                  "[{dp}]",
                  "",
                  {},
                  {}};
  pl::Instruction in;
  in.id = "c";
  in.stream = "comm";
  in.comm = "dp";
  in.dtype = pl::DType::Float32;
  if (op == Op::AllGather) {
    in.op = pl::OpKind::AllGather;
    in.count = shard;
    in.inputs = {"part"};
    in.outputs = {"whole"};
  } else if (op == Op::ReduceScatter) {
    whole.layout = "[{}] partial(sum)={dp}";
    in.op = pl::OpKind::ReduceScatter;
    in.count = shard;
    in.reduce = ReduceOp::Sum;
    in.inputs = {"whole"};
    in.outputs = {"part"};
  } else {
    whole.layout = "[{}] partial(sum)={dp}";
    in.op = pl::OpKind::AllReduce;
    in.count = n;
    in.reduce = ReduceOp::Sum;
    in.inputs = {"whole"};
    in.outputs = {"whole"};
  }
  p.buffers = {whole, part};
  p.streams = {"comm"};
  p.program = {in};
  return p;
}

double seconds(std::chrono::steady_clock::time_point a) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - a)
      .count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Reductions in the members' key order (the default) or Gloo's orders.
bool gKeyOrder = true;
/// --only: one collective (by opName); --from-kib: the smallest size.
std::string gOnly;
int64_t gFromBytes = 4 << 10;

int runRank(int rank, const std::string &dir, int reps) {
  SessionOptions o;
  o.keyOrderReductions = gKeyOrder;
  o.rank = rank;
  o.worldSize = kRanks;
  o.store = {StoreAddress::Kind::File, dir, "", 0};
  o.timeout = std::chrono::milliseconds(120000);

  bool pass = true;
  if (rank == 0)
    std::printf("reductions in %s\n",
                gKeyOrder
                    ? "the members' key order (MESHPLAN_REDUCTION_ORDER=key)"
                    : "Gloo's orders (MESHPLAN_REDUCTION_ORDER=gloo)");
  if (rank == 0)
    std::printf("%-15s %10s %12s %12s %8s\n", "collective", "tensor",
                "runtime ms", "raw Gloo ms", "ratio");
  int jobs = 0;
  std::vector<std::unique_ptr<Session>> keep;
  for (Op op : {Op::AllGather, Op::ReduceScatter, Op::AllReduce}) {
    if (!gOnly.empty() && gOnly != opName(op))
      continue;
    for (int64_t bytes = 4 << 10; bytes <= (64 << 20); bytes *= 4) {
      if (bytes < gFromBytes)
        continue;
      int64_t n = bytes / 4;
      o.job = "s" + std::to_string(jobs++);
      auto s = Session::open(onePlan(op, n, rank), o);
      if (!s) {
        std::fprintf(stderr, "rank %d: %s\n", rank, s.error().message.c_str());
        return 1;
      }
      // Sessions stay open until the end: tearing one down closes its
      // connections while the next is measured.
      keep.push_back(std::move(*s));
      Session *session = keep.back().get();
      // Raw Gloo runs on the very context (the same connections) the
      // runtime's communicator uses.
      auto comm = session->planCommunicator("dp");
      if (!comm) {
        std::fprintf(stderr, "rank %d: %s\n", rank,
                     comm.error().message.c_str());
        return 1;
      }
      std::shared_ptr<gloo::Context> context = glooContextOf(**comm);
      for (TensorView &t : session->optimizerState())
        std::fill(t.as<float>().begin(), t.as<float>().end(), 1.0f);
      std::vector<float> whole(size_t(n), 1.0f), part(size_t(n / kRanks), 1.0f);
      auto raw = [&] {
        if (op == Op::AllGather) {
          gloo::AllgatherOptions opts(context);
          opts.setInput(part.data(), part.size());
          opts.setOutput(whole.data(), whole.size());
          gloo::allgather(opts);
        } else if (op == Op::AllReduce) {
          gloo::AllreduceOptions opts(context);
          opts.setOutput(whole.data(), whole.size());
          opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
          opts.setReduceFunction(
              static_cast<void (*)(void *, const void *, const void *, size_t)>(
                  &gloo::sum<float>));
          gloo::allreduce(opts);
        } else {
          std::vector<int> counts(kRanks, int(n / kRanks));
          gloo::ReduceScatterHalvingDoubling<float> algo(
              context, {whole.data()}, int(n), counts);
          algo.run();
        }
      };
      // Batches of back-to-back calls (about 128 MiB of tensor per batch, at
      // least 4 calls), timed per call: steady-state throughput, in which a
      // sleeping transport thread's wake-up at a batch's start does not
      // dominate, and a batch of the largest sizes long enough (0.2-0.4 s)
      // that the scheduler's noise on an oversubscribed machine averages
      // out (one call per batch gave ratios of 0.66-1.19 between two runs of
      // the same algorithm).
      int batch = int(std::clamp<int64_t>((128 << 20) / bytes, 4, 64));
      // A barrier before each batch, so that every rank starts it together.
      auto barrier = [&] {
        gloo::BarrierOptions opts(context);
        gloo::barrier(opts);
      };
      // Warm-up, a batch of each: creates the runtime's communicator, touches
      // the pages, and lets fresh TCP connections reach their steady state
      // (their first few dozen small messages are several times slower).
      for (int j = 0; j < std::max(batch, 32); ++j) {
        if (auto ok = session->step(); !ok) {
          std::fprintf(stderr, "rank %d: %s\n", rank,
                       ok.error().message.c_str());
          return 1;
        }
        raw();
      }
      std::vector<double> tRuntime, tRaw;
      auto runtimeBatch = [&]() -> bool {
        barrier();
        auto a = std::chrono::steady_clock::now();
        for (int j = 0; j < batch; ++j)
          if (auto ok = session->step(); !ok) {
            std::fprintf(stderr, "rank %d: %s\n", rank,
                         ok.error().message.c_str());
            return false;
          }
        tRuntime.push_back(seconds(a) / batch);
        return true;
      };
      auto rawBatch = [&] {
        barrier();
        auto a = std::chrono::steady_clock::now();
        for (int j = 0; j < batch; ++j)
          raw();
        tRaw.push_back(seconds(a) / batch);
      };
      // Alternate which goes first, so that neither always follows the
      // other's traffic.
      for (int i = 0; i < reps; ++i) {
        if (i % 2 == 0) {
          if (!runtimeBatch())
            return 1;
          rawBatch();
        } else {
          rawBatch();
          if (!runtimeBatch())
            return 1;
        }
      }
      double mr = median(tRuntime), mg = median(tRaw);
      double ratio = mr / mg;
      if (ratio > 1.10)
        pass = false;
      if (rank == 0) {
        char size[32];
        if (bytes >= (1 << 20))
          std::snprintf(size, sizeof size, "%lld MiB",
                        static_cast<long long>(bytes >> 20));
        else
          std::snprintf(size, sizeof size, "%lld KiB",
                        static_cast<long long>(bytes >> 10));
        std::printf("%-15s %10s %12.3f %12.3f %7.2f\n", opName(op), size,
                    mr * 1e3, mg * 1e3, ratio);
      }
    }
  }
  if (rank == 0)
    std::printf("%s: runtime / raw Gloo <= 1.10 for every collective and size "
                "above (medians, %d ranks)\n",
                pass ? "PASS" : "FAIL", kRanks);
  return pass ? 0 : 3;
}

} // namespace

int main(int argc, char **argv) {
  int reps = 10;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc)
      reps = std::max(3, std::atoi(argv[++i]));
    else if (a == "--reduction-order" && i + 1 < argc &&
             (std::string(argv[i + 1]) == "key" ||
              std::string(argv[i + 1]) == "gloo"))
      gKeyOrder = std::string(argv[++i]) == "key";
    else if (a == "--only" && i + 1 < argc &&
             (std::string(argv[i + 1]) == "all_gather" ||
              std::string(argv[i + 1]) == "reduce_scatter" ||
              std::string(argv[i + 1]) == "all_reduce"))
      gOnly = argv[++i];
    else if (a == "--from-kib" && i + 1 < argc && std::atoll(argv[i + 1]) > 0)
      gFromBytes = std::atoll(argv[++i]) << 10;
    else {
      std::fprintf(stderr,
                   "usage: %s [--reps N] [--reduction-order key|gloo] "
                   "[--only all_gather|reduce_scatter|all_reduce] "
                   "[--from-kib K]\n",
                   argv[0]);
      return 2;
    }
  }
  char tmpl[] = "/tmp/meshplan-bench-collectives-XXXXXX";
  if (!mkdtemp(tmpl)) {
    std::perror("mkdtemp");
    return 1;
  }
  std::string dir = tmpl;
  int rc = bench::runForkedRanks(kRanks,
                                 [&](int r) { return runRank(r, dir, reps); });
  std::filesystem::remove_all(dir);
  return rc;
}

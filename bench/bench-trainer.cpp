//===- bench-trainer.cpp - meshplan-train's speed, measured in one run ----===//
//
// Two figures of the example trainer (docs/trainer.md, docs/performance.md
// section F), each measured side by side in one run:
//
//  1. The single-process forward + backward of the model (examples/trainer/
//     model) against OpenBLAS sgemm on the model's own largest matmul shape:
//     the model's matmul FLOPs over its whole forward + backward time must
//     reach >= 50% of sgemm's throughput (the wide model; tiny is reported).
//  2. meshplan-train on 8 processes (`meshplan run`, Gloo) for tiny and
//     examples/models/wide.json: the runtime's own overhead (step time minus
//     time in callbacks, kernels and collectives) must be <= 5% of the step;
//     the exposed communication is printed beside the plan cost model's
//     estimate with this machine's measured parameters (--cost-model).
//  3. Gradient clipping's and executed-step tracing's cost on the same
//     8-process tiny run: each under 2% of the median step.
//
// Usage: bench-trainer [Google Benchmark flags]   (run from anywhere; the
// paths of the build and the sources are compiled in)
//
//===----------------------------------------------------------------------===//

#include "model/Llama.h"

#include <benchmark/benchmark.h>
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <regex>
#include <string>
#include <unistd.h>
#include <vector>

using namespace meshplan;
using namespace meshplan::trainer;

namespace {

struct ModelCase {
  const char *name;
  LlamaConfig config;
  MicrobatchShape shape;
};

const ModelCase kCases[] = {
    {"tiny", {64, 2, 4, 2, 128, 256}, {4, 64}},
    {"wide", {512, 4, 8, 4, 1536, 256}, {4, 256}},
};

/// Whole-model weights and gradients, random.
struct Weights {
  std::vector<std::vector<float>> w, g;
  float *add(size_t n, std::mt19937 &rng, float scale) {
    std::normal_distribution<float> d(0.0f, scale);
    w.emplace_back(n);
    for (float &x : w.back())
      x = d(rng);
    g.emplace_back(n, 0.0f);
    return w.back().data();
  }
};

struct Run {
  double seconds = 0, flops = 0, sgemmSeconds = 0;
};

/// One forward + backward of a microbatch.
Run forwardBackward(const ModelCase &c, bool bf16) {
  const LlamaConfig &cfg = c.config;
  std::mt19937 rng(1);
  Weights W;
  W.w.reserve(64);
  W.g.reserve(64);
  int64_t d = cfg.dim, hd = cfg.headDim();
  size_t dd = size_t(d);
  float *emb = W.add(size_t(cfg.vocab) * dd, rng, 1.0f);
  size_t embIndex = W.w.size() - 1;
  std::vector<BlockWeights> blocks;
  std::vector<BlockGrads> grads;
  for (int64_t l = 0; l < cfg.nLayers; ++l) {
    BlockWeights b;
    BlockGrads g;
    auto add = [&](size_t n, float s, float *&gp) {
      float *p = W.add(n, rng, s);
      gp = W.g.back().data();
      return p;
    };
    b.attentionNorm = add(dd, 0.0f, g.attentionNorm);
    W.w.back().assign(dd, 1.0f);
    b.wq = add(size_t(cfg.nHeads * hd) * dd, 0.02f, g.wq);
    b.wk = add(size_t(cfg.nKvHeads * hd) * dd, 0.02f, g.wk);
    b.wv = add(size_t(cfg.nKvHeads * hd) * dd, 0.02f, g.wv);
    b.wo = add(size_t(cfg.nHeads * hd) * dd, 0.02f, g.wo);
    b.ffnNorm = add(dd, 0.0f, g.ffnNorm);
    W.w.back().assign(dd, 1.0f);
    b.w1 = add(size_t(cfg.ffnDim) * dd, 0.02f, g.w1);
    b.w3 = add(size_t(cfg.ffnDim) * dd, 0.02f, g.w3);
    b.w2 = add(size_t(cfg.ffnDim) * dd, 0.02f, g.w2);
    blocks.push_back(b);
    grads.push_back(g);
  }
  float *norm = W.add(dd, rng, 0.0f);
  W.w.back().assign(dd, 1.0f);
  size_t normIndex = W.w.size() - 1;
  float *out = W.add(size_t(cfg.vocab) * dd, rng, 0.05f);
  size_t outIndex = W.w.size() - 1;

  int64_t n = c.shape.batch * c.shape.seqLen;
  std::vector<int32_t> tokens(static_cast<size_t>(n)),
      targets(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    tokens[size_t(i)] = int32_t(rng() % uint32_t(cfg.vocab));
    targets[size_t(i)] = int32_t(rng() % uint32_t(cfg.vocab));
  }
  SoloTpGroup solo;
  ModelOptions options;
  options.bf16Matmul = bf16;
  Microbatch mb(cfg, TpShard::whole(cfg), c.shape, options, solo);
  auto check = [](Result<void> ok) {
    if (!ok) {
      std::fprintf(stderr, "bench-trainer: %s\n", ok.error().message.c_str());
      std::exit(1);
    }
  };
  auto start = std::chrono::steady_clock::now();
  check(mb.setData(tokens, targets));
  check(mb.forwardEmbedding(emb));
  for (int64_t l = 0; l < cfg.nLayers; ++l)
    check(mb.forwardBlock(l, blocks[size_t(l)]));
  check(mb.forwardFinalNorm(norm));
  auto loss = mb.forwardOutput(out);
  if (!loss)
    check(loss.error());
  check(mb.backwardOutput(out, 1.0f, W.g[outIndex].data()));
  check(mb.backwardFinalNorm(norm, W.g[normIndex].data()));
  for (int64_t l = cfg.nLayers - 1; l >= 0; --l)
    check(mb.backwardBlock(l, blocks[size_t(l)], grads[size_t(l)]));
  check(mb.backwardEmbedding(W.g[embIndex].data()));
  Run r;
  r.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  r.flops = mb.matmulFlops();
  r.sgemmSeconds = mb.matmulSeconds();
  return r;
}

/// sgemm on the model's largest matmul: [tokens, dim] x [dim, ffn].
double sgemmFlopsPerSecond(const ModelCase &c) {
  int64_t m = c.shape.batch * c.shape.seqLen, k = c.config.dim,
          n = c.config.ffnDim;
  std::vector<float> a(size_t(m * k), 0.5f), b(size_t(k * n), 0.25f),
      out(size_t(m * n));
  auto start = std::chrono::steady_clock::now();
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(m), int(n), int(k),
              1.0f, a.data(), int(k), b.data(), int(k), 0.0f, out.data(),
              int(n));
  double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  return 2.0 * double(m) * double(n) * double(k) / s;
}

std::vector<double> gSgemm[2], gModel[2], gModelMatmul[2];

void BM_Sgemm(benchmark::State &state) {
  const ModelCase &c = kCases[state.range(0)];
  for (auto _ : state) {
    double f = sgemmFlopsPerSecond(c);
    gSgemm[state.range(0)].push_back(f);
    state.counters["GFLOP/s"] = f * 1e-9;
  }
}

void BM_ForwardBackward(benchmark::State &state) {
  const ModelCase &c = kCases[state.range(0)];
  for (auto _ : state) {
    Run r = forwardBackward(c, false);
    gModel[state.range(0)].push_back(r.flops / r.seconds);
    gModelMatmul[state.range(0)].push_back(r.flops / r.sgemmSeconds);
    state.counters["GFLOP/s"] = r.flops / r.seconds * 1e-9;
    state.counters["matmul share"] = r.sgemmSeconds / r.seconds;
  }
}

double median(std::vector<double> v) {
  if (v.empty())
    return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Runs meshplan-train on 8 processes and returns its summary lines.
std::string runTrainer(const std::string &model, const std::string &extra,
                       const std::string &spec = MESHPLAN_SOURCE_DIR
                       "/examples/specs/fsdp-fp8-3d.json") {
  std::string bin = MESHPLAN_BINARY_DIR "/bin/";
  std::string cmd = bin + "meshplan run -n 8 -- " + bin +
                    "meshplan-train --spec " + spec + " --model " + model +
                    " --cost-model --log-every 1000 " + extra + " 2>&1";
  std::printf("$ %s\n", cmd.c_str());
  std::fflush(stdout);
  FILE *p = popen(cmd.c_str(), "r");
  if (!p)
    return "";
  std::string out;
  char buf[4096];
  while (fgets(buf, sizeof buf, p))
    out += buf;
  int status = pclose(p);
  if (status != 0) {
    std::printf("%s\nbench-trainer: the run failed\n", out.c_str());
    return "";
  }
  std::string lines;
  size_t at = 0;
  while (at < out.size()) {
    size_t end = out.find('\n', at);
    std::string line = out.substr(at, end - at);
    if (line.find("summary") != std::string::npos ||
        line.find("cost model") != std::string::npos ||
        line.find("gradient clipping") != std::string::npos ||
        line.find("trace recording") != std::string::npos)
      lines += line + "\n";
    if (end == std::string::npos)
      break;
    at = end + 1;
  }
  return lines;
}

} // namespace

BENCHMARK(BM_Sgemm)->Arg(0)->Arg(1)->Iterations(1)->Repetitions(5);
BENCHMARK(BM_ForwardBackward)->Arg(0)->Arg(1)->Iterations(1)->Repetitions(5);

int main(int argc, char **argv) {
  openblas_set_num_threads(1);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();

  bool pass = true;
  std::printf("\nsingle process, one BLAS thread (medians of 5):\n");
  for (int i = 0; i < 2; ++i) {
    double s = median(gSgemm[i]), m = median(gModel[i]),
           mm = median(gModelMatmul[i]);
    bool target = i == 1;
    bool ok = m >= 0.5 * s;
    std::printf("  %-5s sgemm %.1f GFLOP/s on [%lld x %lld] x [%lld x %lld]; "
                "forward + backward %.1f GFLOP/s of matmul work over its "
                "whole time = %.2f of sgemm (matmuls alone %.2f)%s\n",
                kCases[i].name, s * 1e-9,
                (long long)(kCases[i].shape.batch * kCases[i].shape.seqLen),
                (long long)kCases[i].config.dim,
                (long long)kCases[i].config.dim,
                (long long)kCases[i].config.ffnDim, m * 1e-9, m / s, mm / s,
                target ? (ok ? "  [>= 0.50: PASS]" : "  [>= 0.50: FAIL]") : "");
    if (target)
      pass &= ok;
  }

  std::printf("\n8 processes (meshplan run, Gloo; 2 cores on CI):\n");
  struct Step {
    const char *model, *extra;
  } steps[] = {{"tiny", "--steps 20"},
               {MESHPLAN_SOURCE_DIR "/examples/models/wide.json",
                "--steps 5 --batch 1 --seq-len 128"}};
  std::regex overhead(
      R"(runtime overhead ([0-9.]+) ms \(([0-9.]+)% of the step\))");
  for (const Step &s : steps) {
    std::string lines = runTrainer(s.model, s.extra);
    std::printf("%s", lines.c_str());
    std::smatch m;
    if (!std::regex_search(lines, m, overhead)) {
      std::printf("  no summary: FAIL\n");
      pass = false;
      continue;
    }
    double percent = std::stod(m[2]);
    bool ok = percent <= 5.0;
    std::printf("  runtime overhead %.2f%% of the median step [<= 5%%: %s]\n",
                percent, ok ? "PASS" : "FAIL");
    pass &= ok;
  }
  // Gradient clipping's cost (docs/trainer.md, "The optimizer step"): the
  // same 8-process tiny run with the recipe of trainer.optimizer-step
  // (clipping every step); its norm, all-reduce and scale against the
  // step, measured in the same run. Target: under 2%.
  {
    std::string lines = runTrainer("tiny", "--steps 20",
                                   MESHPLAN_SOURCE_DIR
                                   "/test/trainer/specs/clip-fsdp-fp8-3d.json");
    std::printf("%s", lines.c_str());
    std::smatch m;
    std::regex clipping(
        R"(gradient clipping: median ([0-9.]+) ms per step .* = ([0-9.]+)% of the median step)");
    if (!std::regex_search(lines, m, clipping)) {
      std::printf("  no clipping figure: FAIL\n");
      pass = false;
    } else {
      double percent = std::stod(m[2]);
      bool ok = percent < 2.0;
      std::printf("  gradient clipping %.2f%% of the median step [< 2%%: %s]\n",
                  percent, ok ? "PASS" : "FAIL");
      pass &= ok;
    }
  }
  // Executed-step traces (docs/observability.md): the same 8-process tiny
  // run recording steps 2..20 (copying every traced step's times, then
  // writing the file); the recording's time against the step, measured in
  // the same run. Target: under 2%.
  {
    char dir[] = "/tmp/meshplan-bench-trace-XXXXXX";
    std::string traceDir = mkdtemp(dir) ? dir : "/tmp/meshplan-bench-trace";
    std::string lines = runTrainer(
        "tiny", "--steps 20 --trace " + traceDir + " --trace-steps 2:20",
        MESHPLAN_SOURCE_DIR "/examples/specs/fsdp-tp.json");
    std::printf("%s", lines.c_str());
    std::smatch m;
    std::regex recording(
        R"(trace recording: .* = ([0-9.]+)% of the median step)");
    if (!std::regex_search(lines, m, recording)) {
      std::printf("  no trace-recording figure: FAIL\n");
      pass = false;
    } else {
      double percent = std::stod(m[1]);
      bool ok = percent < 2.0;
      std::printf("  trace recording %.3f%% of the median step [< 2%%: %s]\n",
                  percent, ok ? "PASS" : "FAIL");
      pass &= ok;
    }
    std::string rm = "rm -rf " + traceDir;
    (void)std::system(rm.c_str());
  }
  std::printf("\nbench-trainer: %s\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}

//===- StepCheck.cpp - One rank of a multi-process plan execution test ----===//
//
// Started once per rank (by `meshplan run`), this program executes its rank's
// plan for a few steps on real Gloo with deterministic synthetic compute and
// checks, after every step, every parameter shard and optimizer state against
// a single-process reference computed on whole tensors in the same process:
//
//   init      W[g] = bf16-representable dyadic value of (tensor id, g)
//   forward   checks the parameters it reads, bit for bit, against the
//             reference's whole tensor cast the way the plan casts it (bf16,
//             or float8 with the scale of the whole tensor's amax)
//   backward  adds q(w_seen) + h(g, step, d, microbatch, row) to each
//             gradient element: small dyadic numbers, so every sum is exact
//             and the check can be bit-exact; d is the rank's data-parallel
//             index (replicate axes, then shard axes), row the TP row of a
//             stacked sequence-parallel gradient
//   reference G = mean over replicas of the mean over shards of the sum over
//             microbatches and rows (the plan's avg-then-avg,
//             docs/semantics.md) then AdamW (fp32, or bf16 with stochastic
//             rounding) per tensor
//
// Usage: runtime-step-check --plans DIR [--replicate a,b] [--shard c]
//                           [--steps N] [--tp AXIS] [--device host|cuda]
//                           [--probe]
// With --device the plan runs on a device (docs/cuda.md, "Executor on
// devices"): `host`, the host device (streams as threads; every machine), or
// `cuda`, the rank's GPU (CUDA builds; exits 77 without a GPU). The checks
// are the same: the callbacks copy their views to the host and back.
// --probe only checks that the device can be had (exit 0, or 77).
// fp32 must agree within 1e-6 relative; bf16 parameters and every gathered
// parameter bit for bit. Exits 0 and prints one line on success.
//
//===----------------------------------------------------------------------===//

#include "meshplan/Core/Mesh.h"
#include "meshplan/Runtime/Kernels.h"
#include "meshplan/Runtime/Session.h"
#if MESHPLAN_HAVE_CUDA
#include "meshplan/Runtime/CudaDevice.h"
#endif

#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

using namespace meshplan;
using namespace meshplan::runtime;
namespace k = meshplan::runtime::kernels;
using plan::DType;

namespace {

struct Args {
  std::string plans;
  std::vector<std::string> replicate, shard;
  int steps = 3;
  /// Failure injection: this rank kills itself (SIGKILL) in the first
  /// backward of this step.
  int64_t killRank = -1, killStep = -1;
  /// --stop: SIGSTOP instead of SIGKILL (a stalled rank, runtime.stall).
  bool stop = false;
  std::string device; ///< "", "host" or "cuda"
  /// Only check that the device can be had (exit 0, or 77 for none).
  bool probe = false;
};

std::vector<std::string> splitList(const std::string &s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size() && !s.empty()) {
    size_t c = s.find(',', start);
    out.push_back(s.substr(start, c == std::string::npos ? c : c - start));
    if (c == std::string::npos)
      break;
    start = c + 1;
  }
  return out;
}

[[noreturn]] void fail(const std::string &message) {
  std::fprintf(stderr, "runtime-step-check: %s\n", message.c_str());
  std::exit(1);
}

uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// Initial value: a multiple of 2^-12 in [-0.06, 0.06] with at most 8
/// significant bits, so it is exact in bf16 and the same in every dtype.
float initValue(int64_t tensorId, int64_t g) {
  int64_t k8 =
      int64_t(mix(uint64_t(tensorId) * 1000003u + uint64_t(g)) % 255) - 127;
  return std::ldexp(static_cast<float>(k8), -11);
}

float contribution(float wSeen, int64_t g, int64_t step, int64_t d, int64_t mb,
                   int64_t row) {
  float q = std::nearbyint(wSeen * 256.0f) / 4096.0f;
  int64_t h = (g * 7 + step * 3 + d * 5 + mb * 11 + row * 13) % 17 - 8;
  return q + static_cast<float>(h) / 4096.0f;
}

float readAs(const std::byte *p, DType dtype, int64_t i, float scale) {
  switch (dtype) {
  case DType::Float32:
    return reinterpret_cast<const float *>(p)[i];
  case DType::BFloat16:
    return k::bf16ToFloat(reinterpret_cast<const uint16_t *>(p)[i]);
  case DType::Float8E4M3:
    return k::fp8ToFloat(reinterpret_cast<const uint8_t *>(p)[i],
                         k::Fp8Format::E4M3FN) /
           scale;
  case DType::Float8E5M2:
    return k::fp8ToFloat(reinterpret_cast<const uint8_t *>(p)[i],
                         k::Fp8Format::E5M2) /
           scale;
  default:
    fail("unexpected dtype");
  }
}

/// The reference model: whole tensors.
struct RefTensor {
  std::string name;
  int64_t id = 0;
  DType dtype = DType::Float32;
  std::vector<int64_t> shape;
  int64_t numel = 0;
  std::vector<float> w, m, v; ///< w holds bf16 values when dtype is bf16
  std::vector<float> before;  ///< w at the start of the current step
  std::vector<float> grad;    ///< this step's reduced gradient
  int64_t stackRows = 1;      ///< sequence-parallel rows (1: not stacked)
};

int64_t numel(const std::vector<int64_t> &s) {
  int64_t n = 1;
  for (int64_t d : s)
    n *= d;
  return n;
}

/// Calls f(local index, global index) over a box.
template <typename F>
void forBox(const std::vector<int64_t> &global, const std::vector<int64_t> &off,
            const std::vector<int64_t> &local, F f) {
  auto runs = k::boxIndexRuns(global, off, local);
  if (!runs)
    fail("bad box");
  for (const k::IndexRun &r : *runs)
    for (int64_t i = 0; i < r.length; ++i)
      f(r.local + i, r.global + i);
}

} // namespace

int main(int argc, char **argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc)
        fail(a + " needs a value");
      return argv[++i];
    };
    if (a == "--plans")
      args.plans = next();
    else if (a == "--replicate")
      args.replicate = splitList(next());
    else if (a == "--shard")
      args.shard = splitList(next());
    else if (a == "--steps")
      args.steps = std::stoi(next());
    else if (a == "--kill-rank")
      args.killRank = std::stoll(next());
    else if (a == "--kill-step")
      args.killStep = std::stoll(next());
    else if (a == "--stop")
      args.stop = true;
    else if (a == "--device")
      args.device = next();
    else if (a == "--probe")
      args.probe = true;
    else
      fail("unknown flag " + a);
  }
  auto options = sessionOptionsFromEnv();
  if (!options)
    fail(options.error().message);
  // 30 s unless the job sets its own (meshplan run --timeout).
  if (!std::getenv("MESHPLAN_TIMEOUT"))
    options->timeout = std::chrono::milliseconds(30000);
  if (args.device == "host") {
    options->device = createHostDevice();
  } else if (args.device == "cuda") {
#if MESHPLAN_HAVE_CUDA
    auto cuda = cudaSessionOptions(*options);
    if (!cuda) {
      std::fprintf(stderr, "runtime-step-check: skipped: %s\n",
                   cuda.error().message.c_str());
      return 77;
    }
    options = std::move(cuda);
#else
    fail("--device cuda: this build has no CUDA backend");
#endif
  } else if (!args.device.empty()) {
    fail("--device " + args.device + ": expected host or cuda");
  }
  if (args.probe) {
    std::printf("runtime-step-check: device %s available\n",
                options->device ? options->device->name().c_str() : "none");
    return 0;
  }
  auto session = Session::openPath(args.plans, *options);
  if (!session)
    fail(session.error().message);
  Session &s = **session;
  const plan::Plan &p = s.plan();

  // The rank's data-parallel index and the group sizes.
  auto mesh = Mesh::create(p.mesh.axes, p.mesh.deviceOrder);
  if (!mesh)
    fail(mesh.error().message);
  auto coordsOr = mesh->coordinate(p.rank);
  if (!coordsOr)
    fail(coordsOr.error().message);
  std::vector<int64_t> coords = *coordsOr;
  int64_t d = 0, replicas = 1, shards = 1;
  auto axisIndex = [&](const std::string &name) {
    auto i = mesh->findAxis(name);
    if (!i)
      fail("no axis " + name);
    return *i;
  };
  for (const std::string &a : args.replicate) {
    int64_t i = axisIndex(a);
    d = d * mesh->axis(i).size + coords[size_t(i)];
    replicas *= mesh->axis(i).size;
  }
  for (const std::string &a : args.shard) {
    int64_t i = axisIndex(a);
    d = d * mesh->axis(i).size + coords[size_t(i)];
    shards *= mesh->axis(i).size;
  }

  // Reference tensors from the plan's parameter buffers.
  std::map<std::string, RefTensor> ref;
  int64_t microbatches = 1;
  bool reducesEveryMicrobatch = false;
  for (const plan::Buffer &b : p.buffers) {
    if (b.kind != plan::BufferKind::ParamShard)
      continue;
    RefTensor t;
    t.name = b.tensor;
    t.id = *b.tensorId;
    t.dtype = b.dtype;
    t.shape = b.globalShape;
    t.numel = numel(b.globalShape);
    t.w.resize(size_t(t.numel));
    for (int64_t g = 0; g < t.numel; ++g)
      t.w[size_t(g)] = initValue(t.id, g);
    t.m.assign(size_t(t.numel), 0.0f);
    t.v.assign(size_t(t.numel), 0.0f);
    ref[t.name] = std::move(t);
  }
  for (const plan::Buffer &b : p.buffers)
    if (b.kind == plan::BufferKind::Gradient && ref.count(b.tensor) &&
        b.globalShape.size() == ref[b.tensor].shape.size() + 1)
      ref[b.tensor].stackRows = b.globalShape[0];
  for (const plan::Instruction &in : p.program) {
    if (in.op == plan::OpKind::Compute)
      microbatches = std::max(microbatches, in.microbatch + 1);
    // "every_microbatch" accumulates reduced shards; "last_microbatch"
    // accumulates in backward and has no accumulate instruction.
    if (in.op == plan::OpKind::Accumulate)
      reducesEveryMicrobatch = true;
  }

  auto init = s.initParameters([&](TensorView &v) -> Result<void> {
    RefTensor &t = ref.at(v.tensor());
    forBox(v.globalShape(), v.offset(), v.localShape(),
           [&](int64_t l, int64_t g) {
             float x = t.w[size_t(g)];
             if (v.dtype() == DType::BFloat16)
               v.as<uint16_t>()[size_t(l)] = k::floatToBf16(x);
             else
               v.as<float>()[size_t(l)] = x;
           });
    return {};
  });
  if (!init)
    fail(init.error().message);

  int64_t checkedParams = 0, trainerChecks = 0, lastTrainerStep = 0;
  // One float all-reduced on a trainer communicator: a device one (NCCL)
  // takes device memory.
  auto allReduceOne = [&](Communicator &c, float &x,
                          DeviceStream stream) -> Result<void> {
    if (c.memoryKind() == MemoryKind::Host)
      return c.allReduce(&x, 1, DType::Float32, ReduceOp::Sum);
    Device &dev = *s.device();
    auto p = dev.allocate(sizeof(float));
    if (!p)
      return p.error();
    Result<void> ok = [&]() -> Result<void> {
      MESHPLAN_TRY(dev.copyFromHost(*p, &x, sizeof x, stream));
      MESHPLAN_TRY(c.setStream(stream));
      MESHPLAN_TRY(c.allReduce(*p, 1, DType::Float32, ReduceOp::Sum));
      MESHPLAN_TRY(c.synchronize());
      MESHPLAN_TRY(dev.copyToHost(&x, *p, sizeof x, stream));
      return dev.synchronize(stream);
    }();
    dev.release(*p);
    return ok;
  };
  auto check = [&](ComputeCall &call) -> Result<void> {
    // Once a step, in its first callback (the same on every rank): a
    // collective of the trainer's own on each trainer_<axis> communicator.
    if (call.step != lastTrainerStep) {
      lastTrainerStep = call.step;
      for (const plan::Communicator &c : p.communicators) {
        if (!c.id.starts_with("trainer_"))
          continue;
        auto comm = call.session->trainerCommunicator(c.id);
        if (!comm)
          return comm.error();
        float x = static_cast<float>(p.rank + 1), want = 0;
        for (int64_t r : c.ranks)
          want += static_cast<float>(r + 1);
        MESHPLAN_TRY(allReduceOne(**comm, x, call.stream));
        if (x != want)
          return makeError(c.id + ": the trainer's all-reduce gave " +
                           std::to_string(x) + ", expected " +
                           std::to_string(want));
        ++trainerChecks;
      }
    }
    if (call.phase == "backward" && call.step == args.killStep &&
        p.rank == args.killRank)
      std::raise(args.stop ? SIGSTOP : SIGKILL);
    // What the callback reads must be the reference's whole tensor, cast as
    // the plan casts it, bit for bit.
    std::map<std::string, const TensorView *> seen;
    for (const TensorView &v : call.params) {
      RefTensor &t = ref.at(v.tensor());
      const std::vector<float> &w = t.before;
      float scale = v.scale.value_or(1.0f);
      if (v.scale) {
        float amax = 0;
        for (float x : w)
          amax = std::max(amax, std::fabs(x));
        float expected = k::fp8ScaleFromAmax(amax,
                                             v.dtype() == DType::Float8E4M3
                                                 ? k::Fp8Format::E4M3FN
                                                 : k::Fp8Format::E5M2,
                                             v.buffer->scale->powerOf2);
        if (std::memcmp(&expected, &scale, 4) != 0)
          return makeError(v.id() + ": scale " + std::to_string(scale) +
                           ", expected " + std::to_string(expected));
      }
      std::string bad;
      forBox(v.globalShape(), v.offset(), v.localShape(),
             [&](int64_t l, int64_t g) {
               if (!bad.empty())
                 return;
               float x = w[size_t(g)];
               float want = x,
                     got = readAs(v.bytes.data(), v.dtype(), l, scale);
               if (v.dtype() == DType::BFloat16)
                 want = k::bf16ToFloat(k::floatToBf16(x));
               else if (v.dtype() == DType::Float8E4M3 ||
                        v.dtype() == DType::Float8E5M2) {
                 auto f = v.dtype() == DType::Float8E4M3 ? k::Fp8Format::E4M3FN
                                                         : k::Fp8Format::E5M2;
                 want = k::fp8ToFloat(k::floatToFp8(x * scale, f), f) / scale;
               }
               if (std::memcmp(&want, &got, 4) != 0)
                 bad = v.id() + "[" + std::to_string(g) +
                       "] = " + std::to_string(got) + ", expected " +
                       std::to_string(want);
             });
      if (!bad.empty())
        return makeError("step " + std::to_string(call.step) + " " +
                         call.phase + " " + call.unit + ": " + bad);
      ++checkedParams;
      seen[v.tensor()] = &v;
    }
    for (TensorView &gview : call.grads) {
      RefTensor &t = ref.at(gview.tensor());
      auto it = seen.find(gview.tensor());
      if (it == seen.end())
        return makeError("backward writes " + gview.id() +
                         " but reads no parameter of it");
      const TensorView &pv = *it->second;
      float scale = pv.scale.value_or(1.0f);
      // Parameter value as the callback saw it, by global index.
      std::vector<int64_t> paramShape = t.shape;
      bool stacked = t.stackRows > 1;
      forBox(gview.globalShape(), gview.offset(), gview.localShape(),
             [&](int64_t l, int64_t g) {
               int64_t row = stacked ? g / t.numel : 0;
               int64_t pg = stacked ? g % t.numel : g;
               // Find pg inside the parameter view's box.
               int64_t rem = pg, local = 0, stride = 1;
               std::vector<int64_t> idx(paramShape.size());
               for (size_t dd = paramShape.size(); dd-- > 0;) {
                 idx[dd] = rem % paramShape[dd];
                 rem /= paramShape[dd];
               }
               for (size_t dd = paramShape.size(); dd-- > 0;) {
                 local += (idx[dd] - pv.offset()[dd]) * stride;
                 stride *= pv.localShape()[dd];
               }
               float w = readAs(pv.bytes.data(), pv.dtype(), local, scale);
               gview.as<float>()[size_t(l)] +=
                   contribution(w, pg, call.step, d, call.microbatch, row);
             });
    }
    return {};
  };
  // On a device the checks and the synthetic gradients run on host copies
  // (a trainer would enqueue kernels on call.stream instead).
  s.onCompute([&](ComputeCall &call) { return s.computeOnHost(call, check); });

  for (int step = 1; step <= args.steps; ++step) {
    // The reference step on whole tensors.
    for (auto &[name, t] : ref) {
      t.before = t.w;
      std::vector<float> seenW(t.w.size());
      // What every rank's callback sees: the same cast for all ranks, which
      // the forward check enforces; find the dtype from a gathered buffer.
      DType seenType = t.dtype;
      std::optional<plan::Fp8Scale> scaleInfo;
      for (const plan::Buffer &b : p.buffers)
        if (b.tensor == name && b.kind == plan::BufferKind::Gathered) {
          seenType = b.dtype;
          scaleInfo = b.scale;
        }
      float scale = 1.0f;
      if (scaleInfo) {
        float amax = 0;
        for (float x : t.w)
          amax = std::max(amax, std::fabs(x));
        scale = k::fp8ScaleFromAmax(amax,
                                    seenType == DType::Float8E4M3
                                        ? k::Fp8Format::E4M3FN
                                        : k::Fp8Format::E5M2,
                                    scaleInfo->powerOf2);
      }
      for (size_t g = 0; g < t.w.size(); ++g) {
        float x = t.w[g];
        if (seenType == DType::BFloat16)
          x = k::bf16ToFloat(k::floatToBf16(x));
        else if (seenType == DType::Float8E4M3 ||
                 seenType == DType::Float8E5M2) {
          auto f = seenType == DType::Float8E4M3 ? k::Fp8Format::E4M3FN
                                                 : k::Fp8Format::E5M2;
          x = k::fp8ToFloat(k::floatToFp8(x * scale, f), f) / scale;
        }
        seenW[g] = x;
      }
      // The plan's order: per TP row of a stacked gradient, the sum over
      // microbatches, the mean over shards (with "every_microbatch": the
      // mean over shards of each microbatch, then their sum), the mean over
      // replicas; then the sum of the rows.
      std::vector<float> acc(t.w.size(), 0.0f);
      for (int64_t row = 0; row < t.stackRows; ++row) {
        std::vector<float> replicaSum(t.w.size(), 0.0f);
        for (int64_t r = 0; r < replicas; ++r) {
          std::vector<float> shardSum(t.w.size(), 0.0f);
          if (reducesEveryMicrobatch) {
            // Each microbatch's mean over shards, accumulated.
            for (int64_t mb = 0; mb < microbatches; ++mb) {
              std::vector<float> mbSum(t.w.size(), 0.0f);
              for (int64_t sh = 0; sh < shards; ++sh)
                for (size_t g = 0; g < t.w.size(); ++g)
                  mbSum[g] += contribution(seenW[g], int64_t(g), step,
                                           r * shards + sh, mb, row);
              for (size_t g = 0; g < t.w.size(); ++g)
                shardSum[g] += mbSum[g] / static_cast<float>(shards);
            }
            for (size_t g = 0; g < t.w.size(); ++g)
              replicaSum[g] += shardSum[g];
            continue;
          }
          for (int64_t sh = 0; sh < shards; ++sh)
            for (size_t g = 0; g < t.w.size(); ++g) {
              float sum = 0;
              for (int64_t mb = 0; mb < microbatches; ++mb)
                sum += contribution(seenW[g], int64_t(g), step, r * shards + sh,
                                    mb, row);
              shardSum[g] += sum;
            }
          for (size_t g = 0; g < t.w.size(); ++g)
            replicaSum[g] += shardSum[g] / static_cast<float>(shards);
        }
        for (size_t g = 0; g < t.w.size(); ++g)
          acc[g] += replicaSum[g] / static_cast<float>(replicas);
      }
      const plan::OptimizerConfig &o = *p.optimizer;
      k::AdamWParams hp{o.lr, o.beta1, o.beta2, o.eps, o.weightDecay};
      if (t.dtype == DType::BFloat16) {
        std::vector<uint16_t> bits(t.w.size());
        for (size_t g = 0; g < t.w.size(); ++g)
          bits[g] = k::floatToBf16(t.w[g]);
        std::vector<k::IndexRun> runs{{0, 0, t.numel}};
        k::adamwBf16StochasticRounding(bits, acc, t.m, t.v, hp, step,
                                       uint64_t(o.seed), uint64_t(t.id), runs);
        for (size_t g = 0; g < t.w.size(); ++g)
          t.w[g] = k::bf16ToFloat(bits[g]);
      } else {
        k::adamwFp32(t.w, acc, t.m, t.v, hp, step);
      }
    }

    auto ok = s.step();
    if (!ok)
      fail(ok.error().message);
    // The executor wakes a stream's thread only once its instruction can
    // run (docs/runtime.md, "Waking only the stream that can run"); waking
    // every stream on every completion would count about one per
    // instruction and waiting stream. Allow a few spurious wake-ups.
    if (int64_t woke = s.lastStepProfile().needlessWakeups,
        allowed = 2 + int64_t(p.program.size()) / 20;
        woke > allowed)
      fail("rank " + std::to_string(p.rank) + " step " + std::to_string(step) +
           ": " + std::to_string(woke) +
           " needless wake-ups of stream threads (at most " +
           std::to_string(allowed) + ")");
    // Each instruction became ready when everything it waited for had
    // ended (StepProfile::instructionReady), and started after that.
    {
      const StepProfile &prof = s.lastStepProfile();
      std::map<std::string, size_t> index;
      std::map<std::string, double> lastEnd; // per stream
      for (size_t i = 0; i < p.program.size(); ++i) {
        const plan::Instruction &in = p.program[i];
        index[in.id] = i;
        double ready = prof.instructionReady.at(i), waited = lastEnd[in.stream];
        for (const std::string &d : in.deps)
          waited = std::max(waited, prof.instructionEnd.at(index.at(d)));
        if (ready < waited || ready > prof.instructionStart.at(i))
          fail("rank " + std::to_string(p.rank) + " step " +
               std::to_string(step) + ": instruction \"" + in.id +
               "\" ready at " + std::to_string(ready) + " s, but what it " +
               "waits for ended at " + std::to_string(waited) +
               " s and it started at " +
               std::to_string(prof.instructionStart.at(i)) + " s");
        lastEnd[in.stream] = prof.instructionEnd.at(i);
      }
    }

    // Compare every persistent shard.
    auto compare = [&](const TensorView &device,
                       const std::vector<float> &whole, bool exact) {
      // The shard's bytes on the host (a copy from the device, if any).
      std::vector<std::byte> bytes(device.bytes.size());
      if (auto ok = s.copyOut(device, bytes); !ok)
        fail(ok.error().message);
      TensorView v = device;
      v.bytes = bytes;
      std::string bad;
      forBox(v.globalShape(), v.offset(), v.localShape(),
             [&](int64_t l, int64_t g) {
               if (!bad.empty())
                 return;
               float got = readAs(v.bytes.data(), v.dtype(), l, 1.0f);
               float want = whole[size_t(g)];
               bool same = exact ? std::memcmp(&got, &want, 4) == 0
                                 : std::fabs(got - want) <=
                                       1e-6f * std::max(std::fabs(got),
                                                        std::fabs(want)) +
                                           1e-12f;
               if (!same)
                 bad = v.id() + "[" + std::to_string(g) +
                       "] = " + std::to_string(got) + ", reference " +
                       std::to_string(want);
             });
      if (!bad.empty())
        fail("rank " + std::to_string(p.rank) + " after step " +
             std::to_string(step) + ": " + bad);
    };
    for (const TensorView &v : s.parameters()) {
      const RefTensor &t = ref.at(v.tensor());
      compare(v, t.w, v.dtype() == DType::BFloat16);
    }
    for (const TensorView &v : s.optimizerState()) {
      const RefTensor &t = ref.at(v.tensor());
      bool avg = v.id().ends_with(".exp_avg");
      compare(v, avg ? t.m : t.v, false);
    }
  }
  std::string comms;
  for (const std::string &c : s.createdCommunicators())
    comms += (comms.empty() ? "" : ",") + c;
  std::printf("rank %lld: %d steps match the single-process reference "
              "(%lld parameter reads checked, %lld trainer collectives; "
              "communicators created: %s%s%s)\n",
              static_cast<long long>(p.rank), args.steps,
              static_cast<long long>(checkedParams),
              static_cast<long long>(trainerChecks), comms.c_str(),
              s.device() ? "; device " : "",
              s.device() ? s.device()->name().c_str() : "");
  return 0;
}

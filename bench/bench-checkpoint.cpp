//===- bench-checkpoint.cpp - Checkpoint save/load vs plain sequential I/O ===//
//
// 4 processes (forked here) on one Gloo FileStore, each with Sessions on
// hand-built plans of a 1 GiB model: 8 float32 parameters of 8192 x 4096
// (128 MiB each; parameters only, no optimizer state). Rank 0 times, in the
// same run and on the same disk (the directory of --dir, default /tmp),
// alternately, --reps times:
//   plain write: one process writes 1 GiB sequentially (8 MiB write()s),
//                fsyncs and closes it;
//   save:        Session::saveCheckpoint on 4 ranks, FSDP 4 ("[{dp}, {}]":
//                each rank writes its 256 MiB of rows; CRC32C per 1 MiB;
//                fsyncs, metadata, rename) into a fresh directory (the
//                previous checkpoint is deleted before, timed apart: a save
//                over an existing checkpoint also pays that deletion);
//   plain read:  one process reads the 1 GiB file sequentially;
//   load:        Session::loadCheckpoint on 4 ranks into other layouts of a
//                dp=2 x tp=2 mesh: "row" = "[{tp,dp}, {}]" (each rank's rows
//                come from another writer: contiguous reads), and
//                "fsdp x tp" = "[{dp}, {tp}]" (a column split of row-major
//                chunks: a rank reads whole rows, twice its bytes, and
//                verifies every block it reads).
// Before every read and load, the files' pages are dropped from the page
// cache with posix_fadvise(POSIX_FADV_DONTNEED) after they were fsynced, so
// both read from the device (as far as the kernel's cache is concerned; a
// virtual disk may still be cached by its host). Throughput is the model's
// bytes (1 GiB) over the wall time between barriers around the operation on
// all 4 ranks; it prints the medians and save / plain write and load / plain
// read. Targets (issue 10): save >= 0.7, load into a different layout >= 0.5.
// Every load is checked element by element against the values saved. Each
// layout's loads go into one session, which keeps its staging memory from
// one load to the next (Session::loadCheckpoint): the first load of each
// session, which also faults that memory in, is printed apart (its ratio
// against the median plain read; not part of the verdict). It also prints
// the CPU time of the plain read and of each load (summed over the ranks),
// which depends much less than the wall time on what else the machine runs.
//
// Uses about 2 GiB of disk at a time (the checkpoint and the plain file; a
// save briefly holds the previous checkpoint too) and about 5 GiB of memory
// (1 GiB over the 4 ranks for each of the 3 sessions' buffers and each
// loading session's staging); it deletes its files at the end.
//
//   build/bin/bench-checkpoint [--reps N] [--dir DIR]
//
//===----------------------------------------------------------------------===//

#include "meshplan/Runtime/Session.h"

#include "ForkedRanks.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

using namespace meshplan;
using namespace meshplan::runtime;
namespace pl = meshplan::plan;
namespace fs = std::filesystem;

namespace {

constexpr int kRanks = 4;
constexpr int kTensors = 8;
constexpr int64_t kRows = 8192, kCols = 4096;
constexpr int64_t kModelBytes = kTensors * kRows * kCols * 4;

/// The value of element g of tensor t (exact in float32).
float valueAt(int t, int64_t g) {
  return float((g * 31 + t * 977) % 65521) - 32760.0f;
}

enum class Layout { Fsdp4, Rows2x2, FsdpTp2x2 };

/// A plan with only parameter shards (and one communicator over every rank,
/// for the barriers). Fsdp4: mesh dp=4, "[{dp}, {}]"; Rows2x2: dp=2 x tp=2,
/// "[{tp,dp}, {}]"; FsdpTp2x2: dp=2 x tp=2, "[{dp}, {tp}]".
pl::Plan modelPlan(Layout layout, int64_t rank) {
  pl::Plan p;
  p.rank = rank;
  std::vector<int64_t> all = {0, 1, 2, 3};
  std::string text;
  std::vector<int64_t> local, offset;
  if (layout == Layout::Fsdp4) {
    p.mesh.axes = {MeshAxis{"dp", kRanks, false}};
    p.communicators.push_back(
        {"all", all, 0, rank, {"dp"}, std::nullopt, false});
    text = "[{dp}, {}]";
    local = {kRows / 4, kCols};
    offset = {rank * (kRows / 4), 0};
  } else {
    p.mesh.axes = {MeshAxis{"dp", 2, false}, MeshAxis{"tp", 2, false}};
    p.communicators.push_back(
        {"all", all, 0, rank, {"dp", "tp"}, std::nullopt, false});
    int64_t dp = rank / 2, tp = rank % 2;
    if (layout == Layout::Rows2x2) {
      text = "[{tp, dp}, {}]";
      local = {kRows / 4, kCols};
      offset = {(tp * 2 + dp) * (kRows / 4), 0};
    } else {
      text = "[{dp}, {tp}]";
      local = {kRows / 2, kCols / 2};
      offset = {dp * (kRows / 2), tp * (kCols / 2)};
    }
  }
  for (int t = 0; t < kTensors; ++t) {
    std::string name = "layers." + std::to_string(t) + ".weight";
    p.buffers.push_back({name,
                         pl::BufferKind::ParamShard,
                         pl::DType::Float32,
                         {kRows, kCols},
                         local,
                         offset,
                         text,
                         name,
                         t,
                         std::nullopt});
  }
  return p;
}

double seconds(std::chrono::steady_clock::time_point a) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - a)
      .count();
}

/// CPU time of this process (all its threads): on a machine shared with other
/// work the wall times vary with what else runs, the CPU a load takes much
/// less.
double cpuSeconds() {
  timespec t;
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Drops a file's clean pages from the page cache.
void dropCache(const std::string &path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0)
    return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void dropCheckpointCache(const std::string &dir) {
  std::error_code ec;
  for (const auto &e : fs::directory_iterator(dir, ec))
    dropCache(e.path().string());
}

bool plainWrite(const std::string &path, const std::vector<char> &block) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0)
    return false;
  for (int64_t done = 0; done < kModelBytes;) {
    ssize_t n = ::write(fd, block.data(), block.size());
    if (n <= 0) {
      ::close(fd);
      return false;
    }
    done += n;
  }
  bool ok = ::fsync(fd) == 0;
  return ::close(fd) == 0 && ok;
}

bool plainRead(const std::string &path, std::vector<char> &block) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0)
    return false;
  int64_t total = 0;
  for (;;) {
    ssize_t n = ::read(fd, block.data(), block.size());
    if (n < 0) {
      ::close(fd);
      return false;
    }
    if (n == 0)
      break;
    total += n;
  }
  ::close(fd);
  return total == kModelBytes;
}

bool checkValues(Session &s) {
  for (TensorView &v : s.parameters()) {
    int t = int(*v.buffer->tensorId);
    std::span<float> f = v.as<float>();
    int64_t rows = v.localShape()[0], cols = v.localShape()[1];
    int64_t r0 = v.offset()[0], c0 = v.offset()[1];
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j)
        if (f[size_t(i * cols + j)] != valueAt(t, (r0 + i) * kCols + c0 + j))
          return false;
  }
  return true;
}

int runRank(int rank, const std::string &dir, int reps) {
  SessionOptions o;
  o.rank = rank;
  o.worldSize = kRanks;
  o.store = {StoreAddress::Kind::File, dir + "/store", "", 0};
  o.timeout = std::chrono::milliseconds(600000);
  auto fail = [&](const std::string &what, const Error &e) {
    std::fprintf(stderr, "rank %d: %s: %s\n", rank, what.c_str(),
                 e.message.c_str());
    return 1;
  };

  std::unique_ptr<Session> sessions[3];
  const char *names[3] = {"fsdp4", "rows", "fsdp-tp"};
  for (int i = 0; i < 3; ++i) {
    o.job = names[i];
    auto s = Session::open(modelPlan(Layout(i), rank), o);
    if (!s)
      return fail("open", s.error());
    sessions[i] = std::move(*s);
  }
  Session &saver = *sessions[0];
  auto comm = saver.planCommunicator("all");
  if (!comm)
    return fail("communicator", comm.error());
  auto barrier = [&] { return (*comm)->barrier(); };
  for (TensorView &v : saver.parameters()) {
    int t = int(*v.buffer->tensorId);
    std::span<float> f = v.as<float>();
    int64_t r0 = v.offset()[0], rows = v.localShape()[0];
    for (int64_t i = 0; i < rows * kCols; ++i)
      f[size_t(i)] = valueAt(t, r0 * kCols + i);
  }

  std::string ckpt = dir + "/ckpt", plain = dir + "/plain.bin";
  std::vector<char> block(size_t(8) << 20);
  for (size_t i = 0; i < block.size(); ++i)
    block[i] = char(i * 131);
  std::vector<double> tWrite, tSave, tRead, tLoad[2], tDelete;
  std::vector<double> cRead, cLoad[2]; // CPU seconds (cLoad: this rank's)
  ckpt::CheckpointInfo info;
  info.model = {"bench-1gib", ""};
  info.spec = {"fsdp4", ""};
  info.generator = "bench-checkpoint";
  for (int rep = 0; rep < reps; ++rep) {
    // Plain write (rank 0 alone; the others wait at the barrier).
    if (!barrier())
      return 1;
    if (rank == 0) {
      auto a = std::chrono::steady_clock::now();
      if (!plainWrite(plain, block)) {
        std::perror("plain write");
        return 1;
      }
      tWrite.push_back(seconds(a));
    }
    // Save on 4 ranks, into a fresh directory: the previous checkpoint is
    // deleted first, outside the timing (timed on its own).
    if (rank == 0 && fs::exists(ckpt)) {
      auto a = std::chrono::steady_clock::now();
      std::error_code ec;
      fs::remove_all(ckpt, ec);
      tDelete.push_back(seconds(a));
    }
    if (!barrier())
      return 1;
    auto a = std::chrono::steady_clock::now();
    if (auto ok = saver.saveCheckpoint(ckpt, info); !ok)
      return fail("save", ok.error());
    if (!barrier())
      return 1;
    if (rank == 0)
      tSave.push_back(seconds(a));
    // Plain read, cold.
    if (rank == 0) {
      dropCache(plain);
      auto a = std::chrono::steady_clock::now();
      double c = cpuSeconds();
      if (!plainRead(plain, block)) {
        std::perror("plain read");
        return 1;
      }
      tRead.push_back(seconds(a));
      cRead.push_back(cpuSeconds() - c);
    }
    // Loads into the two other layouts, cold.
    for (int l = 0; l < 2; ++l) {
      if (rank == 0)
        dropCheckpointCache(ckpt);
      if (!barrier())
        return 1;
      auto a = std::chrono::steady_clock::now();
      double c = cpuSeconds();
      auto state = sessions[1 + l]->loadCheckpoint(ckpt);
      if (!state)
        return fail("load", state.error());
      cLoad[l].push_back(cpuSeconds() - c);
      if (!barrier())
        return 1;
      if (rank == 0)
        tLoad[l].push_back(seconds(a));
      if (rep == 0 && !checkValues(*sessions[1 + l])) {
        std::fprintf(stderr, "rank %d: the %s load differs from the save\n",
                     rank, names[1 + l]);
        return 1;
      }
    }
  }
  // Every rank's CPU seconds per load, through files: rank 0 sums them.
  {
    std::ofstream out(dir + "/cpu." + std::to_string(rank));
    for (int l = 0; l < 2; ++l)
      for (double c : cLoad[l])
        out << c << "\n";
  }
  if (!barrier())
    return 1;
  if (rank != 0)
    return 0;
  std::vector<double> cpu[2] = {std::vector<double>(size_t(reps), 0.0),
                                std::vector<double>(size_t(reps), 0.0)};
  for (int r = 0; r < kRanks; ++r) {
    std::ifstream in(dir + "/cpu." + std::to_string(r));
    for (int l = 0; l < 2; ++l)
      for (int i = 0; i < reps; ++i) {
        double c = 0;
        in >> c;
        cpu[l][size_t(i)] += c;
      }
  }
  double gib = double(kModelBytes) / double(1 << 30);
  double w = gib / median(tWrite), s = gib / median(tSave),
         r = gib / median(tRead), lr = gib / median(tLoad[0]),
         lt = gib / median(tLoad[1]);
  std::printf("model: %d float32 tensors of %lld x %lld = %.2f GiB; %d "
              "processes; %s; medians of %d\n",
              kTensors, (long long)kRows, (long long)kCols, gib, kRanks,
              dir.c_str(), reps);
  std::printf("%-44s %8s %10s %7s\n", "", "s", "GiB/s", "ratio");
  std::printf("%-44s %8.3f %10.3f\n", "plain sequential write + fsync",
              median(tWrite), w);
  std::printf("%-44s %8.3f %10.3f %7.2f\n", "save, FSDP 4 (new directory)",
              median(tSave), s, s / w);
  if (!tDelete.empty())
    std::printf("%-44s %8.3f   (a save over an existing checkpoint adds "
                "it)\n",
                "deleting the previous checkpoint", median(tDelete));
  std::printf("%-44s %8.3f %10.3f\n", "plain sequential read (cache dropped)",
              median(tRead), r);
  std::printf("%-44s %8.3f %10.3f %7.2f\n",
              "load into dp2 x tp2 \"[{tp,dp}, {}]\"", median(tLoad[0]), lr,
              lr / r);
  std::printf("%-44s %8.3f %10.3f %7.2f\n",
              "load into dp2 x tp2 \"[{dp}, {tp}]\"", median(tLoad[1]), lt,
              lt / r);
  for (int l = 0; l < 2; ++l)
    std::printf("%-44s %8.3f %10.3f %7.2f\n",
                l == 0 ? "  first load into its session, rows"
                       : "  first load into its session, fsdp x tp",
                tLoad[l][0], gib / tLoad[l][0], gib / tLoad[l][0] / r);
  std::printf("CPU seconds (medians): plain read %.3f; load, all 4 ranks: "
              "rows %.3f, fsdp x tp %.3f (first loads %.3f, %.3f)\n",
              median(cRead), median(cpu[0]), median(cpu[1]), cpu[0][0],
              cpu[1][0]);
  bool pass = s / w >= 0.7 && lr / r >= 0.5 && lt / r >= 0.5;
  std::printf("%s: save / plain write >= 0.7 and load into another layout / "
              "plain read >= 0.5 (both layouts)\n",
              pass ? "PASS" : "FAIL");
  return pass ? 0 : 3;
}

} // namespace

int main(int argc, char **argv) {
  int reps = 3;
  std::string base = "/tmp";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc)
      reps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--dir" && i + 1 < argc)
      base = argv[++i];
    else {
      std::fprintf(stderr, "usage: %s [--reps N] [--dir DIR]\n", argv[0]);
      return 2;
    }
  }
  std::string tmpl = base + "/meshplan-bench-checkpoint-XXXXXX";
  std::vector<char> name(tmpl.begin(), tmpl.end());
  name.push_back('\0');
  if (!mkdtemp(name.data())) {
    std::perror("mkdtemp");
    return 1;
  }
  std::string dir = name.data();
  fs::create_directory(dir + "/store");
  int rc = bench::runForkedRanks(kRanks,
                                 [&](int r) { return runRank(r, dir, reps); });
  std::error_code ec;
  fs::remove_all(dir, ec);
  return rc;
}

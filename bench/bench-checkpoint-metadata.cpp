//===- bench-checkpoint-metadata.cpp - Reading metadata at the limits -----===//
//
// docs/limits.md bounds a checkpoint's metadata at 256 MiB and 2^26 JSON
// values and states what reading it may cost. This program writes a
// checkpoint whose checkpoint.json holds about --values values (default
// 2^26, the limit), with sparse data files of the recorded sizes, then reads
// it with readCheckpointMetadata in a fresh process (fork + exec of itself,
// so that nothing of the writer is resident) --reps times and prints, per
// read and as medians, the wall time and the reader's peak RSS (wait4's
// ru_maxrss). The document is the densest the limits allow: chunks of
// 64-dim tensors, whose offsets and shapes are mostly one-digit integers
// (2 bytes of text per value), so that 2^26 values fit in the byte limit.
//
//   build/bin/bench-checkpoint-metadata [--values N] [--reps R] [--dir DIR]
//                                       [--max-rss-mib M] [--keep]
//
// With --max-rss-mib it exits 1 when a median peak RSS exceeds M (a check
// for ctest at a small size). Uses --dir (default /tmp) for the metadata
// text (about 2.6 bytes per value) and removes it at the end.
//
//===----------------------------------------------------------------------===//

#include "meshplan/Checkpoint/Checkpoint.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using namespace meshplan;

namespace {

constexpr int kDims = 64;    // the most a shape may have
constexpr int kTensors = 16; // chunks spread over a few tensors
constexpr int kFiles = 64;   // and over a few data files

/// Values per chunk as the reader counts them (its limit's unit; keys are
/// not values): the object, offset and shape (an array and kDims integers
/// each), file, byte_offset, length, crc32c (an array and one string).
constexpr int64_t kValuesPerChunk = 1 + 2 * (1 + kDims) + 3 + 2;

int write(const std::string &dir, int64_t values) {
  int64_t chunks = std::max<int64_t>(1, values / kValuesPerChunk);
  int64_t perTensor = std::max<int64_t>(1, chunks / kTensors);
  ckpt::CheckpointMetadata meta;
  meta.model = {"bench", ckpt::fingerprintOf("bench model")};
  meta.spec = {"bench", ckpt::fingerprintOf("bench spec")};
  meta.mesh = "f=" + std::to_string(perTensor);
  std::vector<int64_t> fileBytes(kFiles, 0);
  for (int t = 0; t < kTensors; ++t) {
    ckpt::TensorEntry e;
    e.name = "layers." + std::to_string(t) + ".weight";
    e.tensorId = t;
    e.dtype = plan::DType::Float32;
    e.shape.assign(kDims, 1);
    e.shape.back() = perTensor;
    e.layout = "[{f}]";
    e.chunks.reserve(size_t(perTensor));
    for (int64_t i = 0; i < perTensor; ++i) {
      ckpt::Chunk c;
      c.box.offset.assign(kDims, 0);
      c.box.offset.back() = i;
      c.box.shape.assign(kDims, 1);
      int f = int(i % kFiles);
      c.file = "rank" + std::to_string(f) + ".data";
      c.byteOffset = fileBytes[size_t(f)];
      c.length = 4;
      fileBytes[size_t(f)] += 4;
      c.crc32c = {0}; // not checked by reading the metadata
      e.chunks.push_back(std::move(c));
    }
    meta.tensors.push_back(std::move(e));
  }
  for (int f = 0; f < kFiles; ++f) {
    std::string name = "rank" + std::to_string(f) + ".data";
    meta.files.push_back({name, fileBytes[size_t(f)]});
    fs::path path = fs::path(dir) / name;
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ::ftruncate(fd, fileBytes[size_t(f)]) != 0 ||
        ::close(fd) != 0) {
      std::perror(path.c_str());
      return 2;
    }
  }
  std::string text = ckpt::writeMetadata(meta);
  auto ok = ckpt::writeFileDurably(
      (fs::path(dir) / ckpt::kMetadataFileName).string(), text);
  if (!ok) {
    std::fprintf(stderr, "%s\n", ok.error().message.c_str());
    return 2;
  }
  std::printf("metadata: %lld tensors, %lld chunks of %d dims, about %lld "
              "values, %.1f MiB of text\n",
              (long long)meta.tensors.size(), (long long)(perTensor * kTensors),
              kDims, (long long)(perTensor * kTensors * kValuesPerChunk),
              double(text.size()) / (1 << 20));
  return 0;
}

/// The child: read, report the time on stdout (the parent parses it).
int read(const std::string &dir) {
  auto start = std::chrono::steady_clock::now();
  auto meta = ckpt::readCheckpointMetadata(dir);
  double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  if (!meta) {
    std::fprintf(stderr, "%s\n", meta.error().message.c_str());
    return 1;
  }
  std::printf("%.6f\n", s);
  return 0;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

} // namespace

int main(int argc, char **argv) {
  // The limit, less room for the header, the files and the tensors.
  int64_t values = (int64_t(1) << 26) - 8192;
  int reps = 3;
  std::string base = "/tmp";
  double maxRssMib = 0;
  bool keep = false; // for profiling: `--read DIR` reads it again
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--read" && i + 1 < argc)
      return read(argv[++i]);
    if (a == "--values" && i + 1 < argc)
      values = std::atoll(argv[++i]);
    else if (a == "--reps" && i + 1 < argc)
      reps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--dir" && i + 1 < argc)
      base = argv[++i];
    else if (a == "--keep")
      keep = true;
    else if (a == "--max-rss-mib" && i + 1 < argc)
      maxRssMib = std::atof(argv[++i]);
    else {
      std::fprintf(stderr,
                   "usage: %s [--values N] [--reps R] [--dir DIR] "
                   "[--max-rss-mib M]\n",
                   argv[0]);
      return 2;
    }
  }
  std::string dir = (fs::path(base) /
                     ("meshplan-bench-ckpt-meta-" + std::to_string(::getpid())))
                        .string();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    std::fprintf(stderr, "%s: %s\n", dir.c_str(), ec.message().c_str());
    return 2;
  }
  int rc = write(dir, values);
  std::vector<double> times, rss;
  for (int r = 0; rc == 0 && r < reps; ++r) {
    int out[2];
    if (::pipe(out) != 0)
      return 2;
    pid_t pid = ::fork();
    if (pid == 0) {
      ::dup2(out[1], 1);
      ::close(out[0]);
      ::close(out[1]);
      ::execl("/proc/self/exe", argv[0], "--read", dir.c_str(),
              (char *)nullptr);
      _exit(127);
    }
    ::close(out[1]);
    std::string text;
    char buf[256];
    for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) > 0;)
      text.append(buf, size_t(n));
    ::close(out[0]);
    int status = 0;
    struct rusage usage;
    ::wait4(pid, &status, 0, &usage);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr,
                   "the reading process failed (status %d; peak RSS %.0f "
                   "MiB)\n",
                   status, double(usage.ru_maxrss) / 1024);
      rc = 1;
      break;
    }
    times.push_back(std::atof(text.c_str()));
    rss.push_back(double(usage.ru_maxrss) / 1024); // KiB -> MiB
    std::printf("read %d: %.2f s, peak RSS %.0f MiB\n", r + 1, times.back(),
                rss.back());
  }
  if (keep)
    std::printf("kept %s\n", dir.c_str());
  else
    fs::remove_all(dir, ec);
  if (rc != 0)
    return rc;
  std::printf("median of %d: %.2f s, peak RSS %.0f MiB\n", reps, median(times),
              median(rss));
  if (maxRssMib > 0 && median(rss) > maxRssMib) {
    std::printf("FAIL: peak RSS above %.0f MiB\n", maxRssMib);
    return 1;
  }
  return 0;
}

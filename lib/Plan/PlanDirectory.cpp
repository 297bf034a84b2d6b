//===- PlanDirectory.cpp - Writing and reading plan directories -----------===//
//
// std::filesystem through its error_code overloads only, and C stdio or
// POSIX for the files: nothing here throws (this library may be linked into
// -fno-exceptions code).
//
//===----------------------------------------------------------------------===//

#include "meshplan/Plan/PlanDirectory.h"

#include "Parallel.h"
#include "PlanRead.h"

#include "meshplan/Core/Limits.h"
#include "meshplan/Core/Text.h"
#include "meshplan/Plan/Verify.h"
#include "meshplan/Support/Json.h"
#include "meshplan/Support/JsonReader.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
#include <thread>

namespace meshplan::plan {

namespace fs = std::filesystem;
using json::quote;
using json::readFileInto;

namespace {

/// "rankN.json" with N decimal without leading zeros (as the reader wants).
bool isRankFileName(std::string_view name) {
  if (name.size() < 10 || name.substr(0, 4) != "rank" ||
      name.substr(name.size() - 5) != ".json")
    return false;
  std::string_view digits = name.substr(4, name.size() - 9);
  if (digits.empty() || (digits.size() > 1 && digits[0] == '0'))
    return false;
  return std::all_of(digits.begin(), digits.end(),
                     [](char c) { return c >= '0' && c <= '9'; });
}

/// Whether `target` exists; an error when it exists but is not an empty
/// directory or an earlier plan directory.
Result<bool> checkReplaceable(const fs::path &target, const std::string &dir) {
  std::error_code ec;
  fs::file_status st = fs::symlink_status(target, ec);
  if (ec && ec != std::errc::no_such_file_or_directory)
    return makeError(quote(dir) + ": cannot inspect it: " + ec.message());
  if (!fs::exists(st))
    return false;
  if (fs::is_symlink(st))
    return makeError(quote(dir) +
                     " is a symbolic link; refusing to replace it with a plan "
                     "directory");
  if (!fs::is_directory(st))
    return makeError(quote(dir) +
                     " exists and is not a directory; refusing to replace it");
  fs::directory_iterator it(target, ec), end;
  if (ec)
    return makeError(quote(dir) + ": cannot list it: " + ec.message());
  for (; it != end; it.increment(ec)) {
    if (ec)
      return makeError(quote(dir) + ": cannot list it: " + ec.message());
    std::string name = it->path().filename().string();
    fs::file_status entry = it->symlink_status(ec);
    if (ec)
      return makeError(quote(dir) + ": cannot inspect " + quote(name) + ": " +
                       ec.message());
    if (!fs::is_regular_file(entry) ||
        (name != "index.json" && !isRankFileName(name)))
      return makeError(
          quote(dir) + " holds " + quote(name) +
          ", which is not part of a plan directory (only rankN.json and "
          "index.json); refusing to replace it");
  }
  return true;
}

/// mkdtemp on "<prefix>XXXXXX".
Result<fs::path> makeTempDir(const std::string &prefix) {
  std::string pattern = prefix + "XXXXXX";
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  if (!::mkdtemp(buffer.data()))
    return makeError("cannot create the directory " + quote(pattern) + ": " +
                     std::strerror(errno));
  return fs::path(buffer.data());
}

Result<void> writeFile(const fs::path &path, const std::string &text) {
  std::string name = path.string();
  std::FILE *f = std::fopen(name.c_str(), "wb");
  if (!f)
    return makeError("cannot create " + quote(name) + ": " +
                     std::strerror(errno));
  size_t written = std::fwrite(text.data(), 1, text.size(), f);
  int err = written == text.size() ? 0 : errno;
  if (std::fflush(f) != 0 && !err)
    err = errno;
  if (std::fclose(f) != 0 && !err)
    err = errno;
  if (written != text.size() || err)
    return makeError("cannot write " + quote(name) + ": " +
                     std::strerror(err ? err : EIO));
  return {};
}

/// Removes a directory tree when it goes out of scope, unless released.
class RemoveOnExit {
public:
  explicit RemoveOnExit(fs::path path) : path(std::move(path)) {}
  ~RemoveOnExit() {
    if (!path.empty()) {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  }
  void release() { path.clear(); }

private:
  fs::path path;
};

} // namespace

Result<void> writePlanDirectory(
    const std::string &dir, int64_t worldRanks,
    const std::function<Result<Plan>(int64_t rank)> &planOf,
    const std::vector<int64_t> &ranks,
    const std::function<void(int64_t done, int64_t total)> &progress,
    unsigned threads) {
  if (dir.empty())
    return makeError("the plan directory path is empty");
  fs::path target(dir);
  if (!target.has_filename())
    target = target.parent_path(); // "plans/"
  std::string base = target.filename().string();
  if (base.empty() || base == "." || base == "..")
    return makeError(quote(dir) + ": name the plan directory itself");
  if (worldRanks < 1)
    return makeError(quote(dir) + ": the world has " +
                     std::to_string(worldRanks) + " ranks");
  if (ranks.empty())
    return makeError(quote(dir) + ": no ranks to write");
  if (static_cast<int64_t>(ranks.size()) > worldRanks)
    return makeError(quote(dir) + ": " + std::to_string(ranks.size()) +
                     " ranks to write but the world has " +
                     std::to_string(worldRanks));
  {
    std::vector<int64_t> sorted = ranks;
    std::sort(sorted.begin(), sorted.end());
    if (sorted.front() < 0)
      return makeError(quote(dir) + ": rank " + std::to_string(sorted.front()) +
                       " is negative");
    for (size_t i = 1; i < sorted.size(); ++i)
      if (sorted[i] == sorted[i - 1])
        return makeError(quote(dir) + ": rank " + std::to_string(sorted[i]) +
                         " is listed twice");
  }
  if (!planOf)
    return makeError(quote(dir) + ": no plan source");

  MESHPLAN_TRY(checkReplaceable(target, dir));
  // Users expect `-o a/b/plans` to create a/b, as `mkdir -p` would. Only the
  // parents are created here, after every check on the input; the plan
  // directory itself still appears atomically below.
  if (target.has_parent_path()) {
    std::error_code parentEc;
    fs::create_directories(target.parent_path(), parentEc);
    if (parentEc)
      return makeError(quote(dir) + ": cannot create the parent directory " +
                       quote(target.parent_path().string()) + ": " +
                       parentEc.message());
  }

  Result<fs::path> tmpOr = makeTempDir(target.string() + ".tmp-");
  if (!tmpOr)
    return tmpOr.error().within(quote(dir));
  fs::path tmp = *tmpOr;
  RemoveOnExit cleanup(tmp);
  std::error_code ec;
  // mkdtemp creates 0700; a plan directory is read by other users' jobs.
  fs::permissions(tmp,
                  fs::perms::owner_all | fs::perms::group_read |
                      fs::perms::group_exec | fs::perms::others_read |
                      fs::perms::others_exec,
                  ec);
  if (ec)
    return makeError(quote(tmp.string()) +
                     ": cannot set permissions: " + ec.message());

  // The rank files, on up to `threads` threads.
  const int64_t total = static_cast<int64_t>(ranks.size());
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  std::optional<std::pair<size_t, Error>> firstError;
  int64_t done = 0;
  auto fileName = [](int64_t rank) {
    return "rank" + std::to_string(rank) + ".json";
  };
  auto fail = [&](size_t i, Error e) {
    std::lock_guard<std::mutex> lock(mu);
    if (!firstError || i < firstError->first)
      firstError.emplace(i, std::move(e));
    failed = true;
  };
  auto worker = [&] {
    for (size_t i; !failed && (i = next.fetch_add(1)) < ranks.size();) {
      int64_t rank = ranks[i];
      std::string shown = (target / fileName(rank)).string();
      Result<Plan> plan = planOf(rank);
      if (!plan) {
        fail(i, plan.error().within(shown + ": the plan of rank " +
                                    std::to_string(rank)));
        continue;
      }
      if (plan->rank != rank) {
        fail(i, makeError(shown + ": asked for the plan of rank " +
                          std::to_string(rank) + " but got the plan of rank " +
                          std::to_string(plan->rank)));
        continue;
      }
      int64_t devices = 1;
      for (const MeshAxis &a : plan->mesh.axes)
        if (__builtin_mul_overflow(devices, a.size, &devices))
          devices = -1;
      if (devices != worldRanks) {
        fail(i,
             makeError(shown + ": the plan's mesh has " +
                       std::to_string(devices) + " devices but the world has " +
                       std::to_string(worldRanks) + " ranks"));
        continue;
      }
      if (Result<void> ok = writeFile(tmp / fileName(rank), writePlan(*plan));
          !ok) {
        fail(i, ok.error().within(shown));
        continue;
      }
      if (progress) {
        std::lock_guard<std::mutex> lock(mu);
        if (!failed)
          progress(++done, total);
      }
    }
  };
  threads = std::max(
      1u, std::min<unsigned>(threads, static_cast<unsigned>(std::min<size_t>(
                                          ranks.size(), 256))));
  runOnThreads(threads, worker);
  if (firstError)
    return makeError(firstError->second.message + " (" + quote(dir) +
                     " was left unchanged)");

  // The index, last: it lists exactly the files written.
  std::string index = "{\"format\": \"meshplan.plan-index\", \"version\": " +
                      std::to_string(kPlanVersion) +
                      ", \"generator\": " + "\"meshplan\", \"ranks\": [" +
                      joinInts(ranks, ", ") + "]}\n";
  if (Result<void> ok = writeFile(tmp / "index.json", index); !ok)
    return makeError(ok.error().message + " (" + quote(dir) +
                     " was left unchanged)");

  // Swap it in. Check again: the directory may have changed meanwhile.
  Result<bool> exists = checkReplaceable(target, dir);
  if (!exists)
    return exists.error();
  if (!*exists) {
    fs::rename(tmp, target, ec);
    if (ec)
      return makeError("cannot rename " + quote(tmp.string()) + " to " +
                       quote(dir) + ": " + ec.message());
    cleanup.release();
    return {};
  }
  // An earlier plan: move it onto a fresh empty directory (rename replaces an
  // empty directory), move the new one in, then remove the old one.
  Result<fs::path> oldOr = makeTempDir(target.string() + ".old-");
  if (!oldOr)
    return oldOr.error().within(quote(dir));
  fs::path old = *oldOr;
  RemoveOnExit removeOld(old);
  fs::rename(target, old, ec);
  if (ec)
    return makeError("cannot move the earlier plan " + quote(dir) +
                     " aside to " + quote(old.string()) + ": " + ec.message());
  fs::rename(tmp, target, ec);
  if (ec) {
    std::error_code back;
    fs::rename(old, target, back);
    if (back) {
      // Keep the earlier plan where it is and say where.
      removeOld.release();
      return makeError("cannot rename " + quote(tmp.string()) + " to " +
                       quote(dir) + ": " + ec.message() +
                       "; the earlier plan is in " + quote(old.string()));
    }
    return makeError("cannot rename " + quote(tmp.string()) + " to " +
                     quote(dir) + ": " + ec.message() + " (" + quote(dir) +
                     " was left unchanged)");
  }
  cleanup.release();
  return {};
}

//===----------------------------------------------------------------------===//
// Reading
//===----------------------------------------------------------------------===//

namespace {

/// N for a file named "rankN.json" (N decimal, no leading zeros).
std::optional<int64_t> rankOfFileName(std::string_view name) {
  if (!isRankFileName(name))
    return std::nullopt;
  return parseInt(name.substr(4, name.size() - 9));
}

Result<std::vector<int64_t>> readIndex(const std::string &path) {
  // Errors are prefixed with the index file's path.
  auto fail = [&](const std::string &m) { return makeError(path + ": " + m); };
  std::string text;
  if (Result<void> ok = readFileInto(path, text, kMaxPlanFileBytes); !ok)
    return ok.error();
  Result<json::Document> parsed = json::Document::parse(
      text, kMaxPlanJsonDepth, kMaxPlanJsonValues, kMaxPlanJsonValuesText);
  if (!parsed)
    return fail(parsed.error().message);
  json::Value doc = parsed->root();
  if (!doc.isObject())
    return fail("/: expected an object");
  for (json::Member m : doc.members())
    if (m.key != "format" && m.key != "version" && m.key != "ranks" &&
        m.key != "generator")
      return fail(json::childPointer("", m.key) + ": unknown key " +
                  quote(m.key) +
                  " (known keys: format, version, ranks, generator)");
  std::optional<json::Value> format = doc.find("format");
  if (!format || !format->isString() ||
      format->string() != "meshplan.plan-index")
    return fail("/format: expected \"meshplan.plan-index\"");
  std::optional<json::Value> version = doc.find("version");
  if (!version || version->kind() != json::ValueKind::Unsigned ||
      version->unsignedValue() != kPlanVersion)
    return fail("/version: expected " + std::to_string(kPlanVersion));
  std::optional<json::Value> ranks = doc.find("ranks");
  if (!ranks || !ranks->isArray() || ranks->size() == 0)
    return fail("/ranks: expected a non-empty array of ranks");
  if (static_cast<int64_t>(ranks->size()) > kMaxPlanDirectoryRanks)
    return fail("/ranks: lists " + std::to_string(ranks->size()) +
                " ranks; a plan directory holds at most " +
                kMaxPlanDirectoryRanksText + " (docs/limits.md)");
  std::vector<int64_t> out;
  out.reserve(ranks->size());
  for (json::Value r : ranks->elements()) {
    if (r.kind() != json::ValueKind::Unsigned ||
        r.unsignedValue() > static_cast<uint64_t>(INT64_MAX))
      return fail("/ranks/" + std::to_string(out.size()) +
                  ": expected a non-negative integer");
    out.push_back(static_cast<int64_t>(r.unsignedValue()));
  }
  std::vector<int64_t> sorted = out;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 1; i < sorted.size(); ++i)
    if (sorted[i] == sorted[i - 1])
      return fail("/ranks: rank " + std::to_string(sorted[i]) +
                  " is listed twice");
  return out;
}

} // namespace

// In fresh, compact allocations (as PreparedTemplate::instantiate's
// verificationOnly).
Plan verificationCopy(const Plan &full) {
  Plan lean;
  lean.version = full.version;
  lean.mesh = full.mesh;
  lean.rank = full.rank;
  lean.communicators = full.communicators;
  lean.streams = full.streams;
  lean.program.resize(full.program.size());
  for (size_t i = 0; i < full.program.size(); ++i) {
    const Instruction &in = full.program[i];
    Instruction &out = lean.program[i];
    out.id = in.id;
    out.stream = in.stream;
    out.op = in.op;
    out.comm = in.comm;
    out.dtype = in.dtype;
    out.count = in.count;
    out.reduce = in.reduce;
    out.root = in.root;
    out.peer = in.peer;
    out.tag = in.tag;
    out.deps = in.deps;
  }
  return lean;
}

namespace {

/// readPlanDirectory; with `facts`, also the facts of every full plan,
/// recorded by each reading thread into its own builder; `progress` as
/// readPlanSet's.
Result<std::vector<Plan>>
readDirectory(const std::string &dir, unsigned threads, PlanDetail detail,
              PlanSetFacts *facts,
              const std::function<void(int64_t, int64_t)> &progress) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return makeError("\"" + dir + "\" is not a directory");
  std::vector<int64_t> ranks;
  fs::path indexPath = fs::path(dir) / "index.json";
  auto fileOf = [&](int64_t rank) {
    return fs::path(dir) / ("rank" + std::to_string(rank) + ".json");
  };
  if (fs::exists(indexPath, ec)) {
    Result<std::vector<int64_t>> idx = readIndex(indexPath.string());
    if (!idx)
      return idx.error();
    ranks = std::move(*idx);
  }
  {
    std::vector<int64_t> found;
    fs::directory_iterator it(dir, ec), end;
    if (ec)
      return makeError("cannot list \"" + dir + "\": " + ec.message());
    for (; it != end; it.increment(ec)) {
      if (ec)
        return makeError("cannot list \"" + dir + "\": " + ec.message());
      if (std::optional<int64_t> r =
              rankOfFileName(it->path().filename().string()))
        found.push_back(*r);
    }
    // verify holds every plan in memory at once; refuse before reading.
    if (static_cast<int64_t>(found.size()) > kMaxPlanDirectoryRanks)
      return makeError("\"" + dir + "\" holds " + std::to_string(found.size()) +
                       " plan files; a plan directory holds at most " +
                       kMaxPlanDirectoryRanksText + " (docs/limits.md)");
    std::sort(found.begin(), found.end());
    if (ranks.empty()) {
      if (found.empty())
        return makeError("no rankN.json plan files in \"" + dir + "\"");
      ranks = std::move(found);
    } else {
      std::vector<int64_t> listed = ranks;
      std::sort(listed.begin(), listed.end());
      for (int64_t r : listed)
        if (!std::binary_search(found.begin(), found.end(), r))
          return makeError(indexPath.string() + " lists rank " +
                           std::to_string(r) + ", but " + fileOf(r).string() +
                           " does not exist");
      for (int64_t r : found)
        if (!std::binary_search(listed.begin(), listed.end(), r))
          return makeError(fileOf(r).string() + " is not listed in " +
                           indexPath.string());
    }
  }

  std::vector<Plan> plans(ranks.size());
  std::vector<std::optional<Error>> errors(ranks.size());
  std::mutex progressMutex;
  int64_t done = 0;
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  if (threads == 0)
    threads = std::max(1u, std::thread::hardware_concurrency());
  threads = std::min<unsigned>(
      threads, std::max<size_t>(1, std::min<size_t>(ranks.size(), 64)));
  std::vector<FactsBuilder> builders(facts ? threads : 0);
  std::atomic<unsigned> nextBuilder{0};
  auto worker = [&] {
    FactsBuilder *builder =
        facts ? &builders[nextBuilder.fetch_add(1)] : nullptr;
    // One text buffer and, for verification, one plan per thread, reused
    // from file to file: steady-state reading allocates little but what it
    // keeps (see PlanRead.h).
    std::string text;
    Plan scratch;
    // The operands validation resolved, handed to the facts builder.
    std::vector<int32_t> resolved;
    for (size_t i; !failed && (i = next.fetch_add(1)) < ranks.size();) {
      std::string name = fileOf(ranks[i]).string();
      Plan &into = detail == PlanDetail::Full ? plans[i] : scratch;
      Result<void> ok = readFileInto(name, text, kMaxPlanFileBytes);
      if (ok)
        ok = parsePlanInto(text, into, builder ? &resolved : nullptr);
      if (!ok) {
        errors[i] = ok.error().within(name);
        failed = true;
      } else if (into.rank != ranks[i]) {
        errors[i] =
            makeError(name + ": /rank: the file is named for rank " +
                      std::to_string(ranks[i]) + " but the plan is for rank " +
                      std::to_string(into.rank));
        failed = true;
      } else {
        if (builder)
          builder->add(i, into, &resolved);
        if (detail == PlanDetail::VerificationOnly)
          plans[i] = verificationCopy(scratch);
        if (progress) {
          std::lock_guard<std::mutex> lock(progressMutex);
          progress(++done, int64_t(ranks.size()));
        }
      }
    }
  };
  runOnThreads(threads, worker);
  // The first bad file in rank order, whichever thread read it.
  for (std::optional<Error> &e : errors)
    if (e)
      return *e;
  if (facts)
    *facts = mergeFacts(builders, plans.size());
  return plans;
}

} // namespace

Result<std::vector<Plan>>
readPlanDirectory(const std::string &dir, unsigned threads, PlanDetail detail) {
  return readDirectory(dir, threads, detail, nullptr, nullptr);
}

Result<PlanSet>
readPlanSet(const std::string &dir, unsigned threads,
            const std::function<void(int64_t done, int64_t total)> &progress) {
  PlanSet set;
  Result<std::vector<Plan>> plans = readDirectory(
      dir, threads, PlanDetail::VerificationOnly, &set.facts, progress);
  if (!plans)
    return plans.error();
  set.plans = std::move(*plans);
  return set;
}

} // namespace meshplan::plan

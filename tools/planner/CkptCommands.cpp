//===- CkptCommands.cpp - meshplan ckpt ... -------------------------------===//

#include "CkptCommands.h"

#include "MeshSetup.h"

#include "meshplan/Checkpoint/Checkpoint.h"
#include "meshplan/Checkpoint/Safetensors.h"
#include "meshplan/Plan/Plan.h"
#include "meshplan/Support/Json.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <map>
#include <set>
#include <sstream>

#include <sys/stat.h>

using namespace meshplan;
using namespace meshplan::cli;
namespace fs = std::filesystem;

namespace {

std::string ints(const std::vector<int64_t> &v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i)
    out += (i ? "," : "") + std::to_string(v[i]);
  return out + "]";
}

int64_t bytesOf(const std::vector<int64_t> &shape, plan::DType dtype) {
  int64_t n = plan::dtypeBytes(dtype);
  for (int64_t d : shape)
    n *= d; // shapes come from validated metadata or plans (<= 2^50)
  return n;
}

ckpt::CheckpointMetadata readOrThrow(const std::string &dir) {
  auto meta = ckpt::readCheckpointMetadata(dir);
  if (!meta)
    throw CliError(meta.error().message); // names the directory or file
  return std::move(*meta);
}

/// `-o` of reshard and import: refused before anything is planned or
/// written when it could only fail at the commit (a missing parent) or
/// would replace something that is not a checkpoint.
void checkOutputDir(const std::string &out) {
  if (out.empty())
    throw CliError("-o: an output directory is required");
  if (ckpt::stagingDirOf(out).empty())
    throw CliError("-o: " + out +
                   ": a checkpoint needs a directory name (not \".\", "
                   "\"..\" or \"/\")");
  fs::path parent = fs::path(out).parent_path();
  std::error_code ec;
  if (!parent.empty() && !fs::is_directory(parent, ec))
    throw CliError("-o: the parent directory " + parent.string() +
                   " does not exist");
  struct stat st;
  if (::lstat(out.c_str(), &st) != 0)
    return;
  if (!S_ISDIR(st.st_mode) ||
      ::stat((out + "/" + std::string(ckpt::kMetadataFileName)).c_str(), &st) !=
          0)
    throw CliError("-o: " + out + ": exists and is not a checkpoint (no " +
                   std::string(ckpt::kMetadataFileName) +
                   "); not replacing it");
}

/// Every rank's persistent boxes of a spec, planned in-process.
struct SpecBoxes {
  PlannedRanks planned;
  std::vector<std::vector<ckpt::PersistentBox>> ranks;
  std::optional<plan::OptimizerConfig> optimizer;
};

SpecBoxes boxesOfSpec(const SpecFlags &flags) {
  SpecBoxes out;
  out.planned = planEveryRank(flags, [&](const plan::Plan &plan) {
    auto boxes = ckpt::persistentBoxesOf(plan);
    if (!boxes)
      throw std::runtime_error("internal error: rank " +
                               std::to_string(plan.rank) + ": " +
                               boxes.error().message);
    if (out.ranks.empty())
      out.optimizer = plan.optimizer;
    out.ranks.push_back(std::move(*boxes));
  });
  return out;
}

/// Writes a checkpoint at `out` from every rank's boxes, each owned box's
/// bytes produced by `bytesOf(box)`. The staging directory is removed on
/// any failure, so nothing half-written remains.
ckpt::CheckpointMetadata writeCheckpoint(
    const std::string &out, const SpecBoxes &spec,
    const ckpt::CheckpointInfo &info,
    const std::function<std::vector<std::byte>(const ckpt::PersistentBox &)>
        &boxBytes) {
  if (auto begun = ckpt::beginCheckpoint(out); !begun)
    throw CliError("-o: " + begun.error().message);
  struct Cleanup {
    std::string staging;
    bool done = false;
    ~Cleanup() {
      if (!done) {
        std::error_code ec;
        fs::remove_all(staging, ec);
      }
    }
  } cleanup{ckpt::stagingDirOf(out)};
  std::vector<ckpt::RankRecords> records;
  for (size_t r = 0; r < spec.ranks.size(); ++r) {
    const std::vector<ckpt::PersistentBox> &boxes = spec.ranks[r];
    // One rank's owned bytes at a time.
    std::vector<std::vector<std::byte>> data(boxes.size());
    std::vector<ckpt::SaveBox> save;
    for (size_t i = 0; i < boxes.size(); ++i) {
      if (boxes[i].owned && !boxes[i].box.empty())
        data[i] = boxBytes(boxes[i]);
      save.push_back({&boxes[i], data[i]});
    }
    auto written = ckpt::writeRankData(out, int64_t(r), save);
    if (!written)
      throw CliError("-o: " + written.error().message);
    records.push_back(std::move(*written));
  }
  auto meta = ckpt::commitCheckpoint(out, info, records);
  if (!meta)
    throw CliError("-o: " + meta.error().message);
  cleanup.done = true;
  return std::move(*meta);
}

/// The parameters of a plan, in tensor_id order, one entry each.
std::vector<const ckpt::PersistentBox *> parametersOf(const SpecBoxes &spec) {
  std::map<std::string, const ckpt::PersistentBox *> byName;
  for (const auto &rank : spec.ranks)
    for (const ckpt::PersistentBox &b : rank)
      if (b.kind == ckpt::TensorKind::Parameter)
        byName.emplace(b.tensor, &b);
  std::vector<const ckpt::PersistentBox *> out;
  for (const auto &[name, b] : byName)
    out.push_back(b);
  std::sort(out.begin(), out.end(), [](auto *a, auto *b) {
    return a->tensorId.value_or(INT64_MAX) < b->tensorId.value_or(INT64_MAX);
  });
  return out;
}

std::string summaryLine(const ckpt::CheckpointMetadata &meta) {
  int64_t chunks = 0, bytes = 0;
  for (const ckpt::TensorEntry &t : meta.tensors) {
    chunks += int64_t(t.chunks.size());
    for (const ckpt::Chunk &c : t.chunks)
      bytes += c.length;
  }
  return std::to_string(meta.tensors.size()) + " tensors, " +
         std::to_string(chunks) + " chunks, " + std::to_string(bytes) +
         " bytes in " + std::to_string(meta.files.size()) + " data files";
}

} // namespace

//===----------------------------------------------------------------------===//
// inspect
//===----------------------------------------------------------------------===//

CommandOutput
meshplan::cli::runCkptInspectCommand(const CkptInspectOptions &options) {
  ckpt::CheckpointMetadata meta = readOrThrow(options.dir);
  int64_t parameters = 0, states = 0, chunks = 0, bytes = 0;
  for (const ckpt::TensorEntry &t : meta.tensors) {
    (t.kind == ckpt::TensorKind::Parameter ? parameters : states) += 1;
    chunks += int64_t(t.chunks.size());
    bytes += bytesOf(t.shape, t.dtype);
  }
  CommandOutput result;
  if (options.json) {
    json::Json j = json::Json::object();
    j["directory"] = options.dir;
    j["version"] = ckpt::kCheckpointVersion;
    j["model"] = {{"name", meta.model.name},
                  {"fingerprint", meta.model.fingerprint}};
    j["spec"] = {{"name", meta.spec.name},
                 {"fingerprint", meta.spec.fingerprint}};
    j["training"] = {{"step", meta.training.step},
                     {"seed", meta.training.seed},
                     {"stochastic_rounding", meta.training.stochasticRounding}};
    j["written_by"] = {{"mesh", meta.mesh}, {"generator", meta.generator}};
    j["checksum"] = {{"algorithm", "crc32c"}, {"block_bytes", meta.blockBytes}};
    j["totals"] = {{"tensors", meta.tensors.size()},
                   {"parameters", parameters},
                   {"optimizer_states", states},
                   {"chunks", chunks},
                   {"bytes", bytes},
                   {"files", meta.files.size()}};
    j["files"] = json::Json::array();
    for (const ckpt::DataFile &f : meta.files)
      j["files"].push_back({{"name", f.name}, {"bytes", f.bytes}});
    j["tensors"] = json::Json::array();
    for (const ckpt::TensorEntry &t : meta.tensors) {
      json::Json e = {{"name", t.name},
                      {"kind", std::string(ckpt::tensorKindName(t.kind))}};
      if (t.tensorId)
        e["tensor_id"] = *t.tensorId;
      e["dtype"] = std::string(plan::dtypeName(t.dtype));
      e["shape"] = t.shape;
      e["bytes"] = bytesOf(t.shape, t.dtype);
      e["layout"] = t.layout;
      e["chunks"] = json::Json::array();
      for (const ckpt::Chunk &c : t.chunks)
        e["chunks"].push_back({{"offset", c.box.offset},
                               {"shape", c.box.shape},
                               {"file", c.file},
                               {"byte_offset", c.byteOffset},
                               {"length", c.length}});
      j["tensors"].push_back(std::move(e));
    }
    result.out =
        j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    return result;
  }

  std::ostringstream out;
  auto ref = [](const ckpt::SourceRef &r) {
    return (r.name.empty() ? std::string("-") : r.name) +
           (r.fingerprint.empty() ? "" : " (" + r.fingerprint + ")");
  };
  out << "checkpoint " << options.dir << " (format version "
      << ckpt::kCheckpointVersion << ")\n";
  out << "  model:      " << ref(meta.model) << "\n";
  out << "  spec:       " << ref(meta.spec) << "\n";
  out << "  written by: "
      << (meta.generator.empty() ? std::string("-") : meta.generator)
      << " on mesh " << (meta.mesh.empty() ? std::string("-") : meta.mesh)
      << "\n";
  out << "  training:   step " << meta.training.step << ", seed "
      << meta.training.seed << ", stochastic rounding "
      << (meta.training.stochasticRounding ? "on" : "off") << "\n";
  out << "  checksums:  crc32c per " << meta.blockBytes << "-byte block\n";
  int64_t fileBytes = 0;
  for (const ckpt::DataFile &f : meta.files)
    fileBytes += f.bytes;
  out << "  data:       " << meta.files.size() << " files, " << fileBytes
      << " bytes\n";
  out << "  tensors:    " << meta.tensors.size() << " (" << parameters
      << " parameters, " << states << " optimizer states), " << chunks
      << " chunks, " << bytes << " bytes\n\n";
  size_t nameWidth = 6, shapeWidth = 5;
  for (const ckpt::TensorEntry &t : meta.tensors) {
    nameWidth = std::max(nameWidth, t.name.size());
    shapeWidth = std::max(shapeWidth, ints(t.shape).size());
  }
  out << std::left << std::setw(int(nameWidth) + 2) << "tensor" << std::setw(17)
      << "kind" << std::setw(15) << "dtype" << std::setw(int(shapeWidth) + 2)
      << "shape" << std::right << std::setw(6) << "chunks" << std::setw(12)
      << "bytes"
      << "  layout\n";
  for (const ckpt::TensorEntry &t : meta.tensors) {
    out << std::left << std::setw(int(nameWidth) + 2) << t.name << std::setw(17)
        << ckpt::tensorKindName(t.kind) << std::setw(15)
        << plan::dtypeName(t.dtype) << std::setw(int(shapeWidth) + 2)
        << ints(t.shape) << std::right << std::setw(6) << t.chunks.size()
        << std::setw(12) << bytesOf(t.shape, t.dtype) << "  "
        << (t.layout.empty() ? std::string("-") : t.layout) << "\n";
    if (options.chunks)
      for (const ckpt::Chunk &c : t.chunks)
        out << "    " << ckpt::formatBox(c.box) << "  " << c.file << " @ "
            << c.byteOffset << ", " << c.length << " bytes\n";
  }
  result.out = out.str();
  return result;
}

//===----------------------------------------------------------------------===//
// verify
//===----------------------------------------------------------------------===//

CommandOutput
meshplan::cli::runCkptVerifyCommand(const CkptVerifyOptions &options) {
  // Unreadable or inconsistent metadata (including a gap or overlap in the
  // tiling and a truncated file) is bad input: exit 2, as everywhere.
  readOrThrow(options.dir);
  CommandOutput result;
  auto report = ckpt::verifyCheckpoint(options.dir);
  if (!report) {
    // Well-formed but the data does not match its checksums: exit 1, as
    // `meshplan verify` for a plan set that fails.
    result.exitCode = 1;
    result.err =
        "meshplan: verification failed: " + report.error().message + "\n";
    return result;
  }
  result.out = "verified " + options.dir + ": " +
               std::to_string(report->tensors) + " tensors, " +
               std::to_string(report->chunks) + " chunks, " +
               std::to_string(report->bytes) +
               " bytes; every checksum matches and the chunks tile every "
               "tensor exactly once\n";
  return result;
}

//===----------------------------------------------------------------------===//
// reshard
//===----------------------------------------------------------------------===//

CommandOutput
meshplan::cli::runCkptReshardCommand(const CkptReshardOptions &options) {
  checkOutputDir(options.out);
  ckpt::CheckpointMetadata meta = readOrThrow(options.dir);
  SpecBoxes spec = boxesOfSpec(options.spec);
  // Everything is checked before the first byte is written: every box of
  // every rank must exist with the plan's shape and dtype, and nothing of
  // the checkpoint may be dropped (a spec of another model, or without the
  // optimizer, would silently lose state).
  std::set<std::string> planned;
  for (const auto &rank : spec.ranks) {
    if (auto ok = ckpt::checkLoadable(meta, rank); !ok)
      throw CliError(ok.error().message + " (--spec " + options.spec.spec +
                     ", model " + spec.planned.modelName + ")");
    for (const ckpt::PersistentBox &b : rank)
      planned.insert(b.tensor);
  }
  for (const ckpt::TensorEntry &t : meta.tensors)
    if (!planned.count(t.name))
      throw CliError(options.dir + ": tensor " + json::quote(t.name) +
                     " of the checkpoint has no place in the plan of --spec " +
                     options.spec.spec + " (model " + spec.planned.modelName +
                     "); resharding would drop it");

  ckpt::CheckpointInfo info;
  info.model = meta.model;
  info.spec = {options.spec.spec, ckpt::fingerprintOf(spec.planned.specText)};
  info.training = meta.training;
  info.mesh = spec.planned.mesh;
  info.generator = "meshplan ckpt reshard";
  ckpt::CheckpointMetadata written = writeCheckpoint(
      options.out, spec, info, [&](const ckpt::PersistentBox &b) {
        // Reads only the checksum blocks that intersect the box, verified.
        auto bytes =
            ckpt::loadBox(meta, b.tensor, b.globalShape, b.box, b.dtype);
        if (!bytes)
          throw CliError(bytes.error().message);
        return std::move(*bytes);
      });
  CommandOutput result;
  result.out = "resharded " + options.dir + " (mesh " +
               (meta.mesh.empty() ? std::string("-") : meta.mesh) +
               ") for mesh " + spec.planned.mesh + " (" +
               std::to_string(spec.planned.worldSize) + " ranks): wrote " +
               options.out + ": " + summaryLine(written) + "\n";
  return result;
}

//===----------------------------------------------------------------------===//
// export
//===----------------------------------------------------------------------===//

CommandOutput
meshplan::cli::runCkptExportCommand(const CkptExportOptions &options) {
  if (options.out.empty())
    throw CliError("-o: an output file is required");
  std::error_code ec;
  if (fs::is_directory(options.out, ec))
    throw CliError("-o: " + options.out + ": is a directory");
  fs::path parent = fs::path(options.out).parent_path();
  if (!parent.empty() && !fs::is_directory(parent, ec))
    throw CliError("-o: the parent directory " + parent.string() +
                   " does not exist");
  ckpt::CheckpointMetadata meta = readOrThrow(options.dir);
  // Parameters only: optimizer state has no place in a model file.
  std::vector<const ckpt::TensorEntry *> params;
  std::vector<ckpt::SafetensorsEntry> entries;
  int64_t bytes = 0;
  for (const ckpt::TensorEntry &t : meta.tensors) {
    if (t.kind != ckpt::TensorKind::Parameter)
      continue;
    params.push_back(&t);
    entries.push_back({t.name, t.dtype, t.shape});
    bytes += bytesOf(t.shape, t.dtype);
  }
  std::vector<std::pair<std::string, std::string>> metadata = {
      {"format", "pt"},
      {"meshplan.model", meta.model.name},
      {"meshplan.spec", meta.spec.name},
      {"meshplan.step", std::to_string(meta.training.step)}};
  auto written = ckpt::writeSafetensors(
      options.out, entries, metadata,
      [&](size_t i, std::span<std::byte> out) -> Result<void> {
        const ckpt::TensorEntry &t = *params[i];
        ckpt::Box whole{std::vector<int64_t>(t.shape.size(), 0), t.shape};
        return ckpt::loadBoxInto(meta, t.name, t.shape, whole, t.dtype, out);
      });
  if (!written)
    throw CliError(written.error().message);
  CommandOutput result;
  result.out = "exported " + std::to_string(params.size()) + " parameters (" +
               std::to_string(bytes) + " bytes) of " + options.dir + " to " +
               options.out + "\n";
  return result;
}

//===----------------------------------------------------------------------===//
// import
//===----------------------------------------------------------------------===//

/// `box` of a whole row-major tensor in a safetensors file: reads the byte
/// span from the box's first element to its last (one read) and copies the
/// box's rows out of it.
static std::vector<std::byte> readBox(const std::string &path,
                                      const ckpt::SafetensorsHeader &header,
                                      const ckpt::SafetensorsTensor &t,
                                      const ckpt::Box &box) {
  const int64_t eb = plan::dtypeBytes(t.dtype);
  const size_t n = t.shape.size();
  auto linear = [&](const std::vector<int64_t> &coord) {
    int64_t idx = 0;
    for (size_t d = 0; d < n; ++d)
      idx = idx * t.shape[d] + coord[d];
    return idx;
  };
  std::vector<int64_t> last(n);
  for (size_t d = 0; d < n; ++d)
    last[d] = box.offset[d] + box.shape[d] - 1;
  const int64_t first = linear(box.offset) * eb;
  const int64_t end = (linear(last) + 1) * eb;
  std::vector<std::byte> span(size_t(end - first));
  if (auto ok = ckpt::readSafetensorsBytes(path, header, t, first, span); !ok)
    throw CliError(ok.error().message);
  std::vector<std::byte> out(size_t(box.numElements() * eb));
  const int64_t row = (n ? box.shape[n - 1] : 1) * eb;
  std::vector<int64_t> coord = box.offset;
  for (int64_t at = 0; at < int64_t(out.size()); at += row) {
    std::memcpy(out.data() + at, span.data() + (linear(coord) * eb - first),
                size_t(row));
    // Next row: odometer over the outer dims.
    for (int d = int(n) - 2; d >= 0; --d) {
      if (++coord[size_t(d)] <= last[size_t(d)])
        break;
      coord[size_t(d)] = box.offset[size_t(d)];
    }
  }
  return out;
}

CommandOutput
meshplan::cli::runCkptImportCommand(const CkptImportOptions &options) {
  checkOutputDir(options.out);
  auto header = ckpt::readSafetensorsHeader(options.file);
  if (!header)
    throw CliError(header.error().message);
  SpecBoxes spec = boxesOfSpec(options.spec);
  const std::string &file = options.file;
  // Every parameter of the plan, exactly as the plan stores it, and
  // nothing else: a file of another model is refused, not half used.
  std::set<std::string> names;
  for (const ckpt::PersistentBox *p : parametersOf(spec)) {
    names.insert(p->tensor);
    std::string code(ckpt::safetensorsDTypeCode(p->dtype));
    const ckpt::SafetensorsTensor *t = header->find(p->tensor);
    if (!t)
      throw CliError(file + ": no tensor " + json::quote(p->tensor) +
                     " (a parameter of model " + spec.planned.modelName + ": " +
                     code + " " + ints(p->globalShape) + ")");
    if (t->shape != p->globalShape)
      throw CliError(file + ": tensor " + json::quote(p->tensor) +
                     " has shape " + ints(t->shape) + " in the file but " +
                     ints(p->globalShape) + " in the plan of model " +
                     spec.planned.modelName);
    if (t->dtype != p->dtype)
      throw CliError(file + ": tensor " + json::quote(p->tensor) + " is " +
                     std::string(ckpt::safetensorsDTypeCode(t->dtype)) +
                     " in the file but the plan stores it as " + code + " (" +
                     std::string(plan::dtypeName(p->dtype)) +
                     "); import converts no dtype");
  }
  for (const ckpt::SafetensorsTensor &t : header->tensors)
    if (!names.count(t.name))
      throw CliError(file + ": tensor " + json::quote(t.name) +
                     " is not a parameter of model " + spec.planned.modelName);

  ckpt::CheckpointInfo info;
  info.model = {spec.planned.modelName, ""};
  info.spec = {options.spec.spec, ckpt::fingerprintOf(spec.planned.specText)};
  info.training.step = 0;
  if (spec.optimizer) {
    info.training.seed = spec.optimizer->seed;
    info.training.stochasticRounding = spec.optimizer->stochasticRounding;
  }
  info.mesh = spec.planned.mesh;
  info.generator = "meshplan ckpt import";
  ckpt::CheckpointMetadata written = writeCheckpoint(
      options.out, spec, info, [&](const ckpt::PersistentBox &b) {
        if (b.kind == ckpt::TensorKind::Parameter)
          return readBox(file, *header, *header->find(b.tensor), b.box);
        // Optimizer state starts at zero, as a fresh AdamW's does.
        return std::vector<std::byte>(
            size_t(b.box.numElements() * plan::dtypeBytes(b.dtype)));
      });
  CommandOutput result;
  result.out = "imported " + std::to_string(names.size()) + " parameters of " +
               file + " for mesh " + spec.planned.mesh + " (" +
               std::to_string(spec.planned.worldSize) +
               " ranks; optimizer state zero, step 0): wrote " + options.out +
               ": " + summaryLine(written) + "\n";
  return result;
}

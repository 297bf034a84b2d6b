//===- CkptCommands.cpp - meshplan ckpt ... -------------------------------===//

#include "CkptCommands.h"

#include "HfLlama.h"
#include "MeshSetup.h"
#include "Progress.h"

#include "meshplan/Checkpoint/Cast.h"
#include "meshplan/Checkpoint/Checkpoint.h"
#include "meshplan/Checkpoint/Safetensors.h"
#include "meshplan/Frontend/Spec.h"
#include "meshplan/Plan/Plan.h"
#include "meshplan/Support/Json.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include <sys/stat.h>
#include <unistd.h>

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
  if (out == "-")
    throw CliError("-o: a checkpoint is a directory; \"-\" (standard "
                   "output) names no directory");
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

/// Whether --progress MODE draws the bar (a CliError for another mode).
bool progressOrThrow(const std::string &mode) {
  std::optional<bool> wanted = progressWanted(mode);
  if (!wanted)
    throw CliError("--progress: expected auto, always or never, not \"" + mode +
                   "\"");
  return *wanted;
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
/// bytes produced by `bytesOf(box)`, `bar` advanced per rank written. The
/// staging directory is removed on any failure, so nothing half-written
/// remains.
ckpt::CheckpointMetadata writeCheckpoint(
    const std::string &out, const SpecBoxes &spec,
    const ckpt::CheckpointInfo &info,
    const std::function<std::vector<std::byte>(const ckpt::PersistentBox &)>
        &boxBytes,
    ProgressBar &bar) {
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
    // The message names what was asked for, then the file that failed (in
    // the staging directory, removed on the way out) and why: a full disk
    // is "No space left on device".
    if (!written)
      throw CliError("-o: cannot write " + out + ": " +
                     written.error().message);
    records.push_back(std::move(*written));
    bar(int64_t(r) + 1, int64_t(spec.ranks.size()));
  }
  auto meta = ckpt::commitCheckpoint(out, info, records);
  if (!meta)
    throw CliError("-o: cannot write " + out + ": " + meta.error().message);
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
    if (!meta.from.empty())
      j["written_by"]["from"] = meta.from;
    if (!meta.conversion.empty())
      j["written_by"]["conversion"] = meta.conversion;
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
  out << "checkpoint " << options.dir << " (format version " << meta.version
      << ")\n";
  out << "  model:      " << ref(meta.model) << "\n";
  out << "  spec:       " << ref(meta.spec) << "\n";
  out << "  written by: "
      << (meta.generator.empty() ? std::string("-") : meta.generator)
      << " on mesh " << (meta.mesh.empty() ? std::string("-") : meta.mesh)
      << "\n";
  if (!meta.from.empty())
    out << "  from:       " << meta.from << "\n";
  if (!meta.conversion.empty())
    out << "  converted:  " << meta.conversion << "\n";
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
  ProgressBar bar(progressOrThrow(options.progress), "checking bytes");
  CommandOutput result;
  auto report = ckpt::verifyCheckpoint(options.dir, std::ref(bar));
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
  progressOrThrow(options.progress);
  ckpt::CheckpointMetadata meta = readOrThrow(options.dir);
  SpecBoxes spec = boxesOfSpec(options.spec);
  // Everything is checked before the first byte is written: every box of
  // every rank must exist with the plan's shape and dtype, and nothing of
  // the checkpoint may be dropped (a spec of another model, or without the
  // optimizer, would silently lose state).
  if (options.cast.optimizerState != "keep" &&
      options.cast.optimizerState != "reset")
    throw CliError(
        "--optimizer-state: " + json::quote(options.cast.optimizerState) +
        ": expected keep or reset");
  ckpt::LoadOptions load;
  load.dtypeCast = options.cast.dtypeCast;
  load.resetOptimizerState = options.cast.optimizerState == "reset";
  std::set<std::string> planned;
  std::vector<ckpt::PersistentBox> firstOfEach; // one box per tensor
  for (const auto &rank : spec.ranks) {
    if (auto ok = ckpt::checkLoadable(meta, rank, load); !ok)
      throw CliError(ok.error().message + " (--spec " + options.spec.spec +
                     ", model " + spec.planned.modelName + ")");
    for (const ckpt::PersistentBox &b : rank)
      if (planned.insert(b.tensor).second)
        firstOfEach.push_back(b);
  }
  for (const ckpt::TensorEntry &t : meta.tensors)
    if (!planned.count(t.name) && !(load.resetOptimizerState &&
                                    t.kind == ckpt::TensorKind::OptimizerState))
      throw CliError(options.dir + ": tensor " + json::quote(t.name) +
                     " of the checkpoint has no place in the plan of --spec " +
                     options.spec.spec + " (model " + spec.planned.modelName +
                     "); resharding would drop it");

  ckpt::CheckpointInfo info;
  info.model = meta.model;
  info.spec = {options.spec.spec, ckpt::fingerprintOf(spec.planned.specText)};
  info.training = meta.training;
  // A reset optimizer is a fresh AdamW: its bias correction starts over.
  if (load.resetOptimizerState)
    info.training.step = 0;
  info.mesh = spec.planned.mesh;
  info.generator = "meshplan ckpt reshard";
  info.conversion = ckpt::describeConversion(meta, firstOfEach, load);
  // Provenance is kept through reshards of a converted checkpoint.
  info.from = meta.from;
  if (!info.conversion.empty()) {
    info.from = options.dir + " (meshplan checkpoint of mesh " +
                (meta.mesh.empty() ? std::string("-") : meta.mesh) + ", step " +
                std::to_string(meta.training.step) + ")";
    if (!meta.conversion.empty())
      info.conversion = meta.conversion + "; then " + info.conversion;
  } else {
    info.conversion = meta.conversion;
  }
  ProgressBar bar(progressOrThrow(options.progress), "writing ranks");
  ckpt::CheckpointMetadata written = writeCheckpoint(
      options.out, spec, info,
      [&](const ckpt::PersistentBox &b) {
        // Reads only the checksum blocks that intersect the box, verified;
        // cast to the plan's dtype under --dtype-cast.
        std::vector<std::byte> bytes(
            size_t(b.box.numElements() * plan::dtypeBytes(b.dtype)));
        if (auto ok = ckpt::loadPersistentBoxInto(meta, b, load, bytes); !ok)
          throw CliError(ok.error().message);
        return bytes;
      },
      bar);
  CommandOutput result;
  result.out =
      "resharded " + options.dir + " (mesh " +
      (meta.mesh.empty() ? std::string("-") : meta.mesh) + ") for mesh " +
      spec.planned.mesh + " (" + std::to_string(spec.planned.worldSize) +
      " ranks" +
      (load.dtypeCast || load.resetOptimizerState
           ? "; " + (written.conversion.empty()
                         ? std::string("nothing to convert")
                         : ckpt::describeConversion(meta, firstOfEach, load))
           : "") +
      "): wrote " + options.out + ": " + summaryLine(written) + "\n";
  return result;
}

//===----------------------------------------------------------------------===//
// export
//===----------------------------------------------------------------------===//

/// `ckpt export --format hf-llama`: the model's dims (its heads permute wq
/// and wk) from --model, or the checkpoint's model when that names a preset.
static CommandOutput exportHfLlama(const CkptExportOptions &options) {
  if (options.out.empty())
    throw CliError("-o: an output directory is required");
  if (options.out == "-")
    throw CliError("-o: --format hf-llama writes a directory; \"-\" "
                   "(standard output) names no directory");
  int64_t maxShard =
      hf::parseByteSize(options.maxShardSize, "--max-shard-size");
  ckpt::CheckpointMetadata meta = readOrThrow(options.dir);
  frontend::Spec byName;
  byName.model = options.model.empty() ? meta.model.name : options.model;
  auto model = frontend::loadSpecModel(byName, "");
  if (!model)
    throw CliError((options.model.empty()
                        ? options.dir + ": the checkpoint's model " +
                              json::quote(meta.model.name) +
                              " (give the model file with --model): "
                        : "--model: ") +
                   model.error().message);
  hf::LlamaDims dims = hf::llamaDimsOf(**model);
  hf::HfExport e = hf::exportHfLlama(meta, dims, options.out, maxShard);
  CommandOutput result;
  result.out = "exported " + std::to_string(e.tensors) + " tensors (" +
               std::to_string(e.bytes) + " bytes) of " + options.dir +
               " as a Hugging Face Llama (" +
               (e.tied ? "tied embeddings" : "untied embeddings") + ", " +
               std::to_string(e.files) +
               (e.files == 1 ? " safetensors file" : " safetensors shards") +
               ") to " + options.out + "\n";
  return result;
}

CommandOutput
meshplan::cli::runCkptExportCommand(const CkptExportOptions &options) {
  if (options.format == "hf-llama")
    return exportHfLlama(options);
  if (options.format != "safetensors")
    throw CliError("--format: " + json::quote(options.format) +
                   ": expected safetensors or hf-llama");
  if (!options.model.empty())
    throw CliError("--model: only with --format hf-llama");
  if (options.out.empty())
    throw CliError("-o: an output file is required");
  bool toStdout = options.out == "-";
  // A binary file on a terminal is a mistake, not an output.
  if (toStdout && ::isatty(STDOUT_FILENO))
    throw CliError("-o -: stdout is a terminal; redirect it to a file or a "
                   "pipe for the safetensors bytes");
  std::error_code ec;
  if (!toStdout && fs::is_directory(options.out, ec))
    throw CliError("-o: " + options.out + ": is a directory");
  fs::path parent = fs::path(options.out).parent_path();
  if (!toStdout && !parent.empty() && !fs::is_directory(parent, ec))
    throw CliError("-o: the parent directory " + parent.string() +
                   " does not exist");
  ProgressBar bar(progressOrThrow(options.progress), "exporting tensors");
  ckpt::CheckpointMetadata meta = readOrThrow(options.dir);
  // "-": the file is written whole (and checked) in a private temporary
  // directory first, then copied to stdout, so that a failure leaves no
  // partial file on stdout either.
  std::string target = options.out;
  struct TempDir {
    std::string path;
    ~TempDir() {
      std::error_code ec;
      if (!path.empty())
        fs::remove_all(path, ec);
    }
  } temp;
  if (toStdout) {
    std::string pattern =
        (fs::temp_directory_path(ec) / "meshplan-export-XXXXXX").string();
    std::vector<char> buf(pattern.begin(), pattern.end());
    buf.push_back('\0');
    if (ec || !::mkdtemp(buf.data()))
      throw CliError("-o -: cannot make a temporary directory under " +
                     fs::temp_directory_path(ec).string());
    temp.path = buf.data();
    target = temp.path + "/model.safetensors";
  }
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
  int64_t filled = 0;
  bool readFailed = false;
  auto written = ckpt::writeSafetensors(
      target, entries, metadata,
      [&](size_t i, std::span<std::byte> out) -> Result<void> {
        // fill runs in the file's order, not i's: count the calls.
        bar(filled++, int64_t(params.size()));
        const ckpt::TensorEntry &t = *params[i];
        ckpt::Box whole{std::vector<int64_t>(t.shape.size(), 0), t.shape};
        auto loaded =
            ckpt::loadBoxInto(meta, t.name, t.shape, whole, t.dtype, out);
        readFailed = !loaded;
        return loaded;
      });
  // A checksum failure names the checkpoint's file; a failed write (a full
  // disk) names the output first.
  if (!written)
    throw CliError(readFailed ? written.error().message
                              : "-o: cannot write " + options.out + ": " +
                                    written.error().message);
  bar(int64_t(params.size()), int64_t(params.size()));
  CommandOutput result;
  std::string line = "exported " + std::to_string(params.size()) +
                     " parameters (" + std::to_string(bytes) + " bytes) of " +
                     options.dir + " to " +
                     (toStdout ? std::string("stdout") : options.out) + "\n";
  if (!toStdout) {
    result.out = line;
    return result;
  }
  // The file on stdout (it may be large: streamed, not held); the line on
  // stderr.
  std::ifstream in(target, std::ios::binary);
  if (!(std::cout << in.rdbuf()) || !std::cout.flush())
    throw CliError("-o -: cannot write to stdout");
  result.err = "meshplan: " + line;
  return result;
}

//===----------------------------------------------------------------------===//
// import
//===----------------------------------------------------------------------===//

CommandOutput
meshplan::cli::runCkptImportCommand(const CkptImportOptions &options) {
  const bool hfLlama = options.format == "hf-llama";
  if (!hfLlama && options.format != "safetensors")
    throw CliError("--format: " + json::quote(options.format) +
                   ": expected safetensors or hf-llama");
  checkOutputDir(options.out);
  progressOrThrow(options.progress);
  const std::string &file = options.file;
  std::optional<ckpt::SafetensorsHeader> header;
  if (!hfLlama) {
    auto read = ckpt::readSafetensorsHeader(file);
    if (!read)
      throw CliError(read.error().message);
    header = std::move(*read);
  }
  SpecBoxes spec = boxesOfSpec(options.spec);
  // Where each parameter's bytes are: the file's tensor of the same name,
  // or the HF checkpoint's mapped (and for wq/wk permuted) tensor.
  std::unique_ptr<hf::HfCheckpoint> hfCheckpoint;
  std::map<std::string, hf::SourceTensor> plainSources;
  if (hfLlama) {
    hfCheckpoint = hf::openHfLlama(file, hf::llamaDimsOf(*spec.planned.model));
  } else {
    for (const ckpt::SafetensorsTensor &t : header->tensors)
      plainSources[t.name] = {&file, &*header, &t, 0};
  }
  const std::map<std::string, hf::SourceTensor> &sources =
      hfLlama ? hfCheckpoint->sources : plainSources;

  // Every parameter of the plan, exactly as the plan stores it (or cast,
  // when asked), and nothing else: a file of another model is refused, not
  // half used.
  std::set<std::string> names;
  std::map<std::pair<plan::DType, plan::DType>, int64_t> casts;
  for (const ckpt::PersistentBox *p : parametersOf(spec)) {
    names.insert(p->tensor);
    std::string code(ckpt::safetensorsDTypeCode(p->dtype));
    auto it = sources.find(p->tensor);
    if (it == sources.end()) // hf-llama maps every parameter, or refuses
      throw CliError(file + ": no tensor " + json::quote(p->tensor) +
                     " (a parameter of model " + spec.planned.modelName + ": " +
                     code + " " + ints(p->globalShape) + ")");
    const ckpt::SafetensorsTensor &t = *it->second.tensor;
    std::string where =
        *it->second.path + ": tensor " + json::quote(t.name) +
        (t.name != p->tensor ? " (meshplan's " + p->tensor + ")" : "");
    if (t.shape != p->globalShape)
      throw CliError(where + " has shape " + ints(t.shape) +
                     " in the file but " + ints(p->globalShape) +
                     " in the plan of model " + spec.planned.modelName);
    if (t.dtype == p->dtype)
      continue;
    std::string mismatch = where + " is " +
                           std::string(ckpt::safetensorsDTypeCode(t.dtype)) +
                           " in the file but the plan stores it as " + code +
                           " (" + std::string(plan::dtypeName(p->dtype)) + ")";
    if (!options.dtypeCast)
      throw CliError(mismatch + "; import converts no dtype without "
                                "--dtype-cast (round to nearest even)");
    if (!ckpt::isCastableDType(t.dtype) || !ckpt::isCastableDType(p->dtype))
      throw CliError(mismatch + "; --dtype-cast converts only float32, "
                                "bfloat16 and float16");
    ++casts[{t.dtype, p->dtype}];
  }
  if (!hfLlama)
    for (const ckpt::SafetensorsTensor &t : header->tensors)
      if (!names.count(t.name))
        throw CliError(file + ": tensor " + json::quote(t.name) +
                       " is not a parameter of model " +
                       spec.planned.modelName);

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
  info.from =
      file + (hfLlama
                  ? " (hf-llama; " + hfCheckpoint->configPath + " " +
                        hfCheckpoint->configFingerprint +
                        (hfCheckpoint->tied ? "; tied embeddings" : "") + ")"
                  : " (safetensors)");
  for (const auto &[dtypes, count] : casts)
    info.conversion += (info.conversion.empty() ? "" : "; ") +
                       std::to_string(count) + " parameters " +
                       std::string(plan::dtypeName(dtypes.first)) + "->" +
                       std::string(plan::dtypeName(dtypes.second)) +
                       " (round to nearest even)";
  ProgressBar bar(progressOrThrow(options.progress), "writing ranks");
  ckpt::CheckpointMetadata written = writeCheckpoint(
      options.out, spec, info,
      [&](const ckpt::PersistentBox &b) {
        if (b.kind != ckpt::TensorKind::Parameter)
          // Optimizer state starts at zero, as a fresh AdamW's does.
          return std::vector<std::byte>(
              size_t(b.box.numElements() * plan::dtypeBytes(b.dtype)));
        const hf::SourceTensor &source = sources.at(b.tensor);
        std::vector<std::byte> bytes = hf::readSourceBox(source, b.box);
        if (source.tensor->dtype == b.dtype)
          return bytes;
        std::vector<std::byte> cast(
            size_t(b.box.numElements() * plan::dtypeBytes(b.dtype)));
        if (auto ok =
                ckpt::castElements(source.tensor->dtype, bytes, b.dtype, cast);
            !ok)
          throw CliError(ok.error().message);
        return cast;
      },
      bar);
  CommandOutput result;
  result.out =
      "imported " + std::to_string(names.size()) + " parameters of " + file +
      (hfLlama ? std::string(" (hf-llama") +
                     (hfCheckpoint->tied ? ", tied embeddings" : "") + ")"
               : "") +
      " for mesh " + spec.planned.mesh + " (" +
      std::to_string(spec.planned.worldSize) +
      " ranks; optimizer state zero, step 0" +
      (info.conversion.empty() ? "" : "; " + info.conversion) + "): wrote " +
      options.out + ": " + summaryLine(written) + "\n";
  return result;
}

//===- CkptCommands.h - meshplan ckpt inspect|verify|reshard|export|import ===//
//
// The offline checkpoint commands (docs/checkpoint-format.md, "The ckpt
// command"): they read and write checkpoints with MeshplanCheckpoint and
// plan specs in-process as `meshplan plan` does, without a trainer. Bad
// input is a CliError (one line, exit 2) raised before anything is written:
// a checkpoint appears only through the library's atomic commit, a
// safetensors file only by a rename, and a failed write removes its staging
// directory or temporary file.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_TOOLS_PLANNER_CKPTCOMMANDS_H
#define MESHPLAN_TOOLS_PLANNER_CKPTCOMMANDS_H

#include "PlanCommands.h"

#include <string>

namespace meshplan::cli {

struct CkptInspectOptions {
  std::string dir;
  bool chunks = false; ///< list every chunk under its tensor
  bool json = false;
};
CommandOutput runCkptInspectCommand(const CkptInspectOptions &options);

/// Exit 0: every checksum matches; 1: the metadata is well-formed but a
/// data block fails its checksum (the report names tensor, file, byte);
/// 2: no readable checkpoint.
struct CkptVerifyOptions {
  std::string dir;
  std::string progress = "auto"; ///< auto | always | never
};
CommandOutput runCkptVerifyCommand(const CkptVerifyOptions &options);

/// --dtype-cast and --optimizer-state of reshard (and of a session's load):
/// docs/checkpoint-format.md, "Dtype casts".
struct CastFlags {
  bool dtypeCast = false;
  std::string optimizerState = "keep"; ///< keep | reset
};

struct CkptReshardOptions {
  std::string dir;
  SpecFlags spec;
  std::string out;
  CastFlags cast;
  std::string progress = "auto"; ///< auto | always | never
};
CommandOutput runCkptReshardCommand(const CkptReshardOptions &options);

struct CkptExportOptions {
  std::string dir;
  std::string out;
  std::string format = "safetensors"; ///< safetensors | hf-llama
  /// hf-llama: the model (preset or file) whose heads permute wq/wk; by
  /// default the checkpoint's model name.
  std::string model;
  std::string maxShardSize = "5GB"; ///< hf-llama
  std::string progress = "auto";    ///< auto | always | never
};
CommandOutput runCkptExportCommand(const CkptExportOptions &options);

struct CkptImportOptions {
  std::string file;
  SpecFlags spec;
  std::string out;
  std::string format = "safetensors"; ///< safetensors | hf-llama
  bool dtypeCast = false;
  std::string progress = "auto"; ///< auto | always | never
};
CommandOutput runCkptImportCommand(const CkptImportOptions &options);

} // namespace meshplan::cli

#endif // MESHPLAN_TOOLS_PLANNER_CKPTCOMMANDS_H

//===- Data.h - A deterministic byte-level token stream -------------------===//
//
// meshplan-train learns to predict text that ships with the repository (its
// own docs): bytes are tokens (vocabulary 256, the tiny preset's), no
// download, no tokenizer. Every sequence of a step is a window of the text
// whose start is a hash of (seed, step, microbatch, global sequence index),
// so the data a rank reads depends only on which sequences it owns, never on
// the layout: a single process reading every sequence sees the same global
// batch as the data-parallel ranks together.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_TRAINER_DATA_H
#define MESHPLAN_TRAINER_DATA_H

#include "meshplan/Core/Result.h"

#include <cstdint>
#include <string>
#include <vector>

namespace meshplan::trainer {

class TextData {
public:
  /// A text file, or a directory whose regular files ending in .md or .txt
  /// (recursively, sorted by path) are concatenated. Errors name the path.
  static Result<TextData> load(const std::string &path);

  int64_t size() const { return static_cast<int64_t>(text.size()); }
  /// The files read, for the trainer's first line.
  const std::vector<std::string> &files() const { return paths; }

  /// Sequences [first, first + batch) of (step, microbatch): tokens and the
  /// next-token targets, [batch, seqLen] each. Needs size() > seqLen.
  void fill(uint64_t seed, int64_t step, int64_t microbatch, int64_t first,
            int64_t batch, int64_t seqLen, std::vector<int32_t> &tokens,
            std::vector<int32_t> &targets) const;

private:
  std::string text;
  std::vector<std::string> paths;
};

} // namespace meshplan::trainer

#endif // MESHPLAN_TRAINER_DATA_H

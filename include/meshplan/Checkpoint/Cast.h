//===- Cast.h - Explicit dtype casts on checkpoint load ---------*- C++ -*-===//
//
// Loading a checkpoint converts no dtype unless asked to: a tensor stored as
// float32 under a plan that keeps it as bfloat16 is refused by checkLoadable.
// With LoadOptions::dtypeCast the floating-point dtypes float32, bfloat16 and
// float16 convert into each other, rounding to nearest even as torch's
// `Tensor.to` does (widening is exact; bfloat16 <-> float16 goes through
// float32, which holds both exactly, so it rounds once). Optimizer state is
// cast the same way, or, with resetOptimizerState, not read at all and
// started at zero (a fresh AdamW's). `meshplan ckpt import|reshard
// --dtype-cast` and a session's load use these (docs/checkpoint-format.md,
// "Dtype casts").
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_CHECKPOINT_CAST_H
#define MESHPLAN_CHECKPOINT_CAST_H

#include "meshplan/Checkpoint/Checkpoint.h"

#include <cstdint>
#include <span>

namespace meshplan::ckpt {

/// float32, bfloat16 and float16: the dtypes a cast converts between.
bool isCastableDType(plan::DType dtype);

/// One element, round to nearest even. NaN gives a quiet NaN (bfloat16:
/// 0x7FC0, torch's scalar conversion; float16: the sign and 0x7E00); values
/// beyond the largest finite float16 (65504, ties included: 65520 and up)
/// give infinity; subnormals of either side are converted exactly or
/// rounded, never flushed.
uint16_t floatToBFloat16(float value);
uint16_t floatToFloat16(float value);
float bfloat16ToFloat(uint16_t bits);
float float16ToFloat(uint16_t bits);

/// Converts in.size() / bytes(from) elements of `from` (little-endian) into
/// `out` as `to`. Both dtypes castable; sizes must match the element count.
Result<void> castElements(plan::DType from, std::span<const std::byte> in,
                          plan::DType to, std::span<std::byte> out);

struct LoadOptions {
  /// Convert a tensor stored as another castable dtype than the plan's
  /// (see file comment); without it a dtype mismatch is refused.
  bool dtypeCast = false;
  /// Do not read optimizer state: it starts at zero.
  bool resetOptimizerState = false;
};

/// checkLoadable with the options: dtype mismatches between castable dtypes
/// pass under dtypeCast; optimizer state is not checked under
/// resetOptimizerState. A mismatch without dtypeCast names the flag that
/// allows it (--dtype-cast).
Result<void> checkLoadable(const CheckpointMetadata &meta,
                           std::span<const PersistentBox> boxes,
                           const LoadOptions &options);

/// loadBoxInto for one of a plan's boxes, in the plan's dtype: loaded as
/// stored and cast when the dtypes differ (under dtypeCast), zero for
/// optimizer state under resetOptimizerState. `out` holds the box in
/// b.dtype.
Result<void> loadPersistentBoxInto(const CheckpointMetadata &meta,
                                   const PersistentBox &box,
                                   const LoadOptions &options,
                                   std::span<std::byte> out);

/// What a load with `options` converts, one phrase per (kind, from, to),
/// e.g. "21 parameters float32->bfloat16; optimizer state reset"; "" when
/// nothing is converted. For checkpoint.json's written_by.conversion.
std::string describeConversion(const CheckpointMetadata &meta,
                               std::span<const PersistentBox> boxes,
                               const LoadOptions &options);

} // namespace meshplan::ckpt

#endif // MESHPLAN_CHECKPOINT_CAST_H

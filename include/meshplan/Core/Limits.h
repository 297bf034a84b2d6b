//===- Limits.h - Limits on the size of any input -------------------------===//
//
// meshplan reads untrusted specs, models, plans, MLIR and command-line
// expressions. Every size an input can name is bounded here, in one place,
// so that each command's time and memory have a bound the user can look up
// (docs/limits.md lists each limit, why it is what it is, and what each
// command may then need) and anything beyond a limit is an ordinary error
// naming the item and the limit, reached before any large allocation.
//
// The core, the frontend, the plan reader, the dialect and the CLI all use
// these constants; none of them defines a limit of its own. Messages cite
// the limit as written in kLimitName-style strings below so that the text
// and the value cannot drift apart.
//
// Plain C++ with no dependencies: the runtime and MLIR code include it too.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_CORE_LIMITS_H
#define MESHPLAN_CORE_LIMITS_H

#include <cstdint>

namespace meshplan {

/// Largest number of devices (ranks) a mesh may have. Rank ids, group
/// indices and communicator colors must fit the `int` that NCCL, Gloo and
/// torch.distributed use; planning one rank is O(axes) per query, so the
/// planner itself is fine at this size.
constexpr int64_t kMaxMeshDevices = int64_t(1) << 31;
constexpr const char *kMaxMeshDevicesText = "2^31";

/// Largest number of members of a group that is listed member by member (a
/// plan's communicator, `dist-specialize-rank`, `meshplan mesh`): a listed
/// group costs 8 bytes per member in memory and ~10 in a plan file, per
/// communicator, per rank. Groups of the largest benchmarked meshes (131,072
/// ranks) are far below it.
constexpr int64_t kMaxGroupMembers = int64_t(1) << 20;
constexpr const char *kMaxGroupMembersText = "2^20";

/// Largest number of integers a listing command (`meshplan mesh`, `layout`,
/// `redistribute` without --rank) may print: listing every rank's groups
/// grows with world x group size, so the output, not the mesh, is bounded.
/// About 20 MB of text and 1 s; --rank asks for one rank.
constexpr int64_t kMaxListedIntegers = int64_t(1) << 22;
constexpr const char *kMaxListedIntegersText = "2^22";

/// Largest number of plans one plan directory may hold: `meshplan plan
/// --all` writes one file per rank and `meshplan verify DIR` holds every
/// plan in memory at once. The largest benchmarked mesh has this many ranks;
/// beyond it, plan ranks one at a time with --rank (O(axes) per query).
constexpr int64_t kMaxPlanDirectoryRanks = int64_t(1) << 17;
constexpr const char *kMaxPlanDirectoryRanksText = "2^17 (131072)";

/// Largest number of (coordinate combination, piece) pairs checked when a
/// dim's DTensor placements (Shard, _StridedShard) are converted to a
/// layout: the check is exhaustive so that a wrong offset is never reported.
/// Bounds time to about a second.
constexpr int64_t kMaxPlacementChecks = int64_t(1) << 22;
constexpr const char *kMaxPlacementChecksText = "2^22";

/// Largest number of elements a tensor may have; keeps byte counts and chunk
/// arithmetic far from int64 overflow.
constexpr int64_t kMaxTensorElements = int64_t(1) << 50;
constexpr const char *kMaxTensorElementsText = "2^50";

/// Largest tensor rank (number of dims) of a shape or a layout.
constexpr int kMaxTensorRank = 64;

/// Largest number of axes a mesh may have (every axis of size >= 2 halves
/// the remaining room, so 31 would already do; size-1 axes are allowed).
constexpr int kMaxMeshAxes = 64;

/// Largest nesting depth of a JSON document (spec, model); deeper documents
/// are refused before any recursive code sees them. Plans use
/// kMaxPlanJsonDepth.
constexpr int kMaxJsonDepth = 64;
constexpr int kMaxPlanJsonDepth = 32;

/// Largest spec or model file; plans (machine-written, one per rank, large
/// for big models) may be up to kMaxPlanFileBytes.
constexpr int64_t kMaxFileBytes = int64_t(64) << 20;
constexpr int64_t kMaxPlanFileBytes = int64_t(256) << 20;
constexpr const char *kMaxPlanFileBytesText = "256 MiB";

/// Largest number of JSON values (scalars and containers) one plan may hold.
/// The tape reader (Support/JsonReader.h) keeps 16 bytes per value and key,
/// so this bounds a plan's parse to 512 MiB whatever its text; a Llama 3
/// 405B plan of 16,384 ranks has about a million (4.4 MiB of text).
constexpr int64_t kMaxPlanJsonValues = int64_t(1) << 24;
constexpr const char *kMaxPlanJsonValuesText = "2^24";

/// Largest number of JSON values of one checkpoint's metadata, which lists
/// every chunk of every tensor (about ten values a chunk): a few million
/// chunks, at most 1 GiB of tape.
constexpr int64_t kMaxCheckpointJsonValues = int64_t(1) << 26;
constexpr const char *kMaxCheckpointJsonValuesText = "2^26";

/// Longest string (or key) of a document read by the tape reader: plans,
/// plan indexes, checkpoint metadata. Their strings are names, labels, ids
/// and file names; specs and models are bounded by kMaxFileBytes.
constexpr int64_t kMaxJsonStringBytes = int64_t(1) << 16;
constexpr const char *kMaxJsonStringBytesText = "64 KiB";

/// Largest numbers of instructions, buffers, communicators and streams of
/// one plan. Streams become executor threads (one per stream), so they are
/// bounded tightly; the others bound the arrays a plan can make the reader,
/// the verifier and the executor hold. A Llama 3 405B plan has about 600
/// instructions, 1,900 buffers, a dozen communicators and 3 streams.
constexpr int64_t kMaxPlanInstructions = int64_t(1) << 22;
constexpr const char *kMaxPlanInstructionsText = "2^22";
constexpr int64_t kMaxPlanBuffers = int64_t(1) << 22;
constexpr const char *kMaxPlanBuffersText = "2^22";
constexpr int64_t kMaxPlanCommunicators = int64_t(1) << 16;
constexpr const char *kMaxPlanCommunicatorsText = "2^16";
constexpr int64_t kMaxPlanStreams = 64;
constexpr const char *kMaxPlanStreamsText = "64";

/// Largest number of (stage, microbatch) pairs of one schedule, i.e. pp
/// degree x stages per rank x microbatches. Each pair becomes at most seven
/// actions (F, B or I+W, and up to four sends/recvs) of 16 bytes, so this
/// bounds a schedule to about 112 MiB and its check to well under a second;
/// real schedules (pp 64, v 8, 512 microbatches = 2^18) are below it.
/// Refused before anything is allocated (Core/PipelineSchedule.h).
constexpr int64_t kMaxPipelineStageMicrobatches = int64_t(1) << 20;
constexpr const char *kMaxPipelineStageMicrobatchesText = "2^20";

/// Products of sizes that must not overflow: `*out = a * b`, false (and *out
/// unspecified) on int64 overflow. Every product of user-supplied sizes in
/// core goes through this (or through a check against one of the limits
/// above made with it).
inline bool mulOverflows(int64_t a, int64_t b, int64_t *out) {
  return __builtin_mul_overflow(a, b, out);
}

} // namespace meshplan

#endif // MESHPLAN_CORE_LIMITS_H

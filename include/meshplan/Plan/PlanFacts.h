//===- PlanFacts.h - What verification reads of plans' buffers and operands
//===//
//
// The cross-rank checks of what a step computes (which tensor each operand
// of a collective is, which optimizer updates each parameter, which
// callback runs which microbatch, what an instruction may write) read every
// plan's buffers, operand lists, labels and callbacks. Held as plain Plans,
// a thousand plans of an 8B model would take about 1.4 GiB more than the
// verification-only plans `meshplan verify` keeps (docs/performance.md,
// section B), yet almost all of it is the same strings on every rank. So
// verification reads them as *facts*: every string and every buffer
// description once per plan set (interned), and per plan only integer
// indices into those tables.
//
// A FactsBuilder records the facts of full plans (buffers present), one
// builder per reading thread; mergeFacts combines the builders into the
// set's tables. Plain C++20, no exceptions.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_PLAN_PLANFACTS_H
#define MESHPLAN_PLAN_PLANFACTS_H

#include "meshplan/Plan/Plan.h"

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace meshplan::plan {

/// A buffer as every rank that holds it should describe it: all of Buffer
/// but the rank's own box (which validatePlan already checked against the
/// layout). Strings are indices into PlanSetFacts::strings.
struct BufferFacts {
  int32_t id = -1;
  int32_t tensor = -1; ///< -1: no tensor
  int32_t layout = -1;
  BufferKind kind = BufferKind::Scratch;
  DType dtype = DType::Float32;
  std::optional<int64_t> tensorId;
  std::vector<int64_t> globalShape;
  int32_t scaleAmax = -1; ///< float8: the amax buffer's id (a string index)
  int64_t scaleIndex = 0;
  bool scalePowerOf2 = false;

  bool operator==(const BufferFacts &) const = default;
};

/// The compute callback an instruction runs (Instruction::phase).
enum class Phase : uint8_t {
  None,
  Forward,
  Backward,
  BackwardInput,
  BackwardWeight
};
std::string_view phaseName(Phase phase);

/// One plan's facts, by index. Instruction i's operands are
/// operands[operandStart[i] .. operandStart[i+1]): its inputs first
/// (inputCount[i] of them), then its outputs, each a buffer index of the
/// plan (an index into `buffers`).
struct PlanFacts {
  std::vector<int32_t> buffers; ///< per buffer: index into the set's buffers
  std::vector<int32_t> operandStart;
  std::vector<int32_t> inputCount;
  std::vector<int32_t> operands;
  std::vector<int32_t> label; ///< per instruction: string index (-1: none)
  std::vector<int32_t> unit;  ///< per instruction: string index (-1: none)
  std::vector<Phase> phase;
  std::vector<int64_t> microbatch;
  int32_t optimizer = -1; ///< index into the set's optimizers (-1: none)
};

struct PlanSetFacts {
  std::vector<std::string> strings;
  std::vector<BufferFacts> buffers;
  std::vector<OptimizerConfig> optimizers;
  /// Per plan, in the order of the plan vector they describe.
  std::vector<PlanFacts> plans;
};

/// Records the facts of full plans, interning into its own tables. Not
/// thread-safe: one builder per thread.
class FactsBuilder {
public:
  /// Records `plan` (which must pass validatePlan) as plan `index` of the
  /// set. `operandBuffers`, when given, are the plan's operands already
  /// resolved to buffer indices, per instruction its inputs then its outputs
  /// (what validation found; the plan directory reader passes them), so that
  /// no id is looked up again.
  void add(size_t index, const Plan &plan,
           const std::vector<int32_t> *operandBuffers = nullptr);

private:
  friend PlanSetFacts mergeFacts(std::vector<FactsBuilder> &builders,
                                 size_t plans);
  int32_t internString(std::string_view s);
  /// internString, trying `guess` (the string at this position in the
  /// previous plan) first: one comparison instead of a hash and a lookup.
  int32_t internStringAt(std::string_view s, int32_t guess);
  int32_t internBuffer(const Buffer &b, int32_t guess);
  /// Whether interned buffer `sig` describes `b`.
  bool describes(int32_t sig, const Buffer &b) const;

  std::deque<std::string> strings; ///< stable storage for the map's keys
  std::unordered_map<std::string_view, int32_t> stringIds;
  std::vector<BufferFacts> buffers;
  /// Hash -> first buffer with it; collisions chain through `nextBuffer`.
  std::unordered_map<uint64_t, int32_t> bufferByHash;
  std::vector<int32_t> nextBuffer;
  std::vector<OptimizerConfig> optimizers;
  std::vector<std::pair<size_t, PlanFacts>> added;
  /// By string id: the buffer last interned with that id (the likely
  /// description of the next plan's buffer of the id).
  std::vector<int32_t> lastOfId;
  /// By string id: the current plan's buffer index, valid where the stamp
  /// is the current plan's generation.
  std::vector<int32_t> localIndex;
  std::vector<uint32_t> localStamp;
  uint32_t generation = 0;
  /// The previous plan, by position: buffer b's interned description,
  /// operand k's local buffer index (flat, as PlanFacts::operands), and
  /// instruction i's label and unit. Ranks' plans are nearly the same
  /// program, so a guess from them is almost always right and costs a
  /// string comparison where a lookup costs a hash of the string.
  std::vector<int32_t> prevBuffers, prevOperands, prevLabel, prevUnit;
};

/// Combines builders that recorded distinct plans of one set of `plans`
/// plans (a plan no builder recorded gets empty facts).
PlanSetFacts mergeFacts(std::vector<FactsBuilder> &builders, size_t plans);

/// The facts of full plans, in one thread.
PlanSetFacts factsOf(const std::vector<Plan> &plans);

} // namespace meshplan::plan

#endif // MESHPLAN_PLAN_PLANFACTS_H

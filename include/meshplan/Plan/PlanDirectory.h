//===- PlanDirectory.h - Writing a plan directory all or nothing ----------===//
//
// Writes the rankN.json files and index.json of a plan directory (layout in
// docs/plan-format.md, "Plan directories") so that a failure never leaves a
// half-written directory: everything goes into a fresh sibling DIR.tmp-XXXXXX
// (mkdtemp), which is renamed onto DIR only when every file is written.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_PLAN_PLANDIRECTORY_H
#define MESHPLAN_PLAN_PLANDIRECTORY_H

#include "meshplan/Plan/Plan.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace meshplan::plan {

/// Writes `DIR/rankN.json` (writePlan(planOf(N))) for each rank in `ranks`
/// and `DIR/index.json` listing them.
///
/// `ranks` must be non-empty, distinct, non-negative and at most
/// `worldRanks` many; every plan must be for the rank it was asked for and
/// carry a mesh of `worldRanks` devices. `progress(done, total)` (may be
/// empty) is called after each file. With `threads` > 1, planOf is called
/// concurrently from that many threads (it must be thread-safe, as
/// PreparedTemplate::instantiate is) and progress is called from any of
/// them, one call at a time, with `done` increasing.
///
/// DIR may not exist yet, or be an empty directory, or a directory holding
/// only rankN.json and index.json files (an earlier plan: it is replaced
/// whole: renamed away, the new one renamed in, the old one removed).
/// Anything else in DIR (another file, a subdirectory, a symlink) is an
/// error naming DIR and the entry, and DIR is left alone. On any error the
/// temporary directory is removed and DIR is unchanged; the error names the
/// path involved.
Result<void> writePlanDirectory(
    const std::string &dir, int64_t worldRanks,
    const std::function<Result<Plan>(int64_t rank)> &planOf,
    const std::vector<int64_t> &ranks,
    const std::function<void(int64_t done, int64_t total)> &progress = nullptr,
    unsigned threads = 1);

} // namespace meshplan::plan

#endif // MESHPLAN_PLAN_PLANDIRECTORY_H

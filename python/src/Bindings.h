//===- Bindings.h - What the extension's files share ---------------------===//
//
// The `meshplan._meshplan` extension binds the planner (Planner.cpp) and the
// runtime (Session.cpp) with nanobind. It adds no semantics: every error is
// the C++ library's message, raised as one of the exception classes of
// meshplan/errors.py, and every value comes from the C++ API.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_PYTHON_BINDINGS_H
#define MESHPLAN_PYTHON_BINDINGS_H

#include "meshplan/Core/Result.h"
#include "meshplan/Plan/Plan.h"

#include <nanobind/nanobind.h>

#include <memory>
#include <string>

namespace meshplan::pipeline {
struct PlannedSpec;
}

namespace meshplan::python {

namespace nb = nanobind;

/// Raises `meshplan.errors.<kind>(message)`; the caller holds the GIL.
/// The exception's constructor parses what it can out of the message (the
/// JSON pointer, the rank, the instruction).
[[noreturn]] void raise(const char *kind, const std::string &message);
[[noreturn]] inline void raise(const char *kind, const Error &error) {
  raise(kind, error.message);
}

/// Unwraps a Result or raises `kind` with its error.
template <typename T> T take(const char *kind, Result<T> result) {
  if (!result)
    raise(kind, result.error());
  return std::move(*result);
}
inline void check(const char *kind, const Result<void> &result) {
  if (!result)
    raise(kind, result.error());
}

/// A rank's plan as Python sees it (meshplan.Plan). `planned` is the spec it
/// was planned from, when it was (explain needs it); null for a plan read
/// from a file.
struct PlanObject {
  std::shared_ptr<const plan::Plan> plan;
  std::shared_ptr<const pipeline::PlannedSpec> planned;
};

/// The ranks of a plan's mesh (the product of its axes' sizes).
int64_t worldSizeOf(const plan::Plan &plan);

void bindPlanner(nb::module_ &m);
void bindSession(nb::module_ &m);

} // namespace meshplan::python

#endif // MESHPLAN_PYTHON_BINDINGS_H

//===- GlooBackend.h - Gloo internals for benchmarks and tests ------------===//
//
// Not part of the runtime's API: lets a benchmark run Gloo's own algorithms on
// exactly the context (the same connections) the runtime uses, so the two are
// compared on equal terms.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_RUNTIME_LIB_BACKENDS_GLOO_GLOOBACKEND_H
#define MESHPLAN_RUNTIME_LIB_BACKENDS_GLOO_GLOOBACKEND_H

#include "meshplan/Runtime/Backend.h"

#include <memory>

namespace gloo {
class Context;
}

namespace meshplan::runtime {

/// The Gloo context of a communicator of the Gloo backend (null for any
/// other, and for a group of one rank).
std::shared_ptr<gloo::Context> glooContextOf(Communicator &comm);

} // namespace meshplan::runtime

#endif // MESHPLAN_RUNTIME_LIB_BACKENDS_GLOO_GLOOBACKEND_H

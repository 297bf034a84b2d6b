//===- Backend.cpp - What every backend shares ----------------------------===//
//
// The interface's defaults: a backend of host memory (Gloo) has no stream to
// set and nothing left to wait for, and needs no group order.
//
//===----------------------------------------------------------------------===//

#include "meshplan/Runtime/Backend.h"

namespace meshplan::runtime {

Communicator::~Communicator() = default;
Backend::~Backend() = default;

Result<void> Communicator::setStream(DeviceStream) {
  return makeError("communicator \"" + group().id +
                   "\" takes host memory; it has no device stream");
}

Result<void> Communicator::synchronize() { return {}; }

Result<void> Backend::declareGroups(const std::vector<GroupSpec> &) {
  return {};
}

Result<std::optional<std::vector<char>>>
Backend::storePeek(const std::string &) {
  return std::optional<std::vector<char>>();
}

bool buildHasCudaBackend() {
#ifdef MESHPLAN_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

} // namespace meshplan::runtime

//===- StagedCommunicator.h - Host collectives on device buffers -*- C++
//-*-===//
//
// A session on a device whose backend is a host one (Gloo) wraps each of its
// communicators in a StagedCommunicator: a Device communicator whose calls
// wait for their stream, copy the device input to host staging memory
// (pinned on CUDA), run the host collective, and copy the result back. This
// is how several ranks share one GPU in tests (NCCL refuses two ranks on one
// device) and how the device executor runs on machines without a GPU (the
// host device). Each call returns once the result is back in device memory:
// the staging buffers are reused by the next call.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_RUNTIME_LIB_STAGEDCOMMUNICATOR_H
#define MESHPLAN_RUNTIME_LIB_STAGEDCOMMUNICATOR_H

#include "meshplan/Runtime/Backend.h"
#include "meshplan/Runtime/Device.h"

#include <memory>

namespace meshplan::runtime {

/// Wraps `host` (a MemoryKind::Host communicator) for device buffers.
std::unique_ptr<Communicator>
stageThroughHost(std::unique_ptr<Communicator> host,
                 std::shared_ptr<Device> device);

} // namespace meshplan::runtime

#endif // MESHPLAN_RUNTIME_LIB_STAGEDCOMMUNICATOR_H

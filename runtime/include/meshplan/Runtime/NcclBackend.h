//===- NcclBackend.h - The NCCL backend (CUDA builds only) ------*- C++ -*-===//
//
// Collectives on NCCL behind the Backend interface (Backend.h): device
// memory, one CUDA stream per communicator call site, non-blocking NCCL with
// the runtime's timeout. Defined in the MeshplanRuntimeNccl library, which
// exists only when the build has the CUDA backend (buildHasCudaBackend(),
// MESHPLAN_CUDA; docs/cuda.md): a program links it to use NCCL, and a
// program that does not link it links no CUDA library. This header names no
// CUDA type.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_RUNTIME_NCCLBACKEND_H
#define MESHPLAN_RUNTIME_NCCLBACKEND_H

#include "meshplan/Runtime/Backend.h"

namespace meshplan::runtime {

/// The NCCL backend on the device of `options.localRank` (LOCAL_RANK). The
/// world communicator's unique id goes through `options.store` (the job's
/// file or Redis store, as for Gloo) at the first createCommunicator; every
/// group is an ncclCommSplit of the world with its color and key, in the
/// order of declareGroups, which must come first. Fails when this process
/// sees no CUDA device (the message says why, from the CUDA runtime).
Result<std::unique_ptr<Backend>> createNcclBackend(const BackendOptions &);

} // namespace meshplan::runtime

#endif // MESHPLAN_RUNTIME_NCCLBACKEND_H

//===- CostModel.h - A simple alpha-beta cost model for plan instructions -===//
//
// Estimates how long one instruction of a plan takes on one rank, to compare
// plans and to draw a timeline (Trace.h). Deliberately simple and documented
// (docs/plan-format.md, "Cost model and trace"):
//
//   collective   steps * alpha + bytesSent / bandwidth   (ring algorithms)
//   compute      flops / (peak FLOP/s * MFU)
//   optimizer    max(flops / (peak FLOP/s * MFU), bytes / HBM bandwidth)
//   fp8 ops      bytes / HBM bandwidth (memory bound; also any other
//                element-wise local op)
//   free, wait   0
//
// alpha and bandwidth are the intra-node (NVLink) figures when every member
// of the communicator is on one node (node = rank / ranksPerNode), else the
// inter-node (InfiniBand) figures for the whole ring: the slowest link paces
// a ring.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_PLAN_COSTMODEL_H
#define MESHPLAN_PLAN_COSTMODEL_H

#include "meshplan/Plan/Plan.h"

#include <cstdint>

namespace meshplan::plan {

/// Machine parameters. Defaults: one NVIDIA H100 SXM5 per rank in 8-GPU
/// nodes (DGX/HGX H100), from NVIDIA's H100 datasheet and DGX H100 user
/// guide.
struct CostModel {
  /// Dense BF16 tensor-core peak of an H100 SXM5: 989 TFLOP/s (datasheet;
  /// the 1,979 figure assumes 2:4 sparsity).
  double peakFlopsPerSecond = 989e12;
  /// Assumed model FLOPs utilization of compute instructions: 40%, a typical
  /// figure for well-tuned LLM training on H100.
  double mfu = 0.4;
  /// NVLink 4 bandwidth per GPU per direction: 900 GB/s total, 450 GB/s
  /// each way.
  double intraNodeBytesPerSecond = 450e9;
  /// One 400 Gb/s InfiniBand NDR (ConnectX-7) port per GPU: 50 GB/s per
  /// direction.
  double interNodeBytesPerSecond = 50e9;
  /// Latency of one ring step within a node / across nodes (alpha),
  /// assumed: 10 us and 20 us (NCCL's per-step overheads are of this order).
  double intraNodeLatencySeconds = 10e-6;
  double interNodeLatencySeconds = 20e-6;
  /// HBM3 bandwidth of an H100 SXM5: 3.35 TB/s; optimizer updates and FP8
  /// casts / amax are memory bound.
  double hbmBytesPerSecond = 3.35e12;
  /// GPUs per node; node of a rank = rank / ranksPerNode.
  int64_t ranksPerNode = 8;

  /// Effective FLOP/s of compute instructions.
  double flopsPerSecond() const { return peakFlopsPerSecond * mfu; }
};

/// Error unless every parameter is finite and > 0 (mfu in (0, 1]).
Result<void> checkCostModel(const CostModel &model);

/// Bytes this rank sends for one collective under the count semantics of
/// docs/plan-format.md, with b = dtypeBytes(dtype) and n = groupSize:
///   all_gather (n-1)*count*b    reduce_scatter (n-1)*count*b
///   all_reduce floor(2*(n-1)/n*count*b)  (ring: reduce-scatter + all-gather)
///   all_to_all (n-1)*count*b    permute count*b
///   broadcast  count*b (upper bound: every member forwards once on a ring)
/// 0 for groups of size <= 1 and for local ops; saturates at INT64_MAX.
int64_t bytesSent(OpKind op, DType dtype, int64_t count, int64_t groupSize);

/// Ring steps (latency terms) of a collective on n ranks: n-1 for
/// all_gather, reduce_scatter, all_to_all and broadcast (pipelined), 2(n-1)
/// for all_reduce, 1 for permute; 0 when n <= 1 or for local ops.
int64_t ringSteps(OpKind op, int64_t groupSize);

/// True when every member of `comm` is on one node (rank / ranksPerNode).
bool isIntraNode(const Communicator &comm, const CostModel &model);

/// Estimated duration of one instruction in seconds (see the file comment).
/// `comm` is the instruction's communicator (collectives; null costs 0),
/// `flops` its estimated FLOPs (compute, optimizer_update), `memoryBytes`
/// the bytes it reads plus writes in HBM (optimizer_update, fp8_cast,
/// fp8_amax; Trace.h passes the local sizes of its inputs plus outputs).
double durationSeconds(const Instruction &instruction, const Communicator *comm,
                       double flops, const CostModel &model,
                       int64_t memoryBytes = 0);

} // namespace meshplan::plan

#endif // MESHPLAN_PLAN_COSTMODEL_H

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
// and every instruction starts dispatchSeconds after it is ready (0 unless
// measured: the executor's hand-off, which the timeline counts as idle).
//
// and the device's memory, against which `meshplan plan` and `explain`
// compare a plan's estimated peak (docs/memory.md). The activations that
// peak includes are the trainer's, estimated analytically per transformer
// block (activation*Terms below; docs/memory.md gives every term and its
// source).
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
#include <string>
#include <string_view>
#include <vector>

namespace meshplan::plan {

/// Machine parameters. Defaults: one NVIDIA H100 SXM5 80GB per rank in 8-GPU
/// nodes (DGX/HGX H100), from NVIDIA's H100 datasheet and DGX H100 user
/// guide; devicePresets() holds these and the other devices `--device`
/// names.
struct CostModel {
  /// The device preset these figures describe (devicePresets()), for
  /// messages.
  std::string device = "h100-sxm-80gb";
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
  /// Time from an instruction becoming ready (its stream's previous
  /// instruction and its deps have ended) to its start: the executor's
  /// hand-off, idle time of the instruction's stream. 0 by default, as no
  /// preset states one; meshplan-train measures it on the machine it runs
  /// on (StepProfile::instructionReady; docs/pipeline.md, "Measured
  /// bubble"), where a thread wake-up on oversubscribed cores can take a
  /// scheduler slice.
  double dispatchSeconds = 0;
  /// GPUs per node; node of a rank = rank / ranksPerNode.
  int64_t ranksPerNode = 8;
  /// Device memory as CUDA reports it (nvidia-smi memory.total): an H100
  /// 80GB HBM3 shows 81559 MiB (79.65 GiB) of its 80 GiB of HBM3; the
  /// datasheet's "80GB" is binary gigabytes, less what the driver keeps.
  int64_t deviceMemoryBytes = int64_t(81559) << 20;
  /// Kept back from deviceMemoryBytes for what no plan buffer or activation
  /// accounts for: the CUDA context (about 0.5 GiB), NCCL's communicator
  /// buffers and cuBLAS workspaces. 2 GiB; allocator fragmentation is not
  /// in it (docs/memory.md).
  int64_t reservedMemoryBytes = int64_t(2) << 30;

  /// Effective FLOP/s of compute instructions.
  double flopsPerSecond() const { return peakFlopsPerSecond * mfu; }
  /// Bytes a rank's estimated peak may use: device memory less the reserve
  /// (0 when the reserve is larger).
  int64_t memoryCapacityBytes() const {
    return deviceMemoryBytes > reservedMemoryBytes
               ? deviceMemoryBytes - reservedMemoryBytes
               : 0;
  }
};

/// Error unless every parameter is finite and > 0 (mfu in (0, 1]; the
/// reserve >= 0 and below the device memory; dispatchSeconds finite and
/// >= 0).
Result<void> checkCostModel(const CostModel &model);

/// A device `--device` names: its canonical name, short aliases, and the
/// cost model of one such GPU per rank in 8-GPU nodes, with sources.
struct DevicePreset {
  std::string_view name;                 ///< "h100-sxm-80gb"
  std::vector<std::string_view> aliases; ///< "h100", ...
  std::string_view description;          ///< "NVIDIA H100 SXM5 80GB HBM3"
  CostModel model;
};

/// h100-sxm-80gb (the default), h200-141gb, a100-80gb. Figures (dense
/// BF16 tensor-core peak, HBM bandwidth, NVLink and InfiniBand per GPU per
/// direction, memory as nvidia-smi reports it) from NVIDIA's datasheets:
///   H100 SXM5 80GB: 989 TFLOP/s, HBM3 3.35 TB/s, NVLink 4 900 GB/s,
///     ConnectX-7 400 Gb/s per GPU (DGX H100); 81559 MiB.
///   H200 SXM 141GB: 989 TFLOP/s, HBM3e 4.8 TB/s, NVLink 4 900 GB/s,
///     ConnectX-7 400 Gb/s per GPU (DGX H200); 143771 MiB (140.4 GiB: the
///     datasheet's "141GB" is binary gigabytes too).
///   A100 SXM4 80GB: 312 TFLOP/s, HBM2e 2.039 TB/s, NVLink 3 600 GB/s,
///     HDR 200 Gb/s per GPU (DGX A100); 81920 MiB (80 GiB).
const std::vector<DevicePreset> &devicePresets();
/// The preset named `name` or one of its aliases (case-sensitive); null if
/// none.
const DevicePreset *findDevicePreset(std::string_view name);
/// "h100-sxm-80gb (h100), h200-141gb (h200), a100-80gb (a100)".
std::string devicePresetList();

//===----------------------------------------------------------------------===//
// Activation memory (docs/memory.md)
//===----------------------------------------------------------------------===//
//
// The trainer's activations are not plan buffers; the planner estimates
// them per microbatch from the model's shapes, the tokens each rank holds
// and the activation-checkpointing policy, after Korthikanti et al. 2022,
// "Reducing Activation Recomputation in Large Transformer Models"
// (arXiv:2205.05198), section 4: per layer s*b*h*(34 + 5*a*s/h) bytes for a
// GPT block at 16-bit, divided by t under tensor + sequence parallelism.
// Adapted term by term to Llama 3 as torchtitan runs it (eager PyTorch
// autograd): no dropout, so no masks; RMSNorm (input and fp32 rstd);
// SDPA flash attention, which stores q, k, v, its output and an fp32
// logsumexp instead of the a*s^2 scores (no 5as/h term); k and v repeated
// to the query heads (torchtitan's repeat_kv) before SDPA; a SwiGLU
// feed-forward with hidden size f; the linear layers after a
// sequence-parallel norm read the all-gathered, whole-sequence input, which
// autograd keeps (PyTorch's DTensor saves it; Megatron re-gathers it).
// Every function counts bytes for `tokens` tokens on this rank (the
// microbatch's tokens after context parallelism: s*b of the paper).

/// How much of each transformer block's forward is kept for backward
/// (torchtitan's activation_checkpoint.mode).
enum class Recompute {
  None,      ///< everything autograd saves
  Full,      ///< each block keeps its input; backward recomputes the block
  Selective, ///< torchtitan's op-level policy (see selectiveBlockTerms)
};

/// One transformer block as this rank runs it.
struct BlockShape {
  int64_t dim = 0;         ///< h: the residual stream
  int64_t heads = 0;       ///< a: query heads
  int64_t kvHeads = 0;     ///< k: key/value heads (GQA)
  int64_t headDim = 0;     ///< d
  int64_t ffnDim = 0;      ///< f: feed-forward hidden size
  bool gatedFfn = true;    ///< SwiGLU w2(silu(w1 x) * w3 x), else w2(g(w1 x))
  int64_t attentionTp = 1; ///< TP degree splitting the heads (wq colwise)
  int64_t ffnTp = 1;       ///< TP degree splitting f (w1 colwise)
  /// TP degree splitting the norms' tokens (sequence parallelism); 1 when
  /// the norms are not sequence parallel.
  int64_t sequenceTp = 1;
};

/// One term of an activation estimate: what it is and its bytes.
struct ActivationTerm {
  std::string_view name;
  int64_t bytes = 0;
};

/// What autograd saves in one block without checkpointing; n tokens, p =
/// compute dtype bytes, n_s = ceil(n / sequenceTp), a_t = ceil(a /
/// attentionTp), f_t = ceil(f / ffnTp):
///   attention_norm input            n_s * p * h
///   attention_norm rstd (fp32)      n_s * 4
///   attention input (gathered)      n * p * h      (shared by wq, wk, wv)
///   q after RoPE                    n * p * a_t * d
///   k after RoPE, repeated          n * p * a_t * d  (repeat_kv: a heads)
///   v repeated                      n * p * a_t * d
///   SDPA output                     n * p * a_t * d
///   SDPA logsumexp (fp32)           n * 4 * a_t
///   wo input                        n * p * a_t * d  (a contiguous copy)
///   ffn_norm input                  n_s * p * h
///   ffn_norm rstd (fp32)            n_s * 4
///   feed-forward input (gathered)   n * p * h      (shared by w1, w3)
///   w1 output (SiLU input)          n * p * f_t
///   SiLU output                     n * p * f_t    (gated only)
///   w3 output                       n * p * f_t    (gated only)
///   w2 input                        n * p * f_t
std::vector<ActivationTerm> blockTerms(const BlockShape &block, int64_t tokens,
                                       int64_t dtypeBytes);
/// torchtitan's op-level selective checkpointing
/// (torchtitan/distributed/activation_checkpoint.py): the block keeps its
/// input and the outputs of matmuls (all but every second one, counted in
/// forward order: wq, wv, w1, w2 of wq wk wv wo w1 w3 w2), of SDPA and of
/// reduce-scatters; everything else is recomputed:
///   block input                     n_s * p * h
///   wq output (matmul 1)            n * p * a_t * d
///   wv output (matmul 3)            n * p * k_t * d   (k_t = ceil(k / tA))
///   SDPA output                     n * p * a_t * d
///   SDPA logsumexp (fp32)           n * 4 * a_t
///   wo reduce-scatter output        n_s * p * h   (sequence parallel only)
///   w1 output (matmul 5)            n * p * f_t
///   w2 output (matmul 7)            n * p * h     (gated only: ungated,
///                                                  w2 is matmul 6)
///   w2 reduce-scatter output        n_s * p * h   (sequence parallel only)
/// w2's output is the whole sequence's partial sum under TP (the matmul
/// runs before the reduce-scatter).
std::vector<ActivationTerm> selectiveBlockTerms(const BlockShape &block,
                                                int64_t tokens,
                                                int64_t dtypeBytes);
/// What one block keeps from its forward to its backward under `policy`:
/// blockTerms (None), selectiveBlockTerms (Selective), or the block input
/// alone, n_s * p * h (Full).
std::vector<ActivationTerm> savedBlockTerms(const BlockShape &block,
                                            int64_t tokens, int64_t dtypeBytes,
                                            Recompute policy);
/// Alive only during the block's backward: under Full and Selective the
/// recomputed block, counted as the sum of blockTerms (an upper bound: it
/// counts again what the policy kept); 0 under None.
int64_t blockBackwardTransientBytes(const BlockShape &block, int64_t tokens,
                                    int64_t dtypeBytes, Recompute policy);

/// The final norm, the output projection and the loss, which torchtitan
/// never checkpoints.
struct OutputShape {
  int64_t dim = 0;        ///< h
  int64_t vocab = 0;      ///< V: the output's out features
  int64_t vocabTp = 1;    ///< TP degree splitting V (colwise output: loss
                          ///< parallel, the logits stay split)
  int64_t sequenceTp = 1; ///< as BlockShape::sequenceTp, for the final norm
};
/// Kept from forward to backward (V_t = ceil(V / vocabTp)):
///   final norm input                n_s * p * h
///   final norm rstd (fp32)          n_s * 4
///   output input (gathered)         n * p * h
///   log-softmax of the logits       n * 4 * V_t   (fp32: cross-entropy runs
///                                                  on logits.float())
std::vector<ActivationTerm> outputTerms(const OutputShape &output,
                                        int64_t tokens, int64_t dtypeBytes);
/// Alive only at the loss, in forward and again in backward: the logits in
/// the compute dtype and their fp32 copy (or their gradients),
/// n * V_t * (p + 4), or n * V_t * 4 when p is already 4.
int64_t outputTransientBytes(const OutputShape &output, int64_t tokens,
                             int64_t dtypeBytes);
/// The embedding keeps the token ids: n * 8 (int64).
int64_t tokenIdBytes(int64_t tokens);

/// Sum of the terms' bytes (saturating).
int64_t sumTerms(const std::vector<ActivationTerm> &terms);

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

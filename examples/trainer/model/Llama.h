//===- Llama.h - One rank's share of a Llama 3 forward and backward -------===//
//
// The model's math for meshplan-train, written out in fp32: token embedding,
// RMSNorm, attention with grouped-query heads, RoPE and a causal softmax,
// SwiGLU feed-forward, final norm, output projection, cross-entropy, as a
// sequence of ModelOps calls (ModelOps.h: OpenBLAS sgemm and loops on the CPU,
// cuBLAS and CUDA kernels on a GPU). Weights use PyTorch's nn.Linear convention
// (W is [out, in], y = x W^T), with torchtitan's module shapes
// (frontend/Presets.h).
//
// Tensor parallelism follows torchtitan's Llama plan with sequence
// parallelism; with a TP group of one rank every collective is a no-op and
// this is the plain single-process model:
//
//   activations between segments  [batch, seqLen / P, dim]   (sequence shard)
//   tok_embeddings  rowwise: vocab rows [vocabOffset, +vocabLocal); looked-up
//                   rows summed over TP by a reduce-scatter to the shard
//   attention_norm, ffn_norm, norm   sequence parallel (weight replicated;
//                   each rank's weight gradient is its shard's partial sum)
//   wq, wk, wv, w1, w3  colwise (local output rows) on the all-gathered input
//   wo, w2          rowwise (local input columns); outputs reduce-scattered
//   output          colwise (local vocabulary rows) on the all-gathered
//                   input; vocabulary-parallel cross-entropy (max, sum of
//                   exponentials and target logit all-reduced over TP)
//
// Backward mirrors it: an all-gather's backward is a reduce-scatter and back.
// The model owns the activations of one microbatch (a Microbatch object); the
// trainer owns the weights and gradients and passes them per segment, so the
// same code runs inside the runtime's compute callbacks and in the
// single-process reference. Every weight, gradient and TP-collective
// pointer is memory of the Microbatch's ModelOps (device memory on a GPU);
// data, stage boundaries and the loss cross on the host.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_TRAINER_MODEL_LLAMA_H
#define MESHPLAN_TRAINER_MODEL_LLAMA_H

#include "meshplan/Core/Result.h"
#include "model/ModelOps.h"

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace meshplan::trainer {

struct LlamaConfig {
  int64_t dim = 0;
  int64_t nLayers = 0;
  int64_t nHeads = 0;
  int64_t nKvHeads = 0;
  int64_t ffnDim = 0;
  int64_t vocab = 0;
  float normEps = 1e-5f;       ///< torchtitan's Llama 3 norm_eps
  float ropeTheta = 500000.0f; ///< Llama 3's rope_theta
  int64_t headDim() const { return dim / nHeads; }
};

/// The tensor-parallel group a Microbatch's collectives run on (the plan's
/// `trainer_tp` communicator in meshplan-train). Buffers are fp32, in the
/// memory of the Microbatch's ModelOps, and a call may read them only after
/// the ops' earlier work (ModelOps::synchronize, or the same CUDA stream).
class TpGroup {
public:
  virtual ~TpGroup();
  virtual int64_t size() const = 0;
  virtual int64_t rank() const = 0;
  /// out[k * count .. (k+1) * count) = member k's `in`.
  virtual Result<void> allGather(const float *in, float *out,
                                 int64_t count) = 0;
  /// in holds size() blocks of `count`; out = sum over members of block
  /// rank().
  virtual Result<void> reduceScatter(const float *in, float *out,
                                     int64_t count) = 0;
  virtual Result<void> allReduceSum(float *data, int64_t count) = 0;
  virtual Result<void> allReduceMax(float *data, int64_t count) = 0;
};

/// A group of one: every collective copies (in host memory) or does nothing.
/// Microbatch does not call its copies: it copies on its ModelOps, whose
/// buffers may be device memory.
class SoloTpGroup final : public TpGroup {
public:
  int64_t size() const override { return 1; }
  int64_t rank() const override { return 0; }
  Result<void> allGather(const float *in, float *out, int64_t count) override;
  Result<void> reduceScatter(const float *in, float *out,
                             int64_t count) override;
  Result<void> allReduceSum(float *, int64_t) override { return {}; }
  Result<void> allReduceMax(float *, int64_t) override { return {}; }
};

struct MicrobatchShape {
  int64_t batch = 1;  ///< sequences of this rank's microbatch
  int64_t seqLen = 1; ///< tokens per sequence; a multiple of the TP size
};

struct ModelOptions {
  /// Round both inputs of every matmul (weights, activations, and in
  /// backward the incoming gradients) to bf16 before the fp32 sgemm, the
  /// way a bf16 autocast computes (mixed_precision.param_dtype bfloat16).
  bool bf16Matmul = false;
};

/// This rank's TP shard of a block's weights, fp32, row-major, [out, in].
/// Sizes are the local ones: heads = nHeads / P etc. (see Microbatch).
struct BlockWeights {
  const float *attentionNorm = nullptr; ///< [dim]
  const float *wq = nullptr;            ///< [localHeads * headDim, dim]
  const float *wk = nullptr;            ///< [localKvHeads * headDim, dim]
  const float *wv = nullptr;            ///< [localKvHeads * headDim, dim]
  const float *wo = nullptr;            ///< [dim, localHeads * headDim]
  const float *ffnNorm = nullptr;       ///< [dim]
  const float *w1 = nullptr;            ///< [localFfn, dim]
  const float *w3 = nullptr;            ///< [localFfn, dim]
  const float *w2 = nullptr;            ///< [dim, localFfn]
};

/// Gradients of BlockWeights, same shapes; backward ADDS into them. The
/// norms' are this rank's partial sums over its sequence shard.
struct BlockGrads {
  float *attentionNorm = nullptr, *wq = nullptr, *wk = nullptr, *wv = nullptr,
        *wo = nullptr, *ffnNorm = nullptr, *w1 = nullptr, *w3 = nullptr,
        *w2 = nullptr;
};

/// This rank's share of the TP-split dimensions. With P = 1: everything.
struct TpShard {
  int64_t localHeads = 0; ///< query heads [headOffset, +localHeads)
  int64_t headOffset = 0;
  int64_t localKvHeads = 0; ///< kv heads [kvHeadOffset, +localKvHeads)
  int64_t kvHeadOffset = 0;
  int64_t localFfn = 0;    ///< rows of w1/w3, columns of w2
  int64_t vocabOffset = 0; ///< rows of tok_embeddings and output
  int64_t vocabLocal = 0;

  /// The whole model (P = 1).
  static TpShard whole(const LlamaConfig &config);
};

/// Checks a configuration and a shard: positive sizes, dim divisible by
/// nHeads, nHeads by nKvHeads, the local query heads exactly those that use
/// the local kv heads (GQA groups are not split), and seqLen divisible by
/// the TP size. Errors say which.
Result<void> checkModel(const LlamaConfig &config, const TpShard &shard,
                        const MicrobatchShape &shape, int64_t tpSize);

/// One microbatch on one rank: forward segment by segment (embedding, blocks
/// 0..L-1, final norm, output + loss), then backward in reverse. Keeps what
/// backward needs. Every call may run TP collectives; all members of the
/// group must make the same calls in the same order.
class Microbatch {
public:
  /// Runs on `ops` (the host's by default), which must outlive it.
  Microbatch(const LlamaConfig &config, const TpShard &shard,
             const MicrobatchShape &shape, const ModelOptions &options,
             TpGroup &tp, ModelOps &ops = hostOps());
  ~Microbatch();
  Microbatch(const Microbatch &) = delete;
  Microbatch &operator=(const Microbatch &) = delete;

  /// tokens and targets: [batch, seqLen], the same on every TP rank; values
  /// in [0, vocab) (checked).
  Result<void> setData(std::span<const int32_t> tokens,
                       std::span<const int32_t> targets);

  /// embedding: [vocabLocal, dim] rows [vocabOffset, +vocabLocal).
  Result<void> forwardEmbedding(const float *embedding);
  Result<void> forwardBlock(int64_t layer, const BlockWeights &w);
  Result<void> forwardFinalNorm(const float *norm);
  /// output: [vocabLocal, dim]. Returns the mean cross-entropy over the
  /// microbatch's batch * seqLen tokens (the same on every TP rank).
  Result<float> forwardOutput(const float *output);

  /// Starts backward from d(lossScale * loss); dOutput += this rank's
  /// gradient of the output weight.
  Result<void> backwardOutput(const float *output, float lossScale,
                              float *dOutput);
  Result<void> backwardFinalNorm(const float *norm, float *dNorm);
  Result<void> backwardBlock(int64_t layer, const BlockWeights &w,
                             const BlockGrads &g);
  /// dEmbedding: [vocabLocal, dim].
  Result<void> backwardEmbedding(float *dEmbedding);

  // Pipeline stages: a stage runs a contiguous run of the segments above
  // and exchanges the residual stream with its neighbours (this rank's
  // sequence shard, [batch * seqLen / P, dim], the tensor a stage boundary
  // carries in torchtitan's sequence-parallel plan).

  /// Starts forward at `layer` (a block; nLayers: the final norm; nLayers +
  /// 1: the output) from the previous stage's output instead of the
  /// embedding. Needs setData first (targets, and the sequence's positions).
  Result<void> forwardFrom(int64_t layer, std::span<const float> input);
  /// Starts backward at the last segment forward ran (which must not be the
  /// output: the last stage starts from its loss) from the next stage's
  /// gradient of this stage's output.
  Result<void> backwardFrom(std::span<const float> outputGrad);
  /// The residual stream shard: after a forward segment its output, after a
  /// backward segment the gradient of that segment's input, on the host
  /// (valid until the next call). Empty before setData.
  Result<std::span<const float>> stream();
  /// Its size: batch * seqLen / P * dim once setData ran, else 0.
  int64_t streamSize() const;
  /// Rounds the residual stream shard (or its gradient) to bf16, nearest
  /// even, and widens it back, in place: what a bf16 stage boundary does to
  /// it (the single-process reference emulates a pipeline's bf16 activation
  /// buffers with it, where the ranks write and read those buffers).
  void roundStreamToBf16();

  /// Floating-point operations of the matmuls run so far (2 * m * n * k per
  /// sgemm), and the seconds spent inside sgemm (CPU ops; 0 on a GPU, whose
  /// matmuls run asynchronously), for the trainer's figures.
  double matmulFlops() const;
  double matmulSeconds() const;

  struct Impl;

private:
  std::unique_ptr<Impl> impl;
};

} // namespace meshplan::trainer

#endif // MESHPLAN_TRAINER_MODEL_LLAMA_H

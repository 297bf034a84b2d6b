//===- GlooBackend.cpp - Collectives on Gloo (CPU, TCP) -------------------===//
//
// One gloo::rendezvous::Context per plan communicator, connected through a
// PrefixStore "<job>/e<epoch>/<id>/<color>" over the job's FileStore or
// RedisStore: only the group's members write and read those keys, so the
// cost of creating a group grows with the group, not with the world.
//
// Gloo reports failures by throwing; every call into Gloo is wrapped here and
// its exception becomes an Error value.
//
//===----------------------------------------------------------------------===//

#include "GlooBackend.h"
#include "TorchTcpStore.h"

#include "meshplan/Runtime/Kernels.h"
#include "meshplan/Support/Hash.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/redis_store.h>
#include <gloo/transport/tcp/device.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace meshplan::runtime {

namespace {

/// Runs a Gloo call; its exception becomes an Error.
template <typename F> Result<void> guarded(F &&call) {
  try {
    call();
  } catch (const std::exception &e) {
    return makeError(e.what());
  } catch (...) {
    return makeError("unknown error from Gloo");
  }
  return {};
}

/// A store whose waits end early when the group's `cancelled` says so:
/// waits in slices of kCancelPollInterval on the wrapped store and polls
/// between them. Only a wait's timeout is retried; any other failure of the
/// wrapped store surfaces at once.
class CancellableStore : public gloo::rendezvous::Store {
public:
  static constexpr std::chrono::milliseconds kCancelPollInterval{50};

  /// `waitFor` bounds every wait, whatever Gloo asks for: the context's
  /// timeout is kept short during a cancellable rendezvous (it bounds the
  /// connects, below), and Gloo passes it to the store's waits too.
  CancellableStore(gloo::rendezvous::Store &inner,
                   const std::function<std::optional<std::string>()> &cancelled,
                   std::chrono::milliseconds waitFor)
      : inner(inner), cancelled(cancelled), waitFor(waitFor) {}

  void set(const std::string &key, const std::vector<char> &data) override {
    inner.set(key, data);
  }
  /// A get waits for its key inside the wrapped store (FileStore waits 30
  /// s, uncancellable): wait here first, in slices.
  std::vector<char> get(const std::string &key) override {
    wait({key});
    return inner.get(key);
  }
  void wait(const std::vector<std::string> &keys) override {
    wait(keys, waitFor);
  }
  void wait(const std::vector<std::string> &keys,
            const std::chrono::milliseconds &) override {
    auto deadline = std::chrono::steady_clock::now() + waitFor;
    while (true) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      auto slice = std::max(std::chrono::milliseconds(1),
                            std::min(left, kCancelPollInterval));
      try {
        inner.wait(keys, slice);
        return;
      } catch (const gloo::IoException &e) {
        if (std::string_view(e.what()).find("imeout") ==
                std::string_view::npos ||
            left <= kCancelPollInterval)
          throw;
      }
      if (std::optional<std::string> why = cancelled())
        throw gloo::IoException("rendezvous stopped: " + *why);
    }
  }

private:
  gloo::rendezvous::Store &inner;
  const std::function<std::optional<std::string>()> &cancelled;
  std::chrono::milliseconds waitFor;
};

//===----------------------------------------------------------------------===//
// Reductions
//===----------------------------------------------------------------------===//

using kernels::bf16ToFloat;
using kernels::floatToBf16;

template <typename T> T combine(T a, T b, ReduceOp op) {
  switch (op) {
  case ReduceOp::Sum:
  case ReduceOp::Avg:
    return a + b;
  case ReduceOp::Product:
    return a * b;
  case ReduceOp::Max:
    return a > b ? a : b;
  case ReduceOp::Min:
    return a < b ? a : b;
  }
  return a;
}

template <typename T>
void reduceInto(void *c, const void *a, const void *b, size_t n, ReduceOp op) {
  T *out = static_cast<T *>(c);
  const T *x = static_cast<const T *>(a);
  const T *y = static_cast<const T *>(b);
  // One loop per op, so that each vectorizes.
  switch (op) {
  case ReduceOp::Sum:
  case ReduceOp::Avg:
    for (size_t i = 0; i < n; ++i)
      out[i] = x[i] + y[i];
    return;
  case ReduceOp::Product:
    for (size_t i = 0; i < n; ++i)
      out[i] = x[i] * y[i];
    return;
  case ReduceOp::Max:
    for (size_t i = 0; i < n; ++i)
      out[i] = x[i] > y[i] ? x[i] : y[i];
    return;
  case ReduceOp::Min:
    for (size_t i = 0; i < n; ++i)
      out[i] = x[i] < y[i] ? x[i] : y[i];
    return;
  }
}

void reduceBf16(void *c, const void *a, const void *b, size_t n, ReduceOp op) {
  auto *out = static_cast<uint16_t *>(c);
  auto *x = static_cast<const uint16_t *>(a);
  auto *y = static_cast<const uint16_t *>(b);
  for (size_t i = 0; i < n; ++i)
    out[i] = floatToBf16(combine(bf16ToFloat(x[i]), bf16ToFloat(y[i]), op));
}

using ReduceFn =
    std::function<void(void *, const void *, const void *, size_t)>;

Result<ReduceFn> reduceFunction(DType dtype, ReduceOp op) {
  auto bind = [op](void (*f)(void *, const void *, const void *, size_t,
                             ReduceOp)) -> ReduceFn {
    return [f, op](void *c, const void *a, const void *b, size_t n) {
      f(c, a, b, n, op);
    };
  };
  switch (dtype) {
  case DType::Float32:
    return bind(reduceInto<float>);
  case DType::Float64:
    return bind(reduceInto<double>);
  case DType::BFloat16:
    return bind(reduceBf16);
  case DType::Int32:
    return bind(reduceInto<int32_t>);
  case DType::Int64:
    return bind(reduceInto<int64_t>);
  case DType::Int8:
    return bind(reduceInto<int8_t>);
  case DType::UInt8:
    return bind(reduceInto<uint8_t>);
  default:
    return makeError("reductions over " + std::string(plan::dtypeName(dtype)) +
                     " are not supported");
  }
}

/// data[i] /= n, for avg.
void divideBy(void *data, int64_t count, DType dtype, int64_t n) {
  switch (dtype) {
  case DType::Float32: {
    auto *p = static_cast<float *>(data);
    float d = static_cast<float>(n);
    for (int64_t i = 0; i < count; ++i)
      p[i] /= d;
    return;
  }
  case DType::Float64: {
    auto *p = static_cast<double *>(data);
    for (int64_t i = 0; i < count; ++i)
      p[i] /= static_cast<double>(n);
    return;
  }
  case DType::BFloat16: {
    auto *p = static_cast<uint16_t *>(data);
    for (int64_t i = 0; i < count; ++i)
      p[i] = floatToBf16(bf16ToFloat(p[i]) / static_cast<float>(n));
    return;
  }
  case DType::Int32: {
    auto *p = static_cast<int32_t *>(data);
    for (int64_t i = 0; i < count; ++i)
      p[i] = static_cast<int32_t>(p[i] / n);
    return;
  }
  case DType::Int64: {
    auto *p = static_cast<int64_t *>(data);
    for (int64_t i = 0; i < count; ++i)
      p[i] /= n;
    return;
  }
  default:
    return; // reduceFunction already refused the others
  }
}

/// out = term(0) + term(1) + ... + term(n - 1), elementwise and left to
/// right (the members' key order), in pieces that stay in cache: each output
/// element goes through memory once, not once per term as whole-block
/// passes would take it. The sums are exactly those of whole-block passes.
/// One term may be `out` itself (an all-reduce folding in place): each of
/// its pieces is copied aside, in cache, before the fold overwrites it.
template <typename Term>
void foldInKeyOrder(const ReduceFn &fn, void *out, Term &&term, int64_t n,
                    int64_t count, DType dtype) {
  size_t width = size_t(plan::dtypeBytes(dtype));
  constexpr size_t kPieceBytes = 16 << 10;
  size_t piece = std::max<size_t>(1, kPieceBytes / width);
  auto *dst = static_cast<uint8_t *>(out);
  alignas(64) uint8_t aside[kPieceBytes];
  int64_t self = -1;
  for (int64_t s = 0; s < n; ++s)
    if (term(s) == dst)
      self = s;
  for (size_t first = 0; first < size_t(count); first += piece) {
    size_t length = std::min(piece, size_t(count) - first);
    size_t at = first * width;
    if (n == 1) {
      if (term(0) != dst)
        std::memcpy(dst + at, term(0) + at, length * width);
      continue;
    }
    // Term `self` of this piece, read before the fold writes over it.
    if (self >= 0)
      std::memcpy(aside, dst + at, length * width);
    auto operand = [&](int64_t s) -> const uint8_t * {
      return s == self ? aside : term(s) + at;
    };
    fn(dst + at, operand(0), operand(1), length);
    for (int64_t s = 2; s < n; ++s)
      fn(dst + at, dst + at, operand(s), length);
  }
}

/// allReduceShares' fold: `gathered` holds, per member in key order,
/// `slots` blocks of `count` elements (its contributions, then padding);
/// `layout[k][j]` is the nominal member that member k's j-th contribution
/// stands for. out = the left fold over the nominal members in order.
Result<void> foldShares(DType dtype, ReduceOp op, void *out,
                        const std::byte *gathered, size_t slots, int64_t count,
                        const std::vector<std::vector<int64_t>> &layout) {
  size_t nominal = 0;
  for (const auto &list : layout)
    nominal += list.size();
  std::vector<const std::byte *> term(nominal, nullptr);
  size_t block = size_t(count * plan::dtypeBytes(dtype));
  for (size_t k = 0; k < layout.size(); ++k)
    for (size_t j = 0; j < layout[k].size(); ++j) {
      int64_t g = layout[k][j];
      if (g < 0 || size_t(g) >= nominal || term[size_t(g)])
        return makeError("allReduceShares: the layout names nominal member " +
                         std::to_string(g) + " twice or outside 0.." +
                         std::to_string(nominal - 1));
      term[size_t(g)] = gathered + (k * slots + j) * block;
    }
  ReduceOp sumOp = op == ReduceOp::Avg ? ReduceOp::Sum : op;
  auto fn = reduceFunction(dtype, sumOp);
  if (!fn)
    return fn.error();
  foldInKeyOrder(
      *fn, out,
      [&](int64_t g) {
        return reinterpret_cast<const uint8_t *>(term[size_t(g)]);
      },
      int64_t(nominal), count, dtype);
  return {};
}

//===----------------------------------------------------------------------===//
// Communicator
//===----------------------------------------------------------------------===//

/// Every floating-point sum and product is taken in the members' key order
/// (block 0 + block 1 + ... + block n-1), whatever the algorithm moving the
/// bytes: the result is then a function of the inputs alone, not of the
/// group's size, the message timing or Gloo's schedule, and a single process
/// summing the same values in the same order reproduces it bit for bit
/// (meshplan-train's reference does). Gloo's ring algorithm reduces in
/// another order; it remains for larger all-reduces of two members (a + b is
/// b + a in IEEE arithmetic) and of max and min, which do not depend on the
/// order.
///
/// Up to these many bytes in all (a reduce-scatter's input, an all-gather's
/// output, an all-reduce's tensor times the members), a collective runs on
/// standing bound buffers (exchangeRound): one message per peer, sent at
/// once. An unbound buffer's send waits for the receiver's recv-ready notice
/// to cross first, a second message latency, and with more processes than
/// cores each latency can wait for a scheduler tick: this is what kept the
/// log-round algorithms below at 2-3 ms per call at 4 KiB (0.4 ms on the
/// standing buffers; docs/performance.md section D). Each communicator
/// keeps at most kBoundExchangeBudget bytes of them; past it, the
/// algorithms below. Larger ones measured no faster: a 4 MiB all-gather
/// copies its inbox out, and moves the same bytes as Gloo's ring.
constexpr size_t kBoundExchangeBytes = size_t(1) << 20;
constexpr size_t kBoundExchangeBudget = size_t(16) << 20;
/// Gloo's TCP pair sizes its socket's send buffer from its first bound
/// message (gloo/transport/tcp/pair.cc, Pair::send: SO_SNDBUF = that
/// message's bytes), which also stops the kernel from tuning it, and only
/// grows it for a larger bound message later. A first block of a few bytes
/// left every later transfer on the pair, Gloo's unbound ones included, on
/// a 4.5 KiB send buffer: a few KiB in flight, then a wait for the peer's
/// delayed ACK, 40 ms (44 ms at HZ 250) each time the peer was not reading
/// at that instant. A 1 MiB all-gather took 44-660 ms instead of 0.5 ms
/// with 8 ranks on 2 cores (docs/runtime.md, "The send buffer of a
/// connection that carries bound messages"). So the
/// first bound message on every pair is this many bytes, at least any
/// standing block, sent once when a communicator's first set is created:
/// the send buffer is then fixed at twice this (the kernel doubles it,
/// within net.core.wmem_max), about what tuning reaches on loopback.
constexpr size_t kSendBufferPrimeBytes = kBoundExchangeBytes;
/// Past the standing buffers' budget: in Gloo's orders, a float32
/// reduce-scatter below this many bytes in all runs Gloo's halving-doubling
/// algorithm; above, and in key order, an all-to-all and a local fold.
constexpr size_t kSmallReduceScatterBytes = size_t(1) << 20;
/// Past the standing buffers' budget, up to these many bytes in all (the
/// gathered output; the all-reduce's tensor times the members), the
/// backend's log-round algorithms replace Gloo's: there the number of
/// messages, not the bytes, sets the time. Above, an all-gather is Gloo's
/// ring, the same bytes in more rounds, which measured no slower there.
constexpr size_t kLogRoundAllGatherBytes = size_t(1) << 20;
constexpr size_t kGatherAllReduceBytes = size_t(256) << 10;
/// The piece a larger key-order all-reduce pipelines (pipelinedAllReduce).
constexpr size_t kAllReducePieceBytes = size_t(4) << 20;

static bool orderMatters(DType dtype, ReduceOp op, int64_t members,
                         bool keyOrder) {
  if (!keyOrder)
    return false;
  bool floating = dtype == DType::Float32 || dtype == DType::BFloat16 ||
                  dtype == DType::Float16;
  return members > 2 && floating && op != ReduceOp::Max && op != ReduceOp::Min;
}

class GlooCommunicator final : public Communicator {
public:
  GlooCommunicator(GroupSpec group, std::shared_ptr<gloo::Context> context,
                   std::chrono::milliseconds timeout, bool keyOrder)
      : spec(std::move(group)), context(std::move(context)), timeout(timeout),
        keyOrder(keyOrder) {}

  const GroupSpec &group() const override { return spec; }

  /// Aborts the waits of every unbound buffer in use (abortWaitRecv /
  /// abortWaitSend make them return false at once) and closes the
  /// connections, so that nothing arrives later into memory the aborted
  /// call has given back. Only this file's own algorithms wait on unbound
  /// buffers it can reach: a fault-tolerant group uses them for every
  /// all-reduce (abortable, below); Gloo's own collectives end at their
  /// timeout.
  void abort(const std::string &why) override {
    std::lock_guard<std::mutex> lock(abortMutex);
    if (aborted.exchange(true))
      return;
    abortReason = why;
    for (gloo::transport::UnboundBuffer *b : active) {
      b->abortWaitRecv();
      b->abortWaitSend();
    }
    context->closeConnections();
  }
  bool canAbort() const override { return abortable(); }

  Result<void> allGather(const void *in, void *out, int64_t count,
                         DType dtype) override {
    size_t bytes = size_t(count * plan::dtypeBytes(dtype));
    if (size() == 1) {
      if (bytes)
        std::memmove(out, in, bytes);
      return {};
    }
    if (bytes == 0)
      return {};
    if (standing(bytes))
      return guarded([&] { boundAllGather(in, out, bytes); });
    if (bytes * size_t(size()) <= kLogRoundAllGatherBytes)
      return guarded([&] { logRoundAllGather(in, out, bytes); });
    return guarded([&] {
      gloo::AllgatherOptions opts(context);
      opts.setInput(const_cast<uint8_t *>(static_cast<const uint8_t *>(in)),
                    bytes);
      opts.setOutput(static_cast<uint8_t *>(out), bytes * size_t(size()));
      opts.setTimeout(timeout);
      gloo::allgather(opts);
    });
  }

  Result<void> reduceScatter(const void *in, void *out, int64_t count,
                             DType dtype, ReduceOp op) override {
    // Every member's block for each member moved once ((n-1)/n of the
    // input sent, as a ring reduce-scatter sends), then folded in key order
    // (orderMatters): small, in one round on the standing buffers; larger,
    // through Gloo's all-to-all.
    auto fn = reduceFunction(dtype, op);
    if (!fn)
      return fn.error();
    int64_t n = size();
    size_t block = size_t(count * plan::dtypeBytes(dtype));
    if (n == 1) {
      if (block)
        std::memmove(out, in, block);
    } else if (block && standing(block)) {
      MESHPLAN_TRY(
          guarded([&] { boundReduceScatter(in, out, count, dtype, *fn); }));
    } else if (block && dtype == DType::Float32 && !keyOrder &&
               block * size_t(n) <= kSmallReduceScatterBytes) {
      // Gloo's orders (MESHPLAN_REDUCTION_ORDER=gloo), small, past the
      // standing buffers' budget: Gloo's halving-doubling. It reduces in
      // place and leaves this rank's block at the front.
      std::vector<float> work(static_cast<const float *>(in),
                              static_cast<const float *>(in) + count * n);
      const gloo::ReductionFunction<float> *fn =
          op == ReduceOp::Max       ? gloo::ReductionFunction<float>::max
          : op == ReduceOp::Min     ? gloo::ReductionFunction<float>::min
          : op == ReduceOp::Product ? gloo::ReductionFunction<float>::product
                                    : gloo::ReductionFunction<float>::sum;
      MESHPLAN_TRY(guarded([&] {
        std::vector<int> blocks(size_t(n), static_cast<int>(count));
        gloo::ReduceScatterHalvingDoubling<float> algorithm(
            context, {work.data()}, static_cast<int>(count * n), blocks, fn);
        algorithm.run();
      }));
      std::memcpy(out, work.data(), block);
    } else if (block) {
      scratch.resize(block * size_t(n));
      MESHPLAN_TRY(allToAll(in, scratch.data(), count, dtype));
      foldInKeyOrder(
          *fn, out,
          [&](int64_t s) { return scratch.data() + block * size_t(s); }, n,
          count, dtype);
    }
    if (op == ReduceOp::Avg)
      divideBy(out, count, dtype, avgDivisor());
    return {};
  }

  Result<void> allReduce(void *data, int64_t count, DType dtype,
                         ReduceOp op) override {
    auto fn = reduceFunction(dtype, op);
    if (!fn)
      return fn.error();
    if (aborted)
      return guarded([&] { throwAborted("all-reduce"); });
    bool own = orderMatters(dtype, op, size(), keyOrder) ||
               (abortable() && size() > 1);
    size_t tensorBytes = size_t(count * plan::dtypeBytes(dtype));
    if (count > 0 && size() > 1 &&
        (standing(tensorBytes) ||
         (own && tensorBytes * size_t(size()) <= kGatherAllReduceBytes))) {
      // Small: every member gathers every member's whole input (one round
      // on the standing buffers, or the log-round all-gather) and folds them
      // in key order; the same sums as the path below, in far fewer messages
      // than a ring. (Key order is one of the orders Gloo's orders allow,
      // and a ring's a + b is b + a on two members.)
      int64_t n = size();
      size_t bytes = tensorBytes;
      ReduceOp sumOp = op == ReduceOp::Avg ? ReduceOp::Sum : op;
      auto sum = reduceFunction(dtype, sumOp);
      const uint8_t *all = nullptr;
      if (standing(bytes)) {
        MESHPLAN_TRY(guarded([&] {
          all = exchangeRound(
              bytes, [&](int64_t) { return static_cast<uint8_t *>(data); });
        }));
      } else {
        scratch.resize(bytes * size_t(n));
        MESHPLAN_TRY(
            guarded([&] { logRoundAllGather(data, scratch.data(), bytes); }));
        all = scratch.data();
      }
      // This member's own input is folded where it lies.
      const uint8_t *mine = static_cast<uint8_t *>(data);
      foldInKeyOrder(
          *sum, data,
          [&](int64_t s) {
            return s == key() ? mine : all + bytes * size_t(s);
          },
          n, count, dtype);
    } else if (count > 0 && own) {
      ReduceOp sumOp = op == ReduceOp::Avg ? ReduceOp::Sum : op;
      auto sum = reduceFunction(dtype, sumOp);
      MESHPLAN_TRY(guarded([&] {
        pipelinedAllReduce(static_cast<uint8_t *>(data), count, dtype, *sum);
      }));
    } else if (size() > 1 && count > 0) {
      size_t bytes = size_t(plan::dtypeBytes(dtype));
      MESHPLAN_TRY(guarded([&] {
        gloo::AllreduceOptions opts(context);
        // Elements are opaque bytes to Gloo; the reduce function knows the
        // type. setOutput<T> only records the element size.
        switch (bytes) {
        case 1:
          opts.setOutput(static_cast<uint8_t *>(data), size_t(count));
          break;
        case 2:
          opts.setOutput(static_cast<uint16_t *>(data), size_t(count));
          break;
        case 4:
          opts.setOutput(static_cast<uint32_t *>(data), size_t(count));
          break;
        default:
          opts.setOutput(static_cast<uint64_t *>(data), size_t(count));
          break;
        }
        opts.setReduceFunction(*fn);
        opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
        opts.setTimeout(timeout);
        gloo::allreduce(opts);
      }));
    }
    if (op == ReduceOp::Avg)
      divideBy(data, count, dtype, avgDivisor());
    return {};
  }

  /// Every member gathers every member's contributions (padded to the most
  /// any member brings; log rounds) and folds them in nominal order, as
  /// the gather path of allReduce folds in key order: with every member
  /// live and one contribution each, the same sums.
  Result<void>
  allReduceShares(const std::vector<const void *> &mine, void *out,
                  int64_t count, DType dtype, ReduceOp op,
                  const std::vector<std::vector<int64_t>> &layout) override {
    if (aborted)
      return guarded([&] { throwAborted("all-reduce"); });
    if (layout.size() != size_t(size()))
      return makeError("allReduceShares: the layout has " +
                       std::to_string(layout.size()) + " members, the group " +
                       std::to_string(size()));
    if (layout[size_t(key())].size() != mine.size())
      return makeError("allReduceShares: the layout gives this member " +
                       std::to_string(layout[size_t(key())].size()) +
                       " contributions, it brings " +
                       std::to_string(mine.size()));
    size_t slots = 0;
    for (const auto &list : layout)
      slots = std::max(slots, list.size());
    size_t block = size_t(count * plan::dtypeBytes(dtype));
    std::vector<std::byte> send(slots * block, std::byte{0});
    for (size_t j = 0; j < mine.size(); ++j)
      std::memcpy(send.data() + j * block, mine[j], block);
    std::vector<std::byte> all(send.size() * size_t(size()));
    if (block > 0)
      MESHPLAN_TRY(guarded(
          [&] { logRoundAllGather(send.data(), all.data(), send.size()); }));
    MESHPLAN_TRY(foldShares(dtype, op, out, all.data(), slots, count, layout));
    if (op == ReduceOp::Avg)
      divideBy(out, count, dtype, avgDivisor());
    return {};
  }

  Result<void> broadcast(void *data, int64_t count, DType dtype,
                         int64_t root) override {
    size_t bytes = size_t(count * plan::dtypeBytes(dtype));
    if (size() == 1 || bytes == 0)
      return {};
    return guarded([&] {
      gloo::BroadcastOptions opts(context);
      opts.setOutput(static_cast<uint8_t *>(data), bytes);
      opts.setRoot(static_cast<int>(root));
      opts.setTimeout(timeout);
      gloo::broadcast(opts);
    });
  }

  Result<void> allToAll(const void *in, void *out, int64_t count,
                        DType dtype) override {
    size_t total = size_t(count * plan::dtypeBytes(dtype)) * size_t(size());
    if (size() == 1) {
      if (total)
        std::memmove(out, in, total);
      return {};
    }
    if (total == 0)
      return {};
    return guarded([&] {
      gloo::AlltoallOptions opts(context);
      opts.setInput(const_cast<uint8_t *>(static_cast<const uint8_t *>(in)),
                    total);
      opts.setOutput(static_cast<uint8_t *>(out), total);
      opts.setTimeout(timeout);
      gloo::alltoall(opts);
    });
  }

  Result<void> sendRecv(const void *send, int64_t sendTo, void *recv,
                        int64_t recvFrom, int64_t count, DType dtype) override {
    size_t bytes = size_t(count * plan::dtypeBytes(dtype));
    // Every member takes the next slot, so the slots of one permute agree.
    uint32_t slot = context->nextSlot();
    if (bytes == 0)
      return {};
    if (sendTo == key() && recvFrom == key()) {
      std::memmove(recv, send, bytes);
      return {};
    }
    return guarded([&] {
      std::unique_ptr<gloo::transport::UnboundBuffer> out, in;
      if (recvFrom >= 0) {
        in = context->createUnboundBuffer(recv, bytes);
        in->recv(static_cast<int>(recvFrom), slot);
      }
      if (sendTo >= 0) {
        out = context->createUnboundBuffer(const_cast<void *>(send), bytes);
        out->send(static_cast<int>(sendTo), slot);
      }
      if (out && !out->waitSend(timeout))
        throw std::runtime_error("send to key " + std::to_string(sendTo) +
                                 " was aborted");
      if (in && !in->waitRecv(timeout))
        throw std::runtime_error("receive from key " +
                                 std::to_string(recvFrom) + " was aborted");
    });
  }

  Result<void> send(const void *data, int64_t to, int64_t count, DType dtype,
                    std::string_view tag) override {
    return transfer(const_cast<void *>(data), to, count, dtype, tag, true);
  }
  Result<void> recv(void *data, int64_t from, int64_t count, DType dtype,
                    std::string_view tag) override {
    return transfer(data, from, count, dtype, tag, false);
  }

  const std::shared_ptr<gloo::Context> &glooContext() const { return context; }

  Result<void> barrier() override {
    return guarded([&] {
      gloo::BarrierOptions opts(context);
      opts.setTimeout(timeout);
      gloo::barrier(opts);
    });
  }

private:
  /// Waits for `sends` sends and `recvs` receives posted on the buffers.
  void waitAll(gloo::transport::UnboundBuffer &sending, int sends,
               gloo::transport::UnboundBuffer &receiving, int recvs,
               const char *what) {
    for (; sends > 0; --sends)
      if (!sending.waitSend(timeout))
        throwAborted(std::string(what) + ": a send");
    for (; recvs > 0; --recvs)
      if (!receiving.waitRecv(timeout))
        throwAborted(std::string(what) + ": a receive");
  }

  /// A fault-tolerant group (its avg divides by a nominal size) runs every
  /// all-reduce on this file's own algorithms, whose waits abort() can end.
  bool abortable() const { return spec.nominalSize > 0; }

  /// Registers an unbound buffer for abort() while it is in use.
  struct Tracked {
    GlooCommunicator &comm;
    gloo::transport::UnboundBuffer *buffer;
    Tracked(GlooCommunicator &comm, gloo::transport::UnboundBuffer &buffer)
        : comm(comm), buffer(&buffer) {
      {
        std::lock_guard<std::mutex> lock(comm.abortMutex);
        if (!comm.aborted) {
          comm.active.push_back(this->buffer);
          return;
        }
      }
      comm.throwAborted("a collective");
    }
    ~Tracked() {
      std::lock_guard<std::mutex> lock(comm.abortMutex);
      comm.active.erase(
          std::find(comm.active.begin(), comm.active.end(), buffer));
    }
  };
  [[noreturn]] void throwAborted(const std::string &what) {
    // Never called with abortMutex held.
    std::string why;
    {
      std::lock_guard<std::mutex> lock(abortMutex);
      why = aborted ? abortReason : std::string();
    }
    throw std::runtime_error(what + " was aborted" +
                             (why.empty() ? std::string() : ": " + why));
  }

  /// A small collective's standing buffers, one set per block size, shared
  /// by the collectives that exchange blocks of that size. Gloo's bound
  /// buffers are registered with their pair once, so a send lands in the
  /// peer's memory at once; an unbound buffer's send waits for the
  /// receiver's recv-ready notice, a second message latency, which on a
  /// machine with more processes than cores can cost a scheduler tick. Two
  /// inboxes alternate between rounds, so no notice is needed that a peer
  /// may write again: a peer's data for round c + 2 follows its round c + 1,
  /// which needed this member's data for c + 1, sent only after this member
  /// was done with round c's inbox.
  struct BoundExchange {
    size_t block = 0;
    uint64_t rounds = 0;
    /// n blocks: this member's block for each peer.
    std::vector<uint8_t> outbox;
    /// n blocks each: each peer's block for this member.
    std::vector<uint8_t> inbox[2];
    /// Per inbox and member key (none for this member).
    std::vector<std::unique_ptr<gloo::transport::Buffer>> sends[2], recvs[2];
  };

  /// Whether a collective exchanging blocks of `block` bytes runs on the
  /// standing buffers: small enough, and its set exists or fits the budget.
  /// Every member decides alike: they see the same collectives in one order.
  /// (A fault-tolerant group keeps to unbound buffers, which abort() ends.)
  bool standing(size_t block) const {
    if (abortable() || block * size_t(size()) > kBoundExchangeBytes)
      return false;
    for (const auto &x : exchanges)
      if (x->block == block)
        return true;
    return exchangeBytes + 3 * size_t(size()) * block <= kBoundExchangeBudget;
  }

  /// The standing buffers for `block`, created on first use (every member
  /// reaches it at the same collective, so their slots agree), then a
  /// barrier.
  BoundExchange &boundExchange(size_t block) {
    for (auto &x : exchanges)
      if (x->block == block)
        return *x;
    size_t n = size_t(size());
    size_t bytes = 3 * n * block;
    // The communicator's first set: first one message of
    // kSendBufferPrimeBytes on every pair, to size its socket's send buffer
    // (see there). Every peer's lands in one scratch region, never read.
    std::vector<uint8_t> primeOut, primeIn;
    std::vector<std::unique_ptr<gloo::transport::Buffer>> primeSends,
        primeRecvs;
    if (exchanges.empty()) {
      primeOut.assign(kSendBufferPrimeBytes, 0);
      primeIn.resize(kSendBufferPrimeBytes);
      int primeSlot = context->nextSlot();
      for (size_t s = 0; s < n; ++s) {
        if (int64_t(s) == key())
          continue;
        auto &pair = context->getPair(int(s));
        primeRecvs.push_back(pair->createRecvBuffer(primeSlot, primeIn.data(),
                                                    kSendBufferPrimeBytes));
        primeSends.push_back(pair->createSendBuffer(primeSlot, primeOut.data(),
                                                    kSendBufferPrimeBytes));
      }
    }
    auto x = std::make_unique<BoundExchange>();
    x->block = block;
    x->outbox.resize(n * block);
    int slot = context->nextSlot(2);
    for (int p = 0; p < 2; ++p) {
      x->inbox[p].resize(n * block);
      x->sends[p].resize(n);
      x->recvs[p].resize(n);
      for (size_t s = 0; s < n; ++s) {
        if (int64_t(s) == key())
          continue;
        auto &pair = context->getPair(int(s));
        x->recvs[p][s] = pair->createRecvBuffer(
            slot + p, x->inbox[p].data() + s * block, block);
        x->sends[p][s] = pair->createSendBuffer(
            slot + p, x->outbox.data() + s * block, block);
      }
    }
    // No member sends before every member has registered its inboxes: a
    // message for a slot not yet registered makes Gloo's I/O thread poll
    // for it without sleeping, and a peer that then closes its connection
    // loses the message.
    gloo::BarrierOptions opts(context);
    opts.setTimeout(timeout);
    gloo::barrier(opts);
    for (auto &send : primeSends)
      send->send();
    for (auto &recv : primeRecvs)
      recv->waitRecv();
    for (auto &send : primeSends)
      send->waitSend();
    exchangeBytes += bytes;
    exchanges.push_back(std::move(x));
    return *exchanges.back();
  }

  /// One round on the standing buffers: `outgoing(s)` (block bytes) to each
  /// peer s, at once; returns the inbox holding each peer's block for this
  /// member at s * block (this member's own slot is left as it was). The
  /// caller is done with the inbox before its next round. Every send and
  /// receive of a round completes within it: nothing is in flight between
  /// rounds.
  template <typename Outgoing>
  const uint8_t *exchangeRound(size_t block, Outgoing &&outgoing) {
    int64_t n = size(), me = key();
    BoundExchange &x = boundExchange(block);
    int p = int(x.rounds++ % 2);
    for (int64_t s = 0; s < n; ++s) {
      if (s == me)
        continue;
      std::memcpy(x.outbox.data() + size_t(s) * block, outgoing(s), block);
      x.sends[p][size_t(s)]->send();
    }
    for (int64_t s = 0; s < n; ++s)
      if (s != me)
        x.recvs[p][size_t(s)]->waitRecv();
    // The outbox is written again by the next round.
    for (int64_t s = 0; s < n; ++s)
      if (s != me)
        x.sends[p][size_t(s)]->waitSend();
    return x.inbox[p].data();
  }

  /// A reduce-scatter in one round of direct messages, then the fold in key
  /// order (this member's block read from the input: `out` may be it, and
  /// the fold reads each piece before writing over it).
  void boundReduceScatter(const void *in, void *out, int64_t count, DType dtype,
                          const ReduceFn &fn) {
    size_t block = size_t(count * plan::dtypeBytes(dtype));
    const auto *input = static_cast<const uint8_t *>(in);
    const uint8_t *inbox = exchangeRound(
        block, [&](int64_t s) { return input + size_t(s) * block; });
    const uint8_t *own = input + size_t(key()) * block;
    foldInKeyOrder(
        fn, out,
        [&](int64_t s) { return s == key() ? own : inbox + size_t(s) * block; },
        size(), count, dtype);
  }

  /// An all-gather in one round of direct messages.
  void boundAllGather(const void *in, void *out, size_t block) {
    const auto *input = static_cast<const uint8_t *>(in);
    const uint8_t *inbox = exchangeRound(block, [&](int64_t) { return input; });
    auto *base = static_cast<uint8_t *>(out);
    for (int64_t s = 0; s < size(); ++s) {
      const uint8_t *from = s == key() ? input : inbox + size_t(s) * block;
      if (base + size_t(s) * block != from)
        std::memmove(base + size_t(s) * block, from, block);
    }
  }

  /// ceil(log2 n): the rounds of the log-round algorithms on n members.
  static int logRounds(int64_t n) {
    int rounds = 0;
    while ((int64_t(1) << rounds) < n)
      ++rounds;
    return rounds;
  }
  bool powerOfTwo() const { return (size() & (size() - 1)) == 0; }

  /// An all-gather in ceil(log2 n) rounds, every block received straight
  /// into its place in `out`. On 2^k members, recursive doubling: in round
  /// k a member swaps the 2^k blocks it holds with member key ^ 2^k, so each
  /// round is a pairwise exchange (a member waits only on the member it
  /// sends to, which matters where processes outnumber cores and a wake-up
  /// can wait for the scheduler's next tick). On other sizes, Bruck's.
  void logRoundAllGather(const void *in, void *out, size_t block) {
    if (!powerOfTwo())
      return bruckAllGather(in, out, block);
    int64_t n = size(), me = key();
    auto *base = static_cast<uint8_t *>(out);
    if (base + block * size_t(me) != in)
      std::memcpy(base + block * size_t(me), in, block);
    auto buffer = context->createUnboundBuffer(out, block * size_t(n));
    Tracked tracked(*this, *buffer);
    uint64_t slot = uint64_t(context->nextSlot(logRounds(n)));
    int round = 0;
    for (int64_t bit = 1; bit < n; bit <<= 1, ++round) {
      int64_t partner = me ^ bit;
      // Each holds the aligned run of `bit` blocks around itself.
      size_t length = block * size_t(bit);
      buffer->recv(int(partner), slot + round,
                   block * size_t(partner & ~(bit - 1)), length);
      buffer->send(int(partner), slot + round, block * size_t(me & ~(bit - 1)),
                   length);
      waitAll(*buffer, 1, *buffer, 1, "all-gather");
    }
  }

  /// Bruck's all-gather (Bruck et al., "Efficient algorithms for all-to-all
  /// communications in multiport message-passing systems", IEEE TPDS 1997):
  /// after round k a member holds the blocks of the 2^k members that follow
  /// it (mod n), and in round k it sends all it holds to the member 2^k
  /// before it. ceil(log2 n) rounds instead of the ring's n - 1, every block
  /// still sent once per member, and received straight into its place in
  /// `out` (a range that wraps past member n - 1 goes as two messages).
  void bruckAllGather(const void *in, void *out, size_t block) {
    int64_t n = size(), me = key();
    auto *base = static_cast<uint8_t *>(out);
    if (base + block * size_t(me) != in)
      std::memcpy(base + block * size_t(me), in, block);
    auto buffer = context->createUnboundBuffer(out, block * size_t(n));
    Tracked tracked(*this, *buffer);
    // Two slots per round, one per piece of a wrapping range.
    uint64_t slot = uint64_t(context->nextSlot(2 * logRounds(n)));
    int64_t have = 1;
    for (int round = 0; have < n; ++round) {
      int64_t count = std::min(have, n - have);
      int sends = 0, recvs = 0;
      // The blocks of members [first, first + count) mod n, as at most two
      // contiguous pieces: sender and receiver split the same range alike.
      auto pieces = [&](int64_t first, auto &&post) {
        int64_t end = first + count;
        post(first, std::min(end, n) - first, 0);
        if (end > n)
          post(int64_t(0), end - n, 1);
      };
      pieces((me + have) % n, [&](int64_t first, int64_t blocks, int piece) {
        buffer->recv(int((me + have) % n), slot + 2 * round + piece,
                     block * size_t(first), block * size_t(blocks));
        ++recvs;
      });
      pieces(me, [&](int64_t first, int64_t blocks, int piece) {
        buffer->send(int((me - have + n) % n), slot + 2 * round + piece,
                     block * size_t(first), block * size_t(blocks));
        ++sends;
      });
      waitAll(*buffer, sends, *buffer, recvs, "all-gather");
      have += count;
    }
  }

  /// A key-order all-reduce of a large tensor. The tensor is cut into n
  /// regions, member s owning region s; each region into pieces. Per piece,
  /// every member sends its part of region s to member s, which folds the n
  /// parts in key order and sends the sum back to every member: one message
  /// per member and direction, (n-1)/n of the tensor each way, as the ring
  /// sends, but two message latencies per piece instead of the ring's
  /// 2 (n - 1). The transfers of piece c + 1 run on Gloo's I/O thread while
  /// piece c is folded (two inboxes).
  void pipelinedAllReduce(uint8_t *data, int64_t count, DType dtype,
                          const ReduceFn &sum) {
    int64_t n = size(), me = key();
    size_t width = size_t(plan::dtypeBytes(dtype));
    int64_t region = (count + n - 1) / n;
    // At least two pieces per region from 2 MiB, so that folding one
    // overlaps moving the next (16 MiB on 4 members: 0.95-1.02 of the ring
    // against 1.02-1.09 in one piece; 256 KiB pieces lost more to latency).
    int64_t piece = std::clamp<int64_t>(
        (region + 1) / 2, int64_t((size_t(1) << 20) / width),
        std::max<int64_t>(1, int64_t(kAllReducePieceBytes / width)));
    int64_t pieces = (region + piece - 1) / piece;
    // Elements [first, last) of region s's piece c (empty past the end).
    auto span = [&](int64_t s, int64_t c) {
      int64_t first = std::min(count, s * region + c * piece);
      int64_t last = std::min({count, (s + 1) * region, first + piece});
      return std::pair<size_t, size_t>(
          size_t(first) * width, size_t(std::max(first, last) - first) * width);
    };
    size_t inboxBytes = size_t(piece) * width * size_t(n);
    packed.resize(2 * inboxBytes);
    auto whole = context->createUnboundBuffer(data, size_t(count) * width);
    std::unique_ptr<gloo::transport::UnboundBuffer> inbox[2] = {
        context->createUnboundBuffer(packed.data(), inboxBytes),
        context->createUnboundBuffer(packed.data() + inboxBytes, inboxBytes)};
    Tracked trackedWhole(*this, *whole), tracked0(*this, *inbox[0]),
        tracked1(*this, *inbox[1]);
    uint64_t slot = uint64_t(context->nextSlot(int(2 * pieces)));
    int sends = 0, results = 0;
    int parts[2] = {0, 0};
    // Sends this member's parts of piece c to their owners and receives the
    // others' parts of its own region into inbox c % 2.
    auto scatter = [&](int64_t c) {
      auto [at, bytes] = span(me, c);
      for (int64_t s = 0; s < n && bytes; ++s)
        if (s != me) {
          inbox[c % 2]->recv(int(s), slot + 2 * c, size_t(s) * bytes, bytes);
          ++parts[c % 2];
        }
      for (int64_t s = 0; s < n; ++s) {
        auto [theirs, length] = span(s, c);
        if (s != me && length) {
          whole->send(int(s), slot + 2 * c, theirs, length);
          ++sends;
        }
      }
    };
    scatter(0);
    for (int64_t c = 0; c < pieces; ++c) {
      if (c + 1 < pieces)
        scatter(c + 1);
      auto [at, bytes] = span(me, c);
      for (; parts[c % 2] > 0; --parts[c % 2])
        if (!inbox[c % 2]->waitRecv(timeout))
          throwAborted("all-reduce: a receive");
      if (bytes) {
        // This member's own part is folded where it lies.
        uint8_t *box = packed.data() + (c % 2) * inboxBytes;
        foldInKeyOrder(
            sum, data + at,
            [&](int64_t s) {
              return s == me ? data + at : box + size_t(s) * bytes;
            },
            n, int64_t(bytes / width), dtype);
      }
      // The sum of piece c of this member's region, to every member; theirs
      // into place. (A member sends its sum only after it received every
      // part, this one's included, so no part is still being sent from the
      // bytes a result lands on.)
      for (int64_t s = 0; s < n; ++s) {
        if (s == me)
          continue;
        auto [theirs, length] = span(s, c);
        if (length) {
          whole->recv(int(s), slot + 2 * c + 1, theirs, length);
          ++results;
        }
        if (bytes) {
          whole->send(int(s), slot + 2 * c + 1, at, bytes);
          ++sends;
        }
      }
    }
    waitAll(*whole, sends, *whole, results, "all-reduce");
  }

  /// The Gloo slot of a tagged transfer: a 56-bit FNV-1a hash of the tag
  /// under a prefix byte Gloo's own collectives never use (theirs are small;
  /// Slot::build), so transfers never meet collectives or each other's
  /// messages; both sides compute the same slot from the tag. The plan
  /// reader makes tags unique per direction on a communicator, and the
  /// session refuses two tags of one communicator with the same slot.
  /// The tag of each slot transfers used (the executor runs one operation
  /// of a communicator at a time, so no lock).
  std::unordered_map<uint64_t, std::string> tagOfSlot;
  static uint64_t transferSlot(std::string_view tag) {
    uint64_t h = fnv1a64(tag);
    return (uint64_t(0xF7) << 56) | (h & ((uint64_t(1) << 56) - 1));
  }
  Result<void> transfer(void *data, int64_t peer, int64_t count, DType dtype,
                        std::string_view tag, bool sending) {
    size_t bytes = size_t(count * plan::dtypeBytes(dtype));
    if (bytes == 0)
      return {};
    if (peer < 0 || peer >= size() || peer == key())
      return makeError("key " + std::to_string(peer) +
                       " is not another member of the group");
    uint64_t slot = transferSlot(tag);
    auto [known, fresh] = tagOfSlot.emplace(slot, tag);
    if (!fresh && known->second != tag)
      return makeError("the transfer tags \"" + known->second + "\" and \"" +
                       std::string(tag) + "\" share a Gloo slot; rename one");
    return guarded([&] {
      std::unique_ptr<gloo::transport::UnboundBuffer> buffer =
          context->createUnboundBuffer(data, bytes);
      Tracked tracked(*this, *buffer);
      if (sending) {
        buffer->send(static_cast<int>(peer), slot);
        if (!buffer->waitSend(timeout))
          throw std::runtime_error("send \"" + std::string(tag) + "\" to key " +
                                   std::to_string(peer) + " was aborted");
      } else {
        buffer->recv(static_cast<int>(peer), slot);
        if (!buffer->waitRecv(timeout))
          throw std::runtime_error("receive \"" + std::string(tag) +
                                   "\" from key " + std::to_string(peer) +
                                   " was aborted");
      }
    });
  }

  GroupSpec spec;
  std::shared_ptr<gloo::Context> context;
  std::chrono::milliseconds timeout;
  std::vector<uint8_t> scratch;
  /// The pipelined all-reduce's two inboxes.
  std::vector<uint8_t> packed;
  /// The standing buffers (exchangeRound). Declared after `context`, so
  /// destroyed before it: a bound buffer unregisters from its pair.
  std::vector<std::unique_ptr<BoundExchange>> exchanges;
  size_t exchangeBytes = 0;
  bool keyOrder = true;
  /// abort(): the unbound buffers in use, under abortMutex.
  std::mutex abortMutex;
  std::vector<gloo::transport::UnboundBuffer *> active;
  std::atomic<bool> aborted{false};
  std::string abortReason;
};

/// A group of one rank needs no context: every collective is a copy.
class SelfCommunicator final : public Communicator {
public:
  explicit SelfCommunicator(GroupSpec group) : spec(std::move(group)) {}
  const GroupSpec &group() const override { return spec; }
  Result<void> allGather(const void *in, void *out, int64_t count,
                         DType dtype) override {
    std::memmove(out, in, size_t(count * plan::dtypeBytes(dtype)));
    return {};
  }
  Result<void> reduceScatter(const void *in, void *out, int64_t count,
                             DType dtype, ReduceOp op) override {
    std::memmove(out, in, size_t(count * plan::dtypeBytes(dtype)));
    if (op == ReduceOp::Avg && avgDivisor() != 1)
      divideBy(out, count, dtype, avgDivisor());
    return {};
  }
  Result<void> allReduce(void *data, int64_t count, DType dtype,
                         ReduceOp op) override {
    // The last live member of a fault-tolerant group still averages over
    // the group's nominal size.
    if (op == ReduceOp::Avg && avgDivisor() != 1)
      divideBy(data, count, dtype, avgDivisor());
    return {};
  }
  Result<void>
  allReduceShares(const std::vector<const void *> &mine, void *out,
                  int64_t count, DType dtype, ReduceOp op,
                  const std::vector<std::vector<int64_t>> &layout) override {
    if (layout.size() != 1 || layout[0].size() != mine.size())
      return makeError("allReduceShares: the layout does not match this "
                       "member's contributions");
    size_t block = size_t(count * plan::dtypeBytes(dtype));
    std::vector<std::byte> all(block * mine.size());
    for (size_t j = 0; j < mine.size(); ++j)
      std::memcpy(all.data() + j * block, mine[j], block);
    MESHPLAN_TRY(
        foldShares(dtype, op, out, all.data(), mine.size(), count, layout));
    if (op == ReduceOp::Avg && avgDivisor() != 1)
      divideBy(out, count, dtype, avgDivisor());
    return {};
  }
  Result<void> broadcast(void *, int64_t, DType, int64_t) override {
    return {};
  }
  Result<void> allToAll(const void *in, void *out, int64_t count,
                        DType dtype) override {
    std::memmove(out, in, size_t(count * plan::dtypeBytes(dtype)));
    return {};
  }
  Result<void> sendRecv(const void *send, int64_t sendTo, void *recv,
                        int64_t recvFrom, int64_t count, DType dtype) override {
    if (sendTo != recvFrom)
      return makeError("a group of one rank can only send to itself");
    if (sendTo == 0)
      std::memmove(recv, send, size_t(count * plan::dtypeBytes(dtype)));
    return {};
  }
  Result<void> barrier() override { return {}; }

private:
  GroupSpec spec;
};

//===----------------------------------------------------------------------===//
// Backend
//===----------------------------------------------------------------------===//

class GlooBackend final : public Backend {
public:
  static Result<std::unique_ptr<Backend>> create(const BackendOptions &o) {
    // A peer that dies mid-collective closes its sockets, and writing to one
    // raises SIGPIPE, whose default action kills this process without a word
    // before Gloo can report the broken connection (the error would name the
    // communicator and the instruction). Ignore it, unless the program chose
    // its own handler (CPython, which loads the C API, ignores it already).
    struct sigaction current {};
    if (sigaction(SIGPIPE, nullptr, &current) == 0 &&
        current.sa_handler == SIG_DFL)
      signal(SIGPIPE, SIG_IGN);
    auto backend = std::unique_ptr<GlooBackend>(new GlooBackend(o));
    std::string host = o.hostname;
    if (const char *env = std::getenv("MESHPLAN_HOSTNAME"); env && *env)
      host = env;
    if (host.empty()) {
      // A file store, or torchrun's store on the loopback (--standalone),
      // means one machine: peers meet on the loopback.
      bool loopbackTcp =
          o.store.kind == StoreAddress::Kind::Tcp &&
          (o.store.host == "localhost" || o.store.host.starts_with("127.") ||
           o.store.host == "::1");
      if (o.store.kind == StoreAddress::Kind::File || loopbackTcp) {
        host = "127.0.0.1";
      } else {
        char name[256] = {0};
        if (gethostname(name, sizeof(name) - 1) != 0)
          return makeError("cannot read this machine's host name; set "
                           "MESHPLAN_HOSTNAME");
        host = name;
      }
    }
    MESHPLAN_TRY(guarded([&] {
      if (o.store.kind == StoreAddress::Kind::File)
        backend->store =
            std::make_unique<gloo::rendezvous::FileStore>(o.store.path);
      else if (o.store.kind == StoreAddress::Kind::Tcp)
        backend->store = std::make_unique<TorchTcpStore>(
            o.store.host, o.store.port, o.timeout);
      else
        backend->store = std::make_unique<gloo::rendezvous::RedisStore>(
            o.store.host, o.store.port);
      gloo::transport::tcp::attr attr;
      attr.hostname = host;
      backend->device = gloo::transport::tcp::CreateDevice(attr);
    }));
    return std::unique_ptr<Backend>(std::move(backend));
  }

  std::string_view name() const override { return "gloo"; }

  Result<std::unique_ptr<Communicator>>
  createCommunicator(const GroupSpec &group) override {
    if (group.ranks.size() == 1)
      return std::unique_ptr<Communicator>(
          std::make_unique<SelfCommunicator>(group));
    std::string prefix = options.job + "/e" + std::to_string(group.epoch) +
                         "/i" + std::to_string(group.incarnation) + "/" +
                         group.id + "/" + std::to_string(group.color);
    std::shared_ptr<gloo::rendezvous::Context> context;
    Result<void> ok = guarded([&] {
      gloo::rendezvous::PrefixStore scoped(prefix, *store);
      context = std::make_shared<gloo::rendezvous::Context>(
          static_cast<int>(group.key), static_cast<int>(group.ranks.size()));
      context->setTimeout(options.timeout);
      if (group.cancelled) {
        // A member may give up the rendezvous after publishing its address
        // (its group's epoch ended); a peer connecting to it would wait for
        // Gloo's connect timeout, five times the context's. With
        // GroupSpec::connectTimeout that wait is bounded by it instead,
        // and the store's waits keep the whole timeout.
        if (std::optional<std::string> why = group.cancelled())
          throw gloo::IoException("rendezvous stopped: " + *why);
        if (group.connectTimeout.count() > 0)
          context->setTimeout(
              std::max(std::chrono::milliseconds(1), group.connectTimeout / 5));
        CancellableStore cancellable(scoped, group.cancelled, options.timeout);
        context->connectFullMesh(cancellable, device);
        context->setTimeout(options.timeout);
      } else {
        context->connectFullMesh(scoped, device);
      }
    });
    if (!ok)
      return makeError("rendezvous of communicator \"" + group.id +
                       "\" (color " + std::to_string(group.color) + ", " +
                       std::to_string(group.ranks.size()) +
                       " members) failed: " + ok.error().message);
    // The predicate serves the rendezvous only (it may capture the
    // caller's state by reference): the communicator keeps no copy.
    GroupSpec kept = group;
    kept.cancelled = nullptr;
    return std::unique_ptr<Communicator>(std::make_unique<GlooCommunicator>(
        kept, context, options.timeout, options.keyOrderReductions));
  }

  Result<void> storeSet(const std::string &key,
                        const std::vector<char> &value) override {
    return guarded([&] { store->set(options.job + "/kv/" + key, value); });
  }

  Result<std::vector<char>> storeGet(const std::string &key) override {
    std::vector<char> value;
    std::string full = options.job + "/kv/" + key;
    MESHPLAN_TRY(guarded([&] {
      store->wait({full}, options.timeout);
      value = store->get(full);
    }));
    return value;
  }

  Result<std::optional<std::vector<char>>>
  storePeek(const std::string &key) override {
    std::string full = options.job + "/kv/" + key;
    // Gloo's stores have no "check": a wait that ends at once says whether
    // the key is there.
    try {
      store->wait({full}, std::chrono::milliseconds(1));
    } catch (const std::exception &) {
      return std::optional<std::vector<char>>();
    }
    std::vector<char> value;
    MESHPLAN_TRY(guarded([&] { value = store->get(full); }));
    return std::optional<std::vector<char>>(std::move(value));
  }

private:
  explicit GlooBackend(BackendOptions o) : options(std::move(o)) {}
  BackendOptions options;
  std::unique_ptr<gloo::rendezvous::Store> store;
  std::shared_ptr<gloo::transport::Device> device;
};

} // namespace

std::shared_ptr<gloo::Context> glooContextOf(Communicator &comm) {
  if (auto *g = dynamic_cast<GlooCommunicator *>(&comm))
    return g->glooContext();
  return nullptr;
}

Result<std::unique_ptr<Backend>>
createGlooBackend(const BackendOptions &options) {
  return GlooBackend::create(options);
}

} // namespace meshplan::runtime

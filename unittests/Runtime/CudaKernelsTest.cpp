//===- CudaKernelsTest.cpp - GPU kernels bit for bit against the CPU ------===//
//
// Every CUDA kernel (runtime/lib/Kernels/Cuda) against its CPU counterpart
// (meshplan/Runtime/Kernels.h, the executor's BoxCopy and sums), bit for bit,
// over sampled bit patterns and the edge cases where implementations differ:
// NaN payloads and signs, infinities, zeros of both signs, float and float8
// subnormals, values at and beyond float8 saturation, ties, and every
// power-of-two scale exponent. Needs a CUDA device; skips without one
// (CudaTestSupport.h).
//
//===----------------------------------------------------------------------===//

#include "CudaTestSupport.h"

#include "BoxCopy.h"
#include "Kernels/Cuda/CudaKernels.h"
#include "meshplan/Runtime/Kernels.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

using namespace meshplan;
using namespace meshplan::runtime;
namespace k = meshplan::runtime::kernels;
namespace cu = meshplan::runtime::cuda;
using k::Fp8Format;

namespace {

/// Device memory holding a copy of a host vector.
template <typename T> class DeviceVector {
public:
  explicit DeviceVector(size_t n) : n(n) {
    EXPECT_EQ(cudaMalloc(&data, std::max<size_t>(n, 1) * sizeof(T)),
              cudaSuccess);
  }
  explicit DeviceVector(const std::vector<T> &host)
      : DeviceVector(host.size()) {
    EXPECT_EQ(
        cudaMemcpy(data, host.data(), n * sizeof(T), cudaMemcpyHostToDevice),
        cudaSuccess);
  }
  ~DeviceVector() { cudaFree(data); }
  T *get() { return static_cast<T *>(data); }
  std::vector<T> read() {
    std::vector<T> host(n);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(
        cudaMemcpy(host.data(), data, n * sizeof(T), cudaMemcpyDeviceToHost),
        cudaSuccess);
    return host;
  }

private:
  void *data = nullptr;
  size_t n;
};

float bits(uint32_t b) { return std::bit_cast<float>(b); }

/// The floats where conversions differ, both signs.
std::vector<float> edgeFloats() {
  std::vector<uint32_t> patterns = {
      0x00000000, 0x00000001, 0x00000002, 0x007FFFFF, 0x00800000, 0x00400000,
      0x7F7FFFFF, 0x7F800000, 0x7F800001, 0x7FC00000, 0x7FFFFFFF, 0x7FA00000,
      0x3F800000, 0x3F800001, 0x3F7FFFFF, 0x3F808000, 0x3F818000, 0x3F80FFFF};
  std::vector<float> values = {448.0f,
                               449.0f,
                               464.0f,
                               464.0001f,
                               479.9f,
                               480.0f,
                               500.0f,
                               57344.0f,
                               61439.0f,
                               61440.0f,
                               65536.0f,
                               1e30f,
                               0.015625f,
                               0.0146484375f,
                               0.001953125f,
                               0.0009765625f,
                               0.00146484375f,
                               0.0029296875f,
                               1.52587890625e-05f,
                               7.62939453125e-06f,
                               1.1444091796875e-05f,
                               6.103515625e-05f,
                               3.0517578125e-05f,
                               1.0f / 3,
                               2.0f / 3,
                               0.1f,
                               1.0625f,
                               1.125f,
                               1.1875f,
                               1.25f,
                               240.0f,
                               248.0f,
                               256.0f,
                               272.0f,
                               288.0f};
  std::vector<float> out;
  for (uint32_t p : patterns)
    values.push_back(bits(p));
  for (float v : values) {
    out.push_back(v);
    out.push_back(-v);
  }
  // Every float8 code's value, and the midpoints between neighbours (ties).
  for (Fp8Format f : {Fp8Format::E4M3FN, Fp8Format::E5M2})
    for (int c = 0; c < 127; ++c) {
      float a = k::fp8ToFloat(uint8_t(c), f),
            b = k::fp8ToFloat(uint8_t(c + 1), f);
      if (std::isfinite(a) && std::isfinite(b)) {
        for (float x : {a, (a + b) / 2, std::nextafter((a + b) / 2, 0.0f),
                        std::nextafter((a + b) / 2, 1e30f)}) {
          out.push_back(x);
          out.push_back(-x);
        }
      }
    }
  return out;
}

/// n float bit patterns spread over the whole 32-bit space, plus the edges.
std::vector<float> sampledFloats(size_t n) {
  std::vector<float> out = edgeFloats();
  uint32_t x = 0x12345678;
  for (size_t i = 0; i < n; ++i) {
    x += 0x9E3779B9u; // a Weyl sequence: every pattern class is visited
    out.push_back(bits(x));
  }
  return out;
}

/// Finite values of moderate magnitude (AdamW inputs), with some zeros.
std::vector<float> normalFloats(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i)
    out[i] = i % 97 == 0 ? 0.0f : dist(rng);
  return out;
}

/// Every power-of-two scale exponent, non-powers of two, and the degenerate
/// scales a broken amax yields.
std::vector<float> scales() {
  std::vector<float> out;
  for (int e = -149; e <= 127; ++e) {
    out.push_back(std::ldexp(1.0f, e));
    if (e < 127)
      out.push_back(std::ldexp(1.5f, e));
  }
  for (float s : {0.0f, 448.0f / 3.0f, 57344.0f / 7.0f,
                  std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN()})
    out.push_back(s);
  return out;
}

/// Float results agree bit for bit, except that a NaN matches any NaN: the
/// GPU writes the canonical NaN 0x7FFFFFFF for every NaN an operation
/// produces or passes through, x86 keeps (quiets) an operand's payload or
/// makes 0xFFC00000, and no kernel promises NaN payloads (bf16 and float8
/// outputs canonicalize NaN and are compared exactly).
bool sameFloat(float a, float b) {
  return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b) ||
         (std::isnan(a) && std::isnan(b));
}
::testing::AssertionResult sameFloats(const std::vector<float> &got,
                                      const std::vector<float> &want) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "sizes differ";
  for (size_t i = 0; i < got.size(); ++i)
    if (!sameFloat(got[i], want[i]))
      return ::testing::AssertionFailure()
             << "element " << i << ": got bits 0x" << std::hex
             << std::bit_cast<uint32_t>(got[i]) << ", want 0x"
             << std::bit_cast<uint32_t>(want[i]);
  return ::testing::AssertionSuccess();
}

class CudaKernels : public ::testing::Test {
protected:
  void SetUp() override { MESHPLAN_REQUIRE_CUDA_DEVICE(); }
};

TEST_F(CudaKernels, Fp8CastFromFloatEveryScale) {
  std::vector<float> in = sampledFloats(1 << 14);
  DeviceVector<float> din(in);
  DeviceVector<uint8_t> dout(in.size());
  DeviceVector<float> dscale(1);
  for (Fp8Format f : {Fp8Format::E4M3FN, Fp8Format::E5M2})
    for (float scale : scales()) {
      ASSERT_EQ(cudaMemcpy(dscale.get(), &scale, 4, cudaMemcpyHostToDevice),
                cudaSuccess);
      ASSERT_EQ(cu::castToFp8(din.get(), dscale.get(), dout.get(),
                              int64_t(in.size()), f, nullptr),
                cudaSuccess);
      std::vector<uint8_t> want(in.size());
      k::castToFp8(in, scale, want, f);
      std::vector<uint8_t> got = dout.read();
      for (size_t i = 0; i < in.size(); ++i)
        ASSERT_EQ(got[i], want[i])
            << "format " << int(f) << " scale " << scale << " input bits 0x"
            << std::hex << std::bit_cast<uint32_t>(in[i]);
    }
}

TEST_F(CudaKernels, Fp8CastManyPatternsScaleOne) {
  std::vector<float> in = sampledFloats(1 << 22);
  DeviceVector<float> din(in);
  DeviceVector<uint8_t> dout(in.size());
  for (Fp8Format f : {Fp8Format::E4M3FN, Fp8Format::E5M2}) {
    // A null scale pointer means 1.
    ASSERT_EQ(cu::castToFp8(din.get(), nullptr, dout.get(), int64_t(in.size()),
                            f, nullptr),
              cudaSuccess);
    std::vector<uint8_t> want(in.size());
    k::castToFp8(in, 1.0f, want, f);
    EXPECT_EQ(dout.read(), want);
  }
}

// The fp32 cast and amax take 16-byte loads when the pointers allow
// (Float8.cu, Amax.cu): every alignment and every length around a multiple
// of 4 gives the scalar kernels' results.
TEST_F(CudaKernels, VectorPathsAtEveryAlignmentAndLength) {
  std::vector<float> all = sampledFloats(4096 + 8);
  DeviceVector<float> din(all);
  DeviceVector<uint8_t> dout(all.size());
  DeviceVector<float> dscale(1), dresult(1);
  float scale = 3.5f;
  ASSERT_EQ(cudaMemcpy(dscale.get(), &scale, 4, cudaMemcpyHostToDevice),
            cudaSuccess);
  for (size_t offset : {0, 1, 2, 3, 4})
    for (size_t n : {1, 3, 4, 5, 7, 8, 1023, 1024, 1025, 4096}) {
      std::span<const float> in(all.data() + offset, n);
      for (size_t outOffset : {size_t(0), size_t(1)}) {
        // A fresh output each time: stale bytes must not pass for results.
        ASSERT_EQ(cudaMemset(dout.get(), 0xAB, all.size()), cudaSuccess);
        for (Fp8Format f : {Fp8Format::E4M3FN, Fp8Format::E5M2}) {
          ASSERT_EQ(cu::castToFp8(din.get() + offset, dscale.get(),
                                  dout.get() + outOffset, int64_t(n), f,
                                  nullptr),
                    cudaSuccess);
          std::vector<uint8_t> want(n);
          k::castToFp8(in, scale, want, f);
          std::vector<uint8_t> got = dout.read();
          std::vector<uint8_t> mine(got.begin() + ptrdiff_t(outOffset),
                                    got.begin() + ptrdiff_t(outOffset + n));
          ASSERT_EQ(mine, want) << "offset " << offset << ", output offset "
                                << outOffset << ", " << n << " elements";
          if (outOffset + n < got.size()) {
            ASSERT_EQ(got[outOffset + n], 0xAB) << "wrote past the end";
          }
        }
      }
      ASSERT_EQ(
          cu::amax(din.get() + offset, int64_t(n), dresult.get(), nullptr),
          cudaSuccess);
      EXPECT_EQ(std::bit_cast<uint32_t>(dresult.read()[0]),
                std::bit_cast<uint32_t>(k::amax(in)))
          << "offset " << offset << ", " << n << " elements";
    }
}

TEST_F(CudaKernels, Fp8CastFromEveryBf16) {
  std::vector<uint16_t> in(65536);
  for (size_t i = 0; i < in.size(); ++i)
    in[i] = uint16_t(i);
  DeviceVector<uint16_t> din(in);
  DeviceVector<uint8_t> dout(in.size());
  DeviceVector<float> dscale(1);
  for (Fp8Format f : {Fp8Format::E4M3FN, Fp8Format::E5M2})
    for (float scale : scales()) {
      ASSERT_EQ(cudaMemcpy(dscale.get(), &scale, 4, cudaMemcpyHostToDevice),
                cudaSuccess);
      ASSERT_EQ(cu::castToFp8(din.get(), dscale.get(), dout.get(),
                              int64_t(in.size()), f, nullptr),
                cudaSuccess);
      std::vector<uint8_t> want(in.size());
      k::castToFp8(std::span<const uint16_t>(in), scale, want, f);
      ASSERT_EQ(dout.read(), want) << "format " << int(f) << " scale " << scale;
    }
}

TEST_F(CudaKernels, Fp8DequantEveryCodeEveryScale) {
  std::vector<uint8_t> in(256);
  for (int c = 0; c < 256; ++c)
    in[size_t(c)] = uint8_t(c);
  DeviceVector<uint8_t> din(in);
  DeviceVector<float> dout(256);
  DeviceVector<uint16_t> dout16(256);
  DeviceVector<float> dscale(1);
  for (Fp8Format f : {Fp8Format::E4M3FN, Fp8Format::E5M2})
    for (float scale : scales()) {
      ASSERT_EQ(cudaMemcpy(dscale.get(), &scale, 4, cudaMemcpyHostToDevice),
                cudaSuccess);
      ASSERT_EQ(
          cu::dequantFp8(din.get(), dscale.get(), dout.get(), 256, f, nullptr),
          cudaSuccess);
      ASSERT_EQ(cu::dequantFp8(din.get(), dscale.get(), dout16.get(), 256, f,
                               nullptr),
                cudaSuccess);
      std::vector<float> want(256);
      std::vector<uint16_t> want16(256);
      k::dequantFp8(in, scale, want, f);
      k::dequantFp8(in, scale, std::span<uint16_t>(want16), f);
      std::vector<float> got = dout.read();
      ASSERT_TRUE(sameFloats(got, want)) << "scale " << scale;
      ASSERT_EQ(dout16.read(), want16) << "scale " << scale;
    }
}

TEST_F(CudaKernels, Fp8ScaleFromAmaxOnDevice) {
  std::vector<float> amaxes = edgeFloats();
  for (float s : scales())
    amaxes.push_back(s);
  DeviceVector<float> damax(amaxes);
  DeviceVector<float> dscale(amaxes.size());
  for (Fp8Format f : {Fp8Format::E4M3FN, Fp8Format::E5M2})
    for (bool pow2 : {false, true}) {
      for (size_t i = 0; i < amaxes.size(); ++i)
        ASSERT_EQ(cu::fp8ScaleFromAmax(damax.get() + i, dscale.get() + i, f,
                                       pow2, nullptr),
                  cudaSuccess);
      std::vector<float> got = dscale.read();
      for (size_t i = 0; i < amaxes.size(); ++i)
        ASSERT_TRUE(sameFloat(got[i], k::fp8ScaleFromAmax(amaxes[i], f, pow2)))
            << "amax " << amaxes[i] << " power of two " << pow2;
    }
}

TEST_F(CudaKernels, AmaxMatchesCpu) {
  DeviceVector<float> dresult(1);
  std::vector<std::vector<float>> cases = {
      {},
      {0.0f},
      {-0.0f},
      {-3.0f, 2.0f},
      sampledFloats(1000),
      normalFloats((1 << 20) + 3, 1, 5.0f)};
  std::vector<float> withNaN = normalFloats(100000, 2, 1.0f);
  withNaN[77777] = bits(0xFFC00001);
  cases.push_back(withNaN);
  std::vector<float> withInf = normalFloats(4097, 3, 1.0f);
  withInf[4096] = -std::numeric_limits<float>::infinity();
  cases.push_back(withInf);
  for (const std::vector<float> &in : cases) {
    DeviceVector<float> din(in);
    ASSERT_EQ(cu::amax(din.get(), int64_t(in.size()), dresult.get(), nullptr),
              cudaSuccess);
    EXPECT_EQ(std::bit_cast<uint32_t>(dresult.read()[0]),
              std::bit_cast<uint32_t>(k::amax(in)))
        << in.size() << " elements";
    std::vector<uint16_t> in16(in.size());
    k::castToBf16(in, in16);
    DeviceVector<uint16_t> din16(in16);
    ASSERT_EQ(
        cu::amax(din16.get(), int64_t(in16.size()), dresult.get(), nullptr),
        cudaSuccess);
    EXPECT_EQ(
        std::bit_cast<uint32_t>(dresult.read()[0]),
        std::bit_cast<uint32_t>(k::amax(std::span<const uint16_t>(in16))));
  }
}

TEST_F(CudaKernels, Bf16CastsMatchCpu) {
  std::vector<float> in = sampledFloats(1 << 22);
  DeviceVector<float> din(in);
  DeviceVector<uint16_t> dout(in.size());
  ASSERT_EQ(cu::castToBf16(din.get(), dout.get(), int64_t(in.size()), nullptr),
            cudaSuccess);
  std::vector<uint16_t> want(in.size());
  k::castToBf16(in, want);
  EXPECT_EQ(dout.read(), want);

  std::vector<uint16_t> every(65536);
  for (size_t i = 0; i < every.size(); ++i)
    every[i] = uint16_t(i);
  DeviceVector<uint16_t> devery(every);
  DeviceVector<float> dwide(every.size());
  ASSERT_EQ(cu::castBf16ToFloat(devery.get(), dwide.get(), 65536, nullptr),
            cudaSuccess);
  std::vector<float> wide = dwide.read(), wantWide(65536);
  k::castBf16ToFloat(every, wantWide);
  EXPECT_EQ(std::memcmp(wide.data(), wantWide.data(), 65536 * 4), 0);
}

/// Shard boxes: (global shape, offset, local shape).
struct Box {
  std::vector<int64_t> global, offset, local;
};
std::vector<Box> shardBoxes() {
  return {{{1000}, {0}, {1000}},
          {{1000}, {333}, {334}},
          {{96, 130}, {0, 65}, {96, 65}},      // a column shard: 96 runs
          {{96, 130}, {48, 0}, {48, 130}},     // a row shard: one run
          {{7, 9, 33}, {2, 3, 0}, {4, 5, 33}}, // two outer dims
          {{5, 6, 7, 8}, {1, 0, 2, 3}, {3, 6, 4, 5}},
          {{64}, {10}, {0}},
          // Contiguous shards (one run, AdamW's per-counter kernel) that
          // start and end inside a superblock of 64.
          {{200}, {63}, {1}},
          {{1 << 16}, {4097}, {60000}}};
}

TEST_F(CudaKernels, StochasticBf16CastMatchesCpuOnShards) {
  for (const Box &box : shardBoxes()) {
    auto runs = k::boxIndexRuns(box.global, box.offset, box.local);
    auto index = cu::shardIndexOf(box.global, box.offset, box.local);
    ASSERT_TRUE(runs && index);
    int64_t n = 1;
    for (int64_t d : box.local)
      n *= d;
    std::vector<float> in = normalFloats(size_t(n), 5, 3.0f);
    for (size_t i = 0; i < in.size() && i < 40; ++i)
      in[i] = edgeFloats()[i * 7 % edgeFloats().size()];
    DeviceVector<float> din(in);
    DeviceVector<uint16_t> dout(in.size());
    for (k::StochasticRoundingKey key :
         {k::StochasticRoundingKey{0, 1, 0},
          {42, 7, 3},
          {0xFFFFFFFFFFFFFFFFull, int64_t(1) << 40, 291}}) {
      ASSERT_EQ(cu::castToBf16Stochastic(din.get(), dout.get(), n, key, *index,
                                         nullptr),
                cudaSuccess);
      std::vector<uint16_t> want(in.size());
      k::castToBf16Stochastic(in, want, key, *runs);
      ASSERT_EQ(dout.read(), want) << "seed " << key.seed;
    }
  }
}

TEST_F(CudaKernels, SumRowsInTheExecutorsOrder) {
  int64_t rows = 5, n = 10007;
  std::vector<float> in = normalFloats(size_t(rows * n), 9, 1e3f);
  in[3] = -0.0f;
  in[n + 3] = -0.0f; // a column of negative zeros sums to +0 from +0
  for (int64_t r = 0; r < rows; ++r)
    in[size_t(r * n + 4)] = -0.0f;
  DeviceVector<float> din(in);
  DeviceVector<float> dout(static_cast<size_t>(n));
  ASSERT_EQ(cu::sumRows(din.get(), rows, n, dout.get(), nullptr), cudaSuccess);
  std::vector<float> want(size_t(n), 0.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j)
      want[size_t(j)] += in[size_t(r * n + j)];
  std::vector<float> got = dout.read();
  EXPECT_TRUE(sameFloats(got, want));
}

TEST_F(CudaKernels, KeyOrderBlockReductionMatchesGlooOrder) {
  int64_t blocks = 5, count = 4099;
  std::vector<float> in = normalFloats(size_t(blocks * count), 11, 1e4f);
  DeviceVector<float> din(in);
  DeviceVector<float> dout(static_cast<size_t>(count));
  for (cu::BlockReduce op :
       {cu::BlockReduce::Sum, cu::BlockReduce::Avg, cu::BlockReduce::Product}) {
    ASSERT_EQ(cu::reduceBlocksInKeyOrder(din.get(), blocks, count, dout.get(),
                                         false, op, nullptr),
              cudaSuccess);
    std::vector<float> want(in.begin(), in.begin() + count);
    for (int64_t b = 1; b < blocks; ++b)
      for (int64_t j = 0; j < count; ++j)
        want[size_t(j)] = op == cu::BlockReduce::Product
                              ? want[size_t(j)] * in[size_t(b * count + j)]
                              : want[size_t(j)] + in[size_t(b * count + j)];
    if (op == cu::BlockReduce::Avg)
      for (float &x : want)
        x /= float(blocks);
    std::vector<float> got = dout.read();
    EXPECT_TRUE(sameFloats(got, want));
  }
  // bf16: every partial sum rounded, as the Gloo backend's reduceBf16 does.
  std::vector<uint16_t> in16(in.size());
  k::castToBf16(in, in16);
  DeviceVector<uint16_t> din16(in16);
  DeviceVector<uint16_t> dout16(static_cast<size_t>(count));
  ASSERT_EQ(cu::reduceBlocksInKeyOrder(din16.get(), blocks, count, dout16.get(),
                                       true, cu::BlockReduce::Avg, nullptr),
            cudaSuccess);
  std::vector<uint16_t> want16(in16.begin(), in16.begin() + count);
  for (int64_t b = 1; b < blocks; ++b)
    for (int64_t j = 0; j < count; ++j)
      want16[size_t(j)] =
          k::floatToBf16(k::bf16ToFloat(want16[size_t(j)]) +
                         k::bf16ToFloat(in16[size_t(b * count + j)]));
  for (uint16_t &x : want16)
    x = k::floatToBf16(k::bf16ToFloat(x) / float(blocks));
  EXPECT_EQ(dout16.read(), want16);
}

cu::ElementType elementTypeOf(plan::DType d) {
  switch (d) {
  case plan::DType::BFloat16:
    return cu::ElementType::BFloat16;
  case plan::DType::Float8E4M3:
    return cu::ElementType::Float8E4M3;
  case plan::DType::Float8E5M2:
    return cu::ElementType::Float8E5M2;
  default:
    return cu::ElementType::Float32;
  }
}

TEST_F(CudaKernels, BoxCopyPacksAndUnpacksLikeTheCpu) {
  using plan::DType;
  std::vector<DType> types = {DType::Float32, DType::BFloat16,
                              DType::Float8E4M3, DType::Float8E5M2};
  // (src origin, src shape, dst origin, dst shape, region offset, size)
  struct Case {
    std::vector<int64_t> so, ss, dO, ds, off, size;
  };
  std::vector<Case> cases = {
      {{0, 0}, {96, 130}, {0, 0}, {96, 130}, {0, 0}, {96, 130}},
      {{0, 0}, {96, 130}, {32, 0}, {40, 130}, {32, 0}, {40, 130}},
      {{0, 65}, {96, 65}, {0, 0}, {96, 130}, {0, 65}, {96, 65}},
      {{3, 0, 5}, {4, 9, 20}, {0, 0, 0}, {10, 9, 30}, {4, 2, 7}, {2, 7, 11}},
      {{}, {}, {}, {}, {}, {}},
      {{0}, {10}, {0}, {10}, {4}, {0}}};
  float scale = 3.0f;
  DeviceVector<float> dscale(std::vector<float>{scale});
  for (const Case &c : cases)
    for (DType from : types)
      for (DType to : types) {
        if (!canConvert(from, to))
          continue;
        int64_t srcN = 1, dstN = 1;
        for (int64_t d : c.ss)
          srcN *= d;
        for (int64_t d : c.ds)
          dstN *= d;
        size_t srcBytes = size_t(srcN * plan::dtypeBytes(from));
        size_t dstBytes = size_t(dstN * plan::dtypeBytes(to));
        std::vector<std::byte> src(srcBytes), dst(dstBytes, std::byte{0x5A});
        std::vector<float> values = normalFloats(size_t(srcN), 13, 50.0f);
        convertElements(reinterpret_cast<const std::byte *>(values.data()),
                        DType::Float32, src.data(), from, srcN, 1.0f);
        DeviceVector<std::byte> dsrc(src), ddst(dst);
        cu::DeviceBox s{dsrc.get(), elementTypeOf(from), c.ss, c.so};
        cu::DeviceBox t{ddst.get(), elementTypeOf(to), c.ds, c.dO};
        ASSERT_EQ(cu::copyBox(s, t, c.off, c.size, dscale.get(), nullptr),
                  cudaSuccess);
        BoxRef hs{src.data(), from, &c.ss, &c.so};
        BoxRef ht{dst.data(), to, &c.ds, &c.dO};
        copyBox(hs, ht, c.off, c.size, scale);
        ASSERT_EQ(ddst.read(), dst)
            << plan::dtypeName(from) << " -> " << plan::dtypeName(to);
      }
}

TEST_F(CudaKernels, AdamWFp32MatchesCpu) {
  size_t n = (1 << 18) + 5;
  std::vector<float> p0 = normalFloats(n, 21, 0.1f),
                     g = normalFloats(n, 22, 1e-2f),
                     m0 = normalFloats(n, 23, 1e-3f),
                     v0 = normalFloats(n, 24, 1e-4f);
  for (float &x : v0)
    x = std::abs(x);
  g[0] = 0.0f;
  g[1] = std::numeric_limits<float>::infinity();
  g[2] = std::numeric_limits<float>::quiet_NaN();
  g[3] = 1e-40f; // subnormal
  for (k::AdamWParams params :
       {k::AdamWParams{}, k::AdamWParams{3e-4, 0.9, 0.95, 1e-8, 0.1},
        k::AdamWParams{1e-2, 0.2, 0.5, 1e-6, 0.0}}) // lerp's large weight
    for (int64_t step : {int64_t(1), int64_t(2), int64_t(1000)}) {
      std::vector<float> p = p0, m = m0, v = v0;
      DeviceVector<float> dp(p), dg(g), dm(m), dv(v);
      ASSERT_EQ(cu::adamwFp32(dp.get(), dg.get(), dm.get(), dv.get(),
                              int64_t(n), params, step, nullptr),
                cudaSuccess);
      k::adamwFp32(p, g, m, v, params, step);
      std::vector<float> gp = dp.read(), gm = dm.read(), gv = dv.read();
      EXPECT_TRUE(sameFloats(gp, p)) << "step " << step;
      EXPECT_TRUE(sameFloats(gm, m)) << "step " << step;
      EXPECT_TRUE(sameFloats(gv, v)) << "step " << step;
    }
}

TEST_F(CudaKernels, AdamWBf16StochasticRoundingMatchesCpuOnShards) {
  k::AdamWParams params{1e-3, 0.9, 0.999, 1e-8, 0.01};
  for (const Box &box : shardBoxes()) {
    auto runs = k::boxIndexRuns(box.global, box.offset, box.local);
    auto index = cu::shardIndexOf(box.global, box.offset, box.local);
    ASSERT_TRUE(runs && index);
    int64_t n = 1;
    for (int64_t d : box.local)
      n *= d;
    std::vector<float> pf = normalFloats(size_t(n), 31, 0.05f);
    std::vector<uint16_t> p0(pf.size());
    k::castToBf16(pf, p0);
    std::vector<float> g = normalFloats(size_t(n), 32, 1e-3f),
                       m0(size_t(n), 0.0f), v0(size_t(n), 0.0f);
    for (int64_t step : {int64_t(1), int64_t(17)}) {
      std::vector<uint16_t> p = p0;
      std::vector<float> m = m0, v = v0;
      DeviceVector<uint16_t> dp(p);
      DeviceVector<float> dg(g), dm(m), dv(v);
      ASSERT_EQ(cu::adamwBf16StochasticRounding(dp.get(), dg.get(), dm.get(),
                                                dv.get(), n, params, step, 1234,
                                                57, *index, nullptr),
                cudaSuccess);
      k::adamwBf16StochasticRounding(p, g, m, v, params, step, 1234, 57, *runs);
      EXPECT_EQ(dp.read(), p) << "step " << step;
      std::vector<float> gm = dm.read(), gv = dv.read();
      EXPECT_TRUE(sameFloats(gm, m));
      EXPECT_TRUE(sameFloats(gv, v));
    }
  }
}

} // namespace

int main(int argc, char **argv) {
  return meshplan::test::cudaTestMain(argc, argv, "runtime.cuda.kernels");
}

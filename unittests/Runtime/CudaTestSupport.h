//===- CudaTestSupport.h - Running GPU tests, or skipping them clearly ----===//
//
// GPU suites run on machines with a CUDA device and skip everywhere else: a
// fixture's SetUp calls MESHPLAN_REQUIRE_CUDA_DEVICE(), which GTEST_SKIPs
// each test with the reason, and the suite's main (cudaTestMain) prints one
// line saying why and exits with kSkipExitCode, which ctest reports as
// "Skipped" (SKIP_RETURN_CODE, unittests/CMakeLists.txt), never "Passed".
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_UNITTESTS_RUNTIME_CUDATESTSUPPORT_H
#define MESHPLAN_UNITTESTS_RUNTIME_CUDATESTSUPPORT_H

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <optional>
#include <string>

namespace meshplan::test {

constexpr int kSkipExitCode = 77;

/// Why no CUDA device can be used here, or nullopt when one can.
inline std::optional<std::string> cudaDeviceUnavailable() {
  static const std::optional<std::string> reason =
      []() -> std::optional<std::string> {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess)
      return std::string("cudaGetDeviceCount: ") + cudaGetErrorName(e) + " (" +
             cudaGetErrorString(e) + ")";
    if (count == 0)
      return std::string("cudaGetDeviceCount: 0 devices");
    return std::nullopt;
  }();
  return reason;
}

#define MESHPLAN_REQUIRE_CUDA_DEVICE()                                         \
  do {                                                                         \
    if (auto why = ::meshplan::test::cudaDeviceUnavailable())                  \
      GTEST_SKIP() << "no usable CUDA device: " << *why;                       \
  } while (0)

/// main() of a GPU suite: runs the tests (each skips without a device), then
/// reports a skip to ctest when there was no device.
inline int cudaTestMain(int argc, char **argv, const char *suite) {
  ::testing::InitGoogleTest(&argc, argv);
  int result = RUN_ALL_TESTS();
  if (auto why = cudaDeviceUnavailable()) {
    std::printf("%s: SKIPPED: no usable CUDA device on this machine (%s); "
                "these tests have not run\n",
                suite, why->c_str());
    return result == 0 ? kSkipExitCode : result;
  }
  return result;
}

} // namespace meshplan::test

#endif // MESHPLAN_UNITTESTS_RUNTIME_CUDATESTSUPPORT_H

// What every GPU test needs first: whether an sm_90 device is here, and a skip when it is not,
// so that on machines without one the tests report skipped, never passed.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "gpu/backend.hpp"

namespace coda::test {

inline bool have_sm90() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError(); // clear the sticky "no device" error
    return false;
  }
  return gpu::device_supported();
}

} // namespace coda::test

#define CODA_REQUIRE_SM90()                                                                        \
  do {                                                                                             \
    if (!::coda::test::have_sm90()) GTEST_SKIP() << "no sm_90 GPU";                                \
  } while (0)

// What every GPU test needs first: whether an sm_90 device is here, and a skip when it is not,
// so that on machines without one the tests report skipped, never passed.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "gpu/backend.hpp"
#include "gpu/fused/kernels.hpp"

namespace coda::test {

inline bool have_sm90() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError(); // clear the sticky "no device" error
    return false;
  }
  return gpu::device_supported();
}

// Sets the fused kernels' schedule for the scope of one GPU run, then back to automatic.
struct ScheduleScope {
  explicit ScheduleScope(gpu::FusedSchedule s) { gpu::set_fused_schedule(s); }
  ~ScheduleScope() { gpu::set_fused_schedule(gpu::FusedSchedule::automatic); }
  ScheduleScope(const ScheduleScope&) = delete;
  ScheduleScope& operator=(const ScheduleScope&) = delete;
};

// The FP8 mainloop's tiles, each forced: cooperative 128 x 128 and staged 128 x 128 (the default
// of the fused kernels that have it: K1, K2, K2g, K4 at head_dim 64, K7; docs/fp8.md).
inline constexpr gpu::FusedSchedule kFp8Schedules[] = {gpu::FusedSchedule::cooperative,
                                                       gpu::FusedSchedule::staged};
inline const char* fp8_schedule_name(gpu::FusedSchedule s) {
  return s == gpu::FusedSchedule::staged ? "FP8 staged 128x128" : "FP8 cooperative 128x128";
}

} // namespace coda::test

#define CODA_REQUIRE_SM90()                                                                        \
  do {                                                                                             \
    if (!::coda::test::have_sm90()) GTEST_SKIP() << "no sm_90 GPU";                                \
  } while (0)

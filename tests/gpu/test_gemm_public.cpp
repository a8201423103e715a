// What coda::gemm's GPU path must refuse before any kernel runs.
#include <gtest/gtest.h>

#include <algorithm>

#include <cuda_runtime.h>

#include "coda/coda.hpp"

namespace coda {

namespace {

bool have_gpu() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return false;
  }
  return true;
}

struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(size_t bytes) {
    if (cudaMalloc(&ptr, std::max<size_t>(bytes, 16)) != cudaSuccess) ptr = nullptr;
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

TensorView device_view(void* p, DType t, int64_t rows, int64_t cols) {
  return make_view(p, t, rows, cols, Device::cuda);
}

TEST(GpuGemmPublic, RejectsWhatItCannotRun) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  DeviceBuffer buf(1 << 20);
  ASSERT_NE(buf.ptr, nullptr);
  GemmArgs args;
  args.a = device_view(buf.ptr, DType::bf16, 64, 64);
  args.b = device_view(buf.ptr, DType::bf16, 64, 64);
  args.d = device_view(buf.ptr, DType::bf16, 64, 64);
  args.c = device_view(buf.ptr, DType::f32, 64, 64);
  args.beta = 1.f;
  EXPECT_THROW(coda::gemm(args, nullptr), Error); // C dtype differs from D
  args.c = TensorView{};
  args.beta = 0.f;
  args.a = device_view(static_cast<char*>(buf.ptr) + 2, DType::bf16, 64, 64);
  EXPECT_THROW(coda::gemm(args, nullptr), Error);     // A not 16-byte aligned
  args.a = device_view(buf.ptr, DType::bf16, 64, 60); // K = 60: rows not a multiple of 8
  args.b = device_view(buf.ptr, DType::bf16, 64, 60);
  EXPECT_THROW(coda::gemm(args, nullptr), Error);
}

} // namespace
} // namespace coda

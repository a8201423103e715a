// What the per-kernel GPU tests share: a device copy of a HostTensor fenced by guard bytes, and a
// check that the device finished without error.
#pragma once

#include <cstddef>
#include <vector>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "coda/core/tensor.hpp"
#include "tests/common/kernel_fixtures.hpp"

namespace coda::test {

// A device copy of a host tensor (its NaN poison included) followed by guard bytes, so that a
// kernel writing past its output is caught at copy_back().
class DeviceTensor {
public:
  static constexpr size_t kGuardBytes = 256;
  static constexpr unsigned char kGuardByte = 0x5A;

  explicit DeviceTensor(HostTensor& host) : host_(&host) {
    const TensorView h = host.host_view();
    if (h.data == nullptr) return;
    bytes_ = size_t(host.numel() * dtype_size(host.dtype()));
    EXPECT_EQ(cudaMalloc(&data_, bytes_ + kGuardBytes), cudaSuccess);
    upload();
    EXPECT_EQ(cudaMemset(static_cast<char*>(data_) + bytes_, kGuardByte, kGuardBytes), cudaSuccess);
  }
  ~DeviceTensor() { cudaFree(data_); }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;

  // The host tensor's contents onto the device again (e.g. dx before a second accumulation).
  void upload() {
    if (data_ != nullptr)
      EXPECT_EQ(cudaMemcpy(data_, host_->host_view().data, bytes_, cudaMemcpyHostToDevice),
                cudaSuccess);
  }
  TensorView view() const {
    TensorView v = host_->host_view();
    if (v.data == nullptr) return v;
    v.data = data_;
    v.device = Device::cuda;
    v.device_index = 0;
    return v;
  }
  // The device contents back into `into` (by default the host tensor); false if a guard byte
  // changed.
  bool copy_back(HostTensor* into = nullptr) {
    if (data_ == nullptr) return true;
    HostTensor& dst = into != nullptr ? *into : *host_;
    EXPECT_EQ(cudaMemcpy(dst.host_view().data, data_, bytes_, cudaMemcpyDeviceToHost), cudaSuccess);
    std::vector<unsigned char> guard(kGuardBytes);
    EXPECT_EQ(cudaMemcpy(guard.data(), static_cast<char*>(data_) + bytes_, kGuardBytes,
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    for (unsigned char g : guard)
      if (g != kGuardByte) return false;
    return true;
  }

private:
  HostTensor* host_;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// The device finished every launch so far without error.
inline void synchronize_ok() {
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
}

} // namespace coda::test

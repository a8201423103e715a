// A non-owning view of a strided tensor: what every coda entry point takes.
#pragma once

#include <cstdint>

#include "coda/core/types.hpp"

namespace coda {

enum class Device : int32_t { cpu = 0, cuda = 1 }; // values match coda.h's coda_device

constexpr int kMaxRank = 4;

// Shapes are row-major and strides are in elements (not bytes), as in PyTorch. A view never
// owns or frees its memory.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::bf16;
  int32_t rank = 0;
  int64_t shape[kMaxRank] = {};
  int64_t stride[kMaxRank] = {};
  Device device = Device::cpu;
  int32_t device_index = 0;

  int64_t size(int i) const { return shape[i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= shape[i];
    return n;
  }
  bool is_contiguous() const {
    int64_t expect = 1;
    for (int i = rank - 1; i >= 0; --i) {
      if (shape[i] != 1 && stride[i] != expect) return false;
      expect *= shape[i];
    }
    return true;
  }
  template <class T> T* ptr() const { return static_cast<T*>(data); }
};

// Contiguous row-major views, the common case.
inline TensorView make_view(void* data, DType dtype, int64_t rows, int64_t cols,
                            Device device = Device::cpu) {
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.rank = 2;
  v.shape[0] = rows;
  v.shape[1] = cols;
  v.stride[0] = cols;
  v.stride[1] = 1;
  v.device = device;
  return v;
}
inline TensorView make_view(void* data, DType dtype, int64_t n, Device device = Device::cpu) {
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.rank = 1;
  v.shape[0] = n;
  v.stride[0] = 1;
  v.device = device;
  return v;
}

} // namespace coda

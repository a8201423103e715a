// Fused gate/up weight layout converters.
//
// Fused (interleaved) layout: row 2j = gate row j, row 2j+1 = up row j.
// Stacked (Hugging Face) layout: rows [0, F) = gate, rows [F, 2F) = up.
// Both directions are two strided row copies: the gate rows and the up rows.
#include <cstring>
#include <string>

#include "api/checks.hpp"
#include "coda/coda.hpp"

#if CODA_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace coda {
namespace {

// `rows` rows of `width` bytes from src (rows src_pitch bytes apart) to dst (dst_pitch apart).
struct RowCopy {
  char* dst;
  int64_t dst_pitch;
  const char* src;
  int64_t src_pitch;
  int64_t width;
  int64_t rows;
};

void run_copy(const char* op, const RowCopy& c, Device device, Stream stream) {
  if (device == Device::cpu) {
    for (int64_t r = 0; r < c.rows; ++r)
      std::memcpy(c.dst + r * c.dst_pitch, c.src + r * c.src_pitch, size_t(c.width));
    return;
  }
#if CODA_WITH_CUDA
  const cudaError_t err =
      cudaMemcpy2DAsync(c.dst, size_t(c.dst_pitch), c.src, size_t(c.src_pitch), size_t(c.width),
                        size_t(c.rows), cudaMemcpyDeviceToDevice, stream);
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw Error(Status::cuda_error,
                std::string(op) + ": cudaMemcpy2DAsync failed: " + cudaGetErrorString(err));
  }
#endif
}

// One [2F, K] view as raw rows.
struct RawRows {
  char* data;
  int64_t pitch; // bytes between rows
  int64_t f;     // half the row count
  int64_t width; // bytes per row
};

RawRows raw_rows(const TensorView& t) {
  const int64_t es = dtype_size(t.dtype);
  return {static_cast<char*>(t.data), t.stride[0] * es, t.shape[0] / 2, t.shape[1] * es};
}

} // namespace

void interleave_gate_up(const TensorView& stacked, const TensorView& fused, Stream stream) {
  const char* op = "interleave_gate_up";
  const Device device = api::validate_gate_up(op, "stacked", stacked, "fused", fused);
  const RawRows s = raw_rows(stacked), d = raw_rows(fused);
  run_copy(op, {d.data, 2 * d.pitch, s.data, s.pitch, s.width, s.f}, device, stream);
  run_copy(op, {d.data + d.pitch, 2 * d.pitch, s.data + s.f * s.pitch, s.pitch, s.width, s.f},
           device, stream);
}

void deinterleave_gate_up(const TensorView& fused, const TensorView& stacked, Stream stream) {
  const char* op = "deinterleave_gate_up";
  const Device device = api::validate_gate_up(op, "fused", fused, "stacked", stacked);
  const RawRows s = raw_rows(fused), d = raw_rows(stacked);
  run_copy(op, {d.data, d.pitch, s.data, 2 * s.pitch, s.width, s.f}, device, stream);
  run_copy(op, {d.data + d.f * d.pitch, d.pitch, s.data + s.pitch, 2 * s.pitch, s.width, s.f},
           device, stream);
}

} // namespace coda

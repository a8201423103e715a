// The stream-K scratch the block's coda::gemm calls (weight gradients and dy0) take from the
// block workspace: the largest gemm_workspace_size of those GEMMs on the current device.
#include "block/scratch.hpp"

#include <algorithm>
#include <initializer_list>
#include <vector>

#if CODA_WITH_CUDA
#include <cuda_runtime_api.h>

#include "gpu/backend.hpp"
#include "gpu/gemm_workspace.hpp"
#endif

namespace coda::llama::detail {

#if CODA_WITH_CUDA

namespace {

// D [rows, cols] with reduction depth k, as a GemmArgs holding shapes and dtypes only (the size
// query reads no data).
GemmArgs gemm_shape(GemmLayout layout, int64_t rows, int64_t cols, int64_t k, DType out) {
  GemmArgs g;
  g.layout = layout;
  g.a = layout == GemmLayout::wgrad ? make_view(nullptr, DType::bf16, k, rows, Device::cuda)
                                    : make_view(nullptr, DType::bf16, rows, k, Device::cuda);
  g.d = make_view(nullptr, out, rows, cols, Device::cuda);
  return g;
}

} // namespace

size_t gemm_scratch_bytes(Layer layer, const Config& c, int64_t m) {
  // NOTE: only where the GPU backend can run: host calls on a machine without one need none.
  if (!gpu::device_supported()) return 0;
  const int64_t d = c.hidden, f = c.intermediate;
  struct Shape {
    GemmLayout layout;
    int64_t rows, cols, k;
  };
  std::vector<Shape> gemms;
  if (layer == Layer::first) gemms.push_back({GemmLayout::wgrad, c.qkv_width(), d, m});  // dW_qkv
  if (layer == Layer::middle) gemms.push_back({GemmLayout::wgrad, c.qkv_width(), d, m}); // dW3
  if (layer == Layer::last) gemms.push_back({GemmLayout::wgrad, c.vocab, d, m}); // dW_lm_head
  if (layer != Layer::first) {
    gemms.push_back({GemmLayout::wgrad, d, f, m});                   // dW2
    gemms.push_back({GemmLayout::wgrad, 2 * f, d, m});               // dW1
    gemms.push_back({GemmLayout::dgrad, m, c.attention_width(), d}); // dy0
    gemms.push_back({GemmLayout::wgrad, d, c.attention_width(), m}); // dW0
  }
  size_t most = 0;
  for (const Shape& s : gemms)
    for (DType out : {DType::bf16, DType::f32}) // weight gradients may be either
      most =
          std::max(most, gpu::gemm_workspace_size(gemm_shape(s.layout, s.rows, s.cols, s.k, out)));
  return most;
}

#else

size_t gemm_scratch_bytes(Layer, const Config&, int64_t) { return 0; }

#endif

} // namespace coda::llama::detail

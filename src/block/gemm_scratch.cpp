// The stream-K scratch the block's coda::gemm calls (weight gradients and dy0) take from the
// block workspace: the largest gemm_workspace_size of those GEMMs on the current device, from the
// public query (0 where no sm_90 device is current, so host calls there need none).
#include "block/scratch.hpp"

#include <algorithm>
#include <initializer_list>
#include <vector>

#include "coda/coda.hpp"

namespace coda::llama::detail {

size_t gemm_scratch_bytes(Layer layer, const Config& c, int64_t m) {
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
      most = std::max(most, gemm_workspace_size(s.layout, s.rows, s.cols, s.k, out));
  return most;
}

} // namespace coda::llama::detail

#include "reference/fp8.hpp"

#include <algorithm>
#include <cmath>

#include "coda/core/fp8.hpp"

namespace coda::ref {

Fp8Blocks quantize_fp8_blocks(const std::vector<float>& x, int64_t rows, int64_t cols,
                              int64_t block_rows) {
  const int64_t blocks_r = (rows + block_rows - 1) / block_rows;
  const int64_t blocks_c = num_fp8_scale_blocks(cols);
  Fp8Blocks q{std::vector<uint8_t>(size_t(rows * cols)),
              std::vector<uint8_t>(size_t(blocks_r * blocks_c))};
  for (int64_t br = 0; br < blocks_r; ++br)
    for (int64_t bc = 0; bc < blocks_c; ++bc) {
      const int64_t r0 = br * block_rows, r1 = std::min(rows, r0 + block_rows);
      const int64_t c0 = bc * kFp8ScaleBlock, c1 = std::min(cols, c0 + kFp8ScaleBlock);
      float amax = 0.f;
      bool nan = false;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) {
          const float v = x[size_t(r * cols + c)];
          nan = nan || std::isnan(v);
          amax = std::max(amax, std::fabs(v));
        }
      const int k = nan ? kNoScale : e4m3_scale_exponent(amax); // NaN or inf: no finite scale
      q.scales[size_t(br * blocks_c + bc)] = e8m0_bits_of_exponent(k);
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c)
          q.codes[size_t(r * cols + c)] = quantize_e4m3(x[size_t(r * cols + c)], k).bits;
    }
  return q;
}

std::vector<double> dequantize_fp8_blocks(const Fp8Blocks& q, int64_t rows, int64_t cols,
                                          int64_t block_rows) {
  const int64_t blocks_c = num_fp8_scale_blocks(cols);
  std::vector<double> out(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t scale = q.scales[size_t(r / block_rows * blocks_c + c / kFp8ScaleBlock)];
      out[size_t(r * cols + c)] = double(e4m3_bits_to_float(q.codes[size_t(r * cols + c)])) *
                                  double(e8m0_bits_to_float(scale));
    }
  return out;
}

} // namespace coda::ref

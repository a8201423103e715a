// ScalePerRow: x * s[m], one factor per output row (m). The factor is either given ([M] f32) or
// is the RMSNorm rstd of the row, finished from the row partials of its sum of squares:
//   s[m] = rsqrt(sum_b partials[m, b] / width + eps)
// (the consumer side of ReduceOverN: each tile reads the few partials of its own rows).
#pragma once

#include <vector>

#include "coda/core/types.hpp"
#include "coda/epilogue/host_tensor.hpp"
#include "coda/epilogue/math.hpp"
#include "coda/epilogue/tile.hpp"

namespace coda::epilogue {

template <class T> CODA_HD T scale_per_row(T x, T factor) { return x * factor; }

// RMSNorm's rstd from the full-row sum of squares over `width` elements.
template <class T> CODA_HD T rstd_from_sum_of_squares(T sum_of_squares, T width, T eps) {
  return math::rsqrt(sum_of_squares / width + eps);
}

struct ScalePerRow {
  struct Args {
    TensorView factors;        // [M] f32; when not given, the factor is rstd from:
    TensorView sumsq_partials; // [M, P] f32 row partials of the sum of squares (any P >= 1)
    int64_t width = 0;         // RMSNorm width: the divisor of the mean
    float eps = 0.f;
    TensorView factors_out; // optional [M] f32: receives the factors (rstd for the backward)
  };

  explicit ScalePerRow(const Args& args) : args_(args) {}

  void begin_tile(const TileCoord& tile) {
    factors_.resize(size_t(tile.rows));
    for (int64_t r = 0; r < tile.rows; ++r) {
      factors_[size_t(r)] = row_factor(tile.m0 + r);
      if (tile.n_block == 0 && is_given(args_.factors_out))
        store_float(args_.factors_out, tile.m0 + r, factors_[size_t(r)]);
    }
  }

  void visit(const HostFragment& frag) const {
    for (int64_t r = 0; r < frag.tile.rows; ++r)
      for (int64_t c = 0; c < frag.tile.cols; ++c)
        frag.value(r, c) = scale_per_row(frag.value(r, c), factors_[size_t(r)]);
  }

  void end_tile(const TileCoord&) {}

  // Device: each thread holds the factors of its two rows in registers.
  static constexpr int64_t shared_bytes(int64_t, int64_t) { return 0; }

private:
  float row_factor(int64_t m) const {
    if (is_given(args_.factors)) return load_float(args_.factors, m);
    return rstd_from_sum_of_squares(sum_partials(args_.sumsq_partials, m), float(args_.width),
                                    args_.eps);
  }

  Args args_;
  std::vector<float> factors_; // [tile rows]
};

} // namespace coda::epilogue

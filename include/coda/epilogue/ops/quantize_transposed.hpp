// QuantizeTransposed: the value's transpose as E4M3 codes with one power-of-two scale per column
// and block of kFp8ScaleBlock (128) rows (docs/fp8.md, "Transposed copies"): codes_t [N, M],
// scales_t [N, ceil(M/128)], gemm_fp8's A layout for the weight gradient, which reduces over M
// (dW = dYᵀ X takes dYᵀ so). Per column n and block of rows:
//   amax = max |value|,  k = e4m3_scale_exponent(amax),
//   codes_t[n, m] = quantize_e4m3(value[m, n], k),  scales_t[n, m / 128] = 2^k as an E8M0 byte,
// the column-block twin of QuantizeRowBlocks (same scale rule, NaN and infinity poison their
// block only). A tile of 128 rows holds whole blocks, so an epilogue computes the column's amax
// on chip (the reduction ReduceOverM does for K6's dgamma partials).
//
// The host op sees a block in one tile: tiles start at a 128-row boundary and hold whole blocks
// (a short one only at the last rows); a tile that would cut a block is refused.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "coda/core/error.hpp"
#include "coda/core/fp8.hpp"
#include "coda/epilogue/host_tensor.hpp"
#include "coda/epilogue/tile.hpp"

namespace coda::epilogue {

struct QuantizeTransposed : NoTileState {
  struct Args {
    TensorView codes_t;  // [N, M] e4m3
    TensorView scales_t; // [N, ceil(M / kFp8ScaleBlock)] e8m0
  };

  explicit QuantizeTransposed(const Args& args) : args_(args) {}

  void visit(const HostFragment& frag) const {
    const TileCoord& tile = frag.tile;
    if (tile.m0 % kFp8ScaleBlock != 0 ||
        (tile.rows % kFp8ScaleBlock != 0 && tile.m0 + tile.rows != args_.codes_t.shape[1]))
      throw Error(Status::invalid_argument,
                  "QuantizeTransposed: a tile must hold whole 128-row blocks (a short one only "
                  "at the last rows)");
    for (int64_t c = 0; c < tile.cols; ++c) {
      const int64_t n = tile.n0 + c;
      for (int64_t r0 = 0; r0 < tile.rows; r0 += kFp8ScaleBlock) {
        const int64_t r1 = std::min<int64_t>(r0 + kFp8ScaleBlock, tile.rows);
        float amax = 0.f; // a NaN compares false: a non-finite magnitude is kept apart
        bool finite = true;
        for (int64_t r = r0; r < r1; ++r) {
          const float a = std::fabs(frag.value(r, c));
          finite = finite && std::isfinite(a);
          amax = std::max(amax, a);
        }
        const int k = finite ? e4m3_scale_exponent(amax) : kNoScale;
        args_.scales_t
            .ptr<e8m0>()[element_offset(args_.scales_t, n, (tile.m0 + r0) / kFp8ScaleBlock)] =
            e8m0::of_exponent(k);
        for (int64_t r = r0; r < r1; ++r)
          args_.codes_t.ptr<e4m3>()[element_offset(args_.codes_t, n, tile.m0 + r)] =
              quantize_e4m3(frag.value(r, c), k);
      }
    }
  }

  static constexpr int64_t shared_bytes(int64_t, int64_t) { return 0; }

private:
  Args args_;
};

} // namespace coda::epilogue

// QuantizeRowBlocks: the value as E4M3 codes with one power-of-two scale per row and block of
// kFp8ScaleBlock (128) columns (docs/fp8.md, "Scales"): the layout gemm_fp8 reads its A operand
// in, so an epilogue can hand the next GEMM (one that reduces over this output's columns) its
// FP8 operand without a pass over memory. Per row of a block:
//   amax = max |value|,  k = e4m3_scale_exponent(amax),
//   codes[m, n] = quantize_e4m3(value, k),  scales[m, n / 128] = 2^k as an E8M0 byte.
// The block's largest magnitude lands in (224, 448]: nothing saturates, and dequantizing
// (code * 2^k) is exact, so the cast is the only rounding. A block holding a NaN or an infinity
// gets the NaN scale and NaN codes (kNoScale): a non-finite value poisons its block, no other.
// The value quantized is the fragment's at this point of the list: after a RoundTo it is the
// 16-bit value as stored, before one the fp32 value (one rounding instead of two).
//
// A block is a row's kFp8ScaleBlock columns starting at a multiple of kFp8ScaleBlock, the last
// one short where N is not a multiple. The host op sees a block in one tile: the backend runs
// it on tiles whose columns start at a block boundary and hold whole blocks (the executor's
// tiles of kReduceBlock = 128 columns); a tile that does not is refused, not quantized by a
// partial amax.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "coda/core/error.hpp"
#include "coda/core/fp8.hpp"
#include "coda/epilogue/host_tensor.hpp"
#include "coda/epilogue/tile.hpp"

namespace coda::epilogue {

struct QuantizeRowBlocks : NoTileState {
  struct Args {
    TensorView codes;  // [M, N] e4m3
    TensorView scales; // [M, ceil(N / kFp8ScaleBlock)] e8m0
  };

  explicit QuantizeRowBlocks(const Args& args) : args_(args) {}

  void visit(const HostFragment& frag) const {
    const TileCoord& tile = frag.tile;
    if (tile.n0 % kFp8ScaleBlock != 0 ||
        (tile.cols % kFp8ScaleBlock != 0 && tile.n0 + tile.cols != args_.codes.shape[1]))
      throw Error(Status::invalid_argument,
                  "QuantizeRowBlocks: a tile must hold whole 128-column blocks (a short one "
                  "only at the end of a row)");
    for (int64_t r = 0; r < tile.rows; ++r) {
      const int64_t m = tile.m0 + r;
      for (int64_t c0 = 0; c0 < tile.cols; c0 += kFp8ScaleBlock) {
        const int64_t c1 = std::min<int64_t>(c0 + kFp8ScaleBlock, tile.cols);
        // A NaN compares false: fmaxf would drop it, so a non-finite magnitude is kept apart.
        float amax = 0.f;
        bool finite = true;
        for (int64_t c = c0; c < c1; ++c) {
          const float a = std::fabs(frag.value(r, c));
          finite = finite && std::isfinite(a);
          amax = std::max(amax, a);
        }
        const int k = finite ? e4m3_scale_exponent(amax) : kNoScale;
        args_.scales.ptr<e8m0>()[element_offset(args_.scales, m, (tile.n0 + c0) / kFp8ScaleBlock)] =
            e8m0::of_exponent(k);
        for (int64_t c = c0; c < c1; ++c)
          args_.codes.ptr<e4m3>()[element_offset(args_.codes, m, tile.n0 + c)] =
              quantize_e4m3(frag.value(r, c), k);
      }
    }
  }

  // Device: the row's block gathered across the quad's lanes in a prepass (docs/fp8.md).
  static constexpr int64_t shared_bytes(int64_t, int64_t) { return 0; }

private:
  Args args_;
};

} // namespace coda::epilogue

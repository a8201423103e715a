// The output cast to E4M3 with one power-of-two scale per block of kFp8ScaleBlock (128) values
// (docs/fp8.md, "Scales"), so that an epilogue hands the next GEMM its FP8 operand from the tile
// on chip, in gemm_fp8's A layout (codes [lines, length], scales [lines, ceil(length / 128)]):
//   QuantizeRowBlocks   blocks along a row: codes [M, N], scales [M, ceil(N/128)], for a next
//                       GEMM that reduces over this output's columns (K0's h before the gate/up
//                       and QKV GEMMs, K2's act before the down GEMM);
//   QuantizeTransposed  blocks along a column, stored transposed: codes [N, M], scales
//                       [N, ceil(M/128)], for the weight gradient, which reduces over M
//                       (dW = dYᵀ X takes dYᵀ so).
// Per block: amax = max |value|, k = e4m3_scale_exponent(amax), each code quantize_e4m3(value, k),
// the scale 2^k as an E8M0 byte (quantize_block_e4m3). The block's largest magnitude lands in
// (224, 448]: nothing saturates, and dequantizing (code * 2^k) is exact, so the cast is the only
// rounding. A block holding a NaN or an infinity gets the NaN scale and NaN codes: a non-finite
// value poisons its block, no other. The value quantized is the fragment's at this point of the
// list: after a RoundTo the 16-bit value as stored, before one the fp32 value.
//
// The host op sees a block in one tile: tiles start at a block boundary and hold whole blocks (a
// short one only at the end of a line); a tile that does not is refused, never quantized by a
// partial amax. The device twin of the row blocks is device/ops/quantize_row_blocks.cuh; the
// transposed copy has none yet (docs/fp8.md).
#pragma once

#include <algorithm>
#include <cstdint>

#include "coda/core/error.hpp"
#include "coda/core/fp8.hpp"
#include "coda/epilogue/host_tensor.hpp"
#include "coda/epilogue/tile.hpp"

namespace coda::epilogue {

// kAlongRows: blocks run along a row of the output; else along a column, stored transposed.
// Either way a "line" is what one row of codes holds, and a block runs along it.
template <bool kAlongRows> struct QuantizeBlocks : NoTileState {
  struct Args {
    TensorView codes;  // [lines, length] e4m3: [M, N], or [N, M] transposed
    TensorView scales; // [lines, ceil(length / kFp8ScaleBlock)] e8m0
  };

  explicit QuantizeBlocks(const Args& args) : args_(args) {}

  void visit(const HostFragment& frag) const {
    const TileCoord& t = frag.tile;
    const int64_t lines = kAlongRows ? t.rows : t.cols, length = kAlongRows ? t.cols : t.rows;
    const int64_t line0 = kAlongRows ? t.m0 : t.n0, along0 = kAlongRows ? t.n0 : t.m0;
    if (along0 % kFp8ScaleBlock != 0 ||
        (length % kFp8ScaleBlock != 0 && along0 + length != args_.codes.shape[1]))
      throw Error(Status::invalid_argument,
                  "QuantizeBlocks: a tile must hold whole 128-value blocks (a short one only at "
                  "the end of a line)");
    const auto value = [&](int64_t line, int64_t along) {
      return kAlongRows ? frag.value(line, along) : frag.value(along, line);
    };
    e4m3* codes = args_.codes.template ptr<e4m3>();
    for (int64_t line = 0; line < lines; ++line)
      for (int64_t b0 = 0; b0 < length; b0 += kFp8ScaleBlock) {
        const int k = quantize_block_e4m3(
            std::min<int64_t>(kFp8ScaleBlock, length - b0),
            [&](int64_t i) { return value(line, b0 + i); },
            [&](int64_t i, e4m3 q) {
              codes[element_offset(args_.codes, line0 + line, along0 + b0 + i)] = q;
            });
        args_.scales.template ptr<e8m0>()[element_offset(
            args_.scales, line0 + line, (along0 + b0) / kFp8ScaleBlock)] = e8m0::of_exponent(k);
      }
  }

  // Device (row blocks): the row's block gathered across the quad's lanes in a prepass.
  static constexpr int64_t shared_bytes(int64_t, int64_t) { return 0; }

private:
  Args args_;
};

using QuantizeRowBlocks = QuantizeBlocks<true>;
using QuantizeTransposed = QuantizeBlocks<false>;

} // namespace coda::epilogue

// Device side of QuantizeRowBlocks (coda/epilogue/ops/quantize_row_blocks.hpp): the value as
// E4M3 codes with one power-of-two scale per row and 128-column block, gemm_fp8's A layout.
//
// A block's scale needs its largest magnitude before the first value is cast, and a row's 128
// columns lie in four subtiles and the four lanes of a quad (coda/core/fragment.hpp: a thread
// holds columns 8j + 2q + e of rows r and r + 8). So the op runs in the prepass (kGroupCols =
// 128: the whole block on the register schedules, one 128-column group of a staged tile): each
// thread takes the largest magnitude of its 32 values per row and block, the quad's two shuffles
// the row's, and the exponent is kept in registers for the block's subtiles, whose visit scales
// each value, converts pairs with cvt.rn.satfinite.e4m3x2.f32 (the conversion
// float_to_e4m3_bits is the host twin of) and stores them.
//
// The magnitude is taken as the bits of |x| compared as unsigned integers: the order of the
// finite magnitudes, with an infinity and every NaN above all of them, so a block holding a
// non-finite value gets kNoScale (NaN scale, NaN codes) exactly as the host op's test gives;
// fmaxf would drop a NaN. Columns past N take no part.
//
// Stores: each thread writes its column pairs (two bytes per row and 8-column group) and lane 0
// of each quad its rows' scale bytes, straight to global memory. Not yet through shared memory
// and a TMA store: that is a measured decision for later (docs/fp8.md).
// After a rounding Stage on the register schedules, the list takes Stage<T, /*kPrepass=*/true>:
// the amax is taken in the prepass, so the value must be rounded by then (as the host's RoundTo
// has it; on the staged schedules the staged tile is rounded already).
// Shapes: tiles of whole 128-column blocks (cooperative 128 x 256, ping-pong 128 x 128,
// staged_wide); not the staged schedule's 128 x 192 tile, which cuts a block.
#pragma once

#include <cstdint>

#include "coda/core/convert.cuh"
#include "coda/core/fp8.hpp"
#include "coda/core/tensor.hpp"
#include "coda/epilogue/device/driver.cuh"

namespace coda::epilogue::device {

template <class Shape> struct QuantizeRowBlocks : OpBase {
  static constexpr int kBlock = kFp8ScaleBlock;
  static constexpr bool kPrepass = true;
  static constexpr int kGroupCols = kBlock;
  static_assert(Shape::kCols % kBlock == 0,
                "QuantizeRowBlocks needs tiles of whole 128-column blocks (not the staged "
                "schedule's 128 x 192 tile)");
  static constexpr int kTileBlocks = Shape::kCols / kBlock;

  struct Params {
    uint8_t* codes = nullptr;  // [M, N] e4m3
    uint8_t* scales = nullptr; // [M, ceil(N / 128)] e8m0
    int64_t codes_stride = 0, scales_stride = 0;
    int32_t rows = 0, cols = 0; // M, N (a multiple of 8: GEMM N)
  };
  using Ctx = OpContext<Params, SharedStorage>;

  // The scale exponent of the current 64-row block's rows (row slots r and r + 8) per 128-column
  // block of the warpgroup's tile, from the prepass to the block's subtiles.
  int exponent[kTileBlocks][2];

  // `regs`: whole 128-column blocks from column `tile.col0` on (the block on the register
  // schedules, one group of the staged tile on the staged ones).
  template <int kRegs>
  __device__ void visit_block(const Ctx& c, float (&regs)[kRegs], sm90::EpilogueTile tile,
                              int block) {
    constexpr int kRegsPerBlock = kBlock / 2; // 32 values of each of the thread's two rows
    static_assert(kRegs % kRegsPerBlock == 0, "the prepass holds whole 128-column blocks");
    const Params& p = c.params;
    const int thread = c.wg.thread;
#pragma unroll
    for (int g = 0; g < kRegs / kRegsPerBlock; ++g) {
      const int32_t col0 = tile.col0 + g * kBlock;
      const bool ragged = col0 + kBlock > p.cols; // the last block of a row, short or past N
      uint32_t magnitude[2] = {0u, 0u};
#pragma unroll
      for (int i = 0; i < kRegsPerBlock; ++i) {
        const int reg = g * kRegsPerBlock + i;
        const uint32_t bits = float_bits(regs[reg]) & 0x7fffffffu;
        const bool in = !ragged || col0 + Shape::Fragment::col(thread, i) < p.cols;
        const int s = Shape::Fragment::row_slot(i);
        magnitude[s] = in && bits > magnitude[s] ? bits : magnitude[s];
      }
      const int tile_block = (col0 / kBlock) % kTileBlocks;
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        uint32_t m = magnitude[s];
        m = max(m, __shfl_xor_sync(0xffffffffu, m, 1));
        m = max(m, __shfl_xor_sync(0xffffffffu, m, 2));
        const int k = e4m3_scale_exponent(bits_float(m));
        set_exponent(tile_block, s, k);
        const int32_t row = tile.row0 + 64 * block + Shape::Fragment::slot_row(thread, s);
        if (c.wg.quad_lane() == 0 && row < p.rows && col0 < p.cols)
          p.scales[int64_t(row) * p.scales_stride + col0 / kBlock] = e8m0_bits_of_exponent(k);
      }
    }
  }

  __device__ void visit(const Ctx& c, const Subtile& st, float (&v)[16]) {
    const Params& p = c.params;
    const int tile_block = (st.col0 / kBlock) % kTileBlocks;
#pragma unroll
    for (int i = 0; i < 16; i += 2) {
      const int s = SubtileMap::row_slot(i);
      const int32_t row = st.row0 + SubtileMap::row(c.wg.thread, i);
      const int32_t col = st.col0 + SubtileMap::col(c.wg.thread, i); // even; N is a multiple of 8
      if (row >= p.rows || col >= p.cols) continue;
      const int k = exponent_of(tile_block, s);
      uint16_t pair = uint16_t(kE4m3NanBits) << 8 | kE4m3NanBits;
      if (k != kNoScale) {
        const float scale = scale_exp2(-k); // exact: a power of two
        pair = e4m3x2(v[i] * scale, v[i + 1] * scale);
      }
      *reinterpret_cast<uint16_t*>(p.codes + int64_t(row) * p.codes_stride + col) = pair;
    }
  }

private:
  // The block index is known at run time only (rolled subtile loops): selects over the
  // registers, where an indexed array would live in local memory.
  __device__ int exponent_of(int tile_block, int s) const {
    int k = exponent[0][s];
#pragma unroll
    for (int b = 1; b < kTileBlocks; ++b) k = tile_block == b ? exponent[b][s] : k;
    return k;
  }
  __device__ void set_exponent(int tile_block, int s, int k) {
#pragma unroll
    for (int b = 0; b < kTileBlocks; ++b)
      if (tile_block == b) exponent[b][s] = k;
  }

public:
  // codes [M, N] e4m3, scales [M, ceil(N / 128)] e8m0 (row strides in elements).
  static Params params(const TensorView& codes, const TensorView& scales) {
    Params p;
    p.codes = codes.ptr<uint8_t>();
    p.scales = scales.ptr<uint8_t>();
    p.codes_stride = codes.stride[0];
    p.scales_stride = scales.stride[0];
    p.rows = int32_t(codes.shape[0]);
    p.cols = int32_t(codes.shape[1]);
    return p;
  }
};

} // namespace coda::epilogue::device

// The block-scaled FP8 mainloop (docs/fp8.md): E4M3 A [M, K] and B [N, K], both K-major, with one
// E8M0 scale per row of A and per 128 rows of B for each 128-deep block of K. The producer side
// is the 16-bit mainloop's, unchanged: a K-major tile row of 128 FP8 values is 128 bytes, one
// swizzle span, as 64 16-bit values are, so the TMA boxes, the ring, the descriptors and the
// k-step of 32 bytes are the same.
//
// The consumer differs. The scale changes with every k-block (= every scale block), so a
// k-block's products cannot simply accumulate on top of the previous ones: each k-block's
// wgmmas start a fresh fp32 partial sum (the tensor cores' accumulators), and once they retire
// the partial is promoted into the tile's fp32 accumulator, times scale_a(row) * scale_b(block)
// (fp8_block_scale, fp8_promote of coda/core/fp8.hpp; the CPU backend calls the same two).
// B's scales are per 128 x 128 block (a weight: one per tile and k-block) or per row of B (the
// weight gradient's b, an activation: one per tile column and k-block; Fp8BScaling).
// This also bounds the error of Hopper's FP8 accumulation, which keeps fewer bits than fp32, to
// one 128-deep block (the reason DeepSeek-V3 promotes every 128 values of K even without
// per-block scales).
//
// Registers: a warpgroup holds the partial and the promoted accumulator, 2 x kTileN / 2 floats
// per thread for its 64 rows. At kTileN = 128 that is 128, what the 16-bit cooperative 128 x 256
// kernel holds, beside the epilogue in the 232-register consumers; a 256-wide tile would need 256.
#pragma once

#include <cstdint>

#include "coda/arch/warpgroup.cuh"
#include "coda/arch/wgmma.cuh"
#include "coda/core/fp8.hpp"
#include "coda/core/fragment.hpp"
#include "coda/core/tensor.hpp"
#include "coda/gemm/mainloop.cuh"
#include "coda/gemm/problem.hpp"

namespace coda::sm90 {

template <class Config, Fp8BScaling kBScaling>
struct Fp8Mainloop : Mainloop<Config, GemmLayout::fwd, false> {
  using Base = Mainloop<Config, GemmLayout::fwd, false>;
  using typename Base::Accum;
  using typename Base::Pipeline;
  using typename Base::SharedStorage;
  using typename Base::State;

  static_assert(Config::kOperandBytes == 1, "the FP8 mainloop reads 1-byte operands");
  static_assert(Config::kTileK == kFp8ScaleBlock,
                "a k-block is one scale block: one promotion per k-block");
  static_assert(Config::kTileN == kFp8ScaleBlock,
                "one B scale block per tile column range (and the m64n128k32 wgmma)");
  static_assert(Config::kSchedule == Schedule::cooperative,
                "the promotion runs in the consumers: the cooperative schedule");
  static_assert(2 * Config::kAccumulatorsPerThread <= 128,
                "the partial and the promoted accumulator share the consumers' registers");
  static constexpr bool kBRows = kBScaling == Fp8BScaling::rows;

  // Base::Params' tensor maps (A: dims {K, M}, box {128, kTileM}; B: dims {K, N}, box {128,
  // kTileN / kClusterM}) and the scales, as Fp8GemmArgs lays them out.
  struct Params : Base::Params {
    const uint8_t* a_scales;     // [M, ceil(K/128)] E8M0
    const uint8_t* b_scales;     // [ceil(N/128), ceil(K/128)] E8M0; by rows [N, ceil(K/128)]
    int64_t a_scales_row_stride; // elements between rows
    int64_t b_scales_row_stride;
    int32_t m; // rows of A: the scales of rows past it are not read
    int32_t n; // rows of B: by rows, the scales of rows past it are not read
  };

  // Host: the scales' fields of `p` from gemm_fp8's a_scales and b_scales (Fp8GemmArgs' layouts)
  // for an [m, n] output; the operands' tensor maps are Base's.
  static void set_scales(Params& p, const TensorView& a_scales, const TensorView& b_scales,
                         int64_t m, int64_t n) {
    p.a_scales = a_scales.ptr<const uint8_t>();
    p.b_scales = b_scales.ptr<const uint8_t>();
    p.a_scales_row_stride = a_scales.stride[0];
    p.b_scales_row_stride = b_scales.stride[0];
    p.m = int32_t(m);
    p.n = int32_t(n);
  }

  // One consumer warpgroup: D(rows it owns, tile columns) = the promoted sum over k-blocks
  // [k_begin, k_end) (at least one). The contract of Base::mma_tile, except that each stage is
  // released as soon as its wgmmas retire (the promotion needs them retired anyway).
  template <class WhileMma>
  __device__ static void mma_tile(const Params& p, SharedStorage& smem, Pipeline& pipe, State& st,
                                  Accum& acc, TileCoord tile, int first_block, int32_t k_begin,
                                  int32_t k_end, uint32_t lane, WhileMma&& while_mma) {
    constexpr int kBlocks = Accum::kBlocks;
    const int thread = int(threadIdx.x) % arch::kWarpgroupSize;
    // This thread's two rows in each 64-row block (row slots, fragment.hpp) and their scales;
    // rows past M hold zeros (TMA zero-fills A) and read the scale 2^0.
    const uint8_t* a_scale_row[kBlocks][Map::kRowSlots];
#pragma unroll
    for (int mb = 0; mb < kBlocks; ++mb)
#pragma unroll
      for (int slot = 0; slot < Map::kRowSlots; ++slot) {
        const int32_t row =
            tile.m_block * Config::kTileM + (first_block + mb) * 64 + Map::slot_row(thread, slot);
        a_scale_row[mb][slot] =
            row < p.m ? p.a_scales + int64_t(row) * p.a_scales_row_stride : nullptr;
      }
    // Blocks: the tile's one row of B scales. Rows: each lane reads the scales of the tile's
    // columns lane, lane + 32, lane + 64 and lane + 96 (ColumnScales below).
    const uint8_t* b_scale_row =
        p.b_scales +
        int64_t(kBRows ? tile.n_block * Config::kTileN + int32_t(lane) : tile.n_block) *
            p.b_scales_row_stride;
    const int32_t lane_col = tile.n_block * Config::kTileN + int32_t(lane); // rows only

    Accum partial; // the tensor cores' sum over one k-block
#pragma unroll
    for (int mb = 0; mb < kBlocks; ++mb)
#pragma unroll
      for (int i = 0; i < Accum::kRegsPerBlock; ++i) acc.reg[mb][i] = 0.f;
    for (int32_t kb = k_begin; kb < k_end; ++kb) {
      // NOTE: the scale loads come before the wait (asm with memory clobbers keeps them there):
      // their latency hides behind it and the wgmmas; the promotion needs them only after.
      // (Read-only loads: every tile along N reads a row's scales again.)
      uint8_t b_scale[kBRows ? ColumnScales::kPerLane : 1];
      if constexpr (kBRows)
        ColumnScales::load(b_scale, b_scale_row, p.b_scales_row_stride, lane_col, p.n, kb);
      else
        b_scale[0] = __ldg(b_scale_row + kb);
      uint8_t a_scale[kBlocks][Map::kRowSlots];
#pragma unroll
      for (int mb = 0; mb < kBlocks; ++mb)
#pragma unroll
        for (int slot = 0; slot < Map::kRowSlots; ++slot)
          a_scale[mb][slot] = a_scale_row[mb][slot] != nullptr ? __ldg(a_scale_row[mb][slot] + kb)
                                                               : uint8_t(127); // 2^0
      pipe.consumer_wait(st);
      arch::wgmma_fence(); // the promotion read `partial` with ordinary instructions
      mma_stage(smem, st.index, partial, first_block);
      arch::wgmma_commit_group();
      while_mma(kb - k_begin);
      arch::wgmma_wait_group<0>();
      Base::fence_accumulators(partial);
      pipe.consumer_release(st, lane);
      if constexpr (kBRows)
        promote_by_columns(acc, partial, a_scale, b_scale, thread);
      else
        promote(acc, partial, a_scale, b_scale[0]);
      st.advance();
    }
  }

private:
  using Map = typename Accum::Map;
  using AScales = uint8_t[Accum::kBlocks][Map::kRowSlots];

  // Blocks: one B scale for the whole tile, so one scale per row slot.
  __device__ static void promote(Accum& acc, const Accum& partial, const AScales& a_scale,
                                 uint8_t b_scale) {
#pragma unroll
    for (int mb = 0; mb < Accum::kBlocks; ++mb) {
      float scale[Map::kRowSlots];
#pragma unroll
      for (int slot = 0; slot < Map::kRowSlots; ++slot)
        scale[slot] = fp8_block_scale(a_scale[mb][slot], b_scale);
#pragma unroll
      for (int i = 0; i < Accum::kRegsPerBlock; ++i)
        acc.reg[mb][i] = fp8_promote(acc.reg[mb][i], partial.reg[mb][i], scale[Map::row_slot(i)]);
    }
  }

  // Rows: a B scale per tile column. The tile's 128 column scales of a k-block lie in each warp
  // as ColumnScales leaves them, 4 per lane; a thread's 32 columns (fragment.hpp: 8 c + 2 q + e)
  // take theirs by shuffles, as floats: the column's lane and register are known for every
  // accumulator register, and the register index is the same for the whole warp. No shared
  // memory (the 6 stages and the epilogue's buffers fill it) and no barrier.
  // The scale is e8m0(a) * e8m0(b), fp8_block_scale's product, so the promotion is the CPU's.
  struct ColumnScales {
    static constexpr int kPerLane = Config::kTileN / arch::kWarpSize;
    // This lane's column scales of k-block kb; columns at or past n read none and scale by 2^0
    // (B's rows there are zero-filled, and D's columns there are not stored).
    __device__ static void load(uint8_t (&to)[kPerLane], const uint8_t* lane_row, int64_t stride,
                                int32_t lane_col, int32_t n, int32_t kb) {
#pragma unroll
      for (int r = 0; r < kPerLane; ++r)
        to[r] = lane_col + r * arch::kWarpSize < n
                    ? __ldg(lane_row + int64_t(r * arch::kWarpSize) * stride + kb)
                    : uint8_t(127);
    }
  };
  __device__ static void promote_by_columns(Accum& acc, const Accum& partial,
                                            const AScales& a_scale,
                                            const uint8_t (&b_scale)[ColumnScales::kPerLane],
                                            int thread) {
    float lane_scale[ColumnScales::kPerLane];
#pragma unroll
    for (int r = 0; r < ColumnScales::kPerLane; ++r) lane_scale[r] = e8m0_bits_to_float(b_scale[r]);
    float row_scale[Accum::kBlocks][Map::kRowSlots];
#pragma unroll
    for (int mb = 0; mb < Accum::kBlocks; ++mb)
#pragma unroll
      for (int slot = 0; slot < Map::kRowSlots; ++slot)
        row_scale[mb][slot] = e8m0_bits_to_float(a_scale[mb][slot]);
#pragma unroll
    for (int i = 0; i < Accum::kRegsPerBlock; ++i) {
      if (Map::row_slot(i) != 0) continue; // register i + 2 (row slot 1) shares i's column
      // NOTE: col(0, i) / 32 = col(thread, i) / 32 (2 q + e stays inside a group of 8 columns),
      // a constant once unrolled: the array stays in registers.
      const float col_scale = __shfl_sync(0xffffffffu, lane_scale[Map::col(0, i) / arch::kWarpSize],
                                          Map::col(thread, i) % arch::kWarpSize);
#pragma unroll
      for (int mb = 0; mb < Accum::kBlocks; ++mb)
#pragma unroll
        for (int slot = 0; slot < Map::kRowSlots; ++slot) {
          const int reg = i + 2 * slot;
          acc.reg[mb][reg] =
              fp8_promote(acc.reg[mb][reg], partial.reg[mb][reg], row_scale[mb][slot] * col_scale);
        }
    }
  }

  // The 4 k32 steps of one stage into `partial`; the first overwrites it (scale_d = 0).
  __device__ static void mma_stage(SharedStorage& smem, uint32_t stage, Accum& partial,
                                   int first_block) {
#pragma unroll
    for (int kk = 0; kk < Config::kTileK / 32; ++kk) {
      const uint64_t b = Base::desc_b(smem.b[stage], kk, 0);
#pragma unroll
      for (int mb = 0; mb < Accum::kBlocks; ++mb) {
        const uint64_t a = Base::desc_a(smem.a[stage], first_block + mb, kk);
        arch::wgmma_m64n128k32_e4m3(partial.reg[mb], a, b, kk != 0);
      }
    }
  }
};

} // namespace coda::sm90

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
// Registers: a warpgroup holds two partials (one k-block's promotion overlaps the next one's
// wgmmas, mma_tile) and the promoted accumulator, 3 x kTileN / 2 floats per thread for its 64
// rows: 192 at kTileN = 128, beside the epilogue in the 232-register consumers.
#pragma once

#include <cstdint>
#include <type_traits>

#include "coda/arch/warpgroup.cuh"
#include "coda/arch/wgmma.cuh"
#include "coda/core/error.hpp"
#include "coda/core/fp8.hpp"
#include "coda/core/fragment.hpp"
#include "coda/core/tensor.hpp"
#include "coda/gemm/mainloop.cuh"
#include "coda/gemm/problem.hpp"

namespace coda::sm90 {

template <class Config, Fp8BScaling kBScaling, bool kOverlapPromotion>
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
  static_assert((kOverlapPromotion ? 3 : 2) * Config::kAccumulatorsPerThread <=
                    (kOverlapPromotion ? 192 : 128),
                "the partials and the promoted accumulator share the consumers' registers");
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
    // The kernel addresses the scales by 32-bit offsets (Scales).
    for (const TensorView* t : {&a_scales, &b_scales})
      if (t->shape[0] * t->stride[0] > INT32_MAX)
        throw Error(Status::not_supported,
                    "gemm_fp8: a scale tensor spans 2^31 elements or more (rows x row stride "
                    "of a_scales or b_scales); split the GEMM along M or N");
    p.a_scales = a_scales.ptr<const uint8_t>();
    p.b_scales = b_scales.ptr<const uint8_t>();
    p.a_scales_row_stride = a_scales.stride[0];
    p.b_scales_row_stride = b_scales.stride[0];
    p.m = int32_t(m);
    p.n = int32_t(n);
  }

  // One consumer warpgroup: D(rows it owns, tile columns) = the promoted sum over k-blocks
  // [k_begin, k_end) (at least one). The contract of Base::mma_tile.
  // Two partials in turn: k-block i's wgmmas go into one while k-block i - 1's partial, in the
  // other, waits for its batch (wgmma_wait_group<1>: one batch left in flight), is promoted and
  // its stage released, so the tensor cores always hold this warpgroup's next batch during a
  // promotion. (With one partial, each k-block waited for its own batch to drain before the
  // promotion and the next issue: 0.59x cuBLASLt's block-scaled GEMM, H200 2026-12-05.)
  // The loop is unrolled by hand in pairs: registers cannot be indexed by a run-time parity.
  template <class WhileMma>
  __device__ static void mma_tile(const Params& p, SharedStorage& smem, Pipeline& pipe, State& st,
                                  Accum& acc, TileCoord tile, int first_block, int32_t k_begin,
                                  int32_t k_end, uint32_t lane, WhileMma&& while_mma) {
    const int thread = int(threadIdx.x) % arch::kWarpgroupSize;
    const Scales scales(p, tile, first_block, thread, lane);
#pragma unroll
    for (int mb = 0; mb < Accum::kBlocks; ++mb)
#pragma unroll
      for (int i = 0; i < Accum::kRegsPerBlock; ++i) acc.reg[mb][i] = 0.f;

    Accum partial[2];    // the tensor cores' sums over one k-block each, in turn
    State previous = st; // the stage of the k-block in flight
    const auto issue = [&](int32_t kb, Accum& into) {
      pipe.consumer_wait(st);
      arch::wgmma_fence(); // the promotion read `into` two k-blocks ago with ordinary instructions
      mma_stage(smem, st.index, into, first_block);
      arch::wgmma_commit_group();
      while_mma(kb - k_begin);
    };
    // k-block kb, the one before the k-block just issued, retired once at most `kInFlight`
    // batches are in flight. Its scales are loaded first (asm with memory clobbers keeps them
    // before the wait), so that their latency hides behind it: no scales are held across the
    // k-blocks (the registers go to the partials).
    const auto promote = [&](auto in_flight, int32_t kb, Accum& done) {
      BlockScales scale;
      scales.load(scale, kb);
      arch::wgmma_wait_group<decltype(in_flight)::value>();
      Base::fence_accumulators(done);
      pipe.consumer_release(previous, lane);
      scales.promote(acc, done, scale, thread);
    };
    using One = std::integral_constant<int, 1>;
    using None = std::integral_constant<int, 0>;
    if constexpr (kBRows || !kOverlapPromotion) {
      // One partial: each k-block waits for its own batch. The by-columns promotion's shuffles
      // want the registers a second partial would take (ptxas spilled 180 bytes with two), as
      // do the fused kernels' ops (MainloopFor).
      for (int32_t kb = k_begin; kb < k_end; ++kb) {
        issue(kb, partial[0]);
        previous = st;
        promote(None{}, kb, partial[0]);
        st.advance();
      }
      return;
    }
    issue(k_begin, partial[0]);
    previous = st;
    st.advance();
    for (int32_t kb = k_begin + 1;; kb += 2) {
      if (kb == k_end) return promote(None{}, kb - 1, partial[0]);
      issue(kb, partial[1]);
      promote(One{}, kb - 1, partial[0]);
      previous = st;
      st.advance();
      if (kb + 1 == k_end) return promote(None{}, kb, partial[1]);
      issue(kb + 1, partial[0]);
      promote(One{}, kb, partial[1]);
      previous = st;
      st.advance();
    }
  }

private:
  using Map = typename Accum::Map;
  using AScales = uint8_t[Accum::kBlocks][Map::kRowSlots];
  struct ColumnScales;
  // One k-block's scales as this thread needs them: its rows' A scales, and B's one scale
  // (blocks) or this lane's column scales (rows, ColumnScales).
  struct BlockScales {
    AScales a;
    uint8_t b[kBRows ? Config::kTileN / arch::kWarpSize : 1];
  };

  // Where this thread's scales are, for every k-block of one tile: 32-bit element offsets from
  // the launch's scale pointers (set_scales checks that they fit), the rest read from the
  // kernel's parameters, so the partials keep the registers.
  class Scales {
  public:
    __device__ Scales(const Params& p, TileCoord tile, int first_block, int thread, uint32_t lane)
        : p_(p), lane_col_(tile.n_block * Config::kTileN + int32_t(lane)) {
      // This thread's two rows in each 64-row block (row slots, fragment.hpp); rows past M hold
      // zeros (TMA zero-fills A) and read the scale 2^0 (offset -1).
#pragma unroll
      for (int mb = 0; mb < Accum::kBlocks; ++mb)
#pragma unroll
        for (int slot = 0; slot < Map::kRowSlots; ++slot) {
          const int32_t row =
              tile.m_block * Config::kTileM + (first_block + mb) * 64 + Map::slot_row(thread, slot);
          a_[mb][slot] = row < p.m ? row * int32_t(p.a_scales_row_stride) : -1;
        }
      b_ = (kBRows ? lane_col_ : tile.n_block) * int32_t(p.b_scales_row_stride);
    }
    // (Read-only loads: every tile along N reads a row's scales again.)
    __device__ void load(BlockScales& to, int32_t kb) const {
      if constexpr (kBRows) {
        // This lane's columns lane_col_ + 32 r (ColumnScales); columns at or past n read none
        // and scale by 2^0 (B's rows there are zero-filled, D's columns there not stored).
#pragma unroll
        for (int r = 0; r < ColumnScales::kPerLane; ++r)
          to.b[r] =
              lane_col_ + r * arch::kWarpSize < p_.n
                  ? __ldg(p_.b_scales + b_ + r * arch::kWarpSize * p_.b_scales_row_stride + kb)
                  : uint8_t(127);
      } else {
        to.b[0] = __ldg(p_.b_scales + b_ + kb);
      }
#pragma unroll
      for (int mb = 0; mb < Accum::kBlocks; ++mb)
#pragma unroll
        for (int slot = 0; slot < Map::kRowSlots; ++slot)
          to.a[mb][slot] =
              a_[mb][slot] >= 0 ? __ldg(p_.a_scales + a_[mb][slot] + kb) : uint8_t(127); // 2^0
    }
    __device__ void promote(Accum& acc, const Accum& partial, const BlockScales& s,
                            int thread) const {
      if constexpr (kBRows)
        Fp8Mainloop::promote_by_columns(acc, partial, s.a, s.b, thread);
      else
        Fp8Mainloop::promote(acc, partial, s.a, s.b[0]);
    }

  private:
    const Params& p_;
    int32_t a_[Accum::kBlocks][Map::kRowSlots]; // this thread's rows' first scales, or -1
    int32_t b_;        // blocks: the tile's row of B scales; rows: this lane's first column's
    int32_t lane_col_; // rows: this lane's first column
  };

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
  // as Scales::load leaves them, 4 per lane (columns lane + 32 r); a thread's 32 columns
  // (fragment.hpp: 8 c + 2 q + e) take theirs by shuffles, as floats: the column's lane and
  // register are known for every accumulator register, and the register index is the same for the
  // whole warp. No shared memory (the 6 stages and the epilogue's buffers fill it) and no barrier.
  // The scale is e8m0(a) * e8m0(b), fp8_block_scale's product, so the promotion is the CPU's.
  struct ColumnScales {
    static constexpr int kPerLane = Config::kTileN / arch::kWarpSize;
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

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
// B's scales are per 128 x 128 block (a weight: one per k-block for a 128-column tile, two for a
// 192-column one) or per row of B (the weight gradient's b, an activation: one per tile column
// and k-block; Fp8BScaling).
// This also bounds the error of Hopper's FP8 accumulation, which keeps fewer bits than fp32, to
// one 128-deep block (the reason DeepSeek-V3 promotes every 128 values of K even without
// per-block scales).
//
// Tiles: 128 x 128 or 128 x 192 (two consumer warpgroups of 64 rows, cooperative). Registers
// per thread for its 64 rows: the promoted accumulator (kTileN / 2) and the partials, 192 in all
// either way, beside the epilogue in the 232-register consumers (ptxas: no spills):
//  - 128 columns: two full-width partials in turn, so one k-block's promotion overlaps the next
//    one's wgmmas (64 + 2 x 64);
//  - 192 columns: three of 96 (288) would not fit, so either one partial (96 + 96: each k-block
//    waits for its own batch) or, with the overlap, a partial for each 96-column half of the
//    tile in turn (96 + 2 x 48): one half's promotion runs while the other half's batch is on
//    the tensor cores.
// (128 x 256 would hold 128 + 128 with one partial: more than a thread has.)
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
  static_assert(Config::kTileN == 128 || Config::kTileN == 192,
                "128 or 192 columns: the promoted sum and its partials fit the consumers");
  static_assert(Config::kSchedule == Schedule::cooperative || Config::kSchedule == Schedule::staged,
                "the promotion runs in the two consumer warpgroups of one tile: the cooperative "
                "schedule, or the staged one, whose consumers then hand the tile over");
  static constexpr bool kBRows = kBScaling == Fp8BScaling::rows;
  static constexpr int kTileN = Config::kTileN;
  // The partials (mma_tile): two in turn with the overlapped promotion (not by rows: its
  // by-columns promotion wants the registers), one otherwise; at 192 columns the two are the
  // tile's 96-column halves'.
  static constexpr int kPartials = kOverlapPromotion && !kBRows ? 2 : 1;
  static constexpr bool kHalves = kPartials == 2 && kTileN == 192;
  using Partial = Accumulator<Config::kMmaBlocksM, kHalves ? kTileN / 2 : kTileN>;
  static_assert(Config::kAccumulatorsPerThread +
                        kPartials * Partial::kBlocks * Partial::kRegsPerBlock <=
                    192,
                "the partials and the promoted accumulator share the consumers' 232 registers "
                "with the epilogue (192 compile without spills, ptxas sm_90a)");

  // Base::Params' tensor maps (A: dims {K, M}, box {128, kTileM}; B: dims {K, N}, box {128,
  // kTileN / kClusterM}) and the scales, as Fp8GemmArgs lays them out.
  struct Params : Base::Params {
    const uint8_t* a_scales;     // [M, ceil(K/128)] E8M0
    const uint8_t* b_scales;     // [ceil(N/128), ceil(K/128)] E8M0; by rows [N, ceil(K/128)]
    int64_t a_scales_row_stride; // elements between rows
    int64_t b_scales_row_stride;
    int32_t m; // rows of A: the scales of rows past it are not read
    int32_t n; // rows of B: scales past it are not read (a row's; a 192-column tile's block)
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

  static_assert(Config::kConsumerWarpgroups == 2,
                "mma_tile: a consumer's first 64-row block is 0 or kMmaBlocksM");

  // One consumer warpgroup: D(rows it owns, tile columns) = the promoted sum over k-blocks
  // [k_begin, k_end) (at least one). The contract of Base::mma_tile.
  // Two partials in turn: k-block i's wgmmas go into one while k-block i - 1's partial, in the
  // other, waits for its batch (wgmma_wait_group<1>: one batch left in flight), is promoted and
  // its stage released, so the tensor cores always hold this warpgroup's next batch during a
  // promotion. (With one partial, each k-block waited for its own batch to drain before the
  // promotion and the next issue: 0.59x cuBLASLt's block-scaled GEMM, H200 2026-12-05.)
  // The loop is unrolled by hand in pairs: registers cannot be indexed by a run-time parity.
  // At 192 columns the two partials are the halves' (mma_halves).
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
    // The warpgroup's first 64-row block as a constant (FirstBlock, the kernel's 0 or
    // kMmaBlocksM): mma_stage's descriptors then derive from the stage index and constants alone.
    const auto run = [&](auto first) {
      if constexpr (kHalves)
        mma_halves(smem, pipe, st, acc, scales, first, k_begin, k_end, lane, thread, while_mma);
      else
        mma_full(smem, pipe, st, acc, scales, first, k_begin, k_end, lane, thread, while_mma);
    };
    if (first_block == 0)
      run(std::integral_constant<int, 0>{});
    else
      run(std::integral_constant<int, Config::kMmaBlocksM>{});
  }

private:
  using Map = typename Accum::Map;
  using AScales = uint8_t[Accum::kBlocks][Map::kRowSlots];
  struct ColumnScales;
  // Blocks: the tile's columns in groups of kBGroupCols, each inside one B scale block: one B
  // scale per group and k-block. A 128-column tile is one block. A 192-column tile, from
  // n0 = 192 t, spans two: columns [0, 128) and [128, 192) when t is even (n0 = 384 (t / 2), a
  // block boundary), [0, 64) and [64, 192) when t is odd (n0 = 128 j + 64). In 64-column groups
  // group 0 is the first block's, group 2 the second's, and group 1 the first's (t even) or the
  // second's (t odd): the parity is the one run-time choice, made once per k-block (Scales).
  static constexpr int kBGroupCols = kTileN == 128 ? 128 : 64;
  static constexpr int kBGroups = kTileN / kBGroupCols;
  // One k-block's scales as this thread needs them: its rows' A scales, and B's scale per column
  // group (blocks) or this lane's column scales (rows, ColumnScales).
  struct BlockScales {
    AScales a;
    uint8_t b[kBRows ? kTileN / arch::kWarpSize : kBGroups];
  };

  // Where this thread's scales are, for every k-block of one tile: 32-bit element offsets from
  // the launch's scale pointers (set_scales checks that they fit), the rest read from the
  // kernel's parameters, so the partials keep the registers.
  class Scales {
  public:
    __device__ Scales(const Params& p, TileCoord tile, int first_block, int thread, uint32_t lane)
        : p_(p), lane_col_(tile.n_block * kTileN + int32_t(lane)) {
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
      if constexpr (kBRows) {
        b_ = lane_col_ * int32_t(p.b_scales_row_stride);
      } else if constexpr (kBGroups == 1) {
        b_ = tile.n_block * int32_t(p.b_scales_row_stride); // 128 columns: block n_block
      } else {
        const int32_t n0 = tile.n_block * kTileN, block = n0 / kFp8ScaleBlock;
        b_ = block * int32_t(p.b_scales_row_stride);
        // 192 columns: the second block, unless the tile's columns end before it (N's last block
        // is the first: the second's columns are past N, B's rows there zero-filled and D's
        // columns not stored; they scale by 2^0), and where it starts (odd_: at column 64).
        second_ = (block + 1) * kFp8ScaleBlock < p.n;
        odd_ = n0 % kFp8ScaleBlock != 0;
      }
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
      } else if constexpr (kBGroups == 1) {
        to.b[0] = __ldg(p_.b_scales + b_ + kb);
      } else {
        const uint8_t first = __ldg(p_.b_scales + b_ + kb);
        const uint8_t second = second_
                                   ? __ldg(p_.b_scales + b_ + int32_t(p_.b_scales_row_stride) + kb)
                                   : uint8_t(127); // 2^0
        to.b[0] = first;
        to.b[1] = odd_ ? second : first;
        to.b[2] = second;
      }
#pragma unroll
      for (int mb = 0; mb < Accum::kBlocks; ++mb)
#pragma unroll
        for (int slot = 0; slot < Map::kRowSlots; ++slot)
          to.a[mb][slot] =
              a_[mb][slot] >= 0 ? __ldg(p_.a_scales + a_[mb][slot] + kb) : uint8_t(127); // 2^0
    }
    // Promotes `partial`, the sums of the tile's columns from kCol0 on.
    template <int kCol0>
    __device__ void promote(Accum& acc, const Partial& partial, const BlockScales& s,
                            int thread) const {
      if constexpr (kBRows) {
        static_assert(kCol0 == 0, "by rows, the partial spans the tile");
        Fp8Mainloop::promote_by_columns(acc, partial, s.a, s.b, thread);
      } else {
        Fp8Mainloop::promote<kCol0>(acc, partial, s.a, s.b);
      }
    }

  private:
    const Params& p_;
    int32_t a_[Accum::kBlocks][Map::kRowSlots]; // this thread's rows' first scales, or -1
    int32_t b_;           // blocks: the tile's first row of B scales; rows: this lane's column's
    int32_t lane_col_;    // rows: this lane's first column
    bool second_ = false; // blocks, 192 columns: the tile has columns in a second block
    bool odd_ = false;    // blocks, 192 columns: the second block starts at column 64, not 128
  };

  // Blocks: `partial` holds the tile's columns [kCol0, kCol0 + its width), its register i the
  // accumulator's register kCol0 / 2 + i (fragment.hpp: 8 columns are 4 registers of a thread);
  // each register's scale is its row slot's and its column group's, a constant choice once
  // unrolled (a thread's columns 8 c + 2 q + e stay in the group of column 8 c).
  template <int kCol0>
  __device__ static void promote(Accum& acc, const Partial& partial, const AScales& a_scale,
                                 const uint8_t (&b_scale)[kBGroups]) {
    static_assert(kCol0 % 8 == 0, "a partial starts at a group of 8 columns");
#pragma unroll
    for (int mb = 0; mb < Accum::kBlocks; ++mb) {
      float scale[kBGroups][Map::kRowSlots]; // (the groups a partial lacks are never computed)
#pragma unroll
      for (int g = 0; g < kBGroups; ++g)
#pragma unroll
        for (int slot = 0; slot < Map::kRowSlots; ++slot)
          scale[g][slot] = fp8_block_scale(a_scale[mb][slot], b_scale[g]);
#pragma unroll
      for (int i = 0; i < Partial::kRegsPerBlock; ++i) {
        const int reg = kCol0 / 2 + i;
        acc.reg[mb][reg] = fp8_promote(acc.reg[mb][reg], partial.reg[mb][i],
                                       scale[Map::col(0, reg) / kBGroupCols][Map::row_slot(reg)]);
      }
    }
  }

  // Rows: a B scale per tile column. The tile's column scales of a k-block lie in each warp as
  // Scales::load leaves them, kTileN / 32 per lane (columns lane + 32 r); a thread's columns
  // (fragment.hpp: 8 c + 2 q + e) take theirs by shuffles, as floats: the column's lane and
  // register are known for every accumulator register, and the register index is the same for the
  // whole warp. No shared memory (the 6 stages and the epilogue's buffers fill it) and no barrier.
  // The scale is e8m0(a) * e8m0(b), fp8_block_scale's product, so the promotion is the CPU's.
  struct ColumnScales {
    static constexpr int kPerLane = kTileN / arch::kWarpSize;
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

  // Full-width partials: one, or two in turn (mma_tile).
  template <class FirstBlock, class WhileMma>
  __device__ static void mma_full(SharedStorage& smem, Pipeline& pipe, State& st, Accum& acc,
                                  const Scales& scales, FirstBlock, int32_t k_begin,
                                  int32_t k_end, uint32_t lane, int thread, WhileMma& while_mma) {
    Partial partial[kPartials]; // the tensor cores' sums over one k-block each, in turn
    State previous = st;        // the stage of the k-block in flight
    const auto issue = [&](int32_t kb, Partial& into) {
      pipe.consumer_wait(st);
      arch::wgmma_fence(); // the promotion read `into` two k-blocks ago with ordinary instructions
      mma_stage<0, FirstBlock::value>(smem, st.index, into);
      arch::wgmma_commit_group();
      while_mma(kb - k_begin);
    };
    // k-block kb, the one before the k-block just issued, retired once at most `kInFlight`
    // batches are in flight. Its scales are loaded first (asm with memory clobbers keeps them
    // before the wait), so that their latency hides behind it: no scales are held across the
    // k-blocks (the registers go to the partials).
    const auto promote = [&](auto in_flight, int32_t kb, Partial& done) {
      BlockScales scale;
      scales.load(scale, kb);
      arch::wgmma_wait_group<decltype(in_flight)::value>();
      fence_partial(done);
      pipe.consumer_release(previous, lane);
      scales.template promote<0>(acc, done, scale, thread);
    };
    using One = std::integral_constant<int, 1>;
    using None = std::integral_constant<int, 0>;
    if constexpr (kPartials == 1) {
      // One partial: each k-block waits for its own batch. The by-columns promotion's shuffles
      // want the registers a second partial would take (ptxas spilled 180 bytes with two), as
      // do the fused kernels' ops (MainloopFor).
      for (int32_t kb = k_begin; kb < k_end; ++kb) {
        issue(kb, partial[0]);
        previous = st;
        promote(None{}, kb, partial[0]);
        st.advance();
      }
    } else {
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
  }

  // The overlapped promotion at 192 columns: each k-block's wgmmas in two batches, the tile's
  // columns [0, 96) into partial[0] and [96, 192) into partial[1], committed apart. The first
  // half of k-block kb is promoted while its second half runs on the tensor cores; then kb + 1's
  // first half is issued, and kb's second half promoted while it runs: a batch of this warpgroup
  // is always queued during a promotion, as with two full-width partials, at 48 registers a
  // partial. The price: both halves read the stage's A tile, so A's shared-memory reads double
  // (docs/fp8.md, "The 128 x 192 tile"). A k-block's scales serve both of its halves: loaded
  // once, before its second half is issued.
  template <class FirstBlock, class WhileMma>
  __device__ static void mma_halves(SharedStorage& smem, Pipeline& pipe, State& st, Accum& acc,
                                    const Scales& scales, FirstBlock, int32_t k_begin,
                                    int32_t k_end, uint32_t lane, int thread, WhileMma& while_mma) {
    Partial partial[2];
    State previous = st; // the stage of the k-block whose second half is in flight
    // Half h of k-block kb: the first waits for the stage; after the second the stage is done
    // issuing.
    const auto issue = [&](auto half, int32_t kb) {
      constexpr int h = decltype(half)::value;
      if constexpr (h == 0) pipe.consumer_wait(st);
      arch::wgmma_fence(); // the promotion read partial[h] with ordinary instructions
      mma_stage<h * kTileN / 2, FirstBlock::value>(smem, st.index, partial[h]);
      arch::wgmma_commit_group();
      if constexpr (h == 1) {
        while_mma(kb - k_begin);
        previous = st;
        st.advance();
      }
    };
    // Half h of a k-block, retired once at most `in_flight` batches are; the second releases the
    // k-block's stage.
    const auto promote = [&](auto in_flight, auto half, const BlockScales& scale) {
      constexpr int h = decltype(half)::value;
      arch::wgmma_wait_group<decltype(in_flight)::value>();
      fence_partial(partial[h]);
      if constexpr (h == 1) pipe.consumer_release(previous, lane);
      scales.template promote<h * kTileN / 2>(acc, partial[h], scale, thread);
    };
    using First = std::integral_constant<int, 0>;
    using Second = std::integral_constant<int, 1>;
    using One = std::integral_constant<int, 1>;
    using None = std::integral_constant<int, 0>;
    issue(First{}, k_begin);
    for (int32_t kb = k_begin;; ++kb) {
      BlockScales scale; // (asm with memory clobbers keeps the loads before the waits)
      scales.load(scale, kb);
      // NOTE: never true (a k-block's first half is always followed by its second), but without
      // it ptxas (CUDA 13.0, sm_90a) serializes the wgmmas (C7514: it does not see that the
      // second half retired before its promotion below); with it the loop has mma_full's shape
      // (an exit after each batch), which it follows.
      if (kb == k_end) return promote(None{}, First{}, scale);
      issue(Second{}, kb);
      promote(One{}, First{}, scale);
      if (kb + 1 == k_end) return promote(None{}, Second{}, scale);
      issue(First{}, kb + 1);
      promote(One{}, Second{}, scale);
    }
  }

  __device__ static void fence_partial(Partial& partial) {
#pragma unroll
    for (int mb = 0; mb < Partial::kBlocks; ++mb) arch::wgmma_fence_operand(partial.reg[mb]);
  }

  // The 4 k32 steps of one stage into `partial`, the tile's columns from kCol0 on (B's rows:
  // whole 8-row swizzle atoms), for the warpgroup's 64-row blocks from kFirstBlock on; the first
  // step overwrites it (scale_d = 0). The stage's two descriptors are made once, from the stage
  // index and constants only, and each step's by one add to their start-address field (as the
  // 16-bit mainloop's): the 8 descriptors were rebuilt from the smem addresses and the
  // warpgroup's threadIdx-derived block every k-block, ~40 instructions and 16 moves to uniform
  // registers of the consumers' ~190 a k-block (docs/fp8.md, "Nsight Compute").
  template <int kCol0, int kFirstBlock>
  __device__ static void mma_stage(SharedStorage& smem, uint32_t stage, Partial& partial) {
    const uint64_t a0 = Base::desc_a(smem.a[stage], kFirstBlock, 0);
    const uint64_t b0 = Base::desc_b(smem.b[stage], 0, kCol0);
#pragma unroll
    for (int kk = 0; kk < Config::kTileK / 32; ++kk) {
      const uint64_t b = arch::advance_wgmma_desc(b0, Base::offset_b(kk, 0));
#pragma unroll
      for (int mb = 0; mb < Accum::kBlocks; ++mb) {
        const uint64_t a = arch::advance_wgmma_desc(a0, Base::offset_a(mb, kk));
        arch::wgmma_m64k32_e4m3<Partial::kColumns>(partial.reg[mb], a, b, kk != 0);
      }
    }
  }
};

} // namespace coda::sm90

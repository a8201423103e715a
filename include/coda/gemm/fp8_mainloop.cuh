// The block-scaled FP8 mainloop (docs/fp8.md): E4M3 A [M, K] and B [N, K], both K-major, with one
// E8M0 scale per row of A and per 128 rows of B for each 128-deep block of K. The TMA side is
// the 16-bit mainloop's: a K-major tile row of 128 FP8 values is 128 bytes, one swizzle span,
// as 64 16-bit values are, so the TMA boxes, the ring, the descriptors and the k-step of 32
// bytes are the same. Each stage also carries its k-block's scales as fp32 values, written by
// two more producer warps (load_scales, kStagedScales), so that the consumers' issue chain holds
// no scale load or conversion: the scales' instructions, not their latency, were a sixth of the
// consumers' k-block (docs/fp8.md, "The consumers' issue, counted").
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

#include <cuda/ptx>

#include "coda/arch/shared_memory.cuh"
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
  static constexpr int kStages = Config::kStages;

  // Blocks: the tile's columns in groups of kBGroupCols, each inside one B scale block: one B
  // scale per group and k-block. A 128-column tile is one block. A 192-column tile, from
  // n0 = 192 t, spans two: columns [0, 128) and [128, 192) when t is even (n0 = 384 (t / 2), a
  // block boundary), [0, 64) and [64, 192) when t is odd (n0 = 128 j + 64). In 64-column groups
  // group 0 is the first block's, group 2 the second's, and group 1 the first's (t even) or the
  // second's (t odd): the parity is the one run-time choice, made once per k-block (Scales).
  static constexpr int kBGroupCols = kTileN == 128 ? 128 : 64;
  static constexpr int kBGroups = kTileN / kBGroupCols;

  // Each stage carries its k-block's block scales beside the operands, as fp32 values: the A
  // scale of every tile row and B's of the blocks the tile touches (none by rows). The scale
  // warps (load_scales) convert them from E8M0 and write them with asynchronous stores that
  // complete on the stage's `full` barrier, so the consumers read a k-block's scales from the
  // stage they already waited for: no global load and no E8M0 conversion in their issue chain
  // (docs/fp8.md), only the two products fp8_block_scale forms (the same bits).
  // A's are kept as the top 16 bits of their fp32 value, which is that value exactly (a power
  // of two from 2^-127 up, or NaN), two rows a word: rows r and r + 8 of one 16-row group, r in
  // the low half, so a thread reads its two rows (row slots, fragment.hpp) with one load: word w
  // holds rows 16 (w / 8) + w % 8 and 8 more. B's follow, one fp32 word a block.
  // Where the producer runs in 24 registers beside 232-register consumers (the staged
  // two-partial tile, gemm_fp8's default) the scale warps do not fit (ptxas spilled 8 bytes):
  // there the consumers load and convert the scales themselves, as before (GlobalScales).
  static constexpr bool kStagedScales =
      Config::kSchedule == Schedule::cooperative || Config::kStagedFp8Fused;
  static constexpr int kScaleWords = Config::kTileM / 2;
  static constexpr int kStagedB = kBRows ? 0 : kBGroups == 1 ? 1 : 2;
  static constexpr int kScaleWarps = kStagedScales ? kScaleWords / arch::kWarpSize : 0;
  static constexpr uint32_t kScaleBytes = kStagedScales ? uint32_t(kScaleWords + kStagedB) * 4 : 0u;

  struct StorageWithScales {
    alignas(1024) uint8_t a[kStages][Base::kTileBytesA];
    alignas(1024) uint8_t b[kStages][Base::kTileBytesB];
    PipelineBarriers<kStages> barriers;
    alignas(16) uint32_t scales[kStages][kScaleWords + 4]; // (B's padded to 16 bytes)
  };
  using SharedStorage =
      std::conditional_t<kStagedScales, StorageWithScales, typename Base::SharedStorage>;
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
    // The scale warps may read 4 k-blocks' scales of a row as one 32-bit word: both row strides
    // and pointers 4-byte aligned and the k-blocks a multiple of 4 (no word reaches past a row).
    bool scales_by_words;
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
    const auto words = [](const TensorView& t) {
      return t.stride[0] % 4 == 0 && reinterpret_cast<uintptr_t>(t.data) % 4 == 0;
    };
    p.scales_by_words = a_scales.shape[1] % 4 == 0 && words(a_scales) && words(b_scales);
  }

  static_assert(Config::kConsumerWarpgroups == 2,
                "mma_tile: a consumer's first 64-row block is 0 or kMmaBlocksM");

  // The TMA producer (Base's), arming each stage for the scale words too.
  __device__ static void load_tile(const Params& p, SharedStorage& smem, Pipeline& pipe, State& st,
                                   TileCoord tile, int32_t k_begin, int32_t k_end,
                                   int32_t k_rotation, uint32_t cta_rank) {
    Base::template load_tile<kScaleBytes>(p, smem, pipe, st, tile, k_begin, k_end, k_rotation,
                                          cta_rank);
  }

  // A scale warp (warps 1 .. kScaleWarps of the producer warpgroup, kernel.cuh; one word a lane):
  // the scales of every k-block of one tile, in load_tile's order (whole tiles), each into
  // the stage TMA fills with that k-block. A stage's words are stored once the stage is free
  // (the TMA thread's wait), by st.async, whose bytes complete on the stage's `full` barrier
  // with the operands' (PTX ISA "st.async": the consumers' wait then makes them visible; the
  // transaction count may run ahead of the TMA thread's expect-tx, which only the phase's one
  // arrival completes). The raw E8M0 bytes are loaded ahead, so their latency overlaps the
  // waits for free stages: four k-blocks a word and the next word in flight where the strides
  // allow (Params::scales_by_words), else a byte a k-block, two k-blocks ahead (one round trip
  // per two k-blocks fell behind the MMAs at long K: docs/fp8.md, form S).
  __device__ static void load_scales(const Params& p, SharedStorage& smem, Pipeline& pipe,
                                     State& st, TileCoord tile, int32_t k_blocks) {
    const StageScaleLoader loader(p, tile, int(threadIdx.x) - arch::kWarpSize);
    if (p.scales_by_words) {
      // Four k-blocks a load (a word of each row's scales), the next four rows' words in
      // flight: one round trip per four k-blocks' MMAs. (B's word, the same for every lane and
      // so an L1 hit after the first, is read when its four start: a register fewer.)
      typename StageScaleLoader::Words now = loader.load_words(0);
      uint2 next{};
      if (k_blocks > 4) next = loader.load_rows(4);
      for (int32_t kb = 0; kb < k_blocks; ++kb) {
        pipe.producer_wait(st);
        loader.store(smem, pipe, st, now.k_block(kb % 4));
        if (kb % 4 == 3 && kb + 1 < k_blocks) {
          now = {next.x, next.y, loader.load_b_word(kb + 1)};
          if (kb + 5 < k_blocks) next = loader.load_rows(kb + 5);
        }
        st.advance();
      }
      return;
    }
    uint32_t raw = loader.load(0);
    uint32_t raw_next = k_blocks > 1 ? loader.load(1) : 0u;
    for (int32_t kb = 0; kb < k_blocks; ++kb) {
      pipe.producer_wait(st);
      loader.store(smem, pipe, st, raw);
      raw = raw_next;
      if (kb + 2 < k_blocks) raw_next = loader.load(kb + 2);
      st.advance();
    }
  }

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
    const Scales scales(p, smem, tile, first_block, thread, lane);
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
  static_assert(Accum::kBlocks == 1, "a consumer warpgroup owns one 64-row block of the tile");
  struct ColumnScales;

  // One lane's share of a stage's scales: word w = its lane among the scale warps, rows
  // r0 = 16 (w / 8) + w % 8 and r0 + 8 of the tile (rows past M read none and scale by 2^0: TMA
  // zero-fills A there and D's rows there are not stored), and lanes below kStagedB B's block
  // w of the tile (a second block past N's last one reads none and scales by 2^0: B's rows there
  // are zero-filled). A k-block's raw E8M0 bytes travel as one word: a0 | a1 << 8 | b << 16.
  class StageScaleLoader {
  public:
    __device__ StageScaleLoader(const Params& p, TileCoord tile, int word) : p_(p) {
      row0_ = tile.m_block * Config::kTileM + 16 * (word / 8) + word % 8;
      if constexpr (kStagedB > 0) {
        const int32_t block = tile.n_block * kTileN / kFp8ScaleBlock + word;
        b_ = word < kStagedB && block * kFp8ScaleBlock < p.n
                 ? block * int32_t(p.b_scales_row_stride)
                 : -1;
      }
    }
    // (Read-only loads: every tile along N reads a row's scales again.)
    __device__ uint32_t load(int32_t kb) const {
      const auto a = [&](int32_t row) {
        return row < p_.m
                   ? uint32_t(__ldg(p_.a_scales + row * int32_t(p_.a_scales_row_stride) + kb))
                   : 127u; // 2^0
      };
      const uint32_t a0 = a(row0_), a1 = a(row0_ + 8);
      uint32_t b = 127u;
      if constexpr (kStagedB > 0)
        if (b_ >= 0) b = __ldg(p_.b_scales + b_ + kb);
      return a0 | a1 << 8 | b << 16;
    }
    // The same for k-blocks kb .. kb + 3 (Params::scales_by_words; kb a multiple of 4).
    struct Words {
      uint32_t a0, a1, b;
      __device__ uint32_t k_block(int i) const { // load()'s packing of the i-th
        return __byte_perm(a0, a1, uint32_t(i) | uint32_t(i + 4) << 4) & 0xffffu |
               (b >> (8 * i) & 0xffu) << 16;
      }
    };
    __device__ uint2 load_rows(int32_t kb) const {
      const auto a = [&](int32_t row) {
        return row < p_.m ? __ldg(reinterpret_cast<const uint32_t*>(
                                p_.a_scales + row * int32_t(p_.a_scales_row_stride) + kb))
                          : 0x7f7f7f7fu; // 2^0
      };
      return uint2{a(row0_), a(row0_ + 8)};
    }
    __device__ uint32_t load_b_word(int32_t kb) const {
      if constexpr (kStagedB > 0)
        if (b_ >= 0) return __ldg(reinterpret_cast<const uint32_t*>(p_.b_scales + b_ + kb));
      return 0x7f7f7f7fu;
    }
    __device__ Words load_words(int32_t kb) const {
      const uint2 rows = load_rows(kb);
      return Words{rows.x, rows.y, load_b_word(kb)};
    }
    __device__ void store(SharedStorage& smem, Pipeline& pipe, State st, uint32_t raw) const {
      // The top halves of E8M0's fp32 values (e8m0_bits_to_float): exact.
      const uint32_t rows = __float_as_uint(e8m0_bits_to_float(uint8_t(raw))) >> 16 |
                            (__float_as_uint(e8m0_bits_to_float(uint8_t(raw >> 8))) & 0xffff0000u);
      uint64_t* full = pipe.full_barrier(st);
      const int word = int(threadIdx.x) - arch::kWarpSize; // (kernel.cuh: warps 1..)
      cuda::ptx::st_async(&smem.scales[st.index][word], rows, full);
      if constexpr (kStagedB > 0)
        if (word < kStagedB)
          cuda::ptx::st_async(&smem.scales[st.index][kScaleWords + word],
                              __float_as_uint(e8m0_bits_to_float(uint8_t(raw >> 16))), full);
    }

  private:
    const Params& p_;
    int32_t row0_;   // the first of the two rows
    int32_t b_ = -1; // B's block `word` of the tile: its first scale, or -1
  };

  // Where this thread's scales are: its rows' word in stage 0 (a shared-window address; stage s's
  // is s words-of-a-stage further), and by rows, B's at 32-bit element offsets from the launch's
  // scale pointer (set_scales checks that they fit), the rest read from the kernel's parameters,
  // so the partials keep the registers.
  class SmemScales {
  public:
    // One k-block's scales as this thread needs them: the products of its rows' A scales and
    // B's scale per column group (blocks), or its rows' A scales and this lane's column scales
    // (rows, ColumnScales).
    struct BlockScales {
      float row[kBRows ? 1 : kBGroups][Map::kRowSlots];
      uint8_t b[kBRows ? kTileN / arch::kWarpSize : 1];
    };
    __device__ SmemScales(const Params& p, SharedStorage& smem, TileCoord tile, int first_block,
                          int thread, uint32_t lane)
        : p_(p), lane_col_(tile.n_block * kTileN + int32_t(lane)) {
      const int word = first_block * 32 + (thread / arch::kWarpSize) * 8 + thread % 32 / 4;
      b_words_ = uint32_t(__cvta_generic_to_shared(&smem.scales[0][kScaleWords]));
      static_assert(Map::slot_row(0, 1) == 8 && Map::slot_row(36, 0) == 17,
                    "a thread's two rows are r and r + 8 of a 16-row group");
      words_ = uint32_t(__cvta_generic_to_shared(&smem.scales[0][word]));
      if constexpr (kBRows) b_ = lane_col_ * int32_t(p.b_scales_row_stride);
      if constexpr (kBGroups > 1) odd_ = tile.n_block * kTileN % kFp8ScaleBlock != 0;
    }
    // k-block kb's scales, from `stage`, the ring's slot that holds it (after its wait).
    __device__ void load(BlockScales& to, uint32_t stage, int32_t kb) const {
      const uint32_t at = words_ + stage * uint32_t(sizeof(StorageWithScales::scales[0]));
      const uint32_t rows = arch::load_shared_u32(at);
      const float a[Map::kRowSlots] = {__uint_as_float(rows << 16),
                                       __uint_as_float(rows & 0xffff0000u)};
      if constexpr (kBRows) {
#pragma unroll
        for (int slot = 0; slot < Map::kRowSlots; ++slot) {
          to.row[0][slot] = a[slot];
        }
        // This lane's columns lane_col_ + 32 r (ColumnScales); columns at or past n read none
        // and scale by 2^0 (B's rows there are zero-filled, D's columns there not stored).
        // (Read-only loads: every tile along M reads a column's scales again.)
#pragma unroll
        for (int r = 0; r < ColumnScales::kPerLane; ++r)
          to.b[r] =
              lane_col_ + r * arch::kWarpSize < p_.n
                  ? __ldg(p_.b_scales + b_ + r * arch::kWarpSize * p_.b_scales_row_stride + kb)
                  : uint8_t(127);
      } else {
        // B's words, the same for every thread (a broadcast read).
        const uint32_t b_at = b_words_ + stage * uint32_t(sizeof(StorageWithScales::scales[0]));
        float b[kStagedB];
        if constexpr (kStagedB == 1) {
          b[0] = __uint_as_float(arch::load_shared_u32(b_at));
        } else {
          uint32_t first, second;
          arch::load_shared_u32x2(b_at, first, second);
          b[0] = __uint_as_float(first);
          b[1] = __uint_as_float(second);
        }
        // Each column group's block (kBGroups): 128 columns one; 192 the first, the middle
        // group's (the second's where the tile starts mid-block), the second.
        float group_b[kBGroups];
        group_b[0] = b[0];
        if constexpr (kBGroups > 1) {
          group_b[1] = odd_ ? b[1] : b[0];
          group_b[2] = b[1];
        }
        // fp8_block_scale's product, of the same two fp32 values.
#pragma unroll
        for (int g = 0; g < kBGroups; ++g)
#pragma unroll
          for (int slot = 0; slot < Map::kRowSlots; ++slot) to.row[g][slot] = a[slot] * group_b[g];
      }
    }
    // Promotes `partial`, the sums of the tile's columns from kCol0 on.
    template <int kCol0>
    __device__ void promote(Accum& acc, const Partial& partial, const BlockScales& s,
                            int thread) const {
      if constexpr (kBRows) {
        static_assert(kCol0 == 0, "by rows, the partial spans the tile");
        Fp8Mainloop::promote_by_columns(acc, partial, s.row[0], s.b, thread);
      } else {
        Fp8Mainloop::promote<kCol0>(acc, partial, s.row);
      }
    }

  private:
    const Params& p_;
    uint32_t words_;   // this thread's rows' scale word in stage 0
    uint32_t b_words_; // blocks: B's scale words in stage 0
    int32_t b_ = 0;    // rows: this lane's column's first scale
    int32_t lane_col_; // rows: this lane's first column
    bool odd_ = false; // blocks, 192 columns: the second block starts at column 64, not 128
  };

  // The staged two-partial tile's scales (kStagedScales false): each thread loads its rows' and
  // B's E8M0 bytes by k-block index with ordinary loads before the wait and converts them in
  // the promotion. 128 columns, B by blocks (the staged tile's only form).
  class GlobalScales {
  public:
    struct BlockScales {
      uint8_t a[Map::kRowSlots];
      uint8_t b;
    };
    __device__ GlobalScales(const Params& p, SharedStorage&, TileCoord tile, int first_block,
                            int thread, uint32_t)
        : p_(p) {
      static_assert(!kBRows && kBGroups == 1, "the staged tile: 128 columns, B by blocks");
      // This thread's two rows (row slots, fragment.hpp); rows past M hold zeros (TMA
      // zero-fills A) and read the scale 2^0 (offset -1).
#pragma unroll
      for (int slot = 0; slot < Map::kRowSlots; ++slot) {
        const int32_t row =
            tile.m_block * Config::kTileM + first_block * 64 + Map::slot_row(thread, slot);
        a_[slot] = row < p.m ? row * int32_t(p.a_scales_row_stride) : -1;
      }
      b_ = tile.n_block * int32_t(p.b_scales_row_stride); // 128 columns: block n_block
    }
    // (Read-only loads: every tile along N reads a row's scales again.)
    __device__ void load(BlockScales& to, uint32_t, int32_t kb) const {
      to.b = __ldg(p_.b_scales + b_ + kb);
#pragma unroll
      for (int slot = 0; slot < Map::kRowSlots; ++slot)
        to.a[slot] = a_[slot] >= 0 ? __ldg(p_.a_scales + a_[slot] + kb) : uint8_t(127); // 2^0
    }
    template <int kCol0>
    __device__ void promote(Accum& acc, const Partial& partial, const BlockScales& s, int) const {
      float scale[1][Map::kRowSlots];
#pragma unroll
      for (int slot = 0; slot < Map::kRowSlots; ++slot)
        scale[0][slot] = fp8_block_scale(s.a[slot], s.b);
      Fp8Mainloop::promote<kCol0>(acc, partial, scale);
    }

  private:
    const Params& p_;
    int32_t a_[Map::kRowSlots]; // this thread's rows' first scales, or -1
    int32_t b_;                 // the tile's first row of B scales
  };
  using Scales = std::conditional_t<kStagedScales, SmemScales, GlobalScales>;
  using BlockScales = typename Scales::BlockScales;

  // Blocks: `partial` holds the tile's columns [kCol0, kCol0 + its width), its register i the
  // accumulator's register kCol0 / 2 + i (fragment.hpp: 8 columns are 4 registers of a thread);
  // each register's scale is its row slot's and its column group's, a constant choice once
  // unrolled (a thread's columns 8 c + 2 q + e stay in the group of column 8 c).
  template <int kCol0>
  __device__ static void promote(Accum& acc, const Partial& partial,
                                 const float (&scale)[kBGroups][Map::kRowSlots]) {
    static_assert(kCol0 % 8 == 0, "a partial starts at a group of 8 columns");
#pragma unroll
    for (int i = 0; i < Partial::kRegsPerBlock; ++i) {
      const int reg = kCol0 / 2 + i;
      acc.reg[0][reg] = fp8_promote(acc.reg[0][reg], partial.reg[0][i],
                                    scale[Map::col(0, reg) / kBGroupCols][Map::row_slot(reg)]);
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
                                            const float (&row_scale)[Map::kRowSlots],
                                            const uint8_t (&b_scale)[ColumnScales::kPerLane],
                                            int thread) {
    float lane_scale[ColumnScales::kPerLane];
#pragma unroll
    for (int r = 0; r < ColumnScales::kPerLane; ++r) lane_scale[r] = e8m0_bits_to_float(b_scale[r]);
#pragma unroll
    for (int i = 0; i < Accum::kRegsPerBlock; ++i) {
      if (Map::row_slot(i) != 0) continue; // register i + 2 (row slot 1) shares i's column
      // NOTE: col(0, i) / 32 = col(thread, i) / 32 (2 q + e stays inside a group of 8 columns),
      // a constant once unrolled: the array stays in registers.
      const float col_scale = __shfl_sync(0xffffffffu, lane_scale[Map::col(0, i) / arch::kWarpSize],
                                          Map::col(thread, i) % arch::kWarpSize);
#pragma unroll
      for (int slot = 0; slot < Map::kRowSlots; ++slot) {
        const int reg = i + 2 * slot;
        acc.reg[0][reg] =
            fp8_promote(acc.reg[0][reg], partial.reg[0][reg], row_scale[slot] * col_scale);
      }
    }
  }

  // Full-width partials: one, or two in turn (mma_tile).
  template <class FirstBlock, class WhileMma>
  __device__ static void mma_full(SharedStorage& smem, Pipeline& pipe, State& st, Accum& acc,
                                  const Scales& scales, FirstBlock, int32_t k_begin, int32_t k_end,
                                  uint32_t lane, int thread, WhileMma& while_mma) {
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
      scales.load(scale, previous.index, kb);
      arch::wgmma_wait_group<decltype(in_flight)::value>();
      fence_partial(done);
      if constexpr (kStagedScales)
        __syncwarp(); // every lane has read the stage's scales before lane 0 releases it
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
      if constexpr (h == 1) {
        if constexpr (kStagedScales)
          __syncwarp(); // every lane has read the stage's scales before lane 0 releases it
        pipe.consumer_release(previous, lane);
      }
      scales.template promote<h * kTileN / 2>(acc, partial[h], scale, thread);
    };
    using First = std::integral_constant<int, 0>;
    using Second = std::integral_constant<int, 1>;
    using One = std::integral_constant<int, 1>;
    using None = std::integral_constant<int, 0>;
    issue(First{}, k_begin);
    for (int32_t kb = k_begin;; ++kb) {
      BlockScales scale; // (asm with memory clobbers keeps the loads before the waits)
      scales.load(scale, st.index, kb); // its first half was issued from st
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

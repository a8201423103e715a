// The GEMM mainloop: the producer side (TMA loads of A and B tiles into the shared-memory ring)
// and the consumer side (wgmma over the ring into fp32 accumulators). It knows the operand
// layouts and nothing of what happens to the accumulators afterwards.
//
// Shared-memory operand tiles, 128 B (one swizzle span: 64 16-bit elements, or kTileK = 128 FP8
// ones) deep in their contiguous dimension, 128-byte swizzled exactly as TMA writes them:
//   K-major  A: [kTileM rows][kTileK k]             B: [kTileN rows][kTileK k]
//   MN-major A: [kTileM/64 atoms][64 k][64 m]       B: [kTileN/64 atoms][64 k][64 n]   (16-bit)
// The FP8 mainloop (fp8_mainloop.cuh) loads through this one and reads its descriptors.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda.h>
#include <cuda/ptx>

#include "coda/arch/smem_desc.hpp"
#include "coda/arch/wgmma.cuh"
#include "coda/core/fp8.hpp"
#include "coda/core/fragment.hpp"
#include "coda/gemm/config.hpp"
#include "coda/gemm/pipeline.cuh"
#include "coda/gemm/scheduler.hpp"

namespace coda::sm90 {

template <class Config, GemmLayout kLayout, bool kIsBf16> struct Mainloop {
  static constexpr Major kMajorA = a_major(kLayout);
  static constexpr Major kMajorB = b_major(kLayout);
  static constexpr int kStages = Config::kStages;
  static constexpr int kClusterM = Config::kClusterM;
  static constexpr uint32_t kAtomBytes = 64 * arch::kOperandRowBytes; // 64 rows x 128 B
  static constexpr uint32_t kTileBytesA = Config::kTileM * arch::kOperandRowBytes;
  static constexpr uint32_t kTileBytesB = Config::kTileN * arch::kOperandRowBytes;
  // Each CTA of a cluster loads this share of B (K-major: rows) and multicasts it to all of them.
  static constexpr uint32_t kSliceRowsB = Config::kTileN / kClusterM;
  static_assert(kSliceRowsB % 8 == 0, "B slices are whole 8-row swizzle atoms");
  static constexpr uint32_t kStageBytes = kTileBytesA + kTileBytesB;
  static_assert(kStageBytes == uint32_t(stage_bytes<Config>()), "stage size mismatch");

  // The TMA boxes (columns x rows of the operand as stored) the launcher's tensor maps must have,
  // and how many of each fill one stage (B: over the whole cluster, each CTA multicasting its
  // share). The producer arms every stage with kStageBytes, so they must add up exactly: a box
  // of another size leaves the consumers waiting forever.
  static_assert(Config::kOperandBytes == 2 || (kMajorA == Major::k && kMajorB == Major::k),
                "FP8 operands are K-major (wgmma reads no other FP8 layout)");
  static constexpr uint32_t kBoxColsA = Config::kTileK; // 128 bytes
  static constexpr uint32_t kBoxRowsA = kMajorA == Major::k ? Config::kTileM : 64;
  static constexpr uint32_t kBoxesA = kMajorA == Major::k ? 1 : Config::kTileM / 64;
  static constexpr uint32_t kBoxColsB = Config::kTileK;
  static constexpr uint32_t kBoxRowsB = kMajorB == Major::k ? kSliceRowsB : 64;
  static constexpr uint32_t kBoxesB = kMajorB == Major::k ? kClusterM : Config::kTileN / 64;
  static_assert((kBoxColsA * kBoxRowsA * kBoxesA + kBoxColsB * kBoxRowsB * kBoxesB) *
                        Config::kOperandBytes ==
                    kStageBytes,
                "the TMA boxes of a stage must deliver exactly the bytes its barrier expects");

  using Pipeline = MainloopPipeline<kStages, kClusterM>;
  using State = PipelineState<kStages>;
  using Accum = Accumulator<Config::kMmaBlocksM, Config::kTileN>;

  struct SharedStorage {
    alignas(1024) uint8_t a[kStages][kTileBytesA];
    alignas(1024) uint8_t b[kStages][kTileBytesB];
    PipelineBarriers<kStages> barriers;
  };
  static_assert(kTileBytesA % arch::kSwizzleAtomBytes == 0 &&
                    kTileBytesB % arch::kSwizzleAtomBytes == 0,
                "operand tiles must stay 1024-byte aligned for the 128-byte swizzle");

  struct Params {
    CUtensorMap a; // K-major: dims {K, M}, box {64, kTileM}; MN-major: dims {M, K}, box {64, 64}
    CUtensorMap
        b; // K-major: dims {K, N}, box {64, kSliceRowsB}; MN-major: dims {N, K}, box {64, 64}
  };       // (k-blocks: TileScheduler::k_blocks = ceil(K / 64); TMA zero-fills the K tail)

  // Producer, one thread: stream k-blocks [k_begin, k_end) of one tile through the ring, from
  // k_begin + k_rotation on, wrapping around (the consumers only count stages).
  // kExtraTxBytes: bytes of each stage that another producer stores asynchronously, completing
  // them on the stage's `full` barrier (the FP8 mainloop's scales; its own storage type).
  template <uint32_t kExtraTxBytes = 0, class Storage>
  __device__ static void load_tile(const Params& p, Storage& smem, Pipeline& pipe, State& st,
                                   TileCoord tile, int32_t k_begin, int32_t k_end,
                                   int32_t k_rotation, uint32_t cta_rank) {
    const int32_t m0 = tile.m_block * Config::kTileM;
    const int32_t n0 = tile.n_block * Config::kTileN;
    int32_t kb = k_begin + k_rotation;
    for (int32_t i = k_begin; i < k_end; ++i) {
      pipe.producer_acquire(st, kStageBytes + kExtraTxBytes);
      uint64_t* full = pipe.full_barrier(st);
      const int32_t k0 = kb * Config::kTileK;
      load_a(p, smem.a[st.index], full, m0, k0);
      load_b(p, smem.b[st.index], full, n0, k0, cta_rank);
      st.advance();
      if (++kb == k_end) kb = k_begin;
    }
  }

  // One consumer warpgroup: accumulate k-blocks [k_begin, k_end) of one tile (at least one; the
  // first wgmma overwrites the accumulators). `first_block` is the first 64-row block of the
  // tile this warpgroup owns. Each k-block's stage is released once the wgmmas of the next
  // k-block are issued and the previous batch has retired (one batch in flight).
  // `while_mma(i)` runs after the i-th k-block's wgmmas are issued, while the tensor cores work
  // on them; it must not touch the accumulators.
  // (The kernel also passes the launch's Params and the tile, which the FP8 mainloop reads its
  // scales by; this one needs neither.)
  // NOTE: no other path may write the accumulators (e.g. zeroing them for K = 0): the copies
  // at the merge break ptxas's contiguous HGMMA register range and cost ~40 registers of spills.
  template <class WhileMma>
  __device__ static void mma_tile(const Params&, SharedStorage& smem, Pipeline& pipe, State& st,
                                  Accum& acc, TileCoord, int first_block, int32_t k_begin,
                                  int32_t k_end, uint32_t lane, WhileMma&& while_mma) {
    fence_accumulators(acc);
    State previous = st;
    for (int32_t kb = k_begin; kb < k_end; ++kb) {
      pipe.consumer_wait(st);
      arch::wgmma_fence();
      mma_stage(smem, st.index, acc, first_block, kb == k_begin);
      arch::wgmma_commit_group();
      if (kb > k_begin) {
        arch::wgmma_wait_group<1>();
        pipe.consumer_release(previous, lane);
      }
      while_mma(kb - k_begin);
      previous = st;
      st.advance();
    }
    arch::wgmma_wait_group<0>();
    fence_accumulators(acc);
    pipe.consumer_release(previous, lane);
  }

protected:
  __device__ static void fence_accumulators(Accum& acc) {
#pragma unroll
    for (int mb = 0; mb < Accum::kBlocks; ++mb) arch::wgmma_fence_operand(acc.reg[mb]);
  }

  __device__ static void load_a(const Params& p, uint8_t* dst, uint64_t* full, int32_t m0,
                                int32_t k0) {
    namespace ptx = cuda::ptx;
    if constexpr (kMajorA == Major::k) {
      const int32_t coords[2] = {k0, m0};
      ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global, dst, &p.a, coords, full);
    } else {
#pragma unroll
      for (int atom = 0; atom < Config::kTileM / 64; ++atom) {
        const int32_t coords[2] = {m0 + 64 * atom, k0};
        ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global, dst + atom * kAtomBytes,
                                  &p.a, coords, full);
      }
    }
  }

  // B is shared by the cluster: this CTA loads its slice and multicasts it to every CTA, into the
  // same offset, completing the same-offset `full` barrier of each.
  __device__ static void load_b(const Params& p, uint8_t* dst, uint64_t* full, int32_t n0,
                                int32_t k0, uint32_t cta_rank) {
    namespace ptx = cuda::ptx;
    const uint16_t all_ctas = uint16_t((1u << kClusterM) - 1);
    auto copy = [&](uint8_t* to, int32_t c0, int32_t c1) {
      const int32_t coords[2] = {c0, c1};
      if constexpr (kClusterM == 1)
        ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global, to, &p.b, coords, full);
      else
        ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global, to, &p.b, coords, full,
                                  all_ctas);
    };
    if constexpr (kMajorB == Major::k) {
      copy(dst + cta_rank * kSliceRowsB * arch::kOperandRowBytes, k0,
           n0 + int32_t(cta_rank * kSliceRowsB));
    } else {
      // 64-column atoms; with an odd count (N = 192 tiles) the first CTA loads one more.
      constexpr int kAtoms = Config::kTileN / 64;
      constexpr int kAtomsPerCta = (kAtoms + kClusterM - 1) / kClusterM;
#pragma unroll
      for (int j = 0; j < kAtomsPerCta; ++j) {
        const int atom = int(cta_rank) * kAtomsPerCta + j;
        if (atom < kAtoms) copy(dst + atom * kAtomBytes, n0 + 64 * atom, k0);
      }
    }
  }

  // Byte offsets, from the stage's tile, of what the k step `kk` (32 bytes along K: 16 16-bit
  // elements, or the 32 FP8 ones of a k32 wgmma) of 64-row block `block` of A, and of B from
  // column `n0` (a multiple of 64), read (see smem_desc.hpp).
  static constexpr uint32_t offset_a(int block, int kk) {
    return kMajorA == Major::k ? block * kAtomBytes + kk * 32
                               : block * kAtomBytes + kk * 16 * arch::kOperandRowBytes;
  }
  static constexpr uint32_t offset_b(int kk, int n0) {
    return kMajorB == Major::k ? n0 * arch::kOperandRowBytes + kk * 32
                               : n0 / 64 * kAtomBytes + kk * 16 * arch::kOperandRowBytes;
  }
  // A tile's descriptor at byte offset 0 (the leading offset only matters MN-major).
  template <Major kMajor> __device__ static uint64_t tile_desc(const uint8_t* tile) {
    return arch::make_wgmma_desc_sw128(uint32_t(__cvta_generic_to_shared(tile)),
                                       kMajor == Major::k ? 16 : kAtomBytes,
                                       arch::kSwizzleAtomBytes);
  }

  // The descriptors of step `kk` of block `block` of A, and of B from column `n0`.
  __device__ static uint64_t desc_a(const uint8_t* tile, int block, int kk) {
    return arch::advance_wgmma_desc(tile_desc<kMajorA>(tile), offset_a(block, kk));
  }
  __device__ static uint64_t desc_b(const uint8_t* tile, int kk, int n0) {
    return arch::advance_wgmma_desc(tile_desc<kMajorB>(tile), offset_b(kk, n0));
  }

private:
  // A stage's wgmmas address its tiles by descriptors made once per stage plus each step's
  // constant offset: the consumer warps share their schedulers with the staged epilogue's, so
  // every instruction of the mainloop's issue chain counts (ncu on a staged K7: the consumers'
  // HGMMAs waited on issue, not on the tensor cores; ~10 instructions per wgmma before this).
  __device__ static void mma_stage(SharedStorage& smem, uint32_t stage, Accum& acc, int first_block,
                                   bool first_k_block) {
    constexpr int kTransA = kMajorA == Major::mn ? 1 : 0;
    constexpr int kTransB = kMajorB == Major::mn ? 1 : 0;
    constexpr int kN = Config::kWgmmaN, kParts = Config::kTileN / kN;
    const uint64_t a0 =
        arch::advance_wgmma_desc(tile_desc<kMajorA>(smem.a[stage]), offset_a(first_block, 0));
    const uint64_t b0 = tile_desc<kMajorB>(smem.b[stage]);
#pragma unroll
    for (int kk = 0; kk < Config::kTileK / 16; ++kk) {
#pragma unroll
      for (int part = 0; part < kParts; ++part) {
        const uint64_t b = arch::advance_wgmma_desc(b0, offset_b(kk, part * kN));
#pragma unroll
        for (int mb = 0; mb < Accum::kBlocks; ++mb) {
          const uint64_t a = arch::advance_wgmma_desc(a0, offset_a(mb, kk));
          // Columns [part kN, (part + 1) kN) are registers [part kN/2, (part + 1) kN/2) of the
          // full width's map (coda/core/fragment.hpp): one narrower wgmma on a slice of them.
          float(&d)[kN / 2] = *reinterpret_cast<float(*)[kN / 2]>(&acc.reg[mb][part * kN / 2]);
          arch::wgmma_m64k16<kN, kIsBf16, kTransA, kTransB>(d, a, b, !first_k_block || kk != 0);
        }
      }
    }
  }
};

// The block-scaled FP8 mainloop (fp8_mainloop.cuh; included where it is instantiated).
template <class Config, Fp8BScaling kBScaling, bool kOverlapPromotion = true> struct Fp8Mainloop;

// The mainloop of a GEMM over operands of type InT (for e4m3, with B scaled by 128 x 128 blocks).
// NOTE: the fused kernels' FP8 mainloop promotes each k-block before issuing the next: the ops'
// state held across the mainloop leaves no room for a second partial (K2 and K4 spilled 8-32
// bytes with it, sm_90a, 2026-12-05).
template <class Config, GemmLayout kLayout, class InT>
using MainloopFor =
    std::conditional_t<std::is_same_v<InT, e4m3>, Fp8Mainloop<Config, Fp8BScaling::blocks, false>,
                       Mainloop<Config, kLayout, std::is_same_v<InT, bf16>>>;

} // namespace coda::sm90

// The plain GEMM's epilogue on the register schedules (cooperative, ping-pong): D = alpha * acc +
// beta * C, stored through shared memory by TMA (the staged schedule runs FusedEpilogue instead).
// alpha is a number, or that number times a [1] f32 device scalar (Params::alpha_tensor), read
// once per tile after the mainloop, so no register holds it across the MMAs.
//
// Lifecycle (ARCHITECTURE section 4), run by each consumer warpgroup on the rows it owns:
//   begin_tile(tile)  issue the TMA load of the first C subtile (before the mainloop, so its
//                     latency hides behind the MMAs);
//   visit(acc, tile)  per 64 x 32 subtile: wait for C, compute, write D into a swizzled smem
//                     buffer (stmatrix for 16-bit D), one thread TMA-stores it;
//   end_tile(tile)    nothing to flush: stores stay in flight across tiles;
//   finish()          once, before the kernel exits: drain the stores.
// Subtiles alternate between two D buffers and two C buffers, so a store and a load are in flight
// while the next subtile is computed: the fused driver's protocol (subtile_store.cuh), on the
// same subtile buffers (tile_io.cuh). TMA clips the store and zero-fills the load at the edges.
// C may alias D: a tile's C region is read (into registers) before its D region is written, and
// no two warpgroups share a region.
//
// Deferred stores (kOverlapStores, 16-bit D, no C, Params::defer_stores), so the tensor cores do
// not idle while a tile is stored (the cooperative kernel's warpgroups would otherwise both store
// at once): visit() writes the first 4 subtiles at once, through the 2 D and the 2 (unused) C
// buffers with one barrier pair, and keeps the last 4 as 32 registers of bf16/f16 pairs;
// overlap_with_mainloop() stores those one per k-block of the next mainloop. Subtiles a short
// k-range leaves pending are stored by the next visit() or by finish().
#pragma once

#include <cstdint>

#include <cuda.h>
#include <cuda/ptx>

#include "coda/arch/warpgroup.cuh"
#include "coda/core/fragment.hpp"
#include "coda/core/tensor.hpp"
#include "coda/core/types.hpp"
#include "coda/epilogue/device/subtile_store.cuh"
#include "coda/epilogue/device/tile_io.cuh"
#include "coda/gemm/epilogue_contract.hpp"
#include "coda/gemm/tensor_map.hpp"

namespace coda::epilogue::device {

template <class OutT, int kWarpgroups, bool kOverlapStores = false> struct LinearEpilogue {
  using Layout = SubtileLayout<OutT>; // one subtile: 64 rows x 32 columns
  static constexpr int kSubRows = Layout::kRows, kSubCols = Layout::kCols;
  static constexpr bool k16Bit = sizeof(OutT) == 2;
  static constexpr bool kCanDefer = kOverlapStores && k16Bit;
  // Subtiles held back per tile (the last ones): 16-bit pairs of 4 subtiles are 32 registers,
  // what the 232-register consumers have left beside 128 accumulators (8 subtiles spill).
  static constexpr int kMaxDeferred = 4;

  struct Params {
    CUtensorMap d; // dims {N, M}, box {32, 64}, swizzle = row bytes of the subtile
    CUtensorMap c; // same geometry as d; unused unless load_c
    float alpha, beta;
    int32_t load_c;            // 0: D = alpha * acc (C absent or beta == 0, then C is never read)
    int32_t defer_stores;      // with kOverlapStores and load_c == 0: visit() defers the stores
    const float* alpha_tensor; // optional [1]: the factor is alpha * alpha_tensor[0]
  };

  // Host: the tensor map of a D-shaped [m, n] output (D, or C) in Params' geometry.
  static CUtensorMap output_map(const char* what, const TensorView& t, int64_t m, int64_t n) {
    return sm90::make_tensor_map(
        what, sm90::TensorMapShape{t.data, t.dtype, uint64_t(n), uint64_t(m), uint64_t(t.stride[0]),
                                   uint32_t(kSubCols), uint32_t(kSubRows),
                                   Layout::kRowBytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B
                                                            : CU_TENSOR_MAP_SWIZZLE_64B});
  }

  struct SharedStorage {
    alignas(1024) uint8_t d[kWarpgroups][2][Layout::kBytes];
    alignas(1024) uint8_t c[kWarpgroups][2][Layout::kBytes];
    uint64_t c_full[kWarpgroups][2];
  };

  const Params& params;
  SharedStorage& smem;
  const int warpgroup;  // consumer warpgroup index
  const int thread;     // 0..127 in the warpgroup
  uint32_t subtile = 0; // subtiles visited so far: buffer = subtile & 1
  uint32_t c_phase = 0; // bit b: phase of c_full[warpgroup][b]
  // The deferred subtiles: a queue of packed pairs (SubtileMap order), head at deferred[0].
  uint32_t deferred[kCanDefer ? kMaxDeferred : 1][8];
  int32_t deferred_left = 0;                    // subtiles in the queue
  int32_t deferred_row0 = 0, deferred_col0 = 0; // where the head goes (the next ones: +32 cols)

  __device__ static void init(SharedStorage& smem) {
    for (int w = 0; w < kWarpgroups; ++w)
      for (int b = 0; b < 2; ++b) cuda::ptx::mbarrier_init(&smem.c_full[w][b], 1);
  }

  __device__ LinearEpilogue(const Params& p, SharedStorage& s, int wg, int t)
      : params(p), smem(s), warpgroup(wg), thread(t) {}

  __device__ void begin_tile(sm90::EpilogueTile tile) {
    if (params.load_c && thread == 0) load_c(subtile & 1, tile.row0, tile.col0);
  }

  template <int kBlocks, int kN>
  __device__ void visit(Accumulator<kBlocks, kN>& acc, sm90::EpilogueTile tile) {
    constexpr int kSubtilesN = kN / kSubCols;
    const float alpha = tile_alpha();
    // Deferral holds the last 4 subtiles of a one-block tile (a 256-wide cooperative half).
    if constexpr (kCanDefer && kBlocks == 1 && kSubtilesN % kMaxDeferred == 0) {
      if (params.defer_stores && !params.load_c) return defer(acc, tile, alpha);
    }
#pragma unroll // NOTE: registers cannot be indexed at run time; a rolled loop puts acc in local
               // memory
    for (int mb = 0; mb < kBlocks; ++mb) {
#pragma unroll
      for (int s = 0; s < kSubtilesN; ++s) {
        const int32_t row0 = tile.row0 + mb * kSubRows, col0 = tile.col0 + s * kSubCols;
        const uint32_t buf = subtile & 1;
        begin_slot_write(thread, barrier(), arch::kWarpgroupSize);
        const bool last = mb == kBlocks - 1 && s == kSubtilesN - 1;
        if (params.load_c && thread == 0 && !last) {
          const bool next_row_block = s == kSubtilesN - 1;
          load_c(buf ^ 1, next_row_block ? row0 + kSubRows : row0,
                 next_row_block ? tile.col0 : col0 + kSubCols);
        }
        float v[16]; // this thread's 16 values of the subtile, SubtileMap order
#pragma unroll
        for (int i = 0; i < 16; ++i) v[i] = alpha * acc.reg[mb][16 * s + i];
        if (params.load_c) add_c(v, buf);
        write_d(v, buf);
        end_slot_write(barrier(), arch::kWarpgroupSize);
        if (thread == 0) store_d(buf, row0, col0);
        ++subtile;
      }
    }
  }

  __device__ void end_tile(sm90::EpilogueTile) {}

  __device__ void overlap_with_mainloop(int32_t) {
    if constexpr (kCanDefer) store_deferred(1);
  }

  __device__ void finish() {
    if constexpr (kCanDefer) store_deferred(kMaxDeferred);
    drain_stores(thread == 0);
  }

private:
  // The factor of this tile: alpha, times the device scalar when there is one (the same fp32
  // product as the CPU backend's ScaleByScalar, so both are bitwise equal).
  __device__ float tile_alpha() const {
    return params.alpha_tensor != nullptr ? params.alpha * __ldg(params.alpha_tensor)
                                          : params.alpha;
  }

  // The warpgroup's named barrier (arch::kWarpgroupSize threads).
  __device__ uint32_t barrier() const {
    return uint32_t(sm90::NamedBarrier::epilogue_warpgroup0) + warpgroup;
  }

  // Stores the tile's first subtiles now, at once, and packs the last kMaxDeferred for later.
  template <int kBlocks, int kN>
  __device__ void defer(const Accumulator<kBlocks, kN>& acc, sm90::EpilogueTile tile, float alpha) {
    constexpr int kSubtilesN = kN / kSubCols, kSubtiles = kBlocks * kSubtilesN;
    static_assert(kSubtilesN % kMaxDeferred == 0,
                  "the deferred subtiles are the last columns of the last 64-row block");
    constexpr int kFirstDeferred = kSubtiles - kMaxDeferred;
    static_assert(kFirstDeferred <= 4, "the first subtiles go out through 4 buffers at once");
    store_deferred(kMaxDeferred); // what the previous tile's (short) mainloop left
    // Every store issued so far has read its buffer (they ran during the mainloop): all of them,
    // as the batch writes both slots' buffers.
    begin_slot_write</*kPendingReads=*/0>(thread, barrier(), arch::kWarpgroupSize);
#pragma unroll
    for (int j = 0; j < kSubtiles; ++j) {
      const int mb = j / kSubtilesN, s = j % kSubtilesN;
      uint32_t packed[8];
#pragma unroll
      for (int i = 0; i < 8; ++i)
        packed[i] = pack2<OutT>(alpha * acc.reg[mb][16 * s + 2 * i],
                                alpha * acc.reg[mb][16 * s + 2 * i + 1]);
      if (j < kFirstDeferred) {
        write_subtile<OutT>(batch_buffer(j), thread, packed);
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) deferred[j - kFirstDeferred][i] = packed[i];
      }
    }
    end_slot_write(barrier(), arch::kWarpgroupSize);
    if (thread == 0)
#pragma unroll
      for (int j = 0; j < kFirstDeferred; ++j)
        store_buffer(batch_buffer(j), tile.row0 + j / kSubtilesN * kSubRows,
                     tile.col0 + j % kSubtilesN * kSubCols);
    // The batch's last two bulk groups read D buffers 0 and 1: the deferred stores continue the
    // alternation from buffer 0, whose wait for all but the newest group covers them.
    subtile = 0;
    deferred_left = kMaxDeferred;
    deferred_row0 = tile.row0 + kFirstDeferred / kSubtilesN * kSubRows;
    deferred_col0 = tile.col0 + kFirstDeferred % kSubtilesN * kSubCols;
  }

  // Stores up to `count` of the deferred subtiles not stored yet, in order.
  __device__ void store_deferred(int count) {
    for (; count > 0 && deferred_left > 0; --count, --deferred_left) {
      store_packed(deferred[0], deferred_row0, deferred_col0);
      deferred_col0 += kSubCols;
      // NOTE: the queue shifts down in registers; selecting deferred[deferred_next] instead
      // makes the compiler index a local-memory copy of the array.
#pragma unroll
      for (int j = 0; j + 1 < kMaxDeferred; ++j)
#pragma unroll
        for (int i = 0; i < 8; ++i) deferred[j][i] = deferred[j + 1][i];
    }
  }

  // Buffer j of a batch: C 0, C 1, D 0, D 1 (C is never loaded when stores are deferred; it has
  // D's subtile geometry and swizzle).
  __device__ uint8_t* batch_buffer(int j) {
    return j < 2 ? smem.c[warpgroup][j] : smem.d[warpgroup][j - 2];
  }

  // One subtile of 16-bit pairs through the next D buffer.
  __device__ void store_packed(const uint32_t (&packed)[8], int32_t row0, int32_t col0) {
    const uint32_t buf = subtile & 1;
    begin_slot_write(thread, barrier(), arch::kWarpgroupSize);
    write_subtile<OutT>(smem.d[warpgroup][buf], thread, packed);
    end_slot_write(barrier(), arch::kWarpgroupSize);
    if (thread == 0) store_d(buf, row0, col0);
    ++subtile;
  }

  // NOTE: 16-bit D packs all 8 pairs before its two stmatrix, the order the plain GEMM's code was
  // measured with (write_subtile of the fp32 values packs each stmatrix's 4 pairs just before it).
  __device__ void write_d(const float (&v)[16], uint32_t buf) {
    if constexpr (k16Bit) {
      uint32_t packed[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) packed[i] = pack2<OutT>(v[2 * i], v[2 * i + 1]);
      write_subtile<OutT>(smem.d[warpgroup][buf], thread, packed);
    } else {
      write_subtile<OutT>(smem.d[warpgroup][buf], thread, v);
    }
  }

  // One thread: TMA-store D buffer `buf` at (row0, col0).
  __device__ void store_d(uint32_t buf, int32_t row0, int32_t col0) {
    store_buffer(smem.d[warpgroup][buf], row0, col0);
  }
  // One thread: TMA-store a subtile buffer at (row0, col0) of D, as its own bulk group.
  __device__ void store_buffer(uint8_t* buffer, int32_t row0, int32_t col0) {
    store_subtile(&params.d, buffer, col0, row0);
    commit_slot_stores();
  }

  __device__ void load_c(uint32_t buf, int32_t row0, int32_t col0) {
    load_subtile(&params.c, smem.c[warpgroup][buf], col0, row0, &smem.c_full[warpgroup][buf],
                 Layout::kBytes);
  }

  __device__ void add_c(float (&v)[16], uint32_t buf) {
    wait_loaded(&smem.c_full[warpgroup][buf], c_phase, buf);
    const uint8_t* c = smem.c[warpgroup][buf];
#pragma unroll
    for (int i = 0; i < 16; i += 2) {
      const uint32_t off = Layout::offset(SubtileMap::row(thread, i), SubtileMap::col(thread, i));
      float c0, c1;
      // NOTE: f16 C decodes through load_as_float (integer ops), not tile_io's read_pair (cvt):
      // the plain GEMM's code stays as it was measured.
      if constexpr (k16Bit) {
        const uint32_t packed = *reinterpret_cast<const uint32_t*>(c + off);
        c0 = load_as_float(OutT{uint16_t(packed & 0xffffu)});
        c1 = load_as_float(OutT{uint16_t(packed >> 16)});
      } else {
        const float2 pair = *reinterpret_cast<const float2*>(c + off);
        c0 = pair.x, c1 = pair.y;
      }
      v[i] = fmaf(params.beta, c0, v[i]);
      v[i + 1] = fmaf(params.beta, c1, v[i + 1]);
    }
  }
};

} // namespace coda::epilogue::device

// The plain GEMM epilogue: D = alpha * acc + beta * C, stored through shared memory by TMA.
//
// Lifecycle (ARCHITECTURE section 4), run by each consumer warpgroup on the rows it owns:
//   begin_tile(tile)  issue the TMA load of the first C subtile (before the mainloop, so its
//                     latency hides behind the MMAs);
//   visit(acc, tile)  per 64 x 32 subtile: wait for C, compute, write D into a swizzled smem
//                     buffer (stmatrix for 16-bit D), one thread TMA-stores it;
//   end_tile(tile)    nothing to flush: stores stay in flight across tiles;
//   finish()          once, before the kernel exits: drain the stores.
// Subtiles alternate between two D buffers and two C buffers, so a store and a load are in flight
// while the next subtile is computed. TMA clips the store and zero-fills the load at the edges.
// C may alias D: a tile's C region is read (into registers) before its D region is written, and
// no two warpgroups share a region.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda.h>
#include <cuda/ptx>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "coda/arch/smem_desc.hpp"
#include "coda/arch/stmatrix.cuh"
#include "coda/arch/warpgroup.cuh"
#include "coda/core/types.hpp"
#include "coda/gemm/epilogue_contract.hpp"
#include "coda/gemm/fragment.hpp"
#include "coda/gemm/pipeline.cuh"

namespace coda::gemm {

template <class OutT, int kWarpgroups> struct LinearEpilogue {
  static constexpr int kSubRows = 64, kSubCols = 32; // one subtile: 64 rows x 32 columns
  static constexpr int kRowBytes = kSubCols * int(sizeof(OutT));
  static constexpr arch::Swizzle kSwizzle =
      kRowBytes == 128 ? arch::Swizzle::b128 : arch::Swizzle::b64;
  static constexpr uint32_t kSubtileBytes = kSubRows * kRowBytes;
  static constexpr bool k16Bit = sizeof(OutT) == 2;

  struct Params {
    CUtensorMap d; // dims {N, M}, box {32, 64}, swizzle = row bytes of the subtile
    CUtensorMap c; // same geometry as d; unused unless load_c
    float alpha, beta;
    int32_t load_c; // 0: D = alpha * acc (C absent or beta == 0, then C is never read)
  };

  struct SharedStorage {
    alignas(1024) uint8_t d[kWarpgroups][2][kSubtileBytes];
    alignas(1024) uint8_t c[kWarpgroups][2][kSubtileBytes];
    uint64_t c_full[kWarpgroups][2];
  };

  const Params& params;
  SharedStorage& smem;
  const int warpgroup;  // consumer warpgroup index
  const int thread;     // 0..127 in the warpgroup
  uint32_t subtile = 0; // subtiles visited so far: buffer = subtile & 1
  uint32_t c_phase = 0; // bit b: phase of c_full[warpgroup][b]

  __device__ static void init(SharedStorage& smem) {
    for (int w = 0; w < kWarpgroups; ++w)
      for (int b = 0; b < 2; ++b) cuda::ptx::mbarrier_init(&smem.c_full[w][b], 1);
  }

  __device__ LinearEpilogue(const Params& p, SharedStorage& s, int wg, int t)
      : params(p), smem(s), warpgroup(wg), thread(t) {}

  __device__ void begin_tile(EpilogueTile tile) {
    if (params.load_c && thread == 0) load_c(subtile & 1, tile.row0, tile.col0);
  }

  template <int kBlocks, int kN>
  __device__ void visit(Accumulator<kBlocks, kN>& acc, EpilogueTile tile) {
    constexpr int kSubtilesN = kN / kSubCols;
#pragma unroll // NOTE: registers cannot be indexed at run time; a rolled loop puts acc in local
               // memory
    for (int mb = 0; mb < kBlocks; ++mb) {
#pragma unroll
      for (int s = 0; s < kSubtilesN; ++s) {
        const int32_t row0 = tile.row0 + mb * kSubRows, col0 = tile.col0 + s * kSubCols;
        const uint32_t buf = subtile & 1;
        // The store that last used D buffer `buf` has read it; everyone is done with C buffer !buf.
        if (thread == 0) cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<1>{});
        sync();
        const bool last = mb == kBlocks - 1 && s == kSubtilesN - 1;
        if (params.load_c && thread == 0 && !last) {
          const bool next_row_block = s == kSubtilesN - 1;
          load_c(buf ^ 1, next_row_block ? row0 + kSubRows : row0,
                 next_row_block ? tile.col0 : col0 + kSubCols);
        }
        float v[16]; // this thread's 16 values of the subtile, FragmentMap order
#pragma unroll
        for (int i = 0; i < 16; ++i) v[i] = params.alpha * acc.reg[mb][16 * s + i];
        if (params.load_c) add_c(v, buf);
        write_d(v, buf);
        cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
        sync();
        if (thread == 0) {
          const int32_t coords[2] = {col0, row0};
          cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_global, cuda::ptx::space_shared,
                                          &params.d, coords, smem.d[warpgroup][buf]);
          cuda::ptx::cp_async_bulk_commit_group();
        }
        ++subtile;
      }
    }
  }

  __device__ void end_tile(EpilogueTile) {}

  __device__ void finish() {
    if (thread == 0) cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<0>{});
  }

private:
  __device__ void sync() {
    arch::named_barrier_sync(uint32_t(NamedBarrier::epilogue_warpgroup0) + warpgroup,
                             arch::kWarpgroupSize);
  }

  __device__ void load_c(uint32_t buf, int32_t row0, int32_t col0) {
    namespace ptx = cuda::ptx;
    uint64_t* bar = &smem.c_full[warpgroup][buf];
    const uint32_t bytes =
        kSubtileBytes; // (a constexpr member cannot bind to the const& parameter)
    ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, bar, bytes);
    const int32_t coords[2] = {col0, row0};
    ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global, smem.c[warpgroup][buf],
                              &params.c, coords, bar);
  }

  // Byte offset of (row, col) of the subtile in its swizzled buffer.
  __device__ static uint32_t offset(int row, int col) {
    return arch::swizzle_offset(kSwizzle, uint32_t(row * kRowBytes + col * int(sizeof(OutT))));
  }

  __device__ void add_c(float (&v)[16], uint32_t buf) {
    mbarrier_wait(&smem.c_full[warpgroup][buf], (c_phase >> buf) & 1);
    c_phase ^= 1u << buf;
    const uint8_t* c = smem.c[warpgroup][buf];
#pragma unroll
    for (int i = 0; i < 16; i += 2) {
      const uint32_t off = offset(FragmentMap::row(thread, i), FragmentMap::col(thread, i));
      float c0, c1;
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

  __device__ static uint32_t pack(float lo, float hi) {
    if constexpr (std::is_same_v<OutT, bf16>) {
      const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
      return *reinterpret_cast<const uint32_t*>(&h);
    } else {
      const __half2 h = __floats2half2_rn(lo, hi);
      return *reinterpret_cast<const uint32_t*>(&h);
    }
  }

  // 16-bit D: two stmatrix.x4 per warp, each an 8-register column pair block (16 columns).
  // Lane l addresses row 16*warp + (l & 15), column 16*j + 8*(l >> 4) of the subtile.
  // fp32 D: each thread stores its column pairs directly.
  __device__ void write_d(const float (&v)[16], uint32_t buf) {
    uint8_t* d = smem.d[warpgroup][buf];
    if constexpr (k16Bit) {
      const int warp = thread / 32, lane = thread % 32;
      const uint32_t base = uint32_t(__cvta_generic_to_shared(d));
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const uint32_t addr = base + offset(16 * warp + (lane & 15), 16 * j + 8 * (lane >> 4));
        arch::stmatrix_x4(addr, pack(v[8 * j], v[8 * j + 1]), pack(v[8 * j + 2], v[8 * j + 3]),
                          pack(v[8 * j + 4], v[8 * j + 5]), pack(v[8 * j + 6], v[8 * j + 7]));
      }
    } else {
#pragma unroll
      for (int i = 0; i < 16; i += 2) {
        const uint32_t off = offset(FragmentMap::row(thread, i), FragmentMap::col(thread, i));
        *reinterpret_cast<float2*>(d + off) = make_float2(v[i], v[i + 1]);
      }
    }
  }
};

} // namespace coda::gemm

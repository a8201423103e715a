// Device op QuantizeTileTransposed: the value an op list leaves (K7's act), as the E4M3 copy of
// its transpose with one power-of-two scale per 128 x 128 block: quantize_weight_fp8's codes_t
// and scales_t of the [M, N] output, in place of the 16-bit output (the list's MainStore role).
// The FP8 block's down weight gradient reads act only so (its B, transposed in 128 x 128 blocks),
// which a quantize_weight_fp8 pass over the 16-bit act made (docs/fp8.md, "K7 writes act's FP8
// copy").
//
// On the FP8 mainloop's staged 128 x 128 tile a tile is exactly one such block, so its scale needs
// only the tile's largest magnitude, and the staged tile holds the values between the two passes
// that the scale forces:
//  visit       each warp (the list runs warp-local) writes its rows of the subtile, rounded to T,
//              back over the staged subtile (the values a stored 16-bit act would hold) and keeps
//              the largest magnitude of what it wrote;
//  end_visits  the four warps' maxima meet in shared memory (one barrier, the tile's only one);
//              each warp then reads its 32 columns of the tile back transposed (ldmatrix .trans:
//              a lane gets two consecutive rows of one column), converts them and writes them as
//              its 32 rows of the codes_t box (128 codes a row, 128-byte swizzle) over the
//              staged subtile of its columns in the first 64-row block, which no other warp reads
//              there; its lane 0 TMA-stores the 32 rows (clipped at M and N), and the driver's
//              release waits for that store's reads.
// Past M or N the staged values are zeros (the GEMM's zero-filled operands, and g = u = 0 in
// K7's SwiGLU backward), so they take no part in the magnitude, as quantize_weight_fp8's zero
// fill has it; the GPU test compares the two bit for bit on ragged shapes.
//
// Magnitudes are compared as the bits of |x| (16-bit, as unsigned integers: the order of the
// finite magnitudes, an infinity and every NaN above them all), so a tile holding a non-finite
// value gets kNoScale and NaN codes, as the weight quantizer gives.
#pragma once

#include <cstdint>

#include <cuda.h>
#include <cuda/ptx>

#include "coda/arch/stmatrix.cuh"
#include "coda/arch/warpgroup.cuh"
#include "coda/core/convert.cuh"
#include "coda/core/fp8.hpp"
#include "coda/core/tensor.hpp"
#include "coda/epilogue/device/driver.cuh"
#include "coda/epilogue/device/staged_tile.cuh"
#include "coda/epilogue/device/tile_io.cuh"
#include "coda/gemm/tensor_map.hpp"

namespace coda::epilogue::device {

template <class Shape, class T> struct QuantizeTileTransposed : OpBase {
  static constexpr int kBlock = kFp8ScaleBlock; // 128
  static_assert(Shape::kStaged && Shape::kBlocks * Shape::kSubRows == kBlock &&
                    Shape::kCols == kBlock && Shape::kEpilogueWarps == 4,
                "QuantizeTileTransposed runs on a staged 128 x 128 tile read by 4 warps (the FP8 "
                "mainloop's staged tile): a tile is one scale block");
  static_assert(sizeof(T) == 2, "the staged tile holds 16-bit values");
  using Sub = Subtile16;
  static constexpr int kWarps = Shape::kEpilogueWarps;
  static constexpr int kColsPerWarp = kBlock / kWarps; // 32: one slab
  static_assert(kColsPerWarp == Sub::kCols, "each warp transposes the slab of its columns");
  // A warp's codes_t rows (its 32 columns) are 4 KB of the box: exactly the staged subtile of its
  // slab in the first 64-row block, the 16 KB box starting at the staged tile's first byte.
  static_assert(kColsPerWarp * kBlock == int(Sub::kBytes), "a warp's codes fill one subtile");
  // Its shared storage is touched only in end_visits, behind that hook's own barrier, and its
  // stores are each warp's: the list may still run warp-local (driver.cuh).
  static constexpr bool kWarpLocal = true;

  struct Params {
    CUtensorMap map;             // codes_t [N, M] e4m3: boxes of 32 rows x 128 codes, 128B swizzle
    uint8_t* scales_t = nullptr; // [ceil(N/128), ceil(M/128)] e8m0
    int64_t scales_t_stride = 0;
    int32_t rows = 0, cols = 0; // M, N
  };
  struct SharedStorage {
    uint32_t warp_magnitude[kWarps];
  };
  using Ctx = OpContext<Params, SharedStorage>;

  static Params params(const TensorView& codes_t, const TensorView& scales_t) {
    Params p;
    p.map = sm90::make_tensor_map(
        "act_codes_t", sm90::TensorMapShape{codes_t.data, codes_t.dtype, uint64_t(codes_t.shape[1]),
                                            uint64_t(codes_t.shape[0]), uint64_t(codes_t.stride[0]),
                                            kBlock, kColsPerWarp, CU_TENSOR_MAP_SWIZZLE_128B});
    p.scales_t = scales_t.ptr<uint8_t>();
    p.scales_t_stride = scales_t.stride[0];
    p.rows = int32_t(codes_t.shape[1]);
    p.cols = int32_t(codes_t.shape[0]);
    return p;
  }

  // Two 16-bit maxima (of the halves of the pairs this thread wrote), as unsigned integers.
  uint32_t magnitude2_ = 0;

  __device__ void begin_visit(const Ctx&, sm90::EpilogueTile) { magnitude2_ = 0; }

  __device__ void visit(const Ctx& c, const Subtile& st, float (&v)[16]) {
    uint32_t packed[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      packed[i] = pack2<T>(v[2 * i], v[2 * i + 1]);
      magnitude2_ = __vmaxu2(magnitude2_, packed[i] & 0x7fff7fffu); // signs cleared
    }
    Sub::store(st.staged, c.wg.thread, packed); // the thread's fragment, where it was read
  }

  __device__ void end_visits(const Ctx& c, sm90::EpilogueTile tile, uint8_t* staged) {
    const Params& p = c.params;
    const int warp = c.wg.warp(), lane = c.wg.lane();
    // The tile's largest magnitude: a 16-bit one widened (exactly, keeping the order) to the
    // float the weight quantizer takes its exponent from.
    uint32_t m = max(magnitude2_ & 0xffffu, magnitude2_ >> 16);
    m = __reduce_max_sync(0xffffffffu, m);
    if (lane == 0) c.smem.warp_magnitude[warp] = m;
    // Also orders every warp's visits (their writes of the staged tile) before the reads below.
    arch::named_barrier_sync(uint32_t(sm90::NamedBarrier::epilogue_warpgroup0),
                             kWarps * arch::kWarpSize);
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m = max(m, c.smem.warp_magnitude[w]);
    const int exponent = e4m3_scale_exponent(to_float<T>(uint16_t(m)));
    const bool inside = tile.row0 < p.rows && tile.col0 < p.cols; // a paired CTA's may not be
    if (warp == 0 && lane == 0 && inside)
      p.scales_t[int64_t(tile.col0 / kBlock) * p.scales_t_stride + tile.row0 / kBlock] =
          e8m0_bits_of_exponent(exponent);

    // No warp writes warp_magnitude for the next tile before every warp has read it above: the
    // driver's begin_visit barrier (every staged tile's start, warp-local lists too) lies between.
    const float scale = scale_exp2(-exponent); // exact (a power of two); NaN for kNoScale
    const uint32_t staged_base = uint32_t(__cvta_generic_to_shared(staged));
    uint8_t* const codes = staged + warp * Sub::kBytes; // this warp's 32 rows of the box
    // The first 64 rows (tokens) of its columns come from the subtile its codes go over: all of
    // them are read (and converted) before any code is written.
    uint32_t first[16] = {}; // code pairs 2j and 2j + 1, low half first
    transpose_block(staged_base, 0, warp, lane, scale, exponent, [&](int k, int, uint16_t q) {
      first[k / 2] = k % 2 == 0 ? q : first[k / 2] | uint32_t(q) << 16;
    });
    // No bulk store of this warp reads the subtile still (none is issued before this hook in the
    // lists that take it; the wait is free then), and every lane has read it.
    if (lane == 0) cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{});
    __syncwarp();
#pragma unroll
    for (int k = 0; k < 32; ++k)
      store_code_pair(codes, k, 0, lane, uint16_t(first[k / 2] >> (16 * (k % 2))));
    transpose_block(staged_base, 1, warp, lane, scale, exponent, [&](int k, int block, uint16_t q) {
      store_code_pair(codes, k, block, lane, q);
    });
    cuda::ptx::fence_proxy_async(cuda::ptx::space_shared); // the codes, visible to the TMA store
    __syncwarp();
    if (lane == 0 && inside && tile.col0 + warp * kColsPerWarp < p.cols) {
      store_subtile(&p.map, codes, tile.row0, tile.col0 + warp * kColsPerWarp);
      cuda::ptx::cp_async_bulk_commit_group();
    }
  }

private:
  static constexpr uint16_t kNanPair = uint16_t(kE4m3NanBits) << 8 | kE4m3NanBits;

  // Code pair k (0..31) of this lane in a 64-row block: ldmatrix k / 4 (h = k / 16: tokens 32 h
  // .. + 31 of the block, g = k / 4 % 4: columns 8 g .. + 7 of the slab), register k % 4 (matrix
  // i: tokens 32 h + 8 i ..), whose lane l holds tokens + 2 (l % 4), + 1 of column 8 g + l / 4.
  // Its place in the box: row 8 g + l / 4 of the warp's 32, token 64 block + 32 h + 8 i + 2 (l %
  // 4), the row's 16-byte chunks swizzled by the row's bits 0..2 (the 128-byte swizzle, the box
  // 1024-byte aligned).
  __device__ static void store_code_pair(uint8_t* codes, int k, int block, int lane, uint16_t q) {
    const int h = k / 16, g = k / 4 % 4, i = k % 4;
    const int row = 8 * g + lane / 4;
    const int token = 64 * block + 32 * h + 8 * i + 2 * (lane % 4);
    const int chunk = (token / 16) ^ (row % 8);
    *reinterpret_cast<uint16_t*>(codes + row * kBlock + chunk * 16 + token % 16) = q;
  }

  // The 32 code pairs of this lane in 64-row block `block` of the warp's slab, to f(k, block, q).
  template <class F>
  __device__ static void transpose_block(uint32_t staged_base, int block, int warp, int lane,
                                         float scale, int exponent, F&& f) {
    const uint32_t subtile =
        staged_base + uint32_t((block * Shape::kSubtilesN + warp) * Sub::kBytes);
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int g = 0; g < 4; ++g) {
        // Lane l addresses row (token) 32 h + l of the block, columns 8 g .. + 7: matrix l / 8.
        uint32_t r[4];
        arch::ldmatrix_x4_trans(subtile + Sub::offset(32 * h + lane, 8 * g), r[0], r[1], r[2],
                                r[3]);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float2 x = unpack2<T>(r[i]);
          const uint16_t q = exponent == kNoScale ? kNanPair : e4m3x2(x.x * scale, x.y * scale);
          f(16 * h + 4 * g + i, block, q);
        }
      }
  }
};

} // namespace coda::epilogue::device

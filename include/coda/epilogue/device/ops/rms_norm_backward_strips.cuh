// K6's RMSNorm backward on a staged tile whose 128 rows are one dgamma reduction block: the whole
// op of the cooperative list's AuxReduce<RmsNormBackward, ReduceOverM<Sum>> (+ ResidualAdd when
// dx accumulates), for the warps that read the staged tile in 16-row strip-subtiles (16 rows by
// 32 columns), on either of two tiles (StripStream says which warp takes which):
//  - staged_wide (gemm/config.hpp): the 128 x 256 tile, three epilogue warps that take its
//    strip-subtiles in turn (driver.cuh, kStrips);
//  - the FP8 mainloop's staged 128 x 128 tile (Fp8StagedShape): four epilogue warps, the list
//    warp-local (driver.cuh, kWarpLocal), each warp its own 16 rows of every subtile.
// Per element, rms_norm_backward():
//   dx = rstd (g gamma - xh zeta) (+ dx as read)   -> the fragment (an in-place TileStore after)
//   h_hat = xh gamma                              -> TMA-stored from a strip buffer of the warp
//   g xh                                          -> dgamma partials, column sums over the
//                                                    tile's 128 rows (one reduction block)
// g is the staged tile's value: alpha dz · w rounded to T (the Stage before this op).
//
// Everything it moves goes by TMA in 16-row strips (4-byte global accesses from these warps slow
// the whole kernel: docs/epilogue.md, "The staged_wide schedule"). Shared memory is what limits
// it: beside staged_wide's 64 KB staged tile and 3 pipeline stages there are ~18 KB (on the
// staged FP8 tile the buffers, 20 KB with dx accumulated and 12 KB without, leave 5 pipeline
// stages of 32 KB where K7 has 6), so each warp has a ring of kSlots strips of x (and of dx,
// loaded with it, on one barrier), one h_hat buffer, and its dgamma column sums in registers: a
// strip-subtile's 32 column sums are reduce-scattered over the warp, one per lane, and each lane
// keeps one sum per slab (kSubtilesN registers: 8 hold a warp's 256 columns). At the tile's end
// the warps merge them through their first ring slot (the ring is drained then) in a fixed
// order: one writer per partial, no atomics.
// gamma comes from global memory (pairs; N is a multiple of 8, so a pair never straddles the
// end), rstd and zeta per strip from global memory: small, L1- and L2-resident.
#pragma once

#include <cstdint>

#include <cuda.h>
#include <cuda/ptx>

#include "coda/arch/shared_memory.cuh"
#include "coda/epilogue/device/driver.cuh"
#include "coda/epilogue/device/staged_tile.cuh"
#include "coda/epilogue/device/tensor_maps.hpp"
#include "coda/epilogue/device/tile_io.cuh"
#include "coda/epilogue/ops/residual_add.hpp"
#include "coda/epilogue/ops/rms_norm_backward.hpp"
#include "coda/gemm/pipeline.cuh"
#include "coda/kernels/args.hpp"

namespace coda::epilogue::device {

// Where an epilogue warp's stream of strip-subtiles goes, in the driver's order. Strip s of the
// tile: rows 16 (s % 4) of 64-row block s / 4; unit u of the tile: slab u % kSlabs of strip
// u / kSlabs.
//  - Dealt (fewer than 4 epilogue warps, driver.cuh kStrips): epilogue warp e takes units e,
//    e + kEpilogueWarps, ..; its position n is unit e + kEpilogueWarps n.
//  - Warp-local (4 epilogue warps): warp e visits its own rows of every subtile, block by block
//    and each block's slabs left to right (driver.cuh, visit_staged_slabs); its position n is
//    slab n % kSlabs of strip 4 (n / kSlabs) + e.
template <class Shape> struct StripStream {
  static constexpr int kSlabs = Shape::kSubtilesN;
  static constexpr int kStripsPerBlock = Shape::kSubRows / kStripRows;
  static constexpr int kUnits = Shape::kBlocks * kStripsPerBlock * kSlabs;
  static constexpr bool kDealt = Shape::kEpilogueWarps < kStripsPerBlock;
  static_assert(kDealt || Shape::kEpilogueWarps == kStripsPerBlock,
                "a warp-local stream has one epilogue warp per strip of a block");
  __device__ static int unit(int warp, int n) {
    if constexpr (kDealt)
      return warp + Shape::kEpilogueWarps * n;
    else
      return (n / kSlabs * kStripsPerBlock + warp) * kSlabs + n % kSlabs;
  }
  __device__ static int positions(int warp) {
    if constexpr (kDealt)
      return (kUnits - warp + Shape::kEpilogueWarps - 1) / Shape::kEpilogueWarps;
    else
      return kUnits / kStripsPerBlock;
  }
  // The tile's strip and unit of strip-subtile `st`, visited as virtual warp w (its rows 16 w ..),
  // and the epilogue warp whose stream holds it, at which position.
  __device__ static int strip(const Subtile& st, int w) { return st.block * kStripsPerBlock + w; }
  __device__ static int unit_of(const Subtile& st, int w) {
    return strip(st, w) * kSlabs + st.slab;
  }
  __device__ static int owner(const Subtile& st, int w) {
    if constexpr (kDealt)
      return unit_of(st, w) % Shape::kEpilogueWarps;
    else
      return w;
  }
  __device__ static int position(const Subtile& st, int w) {
    if constexpr (kDealt)
      return unit_of(st, w) / Shape::kEpilogueWarps;
    else
      return st.block * kSlabs + st.slab;
  }
};

template <class Shape, class T, bool kAccumulate, int kSlots = 2>
struct RmsNormBackwardStrips : OpBase {
  static_assert(sizeof(T) == 2, "16-bit x, dx, gamma and h_hat");
  static_assert(Shape::kStaged && Shape::kBlocks * Shape::kSubRows == kReduceBlock &&
                    Shape::kSubtilesN <= 8,
                "a staged tile of 128 rows (one dgamma block) and at most 256 columns");
  using Stream = StripStream<Shape>;
  static constexpr int kWarps = Shape::kEpilogueWarps;
  static constexpr int kInputs = kAccumulate ? 2 : 1; // x (and dx) per slot
  static constexpr uint32_t kStripBytes = kStripRows * SubtileLayout<T>::kRowBytes;
  static_assert(Shape::kCols * sizeof(float) <= kStripBytes,
                "a warp's dgamma column sums fit its first ring slot");
  static constexpr bool kWarpLocal = true;
  static constexpr bool kRollSubtiles = true; // the ring's bookkeeping; 120 registers

  struct Params {
    CUtensorMap x;           // subtile_map of x [M, N] in kStripRows-row boxes
    CUtensorMap dx;          // (kAccumulate) of dx [M, N], read before the in-place store
    CUtensorMap h_hat;       // of h_hat [M, N]
    const uint32_t* gamma{}; // [N] 16-bit, as pairs
    const float* rstd{};     // [M]
    const float* zeta{};     // [M]
    float* partials{};       // [N, blocks], row stride `stride`
    int64_t stride = 0;
    int32_t rows = 0, cols = 0, blocks = 0; // M, N, ceil(M / kReduceBlock)
  };
  struct SharedStorage {
    alignas(1024) uint8_t in[kWarps][kSlots][kInputs][kStripBytes];
    uint8_t h_hat[kWarps][kStripBytes];
    uint64_t full[kWarps][kSlots];
  };
  using Ctx = OpContext<Params, SharedStorage>;

  uint32_t consumed;      // positions this warp has read, over all tiles: the ring position
  uint32_t phase;         // bit s: the parity the next wait on slot s expects
  int rows_strip;         // the tile's strip whose rows rstd and zeta hold (-1: none yet)
  float rstd[2], zeta[2]; // of the thread's two rows of that strip
  // [slab]: the warp's sum of column 8 (k / 2) + 2 q + k % 2 of the slab, lane 4 k + q
  float dgamma[Shape::kSubtilesN];

  __device__ static void init(SharedStorage& s) {
    for (int w = 0; w < kWarps; ++w)
      for (int slot = 0; slot < kSlots; ++slot) cuda::ptx::mbarrier_init(&s.full[w][slot], 1);
  }
  __device__ void begin_kernel(const Ctx&) { consumed = phase = 0; }

  // The tile's first kSlots positions, before the staged tile arrives (the ring is drained and,
  // after end_tile's fence and barrier, free of the dgamma merge).
  __device__ void begin_tile(const Ctx& c, sm90::EpilogueTile tile, uint32_t) {
#pragma unroll
    for (int k = 0; k < Shape::kSubtilesN; ++k) dgamma[k] = 0.f;
    rows_strip = -1;
    const int warp = epilogue_warp(c);
    if (c.wg.lane() != 0) return;
    const int count = Stream::positions(warp) < kSlots ? Stream::positions(warp) : kSlots;
    for (int k = 0; k < count; ++k)
      load(c, warp, (consumed + uint32_t(k)) % kSlots, tile.row0, tile.col0, k);
  }

  __device__ void visit(const Ctx& c, const Subtile& st, float (&v)[16]) {
    const Params& p = c.params;
    const int w = c.wg.warp(); // the virtual warp: this strip's rows in its subtile
    const int warp = Stream::owner(st, w);
    const int lane = c.wg.lane();
    if (const int strip = Stream::strip(st, w); strip != rows_strip) { // its rows' rstd, zeta
      rows_strip = strip;
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        const int32_t row = st.row0 + SubtileMap::slot_row(c.wg.thread, s);
        rstd[s] = row < p.rows ? __ldg(p.rstd + row) : 0.f;
        zeta[s] = row < p.rows ? __ldg(p.zeta + row) : 0.f;
      }
    }
    const uint32_t slot = consumed % kSlots;
    sm90::mbarrier_wait(&c.smem.full[warp][slot], (phase >> slot) & 1);
    phase ^= 1u << slot;
    ++consumed;
    // 32-bit shared loads at lane_offset + pair_offset (below), not generic ones, whose 64-bit
    // swizzled addresses cost more than the math on the values.
    static_assert(pair_offsets_follow_the_layout(), "pair_offset is the subtile layout's offset");
    const uint32_t q = uint32_t(lane) % 4;
    const uint32_t at = lane_offset(uint32_t(lane));
    const uint32_t x = uint32_t(__cvta_generic_to_shared(c.smem.in[warp][slot][0])) + at;
    const uint32_t dx = uint32_t(__cvta_generic_to_shared(c.smem.in[warp][slot][kInputs - 1])) + at;
    // gamma of the thread's columns 8 j + 2 q (+1): one pair per j, shared by both rows. N is a
    // multiple of 8 and so is col0, so a group of 8 columns is whole or past the end.
    const uint32_t* gamma = p.gamma + st.col0 / 2 + int(q);
    // Pair by pair (120 registers: nothing held 16 wide but the fragment): h_hat packed for the
    // store, the dgamma terms folded over the thread's two rows (rows at or past M left out) as
    // ReduceOverM folds them.
    const int32_t row0 = st.row0 + SubtileMap::slot_row(c.wg.thread, 0);
    const bool valid[2] = {row0 < p.rows, row0 + 8 < p.rows};
    uint32_t h_hat[8];
    float term[8] = {}; // [2 j + e]: column 8 j + 2 q + e, both rows
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 gv =
          st.col0 + 8 * j < p.cols ? unpack2<T>(__ldg(gamma + 4 * j)) : make_float2(0.f, 0.f);
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        const int i = 4 * j + 2 * s; // the fragment's registers of (row slot s, pair j)
        const uint32_t offset = pair_offset(uint32_t(lane), uint32_t(j), uint32_t(s));
        const float2 xv = unpack2<T>(arch::load_shared_u32(x + offset));
        const auto lo = rms_norm_backward(v[i], xv.x, rstd[s], zeta[s], gv.x);
        const auto hi = rms_norm_backward(v[i + 1], xv.y, rstd[s], zeta[s], gv.y);
        v[i] = lo.dx, v[i + 1] = hi.dx;
        if constexpr (kAccumulate) {
          const float2 dv = unpack2<T>(arch::load_shared_u32(dx + offset));
          v[i] = residual_add(v[i], dv.x, 1.f), v[i + 1] = residual_add(v[i + 1], dv.y, 1.f);
        }
        h_hat[i / 2] = pack2<T>(lo.h_hat, hi.h_hat);
        if (valid[s]) term[2 * j] += lo.dgamma_term, term[2 * j + 1] += hi.dgamma_term;
      }
    }
    __syncwarp(); // every lane has read the slot: refill it
    const int next = Stream::position(st, w) + kSlots;
    if (lane == 0 && next < Stream::positions(warp))
      load(c, warp, slot, st.row0 - st.block * Shape::kSubRows, st.col0 - st.slab * Shape::kSubCols,
           next);

    // The h_hat store that last read this warp's buffer (issued a strip-subtile ago, in lane 0's
    // last bulk group) is done: lane 0 waits, the warp follows.
    if (lane == 0) cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{});
    __syncwarp();
    Subtile16::store(c.smem.h_hat[warp] - w * int(kStripBytes), c.wg.thread, h_hat);

    // The strip's column sums over the warp's 8 row groups (lane bits 2-4), reduce-scattered:
    // at each halving a lane keeps half of its sums and adds the partner's half, so after three
    // exchanges (7 shuffles, not 24) lane 4 k + q holds the whole sum of term k, and keeps it in
    // dgamma[slab] (column 8 (k / 2) + 2 q + k % 2 of the slab).
    float half4[4], half2[2];
    const bool b4 = lane & 16, b3 = lane & 8, b2 = lane & 4;
#pragma unroll
    for (int k = 0; k < 4; ++k) half4[k] = reduce_half(term[k], term[k + 4], b4, 16);
#pragma unroll
    for (int k = 0; k < 2; ++k) half2[k] = reduce_half(half4[k], half4[k + 2], b3, 8);
    const float sum = reduce_half(half2[0], half2[1], b2, 4);
    // Warp-local, the slab is the driver's rolled loop counter, and the compiler folded the
    // branches below into one store at dgamma[st.slab]: a run-time index, which put the op's state
    // (and the driver's) in local memory (a 96-byte stack frame, ptxas). Adding 0 to the other
    // slabs' sums keeps every index constant; the dealt stream keeps the branches (staged_wide's
    // code unchanged).
#pragma unroll
    for (int k = 0; k < Shape::kSubtilesN; ++k)
      if constexpr (Stream::kDealt) {
        if (st.slab == k) dgamma[k] += sum;
      } else {
        dgamma[k] += st.slab == k ? sum : 0.f;
      }
  }

  // Lane 0, after the driver's fence: the warp's h_hat strip (st is the strip: kStripRows rows
  // from st.row0; the thread is still the strip's virtual one).
  __device__ void issue(const Ctx& c, const Subtile& st) {
    store_subtile(&c.params.h_hat, c.smem.h_hat[Stream::owner(st, c.wg.warp())], st.col0, st.row0);
  }

  // The warps' column sums merged in a fixed order, one partial per column.
  __device__ void end_tile(const Ctx& c, sm90::EpilogueTile tile) {
    const Params& p = c.params;
    const int warp = epilogue_warp(c), lane = c.wg.lane();
    __syncwarp(); // every lane's reads of the ring are done
    float* mine = reinterpret_cast<float*>(c.smem.in[warp][0][0]);
    const int k = lane / 4, column = 8 * (k / 2) + 2 * (lane % 4) + k % 2;
#pragma unroll
    for (int slab = 0; slab < Shape::kSubtilesN; ++slab)
      mine[slab * Shape::kSubCols + column] = dgamma[slab];
    sync();
    const int32_t block = tile.row0 / int32_t(kReduceBlock);
    for (int col = warp * arch::kWarpSize + lane; col < Shape::kCols;
         col += kWarps * arch::kWarpSize) {
      float s = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) s += reinterpret_cast<const float*>(c.smem.in[w][0][0])[col];
      const int32_t n = tile.col0 + col;
      if (n < p.cols && block < p.blocks) p.partials[int64_t(n) * p.stride + block] = s;
    }
    // The next tile's TMA loads (async proxy) write where these generic accesses were.
    cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
    sync();
  }

  static Params params(const TensorView& x, const TensorView& dx, const TensorView& gamma,
                       const TensorView& rstd, const TensorView& zeta, const TensorView& h_hat,
                       const TensorView& partials) {
    Params p;
    p.x = subtile_map("x", x, kStripRows);
    if constexpr (kAccumulate) p.dx = subtile_map("dx", dx, kStripRows);
    p.h_hat = subtile_map("h_hat", h_hat, kStripRows);
    p.gamma = gamma.ptr<const uint32_t>();
    p.rstd = rstd.ptr<const float>();
    p.zeta = zeta.ptr<const float>();
    p.partials = partials.ptr<float>();
    p.stride = partials.stride[0];
    p.rows = int32_t(x.shape[0]);
    p.cols = int32_t(x.shape[1]);
    p.blocks = int32_t(partials.shape[1]);
    return p;
  }

private:
  __device__ static int epilogue_warp(const Ctx& c) {
    return c.wg.warp() - Shape::kFirstEpilogueWarp;
  }

  // A lane's pairs in a strip buffer (16 rows of the subtile's 64-byte swizzled layout,
  // tile_io.cuh): the pair in row slot s, column group j is at row lane / 4 + 8 s, column
  // 8 j + 2 q. The swizzle key (row >> 1) & 3 is the same for both rows of a lane and for every
  // strip, so the offset splits into the lane's part (added to the buffer's address once) and
  // 16 (j ^ key) + 512 s (the chunk j lands in, and an immediate).
  CODA_HD static constexpr uint32_t lane_offset(uint32_t lane) {
    return lane / 4 * SubtileLayout<T>::kRowBytes + 4 * (lane % 4);
  }
  CODA_HD static constexpr uint32_t pair_offset(uint32_t lane, uint32_t j, uint32_t s) {
    return (j ^ ((lane >> 3) % 4)) * 16 + s * 8 * SubtileLayout<T>::kRowBytes;
  }
  // ... which together are the layout's own offset (SubtileLayout::offset), for every lane, j, s.
  static constexpr bool pair_offsets_follow_the_layout() {
    for (uint32_t lane = 0; lane < 32; ++lane)
      for (uint32_t j = 0; j < 4; ++j)
        for (uint32_t s = 0; s < 2; ++s) {
          const uint32_t row = lane / 4 + 8 * s, col = 8 * j + 2 * (lane % 4);
          const uint32_t layout = arch::swizzle_offset(
              SubtileLayout<T>::kSwizzle, row * SubtileLayout<T>::kRowBytes + col * sizeof(T));
          if (lane_offset(lane) + pair_offset(lane, j, s) != layout) return false;
        }
    return true;
  }

  // One halving of a reduce-scatter across the lanes `mask` apart: the lane with the mask bit
  // keeps b and sends a, its partner keeps a and sends b; each adds what it receives.
  __device__ static float reduce_half(float a, float b, bool upper, int mask) {
    const float keep = upper ? b : a, send = upper ? a : b;
    return keep + __shfl_xor_sync(0xffffffffu, send, mask);
  }

  __device__ static void sync() {
    arch::named_barrier_sync(uint32_t(sm90::NamedBarrier::epilogue_warpgroup0),
                             kWarps * arch::kWarpSize);
  }

  // Lane 0: position n of `warp`'s stream of the tile at (row0, col0) into `slot`.
  __device__ static void load(const Ctx& c, int warp, uint32_t slot, int32_t row0, int32_t col0,
                              int n) {
    namespace ptx = cuda::ptx;
    const int unit = Stream::unit(warp, n), strip = unit / Stream::kSlabs;
    uint64_t* bar = &c.smem.full[warp][slot];
    ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, bar,
                                   uint32_t(kInputs * kStripBytes));
    const int32_t coords[2] = {col0 + unit % Stream::kSlabs * Shape::kSubCols,
                               row0 + strip / Stream::kStripsPerBlock * Shape::kSubRows +
                                   strip % Stream::kStripsPerBlock * kStripRows};
    ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global, c.smem.in[warp][slot][0],
                              &c.params.x, coords, bar);
    if constexpr (kAccumulate)
      ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global,
                                c.smem.in[warp][slot][kInputs - 1], &c.params.dx, coords, bar);
  }
};

} // namespace coda::epilogue::device

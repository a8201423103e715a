// K6's RMSNorm backward on the staged_wide schedule (gemm/config.hpp): the whole op of the
// cooperative list's AuxReduce<RmsNormBackward, ReduceOverM<Sum>> (+ ResidualAdd when dx
// accumulates), for three epilogue warps that each take 16-row strips of the staged 128 x 256
// tile in turn (driver.cuh, kStrips). Per element, the shared rms_norm_backward():
//   dx = rstd (g gamma - xh zeta) (+ dx as read)   -> the fragment (an in-place TileStore after)
//   h_hat = xh gamma                              -> TMA-stored from a strip buffer of the warp
//   g xh                                          -> dgamma partials, column sums over the
//                                                    tile's 128 rows (one reduction block)
// g is the staged tile's value: alpha dz · w rounded to T (the Stage before this op).
//
// Everything it moves goes by TMA in 16-row strips (4-byte global accesses from these warps slow
// the whole kernel: docs/epilogue.md, "The staged_wide schedule"). Shared memory is what limits
// it: beside the 64 KB staged tile and 3 pipeline stages there are ~18 KB, so each warp has a
// ring of kSlots strips of x (and of dx, loaded with it, on one barrier), one h_hat buffer, and
// its dgamma column sums in registers: after a strip-subtile's shuffles every lane of a quad
// class holds the same 8 column sums, and lane 4 s + q keeps those of slab s (8 registers hold
// the warp's 256 columns). At the tile's end the warps merge them through their first ring slot
// (the ring is drained then) in a fixed order: one writer per partial, no atomics.
// gamma comes from global memory (pairs; N is a multiple of 8, so a pair never straddles the
// end), rstd and zeta per strip from global memory: small, L1- and L2-resident.
#pragma once

#include <cstdint>

#include <cuda.h>
#include <cuda/ptx>

#include "coda/epilogue/device/driver.cuh"
#include "coda/epilogue/device/tensor_maps.hpp"
#include "coda/epilogue/device/tile_io.cuh"
#include "coda/epilogue/ops/residual_add.hpp"
#include "coda/epilogue/ops/rms_norm_backward.hpp"
#include "coda/gemm/pipeline.cuh"
#include "coda/gemm/staged_tile.cuh"
#include "coda/kernels/args.hpp"

namespace coda::epilogue::device {

// Where an epilogue warp's stream of strip-subtiles goes: position n of epilogue warp e is slab
// n % kSlabs of the tile's strip e + kEpilogueWarps (n / kSlabs); strip s is rows 16 (s % 4) of
// 64-row block s / 4 (the order in which driver.cuh's strip mode visits them).
template <class Shape> struct StripStream {
  static constexpr int kSlabs = Shape::kSubtilesN;
  static constexpr int kStripsPerBlock = Shape::kSubRows / kStripRows;
  static constexpr int kStrips = Shape::kBlocks * kStripsPerBlock;
  __device__ static int position_strip(int warp, int n) {
    return warp + Shape::kEpilogueWarps * (n / kSlabs);
  }
  __device__ static int positions(int warp) {
    const int strips = (kStrips - warp + Shape::kEpilogueWarps - 1) / Shape::kEpilogueWarps;
    return strips * kSlabs;
  }
  // The epilogue warp visiting strip-subtile `st` as virtual warp w (its rows 16 w ..).
  __device__ static int owner(const Subtile& st, int w) {
    return (st.block * kStripsPerBlock + w) % Shape::kEpilogueWarps;
  }
  __device__ static int position(const Subtile& st, int w) {
    const int strip = st.block * kStripsPerBlock + w;
    return strip / Shape::kEpilogueWarps * kSlabs + st.slab;
  }
};

template <class Shape, class T, bool kAccumulate, int kSlots = 2>
struct RmsNormBackwardStrips : OpBase {
  static_assert(sizeof(T) == 2, "16-bit x, dx, gamma and h_hat");
  static_assert(Shape::kStaged && Shape::kEpilogueWarps < 4 && Shape::kCols == 256 &&
                    Shape::kBlocks * Shape::kSubRows == kReduceBlock,
                "the staged_wide epilogue's op: a 128 x 256 tile, one dgamma block of rows");
  using Stream = StripStream<Shape>;
  static constexpr int kWarps = Shape::kEpilogueWarps;
  static constexpr int kInputs = kAccumulate ? 2 : 1; // x (and dx) per slot
  static constexpr uint32_t kStripBytes = kStripRows * SubtileLayout<T>::kRowBytes;
  static_assert(Shape::kCols * sizeof(float) <= kStripBytes,
                "a warp's dgamma column sums fit its first ring slot");
  static constexpr bool kWarpLocal = true;
  static constexpr bool kRollSubtiles = true; // the ring's bookkeeping; 88 registers

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
  float rstd[2], zeta[2]; // of the thread's two rows of the current strip
  float dgamma[8];        // lane 4 s + q: the warp's column sums of slab s, quad lane q

  __device__ static void init(SharedStorage& s) {
    for (int w = 0; w < kWarps; ++w)
      for (int slot = 0; slot < kSlots; ++slot) cuda::ptx::mbarrier_init(&s.full[w][slot], 1);
  }
  __device__ void begin_kernel(const Ctx&) { consumed = phase = 0; }

  // The tile's first kSlots positions, before the staged tile arrives (the ring is drained and,
  // after end_tile's fence and barrier, free of the dgamma merge).
  __device__ void begin_tile(const Ctx& c, sm90::EpilogueTile tile, uint32_t) {
#pragma unroll
    for (int k = 0; k < 8; ++k) dgamma[k] = 0.f;
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
    if (st.slab == 0) { // a new strip: its rows' rstd and zeta
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
    // A strip buffer holds rows 16 w .. of the subtile's layout (the swizzle repeats every 8
    // rows): address it as the subtile it is part of.
    const int shift = w * int(kStripBytes);
    const uint8_t* x = c.smem.in[warp][slot][0] - shift;
    const uint8_t* dx = c.smem.in[warp][slot][kInputs - 1] - shift;
    // Pair by pair (104 registers: nothing held 16 wide but the fragment): h_hat packed for the
    // store, the dgamma terms folded over the thread's two rows (rows at or past M left out) as
    // ReduceOverM folds them.
    const int32_t row0 = st.row0 + SubtileMap::slot_row(c.wg.thread, 0);
    const bool valid[2] = {row0 < p.rows, row0 + 8 < p.rows};
    uint32_t h_hat[8];
    float term[8] = {}; // [2 j + e]: column 8 j + 2 q + e, both rows
#pragma unroll
    for (int i = 0; i < 16; i += 2) {
      const int row = SubtileMap::row(c.wg.thread, i), col = SubtileMap::col(c.wg.thread, i);
      const int s = SubtileMap::row_slot(i);
      const float2 xv = read_pair<T>(x, row, col);
      const int n = st.col0 + col;
      const float2 gv = n < p.cols ? unpack2<T>(__ldg(p.gamma + n / 2)) : make_float2(0.f, 0.f);
      const auto lo = rms_norm_backward(v[i], xv.x, rstd[s], zeta[s], gv.x);
      const auto hi = rms_norm_backward(v[i + 1], xv.y, rstd[s], zeta[s], gv.y);
      v[i] = lo.dx, v[i + 1] = hi.dx;
      if constexpr (kAccumulate) {
        const float2 dv = read_pair<T>(dx, row, col);
        v[i] = residual_add(v[i], dv.x, 1.f), v[i + 1] = residual_add(v[i + 1], dv.y, 1.f);
      }
      h_hat[i / 2] = pack2<T>(lo.h_hat, hi.h_hat);
      if (valid[s]) term[i / 4 * 2] += lo.dgamma_term, term[i / 4 * 2 + 1] += hi.dgamma_term;
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
    sm90::Subtile16::store(c.smem.h_hat[warp] - shift, c.wg.thread, h_hat);

    // The strip's column sums: the 8 row groups of the warp merged by shuffles (every lane of a
    // quad class ends with the same sums); lane 4 s + q keeps those of slab s.
    const bool mine = lane / 4 == st.slab;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      float s = term[k];
#pragma unroll
      for (int mask = 4; mask <= 16; mask *= 2) s += __shfl_xor_sync(0xffffffffu, s, mask);
      if (mine) dgamma[k] += s;
    }
  }

  // Lane 0, after the driver's fence: the warp's h_hat strip (st is the strip: kStripRows rows
  // from st.row0; the thread is still the strip's virtual one).
  __device__ void issue(const Ctx& c, const Subtile& st) {
    store_subtile(&c.params.h_hat, c.smem.h_hat[Stream::owner(st, c.wg.warp())], st.col0, st.row0);
  }

  // The three warps' column sums merged in a fixed order, one partial per column.
  __device__ void end_tile(const Ctx& c, sm90::EpilogueTile tile) {
    const Params& p = c.params;
    const int warp = epilogue_warp(c), lane = c.wg.lane();
    __syncwarp(); // every lane's reads of the ring are done
    float* mine = reinterpret_cast<float*>(c.smem.in[warp][0][0]);
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        mine[lane / 4 * Shape::kSubCols + 8 * j + 2 * (lane % 4) + e] = dgamma[2 * j + e];
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
  __device__ static int epilogue_warp(const Ctx& c) { return c.wg.warp() - (4 - kWarps); }

  __device__ static void sync() {
    arch::named_barrier_sync(uint32_t(sm90::NamedBarrier::epilogue_warpgroup0),
                             kWarps * arch::kWarpSize);
  }

  // Lane 0: position n of `warp`'s stream of the tile at (row0, col0) into `slot`.
  __device__ static void load(const Ctx& c, int warp, uint32_t slot, int32_t row0, int32_t col0,
                              int n) {
    namespace ptx = cuda::ptx;
    const int strip = Stream::position_strip(warp, n);
    uint64_t* bar = &c.smem.full[warp][slot];
    ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, bar,
                                   uint32_t(kInputs * kStripBytes));
    const int32_t coords[2] = {col0 + n % Stream::kSlabs * Shape::kSubCols,
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

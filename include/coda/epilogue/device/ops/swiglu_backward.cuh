// Device side of SwigluBackward (coda/epilogue/ops/swiglu_backward.hpp), K7's op: the fragment
// holds dy = dL/d act [M, F]; the saved interleaved pre-activation [M, 2F] gives per element
// (g, u) = (preact[m, 2j], preact[m, 2j + 1]), and the shared swiglu_backward() gives
//   act = silu(g) u                  -> the fragment (a TileStore after it)
//   (dg, du)                         -> dpreact [M, 2F], interleaved as preact, TMA-stored here
//   g dg + u du                      -> aux, for the ReduceOverN of AuxReduce (zeta partials)
// so it is used as AuxReduce<SwigluBackward, ReduceOverN<Sum>> (aux_reduce.cuh).
//
// The 2X container trick: preact and dpreact are moved as [M, F] tensors of 32-bit (g, u)
// words, so element (m, j) of a container subtile is exactly the accumulator element (m, j):
// the same 64 x 32 subtiles, boxes and coordinates as a D-shaped fp32 tile (128-byte rows,
// 128-byte swizzle; tensor_maps.hpp's pair_subtile_map). preact arrives through a ring of kSlots
// subtile buffers per warpgroup (load_ring.cuh; zero past the edges, so g = u = 0 there and every
// value stays finite); dpreact leaves through two buffers per warpgroup, like TileStore's.
#pragma once

#include <cstdint>

#include <cuda.h>
#include <cuda/ptx>

#include "coda/epilogue/device/driver.cuh"
#include "coda/epilogue/device/load_ring.cuh"
#include "coda/epilogue/device/tensor_maps.hpp"
#include "coda/epilogue/device/tile_io.cuh"
#include "coda/epilogue/ops/swiglu_backward.hpp"

namespace coda::epilogue::device {

template <class Shape, class T, int kSlots = 4> struct SwigluBackward : OpBase {
  static_assert(sizeof(T) == 2, "16-bit pre-activations and gradients");
  using Pairs = SubtileLayout<float>; // 64 x 32 32-bit containers, 128-byte swizzle
  using Ring = SubtileLoadRing<Shape, Pairs::kBytes, kSlots>;
  // An exp per element and the ring's bookkeeping: the rolled subtile loop (unrolled, ptxas
  // spills 208 bytes on the ping-pong config).
  static constexpr bool kRollSubtiles = true;

  struct Params {
    CUtensorMap preact;  // pair_subtile_map of preact [M, 2F]
    CUtensorMap dpreact; // pair_subtile_map of dpreact [M, 2F]
  };
  struct SharedStorage {
    typename Ring::SharedStorage preact;
    alignas(1024) uint8_t dpreact[Shape::kWarpgroups][2][Pairs::kBytes];
  };
  using Ctx = OpContext<Params, SharedStorage>;

  Ring ring;

  __device__ static void init(SharedStorage& s) { Ring::init(s.preact); }
  __device__ void begin_kernel(const Ctx&) { ring.begin_kernel(); }
  __device__ void begin_tile(const Ctx& c, sm90::EpilogueTile tile, uint32_t) {
    ring.begin_tile(c.smem.preact, c.params.preact, c.wg, tile);
  }
  __device__ void prefetch(const Ctx& c, const Subtile& next) {
    ring.prefetch(c.smem.preact, c.params.preact, c.wg, next);
  }

  // Registers (i, i + 1), i even, hold columns (j, j + 1) of one row: two adjacent containers,
  // one 8-byte word of the swizzled buffer (the swizzle moves 16-byte chunks).
  __device__ void visit(const Ctx& c, const Subtile& st, float (&v)[16], float (&aux)[16]) {
    const uint8_t* in = ring.acquire(c.smem.preact, c.wg);
    uint8_t* out = c.smem.dpreact[c.wg.index][st.slot];
#pragma unroll
    for (int i = 0; i < 16; i += 2) {
      const uint32_t off =
          Pairs::offset(SubtileMap::row(c.wg.thread, i), SubtileMap::col(c.wg.thread, i));
      const uint2 z = *reinterpret_cast<const uint2*>(in + off);
      const float2 lo_pair = unpack2<T>(z.x), hi_pair = unpack2<T>(z.y);
      const auto lo = swiglu_backward(lo_pair.x, lo_pair.y, v[i]);
      const auto hi = swiglu_backward(hi_pair.x, hi_pair.y, v[i + 1]);
      *reinterpret_cast<uint2*>(out + off) =
          make_uint2(pack2<T>(lo.dgate, lo.dup), pack2<T>(hi.dgate, hi.dup));
      v[i] = lo.act, v[i + 1] = hi.act;
      aux[i] = lo.zeta_term, aux[i + 1] = hi.zeta_term;
    }
  }

  // Without AuxReduce the driver would call OpBase's empty visit and the op would do nothing.
  template <class C> __device__ void visit(const C&, const Subtile&, float (&)[16]) {
    static_assert(sizeof(C) == 0, "SwigluBackward leaves an aux value per element: use it as "
                                  "AuxReduce<SwigluBackward, a reduction> (aux_reduce.cuh)");
  }

  __device__ void issue(const Ctx& c, const Subtile& st) {
    // container j = accumulator column j
    store_subtile(&c.params.dpreact, c.smem.dpreact[c.wg.index][st.slot], st.col0, st.row0);
  }

  static Params params(const TensorView& preact, const TensorView& dpreact) {
    return Params{pair_subtile_map("preact", preact), pair_subtile_map("dpreact", dpreact)};
  }
};

} // namespace coda::epilogue::device

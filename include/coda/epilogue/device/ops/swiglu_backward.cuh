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

// Registers (i, i + 1), i even, of the fragment: the pair of dy values of two adjacent containers
// z = (g, u) pairs. Replaces them by act, leaves the zeta terms in aux, returns the (dg, du) pairs
// packed as the containers are.
template <class T>
__device__ __forceinline__ uint2 swiglu_backward_pair(uint2 z, float (&v)[16], float (&aux)[16],
                                                      int i) {
  const float2 lo_pair = unpack2<T>(z.x), hi_pair = unpack2<T>(z.y);
  const auto lo = swiglu_backward(lo_pair.x, lo_pair.y, v[i]);
  const auto hi = swiglu_backward(hi_pair.x, hi_pair.y, v[i + 1]);
  v[i] = lo.act, v[i + 1] = hi.act;
  aux[i] = lo.zeta_term, aux[i + 1] = hi.zeta_term;
  return make_uint2(pack2<T>(lo.dgate, lo.dup), pack2<T>(hi.dgate, hi.dup));
}

template <class Shape, class T, int kSlots = 4> struct SwigluBackward : OpBase {
  static_assert(sizeof(T) == 2, "16-bit pre-activations and gradients");
  using Pairs = SubtileLayout<float>; // 64 x 32 32-bit containers, 128-byte swizzle
  using Ring = SubtileLoadRing<Shape, Pairs::kBytes, kSlots>;
  // An exp per element and the ring's bookkeeping: the rolled subtile loop (unrolled, ptxas
  // spills 208 bytes on the ping-pong config; rolled by pairs, 112).
  static constexpr bool kRollSubtiles = true;
  static constexpr bool kRollPairs = false;

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
      *reinterpret_cast<uint2*>(out + off) =
          swiglu_backward_pair<T>(*reinterpret_cast<const uint2*>(in + off), v, aux, i);
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

// The staged schedule's SwigluBackward: the epilogue warpgroup has a whole mainloop per tile,
// but the 4 pipeline stages and the staged tile leave no room for a warpgroup's (g, u) ring.
// Each thread loads its containers from global memory into registers, one subtile ahead (8-byte
// loads, a quad's 32 bytes contiguous), and writes its (dg, du) pairs to global memory from
// registers, as registers (i, i + 1) hold two adjacent containers: one 8-byte store per pair of
// values. Past the edges g = u = 0 and nothing is stored, as the TMA ring's zero fill gives.
// Measured against it and dropped (docs/epilogue.md, experiments): an L2 prefetch of the tile's
// rows by the consumers (K7 1.29 -> 1.46 of the plain GEMM at Llama-1B, H100), each warp's own
// TMA ring of 16-row strips (no gain), and the loads under an L2 evict-first policy (1.30 ->
// 1.37).
//
// The epilogue warpgroup is one warp per scheduler, so its instruction count is its time (K7's
// profile, docs/epilogue.md): a subtile's 8 accesses per thread are addressed from one row pointer
// plus constant offsets, and guarded by 2 row and 4 column tests instead of a test pair each.
template <class Shape, class T> struct SwigluBackwardGlobal : OpBase {
  static_assert(sizeof(T) == 2, "16-bit pre-activations and gradients");
  static_assert(Shape::kStaged, "the staged schedule's epilogue warpgroup");
  static constexpr bool kRollSubtiles = true; // an exp per element
  static constexpr int kSubtiles = Shape::kBlocks * Shape::kSubtilesN;

  struct Params {
    const uint32_t* preact = nullptr; // [M, F] (g, u) containers, row stride in containers
    uint32_t* dpreact = nullptr;      // [M, F] (dg, du) containers
    int64_t preact_stride = 0, dpreact_stride = 0;
    int32_t rows = 0, cols = 0; // M, F (a multiple of 8: GEMM N, api/rules.cpp)
  };
  using Ctx = OpContext<Params, SharedStorage>;

  static Params params(const TensorView& preact, const TensorView& dpreact) {
    Params p;
    p.preact = preact.ptr<const uint32_t>();
    p.dpreact = dpreact.ptr<uint32_t>();
    p.preact_stride = preact.stride[0] / 2; // in (g, u) containers: 16-byte aligned rows
    p.dpreact_stride = dpreact.stride[0] / 2;
    p.rows = int32_t(preact.shape[0]);
    p.cols = int32_t(preact.shape[1] / 2);
    return p;
  }

  // The containers of the next subtile, loaded into registers while this one is computed: pair
  // i / 2 of this thread. One subtile ahead: two measured (H200, c43e7e4, bench_fused) 1.408x the
  // plain GEMM at Llama-1B against one's 1.382, and 1.065 against 1.092 at Llama-8B, a split
  // within the spread, for 16 more registers.
  uint2 pending[8];

  __device__ void begin_visit(const Ctx& c, sm90::EpilogueTile tile) {
    load(c, tile.row0, tile.col0, pending);
  }

  __device__ void visit(const Ctx& c, const Subtile& st, float (&v)[16], float (&aux)[16]) {
    uint2 z[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) z[i] = pending[i];
    if (has_next(st)) {
      const int2 next = next_origin(st);
      load(c, next.x, next.y, pending);
    }
    compute(c.params, c.wg.thread, st, z, v, aux);
  }

  // Without AuxReduce the driver would call OpBase's empty visit and the op would do nothing.
  template <class C> __device__ void visit(const C&, const Subtile&, float (&)[16]) {
    static_assert(sizeof(C) == 0, "SwigluBackwardGlobal leaves an aux value per element: use it "
                                  "as AuxReduce<SwigluBackwardGlobal, a reduction>");
  }

private:
  // The subtile's math on the containers z of `thread` (c.wg.thread) (pair i / 2 of its registers),
  // each (dg, du) pair stored to global memory as it is made.
  __device__ static void compute(const Params& p, int thread, const Subtile& st,
                                 const uint2 (&z)[8], float (&v)[16], float (&aux)[16]) {
    const Lanes lanes(thread, st.row0, st.col0);
    uint32_t* out = p.dpreact + lanes.first(p.dpreact_stride);
    // The math is written out twice, once per store path, so that each result is stored as it
    // is made (held for one store pass, the 16 results spilled the 128-register warpgroup).
    const auto run = [&](auto&& store) {
#pragma unroll
      for (int i = 0; i < 16; i += 2)
        store(i, out + Lanes::offset(i, p.dpreact_stride),
              swiglu_backward_pair<T>(z[i / 2], v, aux, i));
    };
    if (interior(st.row0, st.col0, p)) {
      run([](int, uint32_t* to, uint2 d) { *reinterpret_cast<uint2*>(to) = d; });
    } else {
      const Edges edges(lanes, p);
      run([&](int i, uint32_t* to, uint2 d) {
        if (edges.in(i)) *reinterpret_cast<uint2*>(to) = d;
      });
    }
  }

  // The origin of the subtile after `st` in the driver's order (row-block major: one slab to the
  // right, or the first slab of the next 64-row block), from st's own (no division).
  __device__ static bool has_next(const Subtile& st) {
    return st.block * Shape::kSubtilesN + st.slab + 1 < kSubtiles;
  }
  __device__ static int2 next_origin(const Subtile& st) {
    const bool wrap = st.slab + 1 == Shape::kSubtilesN;
    return make_int2(wrap ? st.row0 + Shape::kSubRows : st.row0,
                     wrap ? st.col0 - (Shape::kSubtilesN - 1) * Shape::kSubCols
                          : st.col0 + Shape::kSubCols);
  }

  // A thread's place in a subtile at (row0, col0): register pair i (i even) is in row slot
  // (i / 2) % 2 (rows 8 apart) and column group i / 4 (8 containers apart) of its first pair.
  struct Lanes {
    int32_t row, col; // of register pair 0
    __device__ Lanes(int thread, int32_t row0, int32_t col0)
        : row(row0 + SubtileMap::row(thread, 0)), col(col0 + SubtileMap::col(thread, 0)) {}
    __device__ int64_t first(int64_t stride) const { return int64_t(row) * stride + col; }
    __device__ static int64_t offset(int i, int64_t stride) {
      return (i / 2) % 2 * 8 * stride + i / 4 * 8;
    }
  };
  static_assert(SubtileMap::row(0, 2) == SubtileMap::row(0, 0) + 8 &&
                    SubtileMap::col(0, 4) == SubtileMap::col(0, 0) + 8,
                "Lanes' offsets follow the accumulator map (fragment.hpp)");
  // Where a subtile crosses the tensor's edge: 2 row and 4 column tests per thread; F being a
  // multiple of 8, a column group is wholly in the tensor or wholly past its edge.
  struct Edges {
    bool row_in[2], col_in[4];
    __device__ Edges(const Lanes& l, const Params& p) {
#pragma unroll
      for (int s = 0; s < 2; ++s) row_in[s] = l.row + 8 * s < p.rows;
#pragma unroll
      for (int g = 0; g < 4; ++g) col_in[g] = l.col + 8 * g < p.cols;
    }
    __device__ bool in(int i) const { return row_in[(i / 2) % 2] && col_in[i / 4]; }
  };
  // Nearly every subtile lies inside the tensor: there (a test the whole warpgroup agrees on)
  // its accesses go unpredicated, so the compiler keeps one address per row slot and constant
  // offsets; predicated, it rebuilt each access's address and memory descriptor (the profile's
  // 38 instructions per element at Llama-1B, a fifth of them for addressing: docs/epilogue.md).
  __device__ static bool interior(int32_t row0, int32_t col0, const Params& p) {
    return row0 + Shape::kSubRows <= p.rows && col0 + Shape::kSubCols <= p.cols;
  }

  // This thread's 8 container pairs of the subtile at (row0, col0) into `to` (zero past the edges).
  // ld.global.cs (`__ldcs`: coherent, evict-first; PTX ISA, "Data Movement and Conversion
  // Instructions: ld"): the block's backward writes dpreact over preact, so preact is not
  // read-only while the kernel runs, which the non-coherent `.nc` path (`__ldg`) requires; each
  // container is read once. Same speed as `__ldg` (docs/epilogue.md, experiments).
  __device__ static void load(const Ctx& c, int32_t row0, int32_t col0, uint2 (&to)[8]) {
    const Params& p = c.params;
    const Lanes lanes(c.wg.thread, row0, col0);
    const uint32_t* in = p.preact + lanes.first(p.preact_stride);
    if (interior(row0, col0, p)) {
#pragma unroll
      for (int i = 0; i < 16; i += 2)
        to[i / 2] = __ldcs(reinterpret_cast<const uint2*>(in + Lanes::offset(i, p.preact_stride)));
      return;
    }
    const Edges edges(lanes, p);
#pragma unroll
    for (int i = 0; i < 16; i += 2)
      to[i / 2] =
          edges.in(i)
              ? __ldcs(reinterpret_cast<const uint2*>(in + Lanes::offset(i, p.preact_stride)))
              : make_uint2(0u, 0u);
  }
};

} // namespace coda::epilogue::device

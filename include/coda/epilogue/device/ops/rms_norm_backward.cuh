// Device side of RmsNormBackward (coda/epilogue/ops/rms_norm_backward.hpp), K6's op: the
// fragment holds g (= alpha dz · w after a ScaleByScalar); with the saved pre-norm x, rstd and
// zeta per row and gamma per column, the shared rms_norm_backward() gives per element
//   dx = rstd (g gamma - xh zeta)   -> the fragment (a ResidualAdd + TileStore after it)
//   h_hat = xh gamma                -> a side output tile, rounded to T, TMA-stored here
//   g xh                            -> aux, for the ReduceOverM of AuxReduce (dgamma partials)
// so it is used as AuxReduce<RmsNormBackward, ReduceOverM<Sum>> (aux_reduce.cuh).
//
// Inputs: x arrives by TMA through a ring of kSlots subtile buffers per warpgroup (load_ring.cuh;
// zero past the edges); gamma (the tile's columns, 16-bit as stored, ScalePerCol's staging), rstd
// and zeta (the warpgroup's rows, fp32) are copied into shared memory by cp.async before the
// mainloop and read per subtile, so that nothing of this op is held in registers across the MMAs.
// Rows past M read rstd = zeta = 0; columns past N read gamma = x = 0: every value stays finite.
#pragma once

#include <cstdint>

#include <cuda.h>
#include <cuda_pipeline_primitives.h>

#include "coda/epilogue/device/driver.cuh"
#include "coda/epilogue/device/load_ring.cuh"
#include "coda/epilogue/device/ops/scale_per_col.cuh"
#include "coda/epilogue/device/ops/store.cuh"
#include "coda/epilogue/device/tensor_maps.hpp"
#include "coda/epilogue/device/tile_io.cuh"
#include "coda/epilogue/ops/rms_norm_backward.hpp"

namespace coda::epilogue::device {

template <class Shape, class T, int kSlots = 4> struct RmsNormBackward : OpBase {
  using Layout = SubtileLayout<T>;
  static_assert(sizeof(T) == 2, "16-bit x, gamma and h_hat");
  using Ring = SubtileLoadRing<Shape, Layout::kBytes, kSlots>;
  using Gamma = ScalePerCol<Shape, T>;  // its cp.async staging of the tile's gamma
  using HatStore = TileStore<Shape, T>; // the h_hat side output
  // The ring's bookkeeping, as ResidualAdd's, wants the rolled subtile loop; by pairs, except
  // with K6's accumulating list (this 2-slot ring beside the dx ring): there ptxas spills 48 bytes.
  static constexpr bool kRollSubtiles = true;
  static constexpr bool kRollPairs = kSlots > 2;

  struct Params {
    CUtensorMap x;                   // subtile_map of x [M, N]
    typename HatStore::Params h_hat; // subtile_map of h_hat [M, N]
    typename Gamma::Params gamma;    // gamma [N] (16-byte aligned), N
    const float* rstd = nullptr;     // [M]
    const float* zeta = nullptr;     // [M]
    int32_t rows = 0;                // M
  };
  struct SharedStorage {
    typename Ring::SharedStorage x;
    typename HatStore::SharedStorage h_hat;
    typename Gamma::SharedStorage gamma;
    float rstd[Shape::kWarpgroups][Shape::kRows];
    float zeta[Shape::kWarpgroups][Shape::kRows];
  };
  using Ctx = OpContext<Params, SharedStorage>;

  Ring ring;

  __device__ static void init(SharedStorage& s) { Ring::init(s.x); }
  __device__ void begin_kernel(const Ctx&) { ring.begin_kernel(); }

  __device__ void begin_tile(const Ctx& c, sm90::EpilogueTile tile, uint32_t slot) {
    const Params& p = c.params;
    ring.begin_tile(c.smem.x, p.x, c.wg, tile);
    Gamma{}.begin_tile(gamma_ctx(c), tile, slot);
    for (int r = c.wg.thread; r < Shape::kRows; r += arch::kWarpgroupSize) {
      const bool valid = tile.row0 + r < p.rows;
      const int64_t row = valid ? int64_t(tile.row0) + r : 0;
      const uint32_t zfill = valid ? 0 : uint32_t(sizeof(float));
      __pipeline_memcpy_async(&c.smem.rstd[c.wg.index][r], p.rstd + row, sizeof(float), zfill);
      __pipeline_memcpy_async(&c.smem.zeta[c.wg.index][r], p.zeta + row, sizeof(float), zfill);
    }
  }

  __device__ void prefetch(const Ctx& c, const Subtile& next) {
    ring.prefetch(c.smem.x, c.params.x, c.wg, next);
  }

  __device__ void visit(const Ctx& c, const Subtile& st, float (&v)[16], float (&aux)[16]) {
    const uint8_t* x = ring.acquire(c.smem.x, c.wg);
    const uint16_t* gamma = reinterpret_cast<const uint16_t*>(c.smem.gamma.factors[c.wg.index]);
    float rstd[2], zeta[2]; // of the thread's two rows (slots) of the subtile
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const int r = st.block * Shape::kSubRows + SubtileMap::slot_row(c.wg.thread, s);
      rstd[s] = c.smem.rstd[c.wg.index][r];
      zeta[s] = c.smem.zeta[c.wg.index][r];
    }
    float h_hat[16];
#pragma unroll
    for (int i = 0; i < 16; i += 2) {
      const int row = SubtileMap::row(c.wg.thread, i), col = SubtileMap::col(c.wg.thread, i);
      const int s = SubtileMap::row_slot(i);
      const float2 xv = read_pair<T>(x, row, col);
      const float2 gv =
          unpack2<T>(*reinterpret_cast<const uint32_t*>(gamma + st.slab * Shape::kSubCols + col));
      const auto lo = rms_norm_backward(v[i], xv.x, rstd[s], zeta[s], gv.x);
      const auto hi = rms_norm_backward(v[i + 1], xv.y, rstd[s], zeta[s], gv.y);
      v[i] = lo.dx, v[i + 1] = hi.dx;
      h_hat[i] = lo.h_hat, h_hat[i + 1] = hi.h_hat;
      aux[i] = lo.dgamma_term, aux[i + 1] = hi.dgamma_term;
    }
    HatStore{}.visit(hat_ctx(c), st, h_hat);
  }

  // Without AuxReduce the driver would call OpBase's empty visit and the op would do nothing.
  template <class C> __device__ void visit(const C&, const Subtile&, float (&)[16]) {
    static_assert(sizeof(C) == 0, "RmsNormBackward leaves an aux value per element: use it as "
                                  "AuxReduce<RmsNormBackward, a reduction> (aux_reduce.cuh)");
  }

  __device__ void issue(const Ctx& c, const Subtile& st) { HatStore{}.issue(hat_ctx(c), st); }

  // x, gamma, rstd, zeta [M, N] / [N] / [M] / [M]; h_hat [M, N].
  static Params params(const TensorView& x, const TensorView& gamma, const TensorView& rstd,
                       const TensorView& zeta, const TensorView& h_hat) {
    Params p;
    p.x = subtile_map("x", x);
    p.h_hat = HatStore::params("h_hat", h_hat);
    p.gamma = {gamma.ptr<const T>(), int32_t(gamma.shape[0])};
    p.rstd = rstd.ptr<const float>();
    p.zeta = zeta.ptr<const float>();
    p.rows = int32_t(x.shape[0]);
    return p;
  }

private:
  __device__ static OpContext<typename Gamma::Params, typename Gamma::SharedStorage>
  gamma_ctx(const Ctx& c) {
    return {c.params.gamma, c.smem.gamma, c.wg};
  }
  __device__ static OpContext<typename HatStore::Params, typename HatStore::SharedStorage>
  hat_ctx(const Ctx& c) {
    return {c.params.h_hat, c.smem.h_hat, c.wg};
  }
};

} // namespace coda::epilogue::device

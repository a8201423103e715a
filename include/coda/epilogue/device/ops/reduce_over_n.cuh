// Device side of ReduceOverN (coda/epilogue/ops/reduce_over_n.hpp): one partial per (row,
// kBlock-column block), [M, ceil(N / kBlock)] f32, with Sum, SumOfSquares or LogSumExp
// (coda/epilogue/reduction.hpp). kBlock is the API's kReduceBlock, or kStagedReduceBlock for the
// partials the staged 128 x 192 tiles write (K5, K7: coda/epilogue/reduce_block.hpp).
//
// A row of a 64-row block lives in the 4 lanes of one quad. Each thread folds its own columns of
// the row into a state, in increasing column order, across the subtiles of the block; at the
// block's last subtile the quad merges by shuffles (xor 1, then xor 2: the order the host op
// follows) and lane 0 writes the partial. Columns at or past N are skipped (zero is not the
// identity of every reduction). Each partial has one writer: no atomics.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "coda/epilogue/device/driver.cuh"
#include "coda/epilogue/device/tile_io.cuh"
#include "coda/epilogue/reduction.hpp"
#include "coda/epilogue/tile.hpp"
#include "coda/kernels/args.hpp"

namespace coda::epilogue::device {

// A reduction state through __shfl_xor_sync, one 32-bit word at a time.
template <class State> __device__ __forceinline__ State shuffle_xor(State s, int mask) {
  static_assert(sizeof(State) % 4 == 0, "states are made of 32-bit words");
  uint32_t words[sizeof(State) / 4];
  memcpy(words, &s, sizeof(State));
#pragma unroll
  for (int w = 0; w < int(sizeof(State) / 4); ++w)
    words[w] = __shfl_xor_sync(0xffffffffu, words[w], mask);
  memcpy(&s, words, sizeof(State));
  return s;
}

// Folds one subtile's 8 values of a row into a state. By default one after another, in
// increasing column order (the host op's order).
template <class R> struct SubtileFold {
  __device__ static void apply(typename R::State& state, const float (&x)[8],
                               const bool (&valid)[8]) {
#pragma unroll
    for (int k = 0; k < 8; ++k)
      if (valid[k]) R::add(state, x[k]);
  }
};
// LogSumExp: the subtile's maximum first, then the 8 exponentials against it, independent of each
// other and of the running state (no rescaling, no branch per value), then one merge. The online
// order would chain every exp through the running maximum, and with one warp per scheduler that
// latency chain costs more than the GEMM tile. The sum is the host op's up to the order of fp32
// additions and the rounding of exp.
template <> struct SubtileFold<LogSumExp<float>> {
  using R = LogSumExp<float>;
  __device__ static void apply(R::State& state, const float (&x)[8], const bool (&valid)[8]) {
    float top = -math::infinity<float>();
#pragma unroll
    for (int k = 0; k < 8; ++k)
      if (valid[k]) top = math::max(top, x[k]);
    if (top == -math::infinity<float>()) return; // nothing to add (exp(-inf - -inf) is NaN)
    float sum = 0.f;
#pragma unroll
    for (int k = 0; k < 8; ++k)
      if (valid[k]) sum += math::exp(x[k] - top);
    state = R::merge(state, R::State{top, sum});
  }
};

template <class Shape, template <class> class Reduction, int64_t kBlock = kReduceBlock>
struct ReduceOverN : OpBase {
  using R = Reduction<float>;
  using State = typename R::State;
  static constexpr bool kRollSubtiles = std::is_same_v<R, LogSumExp<float>>; // an exp per value
  static constexpr int kSlabsPerBlock = int(kBlock) / Shape::kSubCols;
  static_assert(kBlock % Shape::kSubCols == 0 && Shape::kCols % kBlock == 0,
                "tiles hold whole reduction blocks of whole subtiles");

  struct Params {
    float* partials = nullptr; // [rows, blocks], row stride `stride`
    int64_t stride = 0;
    int32_t rows = 0;   // M
    int32_t cols = 0;   // N: columns at or past it are not reduced
    int32_t blocks = 0; // ceil(N / kBlock)
    float scale = 1.f;  // applied to each finished partial
  };
  using Ctx = OpContext<Params, SharedStorage>;

  State state[2]; // this thread's two rows of the current block

  // Set after the mainloop (every tile starts from identity: tiles hold whole reduction
  // blocks), so that the states are not live across the MMAs (docs/epilogue.md, "Registers").
  __device__ void begin_visit(const Ctx&, sm90::EpilogueTile) {
    state[0] = state[1] = R::identity();
  }

  __device__ void visit(const Ctx& c, const Subtile& st, float (&v)[16]) {
    const Params& p = c.params;
    if (st.col0 + Shape::kSubCols <= p.cols) // the whole subtile lies inside N
      fold(c, st, v, true);
    else
      fold(c, st, v, false);
    if ((st.slab + 1) % kSlabsPerBlock != 0) return;
    const int32_t block =
        (st.col0 - (kSlabsPerBlock - 1) * Shape::kSubCols) / int32_t(kBlock);
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      State merged = R::merge(state[s], shuffle_xor(state[s], 1));
      merged = R::merge(merged, shuffle_xor(merged, 2));
      const int32_t row = st.row0 + SubtileMap::slot_row(c.wg.thread, s);
      if (c.wg.quad_lane() == 0 && row < p.rows && block < p.blocks)
        p.partials[int64_t(row) * p.stride + block] = p.scale * R::finish(merged);
      state[s] = R::identity();
    }
  }

private:
  __device__ void fold(const Ctx& c, const Subtile& st, const float (&v)[16], bool inside) {
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      // Registers 4j + 2s + e hold columns 8j + 2q + e of row slot s: increasing columns.
      float x[8];
      bool valid[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const int i = 4 * (k / 2) + 2 * s + k % 2;
        x[k] = v[i];
        valid[k] = inside || st.col0 + SubtileMap::col(c.wg.thread, i) < c.params.cols;
      }
      SubtileFold<R>::apply(state[s], x, valid);
    }
  }
};

} // namespace coda::epilogue::device

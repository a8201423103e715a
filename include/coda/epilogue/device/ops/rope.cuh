// Device side of Rope (coda/epilogue/ops/rope.hpp): rotate-half RoPE (+theta) on the Q and K heads
// of a fused [Q | K | V] projection; V heads (columns at or past rotated_cols) pass through.
//
// Column c of a head pairs with c + head_dim/2, register i with i + head_dim/4 of the same thread
// (coda/core/fragment.hpp), so a tile that holds whole heads rotates without shuffles, but the
// partners lie in different 32-column subtiles: RoPE runs in the prepass over the whole 64-row
// block (on the staged schedule: per head, read from the staged tile). A thread's first-half
// columns within a head are 8j + 2q + e (j < head_dim/16, e < 2); it computes the rotation of
// each such frequency once per row and applies it to every head it holds. The angles come from the
// shared rope_rotation (the angle reduced to [-pi, pi] in extra precision, then the hardware
// sin/cos); the frequency table is copied to shared memory once per kernel.
#pragma once

#include <cstdint>

#include <cuda_pipeline_primitives.h>

#include "coda/core/tensor.hpp"
#include "coda/epilogue/device/driver.cuh"
#include "coda/epilogue/ops/rope.hpp"

namespace coda::epilogue::device {

template <class Shape, int kHeadDim> struct Rope : OpBase {
  static constexpr int kHalf = kHeadDim / 2;
  static constexpr bool kPrepass = true;
  static constexpr int kGroupCols = kHeadDim; // the staged prepass: one head at a time
  static_assert(kHeadDim % 16 == 0 && Shape::kCols % kHeadDim == 0,
                "tiles hold whole heads; head_dim/2 is a multiple of 8 columns");

  struct Params {
    const int32_t* positions = nullptr; // [M]
    const float* inv_freq = nullptr;    // [head_dim / 2]
    int32_t rows = 0;                   // M
    int32_t rotated_cols = 0;           // (n_q_heads + n_kv_heads) * head_dim
  };
  struct SharedStorage {
    float inv_freq[Shape::kWarpgroups][kHalf];
    int32_t positions[Shape::kWarpgroups][Shape::kRows]; // the tile's rows
  };

  using Ctx = OpContext<Params, SharedStorage>;

  // The table is read after the driver's barrier at the start of the first visit.
  __device__ void begin_kernel(const Ctx& c) {
    for (int i = c.wg.thread; i < kHalf; i += arch::kWarpgroupSize)
      c.smem.inv_freq[c.wg.index][i] = c.params.inv_freq[i];
  }

  // The tile's positions are copied to shared memory by cp.async before the mainloop and read
  // in the prepass: no register of this op is live across the MMAs (docs/epilogue.md,
  // "Registers").
  __device__ void begin_tile(const Ctx& c, sm90::EpilogueTile tile, uint32_t) {
    const Params& p = c.params;
    for (int r = c.wg.thread; r < Shape::kRows; r += arch::kWarpgroupSize) {
      const int64_t row = int64_t(tile.row0) + r;
      const bool valid = row < p.rows; // past M: position 0 (zero fill)
      __pipeline_memcpy_async(&c.smem.positions[c.wg.index][r],
                              valid ? p.positions + row : p.positions, sizeof(int32_t),
                              valid ? 0 : sizeof(int32_t));
    }
  }

  // `regs`: whole heads from column tile.col0 on (the block on the register schedules, one head
  // on the staged one).
  template <int kRegs>
  __device__ void visit_block(const Ctx& c, float (&regs)[kRegs], sm90::EpilogueTile tile,
                              int block) {
    constexpr int kHeads = 2 * kRegs / kHeadDim;
    static_assert(2 * kRegs % kHeadDim == 0, "the prepass holds whole heads");
    const Params& p = c.params;
    const float* inv_freq = c.smem.inv_freq[c.wg.index];
    if (tile.col0 >= p.rotated_cols) return; // only V heads in this tile
#pragma unroll
    for (int j = 0; j < kHalf / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float freq = inv_freq[8 * j + 2 * c.wg.quad_lane() + e];
#pragma unroll
        for (int s = 0; s < 2; ++s) {
          const int32_t position =
              c.smem.positions[c.wg.index][64 * block + Shape::Fragment::slot_row(c.wg.thread, s)];
          const RopeRotation rot = rope_rotation(position, freq);
#pragma unroll
          for (int h = 0; h < kHeads; ++h) {
            if (tile.col0 + h * kHeadDim >= p.rotated_cols) continue;
            const int first = 4 * (h * kHeadDim / 8 + j) + 2 * s + e;
            rope_rotate(regs[first], regs[first + kHeadDim / 4], rot.cos, rot.sin);
          }
        }
      }
  }

  // positions [M] (int32), inv_freq [head_dim / 2] (f32); the Q and K heads are the first
  // rotated_cols columns of the output.
  static Params params(const TensorView& positions, const TensorView& inv_freq, int64_t rows,
                       int64_t rotated_cols) {
    return Params{positions.ptr<const int32_t>(), inv_freq.ptr<const float>(), int32_t(rows),
                  int32_t(rotated_cols)};
  }
};

} // namespace coda::epilogue::device

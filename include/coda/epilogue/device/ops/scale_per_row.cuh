// Device side of ScalePerRow (coda/epilogue/ops/scale_per_row.hpp): x * s[m]. The factor is
// given ([M] f32) or is RMSNorm's rstd, finished here from the row partials of the sum of
// squares: each tile reads the few partials of its own rows (no separate reduction launch).
//
// Before the mainloop, begin_tile copies the warpgroup's rows of partials into shared memory by
// cp.async (up to kStagedPartials per row; wider partials are read from global memory after the
// mainloop instead). kStagedPartials is 32 (hidden sizes up to 4096: one partial per 128 columns);
// a kernel short of shared memory for a fourth pipeline stage may take 16 (hidden up to 2048). The
// 4 lanes that share a row each sum a quarter of its partials and merge; each thread keeps the
// factors of its two rows per 64-row block in registers.
//
// kStagedPartials = kPartialsInRegisters (the staged schedule's consumers): no shared memory,
// which would cost a 128 x 192 staged kernel its fourth pipeline stage at 32 partials per row;
// begin_tile loads each quad lane's partials of its two rows (up to 8 each, 32 per row) into
// registers, and begin_visit sums them after the mainloop, in the same order. The staged
// consumers hold 96 accumulators in 176 registers, so the 16 they take across the MMAs fit.
//
// Pass::subtile scales in the per-subtile pass; Pass::prepass scales the whole block first, for
// chains whose later ops run in the prepass (RoPE after the rstd scale in K4).
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_pipeline_primitives.h>

#include "coda/epilogue/device/driver.cuh"
#include "coda/epilogue/ops/scale_per_row.hpp"
#include "coda/epilogue/reduction.hpp"

namespace coda::epilogue::device {

enum class Pass { subtile, prepass };

// ScalePerRow's kStagedPartials for partials held in registers across the mainloop.
inline constexpr int kPartialsInRegisters = -1;

template <class Shape, Pass kPass = Pass::subtile, int kStagedPartials_ = 32>
struct ScalePerRow : OpBase {
  static constexpr bool kInRegisters = kStagedPartials_ == kPartialsInRegisters;
  static constexpr int kRegisterPartials = 32; // per row, at most; more: read after the mainloop
  static constexpr int kPerLane = kRegisterPartials / 4;
  // On the staged schedule the partials are read from global memory by the epilogue warpgroup
  // (its wait for the staged tile hides their latency from the MMAs): no shared memory.
  static constexpr int kStagedPartials = Shape::kStaged || kInRegisters ? 0 : kStagedPartials_;
  static_assert(!kInRegisters || Shape::kBlocks == 1,
                "partials in registers: the staged consumers' one 64-row block");
  static constexpr bool kPrepass = kPass == Pass::prepass;
  // On the staged schedule it runs before the Stage, in the consumers (with the cooperative
  // shape): the staged value is then round(s[m] * acc), rounded once as an unfused path stores
  // it.
  static constexpr bool kBeforeStage = !Shape::kStaged;
  static_assert(kStagedPartials == 0 || kStagedPartials == 16 || kStagedPartials == 32,
                "a row is half or all 32 banks");
  // The 8 rows x 4 quad lanes a warp reads at once (partials k + q of its rows) hit 32 banks:
  // with 32 staged partials, partial b of row r sits at column (b + 4 (r % 8)) % 32; with 16,
  // two rows share the 32 banks and the shift steps every second row.
  static constexpr int kStagedWidth = kStagedPartials > 0 ? kStagedPartials : 32;
  static constexpr int kRowsPerBankLine = 32 / kStagedWidth;
  __device__ static int staged_col(int r, int b) {
    return (b + 4 * ((r / kRowsPerBankLine) & (kStagedWidth / 4 - 1))) & (kStagedWidth - 1);
  }

  struct Params {
    const float* factors = nullptr;  // [M], or null: rstd from the partials
    const float* partials = nullptr; // [M, count], row stride `stride`
    int64_t stride = 0;
    int32_t count = 0;            // partials per row (any >= 1)
    int32_t rows = 0;             // M
    float width = 1.f, eps = 0.f; // rstd = rsqrt(sum / width + eps)
    float* factors_out = nullptr; // optional [M]: the factors, written by the n = 0 tiles
  };
  struct StagedPartials {
    float partials[Shape::kWarpgroups][Shape::kRows][kStagedWidth];
  };
  using SharedStorage =
      std::conditional_t<kStagedPartials == 0, OpBase::SharedStorage, StagedPartials>;

  using Ctx = OpContext<Params, SharedStorage>;

  float factor[Shape::kBlocks][2]; // the factors of this thread's two rows per block
  // kInRegisters: this quad lane's partials q, q + 4, ... of its two rows.
  float early[kInRegisters ? 2 : 1][kInRegisters ? kPerLane : 1];

  __device__ static bool staged_path(const Params& p) {
    return p.factors == nullptr && p.count <= kStagedPartials;
  }
  __device__ static bool register_path(const Params& p) {
    return kInRegisters && p.factors == nullptr && p.count <= kRegisterPartials;
  }
  // The warpgroup's staged rows of partials (null when nothing is staged).
  __device__ static float (*staged_buffer(const Ctx& c))[kStagedWidth] {
    if constexpr (kStagedPartials > 0)
      return c.smem.partials[c.wg.index];
    else
      return nullptr;
  }
  __device__ static int32_t row_of(const Ctx& c, sm90::EpilogueTile tile, int block, int slot) {
    return tile.row0 + 64 * block + Shape::Fragment::slot_row(c.wg.thread, slot);
  }

  __device__ void begin_tile(const Ctx& c, sm90::EpilogueTile tile, uint32_t) {
    const Params& p = c.params;
    if (p.factors != nullptr) { // given factors: plain loads, consumed after the mainloop
#pragma unroll
      for (int b = 0; b < Shape::kBlocks; ++b)
#pragma unroll
        for (int s = 0; s < 2; ++s) {
          const int32_t row = row_of(c, tile, b, s);
          factor[b][s] = row < p.rows ? p.factors[row] : 1.f;
        }
      return;
    }
    if constexpr (kInRegisters) {
      if (!register_path(p)) return;
      const int q = c.wg.quad_lane();
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        const int32_t row = row_of(c, tile, 0, s);
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) {
          const int k = q + 4 * i;
          early[s][i] = row < p.rows && k < p.count ? p.partials[int64_t(row) * p.stride + k] : 0.f;
        }
      }
      return;
    }
    if (!staged_path(p)) return;
    float(*staged)[kStagedWidth] = staged_buffer(c);
    const int count = Shape::kRows * p.count;
    for (int e = c.wg.thread; e < count; e += arch::kWarpgroupSize) {
      const int r = e / p.count, b = e - r * p.count;
      const int64_t row = int64_t(tile.row0) + r;
      const bool valid = row < p.rows;
      const float* src = valid ? p.partials + row * p.stride + b : p.partials;
      __pipeline_memcpy_async(&staged[r][staged_col(r, b)], src, sizeof(float),
                              valid ? 0 : sizeof(float));
    }
  }

  __device__ void begin_visit(const Ctx& c, sm90::EpilogueTile tile) {
    const Params& p = c.params;
    if (p.factors == nullptr) {
      const bool staged_rows = staged_path(p);
      const float(*staged)[kStagedWidth] = staged_buffer(c);
      const int q = c.wg.quad_lane();
#pragma unroll
      for (int b = 0; b < Shape::kBlocks; ++b)
#pragma unroll
        for (int s = 0; s < 2; ++s) {
          const int32_t row = row_of(c, tile, b, s);
          const int r = row - tile.row0;
          // The 4 lanes sharing the row each sum every 4th partial (a 4 times shorter chain of
          // dependent adds), then merge as a quad: a fixed order, the same in every lane.
          float sum = Sum<float>::identity();
          if (register_path(p)) {
            // The same order as below: partials q, q + 4, ... one after another.
#pragma unroll
            for (int i = 0; i < kPerLane; ++i)
              if (q + 4 * i < p.count) Sum<float>::add(sum, early[s][i]);
          } else if (staged_rows) {
#pragma unroll 4
            for (int k = q; k < p.count; k += 4) Sum<float>::add(sum, staged[r][staged_col(r, k)]);
          } else if (row < p.rows) {
#pragma unroll 4
            for (int k = q; k < p.count; k += 4)
              Sum<float>::add(sum, p.partials[int64_t(row) * p.stride + k]);
          }
          sum = Sum<float>::merge(sum, __shfl_xor_sync(0xffffffffu, sum, 1));
          sum = Sum<float>::merge(sum, __shfl_xor_sync(0xffffffffu, sum, 2));
          factor[b][s] = rstd_from_sum_of_squares(sum, p.width, p.eps);
        }
    }
    if (p.factors_out != nullptr && tile.col0 == 0 && c.wg.quad_lane() == 0)
#pragma unroll
      for (int b = 0; b < Shape::kBlocks; ++b)
#pragma unroll
        for (int s = 0; s < 2; ++s)
          if (row_of(c, tile, b, s) < p.rows) p.factors_out[row_of(c, tile, b, s)] = factor[b][s];
  }

  template <int kRegs>
  __device__ void visit_block(const Ctx&, float (&regs)[kRegs], sm90::EpilogueTile, int block) {
    if constexpr (kPass == Pass::prepass)
#pragma unroll
      for (int i = 0; i < kRegs; ++i)
        regs[i] = scale_per_row(regs[i], factor[block][Shape::Fragment::row_slot(i)]);
  }

  __device__ void visit(const Ctx&, const Subtile& st, float (&v)[16]) {
    if constexpr (kPass == Pass::subtile)
#pragma unroll
      for (int i = 0; i < 16; ++i)
        v[i] = scale_per_row(v[i], factor[st.block][Shape::Fragment::row_slot(i)]);
  }
};

} // namespace coda::epilogue::device

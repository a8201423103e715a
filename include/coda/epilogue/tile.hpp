// What the host side of every epilogue op sees of one output tile: where it lies in the output
// and its fp32 values. The device driver hands ops the registers of the accumulator fragment
// (coda/core/fragment.hpp) instead; the per-element math they apply is the same function.
#pragma once

#include <cstdint>

namespace coda::epilogue {

// The part of the [M, N] output one tile covers: rows [m0, m0 + rows), columns [n0, n0 + cols).
// (m_block, n_block) index the tile in the tile grid; they are also the partial-reduction block
// indices. Edge tiles are partial (rows < tile_m or cols < tile_n) when M or N is ragged.
struct TileCoord {
  int64_t m_block = 0, n_block = 0;
  int64_t m0 = 0, n0 = 0;
  int64_t rows = 0, cols = 0;
};

// The fp32 values of one tile, row-major with leading dimension ld. `value` holds the accumulator
// as the ops transform it, in order; `aux` is a second value per element that an op may leave for
// a later reduction (e.g. the per-pair zeta terms of the SwiGLU backward).
struct HostFragment {
  TileCoord tile;
  float* values = nullptr;
  float* aux_values = nullptr;
  int64_t ld = 0;

  float& value(int64_t r, int64_t c) const { return values[r * ld + c]; }
  float& aux(int64_t r, int64_t c) const { return aux_values[r * ld + c]; }
};

// Which of the two per-element planes a reduction reads.
enum class Plane { value, aux };

inline float& plane_at(const HostFragment& frag, Plane plane, int64_t r, int64_t c) {
  return plane == Plane::value ? frag.value(r, c) : frag.aux(r, c);
}

// The lifecycle every op implements (ARCHITECTURE section 4): begin_tile(tile) loads per-tile
// inputs, visit(fragment) applies the math, end_tile(tile) finishes per-tile reductions and
// writes partials. Ops with nothing to do at a tile's start or end inherit these.
struct NoTileState {
  void begin_tile(const TileCoord&) {}
  void end_tile(const TileCoord&) {}
};

} // namespace coda::epilogue

// The host executor of the CPU backend: walks the output tiles of [M, N] in order (one thread:
// clarity, not speed), forms each tile's fp32 accumulator with a mainloop, then runs the kernel's
// ordered epilogue ops on it with the lifecycle of ARCHITECTURE section 4: every op's begin_tile,
// then every op's visit in order (an op sees its predecessors' results), then every end_tile.
// The ops and their math are the ones the GPU epilogue runs (coda/epilogue/ops).
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "coda/core/error.hpp"
#include "coda/epilogue/tile.hpp"
#include "coda/gemm/problem.hpp"
#include "cpu/backend.hpp"

namespace coda::cpu {

// The epilogue ops (coda/epilogue/ops) that every kernel of the backend composes.
namespace ep = coda::epilogue;

// acc = op(A) · op(B) in the layouts of GemmLayout, fp32 products summed in fp32 in k order over
// the bf16 / f16 inputs.
class GemmMainloop {
public:
  GemmMainloop(GemmLayout layout, const TensorView& a, const TensorView& b, int64_t m, int64_t n,
               int64_t k);
  void operator()(const epilogue::HostFragment& frag) const;

private:
  int64_t k_;
  std::vector<float> a_;   // op(A) [M, K]
  std::vector<float> b_t_; // op(B)ᵀ [N, K]
};

// The tile of an existing [M, N] tensor, as fp32: the auxiliary kernels (RMSNorm statistics,
// RoPE backward) run the same epilogue ops on their input, with no GEMM before them.
class TensorMainloop {
public:
  explicit TensorMainloop(const TensorView& x) : x_(x) {}
  void operator()(const epilogue::HostFragment& frag) const;

private:
  TensorView x_;
};

// Throws Status::invalid_argument with `message` unless `ok`: the backend's own preconditions
// (tiles, partial-buffer shapes), so that no argument can make it index outside a buffer.
void require(bool ok, const std::string& message);
void require_tile(Tile tile, const char* kernel);
// `partials` is [rows, blocks] with rows and blocks as the tile grid makes them.
void require_partials(const TensorView& partials, int64_t rows, int64_t blocks, const char* kernel,
                      const char* name);

template <class Mainloop, class... Ops>
void run_epilogue(const Mainloop& mainloop, int64_t m, int64_t n, Tile tile, Ops&... ops) {
  std::vector<float> values(size_t(tile.m * tile.n)); // [tile.m, tile.n]
  std::vector<float> aux(values.size());              // [tile.m, tile.n]
  for (int64_t m_block = 0; m_block * tile.m < m; ++m_block) {
    for (int64_t n_block = 0; n_block * tile.n < n; ++n_block) {
      epilogue::TileCoord coord;
      coord.m_block = m_block;
      coord.n_block = n_block;
      coord.m0 = m_block * tile.m;
      coord.n0 = n_block * tile.n;
      coord.rows = std::min(tile.m, m - coord.m0);
      coord.cols = std::min(tile.n, n - coord.n0);
      const epilogue::HostFragment frag{coord, values.data(), aux.data(), tile.n};
      // An op that reduces an aux plane no op wrote gets NaN, never a previous tile's data.
      std::fill(aux.begin(), aux.end(), NAN);
      mainloop(frag);
      (ops.begin_tile(coord), ...);
      (ops.visit(frag), ...);
      (ops.end_tile(coord), ...);
    }
  }
}

} // namespace coda::cpu

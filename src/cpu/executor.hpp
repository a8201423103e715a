// The host executor of the CPU backend: walks the output tiles of [M, N] in order (one thread:
// clarity, not speed), forms each tile's fp32 accumulator with a mainloop, then runs the kernel's
// ordered epilogue ops on it with the lifecycle of ARCHITECTURE section 4: every op's begin_tile,
// then every op's visit in order (an op sees its predecessors' results), then every end_tile.
// The ops and their math are the ones the GPU epilogue runs (coda/epilogue/ops); the fused
// kernels' lists are the GPU's too (coda/kernels/op_lists.hpp, on the family HostOps).
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <variant>
#include <vector>

#include "coda/core/error.hpp"
#include "coda/epilogue/ops/aux_reduce.hpp"
#include "coda/epilogue/ops/gated_pair.hpp"
#include "coda/epilogue/ops/reduce_over_m.hpp"
#include "coda/epilogue/ops/reduce_over_n.hpp"
#include "coda/epilogue/ops/residual_add.hpp"
#include "coda/epilogue/ops/rms_norm_backward.hpp"
#include "coda/epilogue/ops/rope.hpp"
#include "coda/epilogue/ops/round.hpp"
#include "coda/epilogue/ops/scalar.hpp"
#include "coda/epilogue/ops/scale_per_col.hpp"
#include "coda/epilogue/ops/scale_per_row.hpp"
#include "coda/epilogue/ops/select_per_row.hpp"
#include "coda/epilogue/ops/store.hpp"
#include "coda/epilogue/ops/swiglu_backward.hpp"
#include "coda/epilogue/tile.hpp"
#include "coda/gemm/problem.hpp"
#include "coda/kernels/op_lists.hpp"
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

// acc = dequant(A) · dequant(B)ᵀ of gemm_fp8's operands (Fp8GemmArgs: a, b and their scales; d is
// not read), in the GPU kernel's order: per element, each 128-deep K block's products of codes
// summed exactly and rounded once to fp32, then promoted into the fp32 accumulator with the
// block's scales (fp8_block_scale, fp8_promote), block after block (cpu/gemm_fp8.cpp).
class Fp8GemmMainloop {
public:
  explicit Fp8GemmMainloop(const Fp8GemmArgs& args);
  void operator()(const epilogue::HostFragment& frag) const;

private:
  float block_sum(int64_t m, int64_t n, int64_t kb) const;

  int64_t k_, k_blocks_;
  std::vector<float> a_, b_; // the codes' values: [M, K], [N, K]
  TensorView a_scales_, b_scales_;
  int64_t b_rows_per_scale_; // 128 (blocks) or 1 (rows)
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
// `tile` when it is at least 1 x 2 with an even width (column pairs never straddle tiles).
Tile checked_tile(Tile tile, const char* kernel);

// The Rope op's arguments for a RopeSpec: rotate the Q and K heads (inverse: by -theta).
ep::Rope::Args rope_args(const RopeSpec& rope, bool inverse);

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

// A kernel's ops, built from their Args in list order.
template <class... Ops> struct OpChain {
  explicit OpChain(const typename Ops::Args&... args) : ops(Ops(args)...) {}
  std::tuple<Ops...> ops;
};

// The GEMM of a fused kernel named `kernel`: acc = a · wᵀ (fwd, w [N, K]) or a · w (dgrad, w [K,
// N]), [m, n] in tiles of checked_tile(tile); run() runs an op list on it.
class FusedGemm {
public:
  // For E4M3 a and w, a_scales and w_scales are gemm_fp8's block scales and acc is
  // Fp8GemmMainloop's, a · wᵀ with w [N, K] whatever the layout (a dgrad kernel's w is then the
  // weight's transposed copy); otherwise they are absent and acc is GemmMainloop's.
  FusedGemm(const char* kernel, GemmLayout layout, const TensorView& a, const TensorView& w,
            Tile tile, const TensorView& a_scales = {}, const TensorView& w_scales = {});

  // The partials the tile grid writes: row partials [m, ceil(n / tile.n)], column partials
  // [n, ceil(m / tile.m)].
  void require_row_partials(const TensorView& partials, const char* name) const;
  void require_col_partials(const TensorView& partials, const char* name) const;

  template <class... Ops> void run(OpChain<Ops...>& chain) const {
    std::visit(
        [&](const auto& mainloop) {
          std::apply([&](Ops&... ops) { run_epilogue(mainloop, m, n, tile_, ops...); }, chain.ops);
        },
        mainloop_);
  }

  const int64_t m, n, k;

private:
  const char* kernel_;
  Tile tile_;
  std::variant<GemmMainloop, Fp8GemmMainloop> mainloop_;
};

// The host op family of the fused kernels' lists (coda/kernels/op_lists.hpp): each name the host
// op of coda/epilogue/ops, but for the two roles the host plays with another op.
struct HostOps {
  template <class... Ops> using List = OpChain<Ops...>;
  template <class Op, class Reduce> using AuxReduce = ep::AuxReduce<Op, Reduce>;
  template <class Gate> using GatedPairStore = ep::GatedPairStore<Gate>;
  // One partial per tile: the tile's width is the block (kTileOf, cpu/backend.hpp).
  template <template <class> class R, int64_t kBlock = kReduceBlock>
  using ReduceOverN = ep::ReduceOverN<R>;
  template <template <class> class R> using ReduceOverM = ep::ReduceOverM<R>;
  using ResidualAdd = ep::ResidualAdd;
  using RmsNormBackward = ep::RmsNormBackward;
  using Rope = ep::Rope;
  using ScaleByScalar = ep::ScaleByScalar;
  using ScalePerCol = ep::ScalePerCol;
  using ScalePerRow = ep::ScalePerRow;
  using SelectPerRow = ep::SelectPerRow;
  using SwigluBackward = ep::SwigluBackward;
  using TileStore = ep::TileStore;
  using Stage = ep::RoundTo;       // rounds to the dtype it is given, as the GPU's hand-over
  using MainStore = ep::TileStore; // no staged tile to store from
};

} // namespace coda::cpu

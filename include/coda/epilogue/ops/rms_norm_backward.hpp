// The RMSNorm backward in the input-gradient GEMM's epilogue (K6). The fragment holds
// g = dL/d(normalized input h_hat) = dz · W; with x the saved pre-norm input, xh = x rstd and
// zeta = (1/N) sum_k z dz over the consumer's output (equal to (1/N) sum_n g gamma xh, because
// z = h_hat · Wᵀ):
//   dx    = rstd (g gamma - xh zeta)          (the textbook rstd gamma g - x rstd^3 mean(g gamma
//   x)) h_hat = xh gamma                          (re-emitted for the weight gradient) dgamma[n] =
//   sum_m g xh                    (its per-element term left for a ReduceOverM)
#pragma once

#include <vector>

#include "coda/core/types.hpp"
#include "coda/epilogue/host_tensor.hpp"
#include "coda/epilogue/tile.hpp"

namespace coda::epilogue {

template <class T> struct RmsNormGrad {
  T dx;
  T h_hat;
  T dgamma_term;
};

template <class T> CODA_HD RmsNormGrad<T> rms_norm_backward(T g, T x, T rstd, T zeta, T gamma) {
  const T xh = x * rstd;
  return {rstd * (g * gamma - xh * zeta), xh * gamma, g * xh};
}

// Replaces the value by dx, leaves g xh in the aux plane and writes h_hat.
struct RmsNormBackward {
  struct Args {
    TensorView x;     // [M, N] saved pre-norm input
    TensorView rstd;  // [M] f32
    TensorView zeta;  // [M] f32
    TensorView gamma; // [N]
    TensorView h_hat; // [M, N] output
  };

  explicit RmsNormBackward(const Args& args) : args_(args) {}

  void begin_tile(const TileCoord& tile) {
    rstd_.resize(size_t(tile.rows));
    zeta_.resize(size_t(tile.rows));
    gamma_.resize(size_t(tile.cols));
    for (int64_t r = 0; r < tile.rows; ++r) {
      rstd_[size_t(r)] = load_float(args_.rstd, tile.m0 + r);
      zeta_[size_t(r)] = load_float(args_.zeta, tile.m0 + r);
    }
    for (int64_t c = 0; c < tile.cols; ++c)
      gamma_[size_t(c)] = load_float(args_.gamma, tile.n0 + c);
  }

  void visit(const HostFragment& frag) const {
    const TileCoord& tile = frag.tile;
    for (int64_t r = 0; r < tile.rows; ++r) {
      for (int64_t c = 0; c < tile.cols; ++c) {
        const auto grad =
            rms_norm_backward(frag.value(r, c), load_float(args_.x, tile.m0 + r, tile.n0 + c),
                              rstd_[size_t(r)], zeta_[size_t(r)], gamma_[size_t(c)]);
        store_float(args_.h_hat, tile.m0 + r, tile.n0 + c, grad.h_hat);
        frag.value(r, c) = grad.dx;
        frag.aux(r, c) = grad.dgamma_term;
      }
    }
  }

  void end_tile(const TileCoord&) {}

  // Device: rstd and zeta of a thread's rows in registers; gamma (fp32) and the 16-bit x tile in
  // shared memory.
  static constexpr int64_t shared_bytes(int64_t tile_m, int64_t tile_n) {
    return tile_n * 4 + tile_m * tile_n * 2;
  }

private:
  Args args_;
  std::vector<float> rstd_, zeta_; // [tile rows]
  std::vector<float> gamma_;       // [tile cols]
};

} // namespace coda::epilogue

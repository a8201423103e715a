// RoundTo: the fragment's values rounded to a 16-bit dtype and kept as fp32, so that the ops after
// it see exactly what a store at this point wrote. K5 rounds its logits before the log-sum-exp and
// the target logit: the cross-entropy then reads the stored logits against an lse of the same
// numbers, so softmax sums to 1 and zeta cancels as in PyTorch's cross-entropy of 16-bit logits.
// (Against the fp32 logits, a bf16 logit of 38 is off by up to 0.07, which shifts the row's
// softmax mass by that much and zeta by the logit times it.)
#pragma once

#include "coda/core/types.hpp"
#include "coda/epilogue/tile.hpp"

namespace coda::epilogue {

inline float round_to(DType dtype, float x) {
  if (dtype == DType::bf16) return bf16::from(x).to_float();
  if (dtype == DType::f16) return f16::from(x).to_float();
  return x;
}

struct RoundTo : NoTileState {
  struct Args {
    DType dtype; // bf16 or f16 (f32: unchanged)
  };

  explicit RoundTo(const Args& args) : args_(args) {}

  void visit(const HostFragment& frag) const {
    const TileCoord& tile = frag.tile;
    for (int64_t r = 0; r < tile.rows; ++r)
      for (int64_t c = 0; c < tile.cols; ++c)
        frag.value(r, c) = round_to(args_.dtype, frag.value(r, c));
  }

  static constexpr int64_t shared_bytes(int64_t, int64_t) { return 0; }

private:
  Args args_;
};

} // namespace coda::epilogue

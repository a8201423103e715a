// ScaleByScalar: x * s with one factor per call (a GEMM's alpha; alpha * dloss read from memory).
#pragma once

#include "coda/core/types.hpp"
#include "coda/epilogue/host_tensor.hpp"
#include "coda/epilogue/tile.hpp"

namespace coda::epilogue {

template <class T> CODA_HD T scale_by_scalar(T x, T factor) { return x * factor; }

struct ScaleByScalar : NoTileState {
  struct Args {
    float value = 1.f;
    TensorView tensor; // optional [1] f32: the factor is value * tensor[0]
  };

  explicit ScaleByScalar(const Args& args)
      : factor_(is_given(args.tensor) ? args.value * load_float(args.tensor, 0) : args.value) {}

  void visit(const HostFragment& frag) const {
    for (int64_t r = 0; r < frag.tile.rows; ++r)
      for (int64_t c = 0; c < frag.tile.cols; ++c)
        frag.value(r, c) = scale_by_scalar(frag.value(r, c), factor_);
  }

  // Device: the factor lives in a register (read once per tile when it comes from memory).
  static constexpr int64_t shared_bytes(int64_t, int64_t) { return 0; }

private:
  float factor_;
};

} // namespace coda::epilogue

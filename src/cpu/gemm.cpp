// D = alpha · op(A)·op(B) + beta · C as an epilogue chain: ScaleByScalar, ResidualAdd (beta · C;
// C is not read when beta is 0, as in BLAS), TileStore (one rounding to D's dtype).
#include "coda/epilogue/ops/residual_add.hpp"
#include "coda/epilogue/ops/scalar.hpp"
#include "coda/epilogue/ops/store.hpp"
#include "cpu/executor.hpp"

namespace coda::cpu {

void gemm(const GemmArgs& args) {
  const GemmMainloop mainloop(args.layout, args.a, args.b, args.m(), args.n(), args.k());
  epilogue::ScaleByScalar alpha({args.alpha.value, args.alpha.tensor});
  epilogue::TileStore store({args.d});
  const Tile tile{};
  if (args.has_c() && args.beta != 0.f) {
    epilogue::ResidualAdd c({args.c, args.beta});
    run_epilogue(mainloop, args.m(), args.n(), tile, alpha, c, store);
  } else {
    run_epilogue(mainloop, args.m(), args.n(), tile, alpha, store);
  }
}

} // namespace coda::cpu

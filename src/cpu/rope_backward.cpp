// RoPE backward and zeta (coda/kernels/args.hpp) on dqkv itself, one tile per row block holding
// whole rows so that zeta is finished in the tile:
//   MultiplyTile(qkv) -> ReduceOverN<Sum>(aux, scale) = zeta, then Rope(inverse) -> dz.
// zeta is taken from dqkv and the saved post-RoPE qkv before the rotation; RoPE is orthogonal,
// so it equals scale * sum z dz.
#include "coda/epilogue/ops/multiply_tile.hpp"
#include "coda/epilogue/ops/reduce_over_n.hpp"
#include "coda/epilogue/ops/rope.hpp"
#include "coda/epilogue/ops/store.hpp"
#include "cpu/executor.hpp"

namespace coda::cpu {

void rope_backward(const RopeBackwardArgs& args) {
  const int64_t m = args.dqkv.shape[0], n = args.dqkv.shape[1];
  const RopeSpec& rope = args.rope;
  require(rope.head_dim >= 2 && rope.head_dim % 2 == 0 && n % rope.head_dim == 0,
          "cpu::rope_backward: head_dim must be even and divide the QKV width");
  const Tile tile{kReduceBlock, std::max<int64_t>(n, 1)};

  TensorView zeta_column = args.zeta; // [M] viewed as the [M, 1] partials of one block
  zeta_column.rank = 2;
  zeta_column.shape[1] = 1;
  zeta_column.stride[1] = 1;

  const TensorMainloop mainloop(args.dqkv); // loads each tile before dz (maybe dqkv) is written
  ep::MultiplyTile products({args.qkv});
  ep::ReduceOverN<ep::Sum> zeta({zeta_column, ep::Plane::aux, args.scale});
  ep::Rope rotate(rope_args(rope, /*inverse=*/true));
  ep::TileStore dz({args.dz});
  run_epilogue(mainloop, m, n, tile, products, zeta, rotate, dz);
}

} // namespace coda::cpu

// AuxReduce<Op, Reduce>: an op that leaves a second value per element in the aux plane (the
// dgamma term of RmsNormBackward, the zeta term of SwigluBackward), and the reduction of that
// plane (ReduceOverM, ReduceOverN). The host twin of device::AuxReduce (device/ops/aux_reduce.cuh):
// the same pair of ops as one list entry, so that both backends run one op list
// (coda/kernels/op_lists.hpp). Every hook goes to both, Op first.
#pragma once

#include "coda/epilogue/tile.hpp"

namespace coda::epilogue {

template <class Op, class Reduce> struct AuxReduce {
  struct Args {
    typename Op::Args op;
    typename Reduce::Args reduce; // its plane is the aux one, whatever it says
  };

  explicit AuxReduce(const Args& args) : op_(args.op), reduce_(on_aux(args.reduce)) {}

  void begin_tile(const TileCoord& tile) {
    op_.begin_tile(tile);
    reduce_.begin_tile(tile);
  }

  void visit(const HostFragment& frag) {
    op_.visit(frag);
    reduce_.visit(frag);
  }

  void end_tile(const TileCoord& tile) {
    op_.end_tile(tile);
    reduce_.end_tile(tile);
  }

  static constexpr int64_t shared_bytes(int64_t tile_m, int64_t tile_n) {
    return Op::shared_bytes(tile_m, tile_n) + Reduce::shared_bytes(tile_m, tile_n);
  }

private:
  static typename Reduce::Args on_aux(typename Reduce::Args args) {
    args.plane = Plane::aux;
    return args;
  }

  Op op_;
  Reduce reduce_;
};

} // namespace coda::epilogue

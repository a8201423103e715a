// AuxReduce<Op, Reduce>: an op that leaves a second value per element, and the reduction of that
// value. The device counterpart of the CPU executor's aux plane (Plane::aux of
// coda/epilogue/tile.hpp), without a second register tile in the driver.
//
// Op's visit takes a 16-value `aux` array beside the fragment values:
//   visit(c, subtile, v, aux)   v: the fragment (read and replaced), aux: written, per element
// and Reduce is any reduction op (ReduceOverM, ReduceOverN), unchanged: it visits `aux` as it
// would visit the fragment (a reduction op never writes what it visits). The array lives only
// inside one subtile's visit. Every other hook goes to both ops, Op first; each keeps its own
// Params and SharedStorage (c.params.op / .reduce; c.smem.op / its base). The prepass
// (visit_block) sees the fragment only, so it goes to Op alone.
//
// E.g. K6: AuxReduce<RmsNormBackward, ReduceOverM<Sum>> turns g into dx and reduces g * xh over
// rows; K7: AuxReduce<SwigluBackward, ReduceOverN<Sum>> turns dy into act and reduces
// g dg + u du over columns.
#pragma once

#include <cstdint>

#include "coda/epilogue/device/driver.cuh"

namespace coda::epilogue::device {

template <class Op, class Reduce> struct AuxReduce : OpBase {
  static constexpr bool kRollSubtiles = Op::kRollSubtiles || Reduce::kRollSubtiles;
  static constexpr bool kRollPairs = Op::kRollPairs && Reduce::kRollPairs;

  struct Params {
    typename Op::Params op;
    typename Reduce::Params reduce;
  };
  // Reduce's storage as a base: an empty one (ReduceOverN's) then takes no bytes, where a member
  // would take one and pad the 1024-byte aligned buffers after it by a kilobyte.
  struct SharedStorage : Reduce::SharedStorage {
    typename Op::SharedStorage op;
  };
  using Ctx = OpContext<Params, SharedStorage>;
  // Its storage holds both ops' (never empty as a type), so it asks them.
  static constexpr bool kWarpLocal = warp_local_op<Op>() && warp_local_op<Reduce>();
  using OpCtx = OpContext<typename Op::Params, typename Op::SharedStorage>;
  using ReduceCtx = OpContext<typename Reduce::Params, typename Reduce::SharedStorage>;

  Op op;
  Reduce reduce;

  __device__ static OpCtx op_ctx(const Ctx& c) { return {c.params.op, c.smem.op, c.wg}; }
  __device__ static ReduceCtx reduce_ctx(const Ctx& c) {
    return {c.params.reduce, static_cast<typename Reduce::SharedStorage&>(c.smem), c.wg};
  }

  __device__ static void init(SharedStorage& s) {
    Op::init(s.op);
    Reduce::init(static_cast<typename Reduce::SharedStorage&>(s));
  }
  // Every hook but the prepass and the subtile visit goes to both ops, Op first. (prefetch_tile
  // too: without it OpBase's empty hook took the call and the staged K7's consumer L2 prefetch
  // of its pre-activation rows never ran, docs/epilogue.md.)
  __device__ void begin_kernel(const Ctx& c) {
    both(c, [&](auto& o, const auto& oc) { o.begin_kernel(oc); });
  }
  __device__ void begin_tile(const Ctx& c, sm90::EpilogueTile tile, uint32_t slot) {
    both(c, [&](auto& o, const auto& oc) { o.begin_tile(oc, tile, slot); });
  }
  __device__ void begin_visit(const Ctx& c, sm90::EpilogueTile tile) {
    both(c, [&](auto& o, const auto& oc) { o.begin_visit(oc, tile); });
  }
  __device__ void prefetch_tile(const Ctx& c, sm90::EpilogueTile tile) {
    both(c, [&](auto& o, const auto& oc) { o.prefetch_tile(oc, tile); });
  }
  __device__ void prefetch(const Ctx& c, const Subtile& next) {
    both(c, [&](auto& o, const auto& oc) { o.prefetch(oc, next); });
  }
  __device__ void issue(const Ctx& c, const Subtile& st) {
    both(c, [&](auto& o, const auto& oc) { o.issue(oc, st); });
  }
  __device__ void end_tile(const Ctx& c, sm90::EpilogueTile tile) {
    both(c, [&](auto& o, const auto& oc) { o.end_tile(oc, tile); });
  }
  template <int kRegs>
  __device__ void visit_block(const Ctx& c, float (&regs)[kRegs], sm90::EpilogueTile tile,
                              int block) {
    op.visit_block(op_ctx(c), regs, tile, block);
  }
  __device__ void visit(const Ctx& c, const Subtile& st, float (&v)[16]) {
    float aux[16];
    op.visit(op_ctx(c), st, v, aux);
    reduce.visit(reduce_ctx(c), st, aux);
  }

private:
  template <class F> __device__ __forceinline__ void both(const Ctx& c, F&& f) {
    f(op, op_ctx(c));
    f(reduce, reduce_ctx(c));
  }
};

} // namespace coda::epilogue::device

// The GPU epilogue driver: runs an ordered list of epilogue ops on the fp32 accumulator tile of
// the GEMM (ARCHITECTURE section 4) and satisfies the kernel's Epilogue contract
// (coda/gemm/epilogue_contract.hpp). docs/epilogue.md describes the design.
//
// Each consumer warpgroup owns Shape::kRows x Shape::kCols of a tile, in 64 x 32 subtiles. Per
// tile the driver calls, for every op in list order:
//   begin_tile(tile, slot)   before the mainloop: issue per-tile loads (cp.async into shared
//                            memory, TMA, registers) whose latency the MMAs hide;
//   begin_visit(tile)        after it, once the cp.async copies have landed (e.g. finish rstd);
//   visit_block(regs, ...)   the prepass: the whole 64-row block in registers, for ops whose
//                            pairs straddle subtiles (RoPE's rotate-half partners);
//   visit(subtile, v)        per 64 x 32 subtile, on the 16 values this thread holds: the math,
//                            and stores into the op's shared-memory buffer;
//   issue(subtile)           one thread, after the subtile's barrier: the op's TMA stores;
//   prefetch(next)           one thread, at the start of a subtile: TMA loads of the next one;
//   end_tile(tile)           per-tile reductions that cross warps.
// Subtiles alternate between two buffer slots, so the stores of one subtile and the loads of the
// next are in flight while this one is computed. All stores of a subtile form one bulk group.
#pragma once

#include <cstdint>
#include <utility>

#include <cuda/ptx>
#include <cuda_pipeline_primitives.h>

#include "coda/arch/warpgroup.cuh"
#include "coda/core/fragment.hpp"
#include "coda/gemm/epilogue_contract.hpp"
#include "coda/gemm/pipeline.cuh"

namespace coda::epilogue::device {

// What one consumer warpgroup owns of a tile: kRows (64-row blocks) x kCols, and how many
// warpgroups share a tile's shared memory (each owns its own buffers).
template <int kWarpgroups_, int kRows_, int kCols_> struct TileShape {
  static constexpr int kWarpgroups = kWarpgroups_;
  static constexpr int kRows = kRows_;
  static constexpr int kCols = kCols_;
  static constexpr int kBlocks = kRows / 64;
  static constexpr int kSubRows = 64, kSubCols = 32;
  static constexpr int kSubtilesN = kCols / kSubCols;
  static_assert(kRows % 64 == 0 && kCols % kSubCols == 0, "whole 64 x 32 subtiles");
  using Fragment = AccumulatorMap<kCols>; // register -> (row, col) within a 64-row block
};

// The calling thread's place: consumer warpgroup and thread 0..127 within it.
struct Warpgroup {
  int index;
  int thread;
  __device__ int quad_lane() const { return thread % 4; }
  __device__ int warp() const { return thread / arch::kWarpSize; }
  __device__ int lane() const { return thread % arch::kWarpSize; }
};

// One 64 x 32 subtile: where it starts in D, which 64-row block and 32-column slab of the
// warpgroup's tile it is, and its buffer slot.
struct Subtile {
  int32_t row0, col0;
  int block; // 64-row block of the warpgroup's tile
  int slab;  // 32-column slab of the tile
  uint32_t slot;
};

// What an op's hooks receive: its parameters (in the kernel's parameter space), its shared
// memory and the calling thread. Ops keep only per-thread state (factors, reduction states) as
// members, so that nothing the driver can recompute occupies registers across the mainloop.
template <class Params, class Storage> struct OpContext {
  const Params& params;
  Storage& smem;
  Warpgroup wg;
};

// The default (empty) lifecycle; ops override the hooks they need (with their own context type).
struct OpBase {
  // Ops whose per-subtile math is heavy (an exp per value) ask for a rolled subtile loop: unrolled,
  // such code outgrows the instruction cache. Light chains run unrolled (no per-subtile selects).
  static constexpr bool kRollSubtiles = false;
  struct SharedStorage {};
  template <class Storage> __device__ static void init(Storage&) {}
  template <class C> __device__ void begin_kernel(const C&) {}
  template <class C> __device__ void begin_tile(const C&, sm90::EpilogueTile, uint32_t) {}
  template <class C> __device__ void begin_visit(const C&, sm90::EpilogueTile) {}
  template <class C, int kRegs>
  __device__ void visit_block(const C&, float (&)[kRegs], sm90::EpilogueTile, int) {}
  template <class C> __device__ void prefetch(const C&, const Subtile&) {}
  template <class C> __device__ void visit(const C&, const Subtile&, float (&)[16]) {}
  template <class C> __device__ void issue(const C&, const Subtile&) {}
  template <class C> __device__ void end_tile(const C&, sm90::EpilogueTile) {}
};

// A tuple addressed by position (the same op type may appear twice in a list).
template <int I, class T> struct Indexed { T value; };
template <class Seq, class... Ts> struct IndexedTupleOf;
template <int... Is, class... Ts>
struct IndexedTupleOf<std::integer_sequence<int, Is...>, Ts...> : Indexed<Is, Ts>... {};
template <class... Ts>
using IndexedTuple = IndexedTupleOf<std::make_integer_sequence<int, int(sizeof...(Ts))>, Ts...>;

template <int I, class T> CODA_HD T& get(Indexed<I, T>& x) { return x.value; }
template <int I, class T> CODA_HD const T& get(const Indexed<I, T>& x) { return x.value; }

template <class Seq, class... Ops> class OpList;
template <int... Is, class... Ops>
class OpList<std::integer_sequence<int, Is...>, Ops...> : Indexed<Is, Ops>... {
public:
  template <class Storage> __device__ static void init(Storage& smem) {
    (Ops::init(get<Is>(smem)), ...);
  }
  // f(op, context) for every op, in list order.
  template <class Params, class Storage, class F>
  __device__ __forceinline__ void for_each(const Params& params, Storage& smem, Warpgroup wg,
                                           F&& f) {
    (f(static_cast<Indexed<Is, Ops>&>(*this).value,
       OpContext<typename Ops::Params, typename Ops::SharedStorage>{get<Is>(params), get<Is>(smem),
                                                                    wg}),
     ...);
  }
};

template <class Shape, class... Ops> class FusedEpilogue {
  using Seq = std::make_integer_sequence<int, int(sizeof...(Ops))>;

public:
  using TileShape = Shape;
  using Params = IndexedTuple<typename Ops::Params...>;
  struct SharedStorage : IndexedTuple<typename Ops::SharedStorage...> {};

  __device__ static void init(SharedStorage& smem) { OpList<Seq, Ops...>::init(smem); }

  __device__ FusedEpilogue(const Params& params, SharedStorage& smem, int warpgroup, int thread)
      : params_(params), smem_(smem), wg_{warpgroup, thread} {
    for_each([&](auto& op, const auto& c) { op.begin_kernel(c); });
  }

  __device__ void begin_tile(sm90::EpilogueTile tile) {
    const uint32_t slot = subtile_ & 1;
    for_each([&](auto& op, const auto& c) { op.begin_tile(c, tile, slot); });
    __pipeline_commit();
  }

  template <int kBlocks, int kN>
  __device__ void visit(Accumulator<kBlocks, kN>& acc, sm90::EpilogueTile tile) {
    static_assert(kBlocks == Shape::kBlocks && kN == Shape::kCols,
                  "the epilogue's TileShape must match the GEMM config's warpgroup tile");
    // The per-tile cp.async copies of every thread are visible to all after this barrier.
    __pipeline_wait_prior(0);
    sync();
    for_each([&](auto& op, const auto& c) { op.begin_visit(c, tile); });
#pragma unroll // NOTE: registers cannot be indexed at run time: blocks are unrolled
    for (int block = 0; block < kBlocks; ++block) {
      for_each([&](auto& op, const auto& c) { op.visit_block(c, acc.reg[block], tile, block); });
      if constexpr (kRollSubtiles) {
#pragma unroll 1
        for (int slab = 0; slab < Shape::kSubtilesN; ++slab)
          visit_subtile(acc.reg[block], tile, block, slab);
      } else {
#pragma unroll
        for (int slab = 0; slab < Shape::kSubtilesN; ++slab)
          visit_subtile(acc.reg[block], tile, block, slab);
      }
    }
  }

  __device__ void end_tile(sm90::EpilogueTile tile) {
    for_each([&](auto& op, const auto& c) { op.end_tile(c, tile); });
  }

  __device__ void finish() {
    if (wg_.thread == 0) cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<0>{});
  }

private:
  static constexpr bool kRollSubtiles = (Ops::kRollSubtiles || ...);

  // One 64 x 32 subtile through the op chain: wait for its buffers, visit, TMA-store.
  template <int kRegs>
  __device__ __forceinline__ void visit_subtile(float (&regs)[kRegs], sm90::EpilogueTile tile,
                                                int block, int slab) {
    const Subtile st{tile.row0 + block * Shape::kSubRows, tile.col0 + slab * Shape::kSubCols, block,
                     slab, subtile_ & 1};
    // The stores that last used slot `st.slot` have read their buffers; everyone is done with
    // the loads of the subtile before.
    if (wg_.thread == 0) cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<1>{});
    sync();
    const bool last = block == Shape::kBlocks - 1 && slab == Shape::kSubtilesN - 1;
    if (wg_.thread == 0 && !last) {
      const bool next_block = slab == Shape::kSubtilesN - 1;
      const Subtile next{next_block ? st.row0 + Shape::kSubRows : st.row0,
                         next_block ? tile.col0 : st.col0 + Shape::kSubCols,
                         next_block ? block + 1 : block, next_block ? 0 : slab + 1, st.slot ^ 1};
      for_each([&](auto& op, const auto& c) { op.prefetch(c, next); });
    }
    float v[16]; // this thread's values of the subtile, in AccumulatorMap register order
    load_slab(v, regs, slab);
    for_each([&](auto& op, const auto& c) { op.visit(c, st, v); });
    cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
    sync();
    if (wg_.thread == 0) {
      for_each([&](auto& op, const auto& c) { op.issue(c, st); });
      cuda::ptx::cp_async_bulk_commit_group();
    }
    ++subtile_;
  }

  // v = registers [16 slab, 16 slab + 16) of the block, selected with constant indices only.
  template <int kRegs>
  __device__ __forceinline__ static void load_slab(float (&v)[16], const float (&regs)[kRegs],
                                                   int slab) {
#pragma unroll
    for (int s = 0; s < kRegs / 16; ++s)
      if (s == slab)
#pragma unroll
        for (int i = 0; i < 16; ++i) v[i] = regs[16 * s + i];
  }

  __device__ void sync() {
    arch::named_barrier_sync(uint32_t(sm90::NamedBarrier::epilogue_warpgroup0) + wg_.index,
                             arch::kWarpgroupSize);
  }

  template <class F> __device__ __forceinline__ void for_each(F&& f) {
    ops_.for_each(params_, smem_, wg_, f);
  }

  const Params& params_;
  SharedStorage& smem_;
  Warpgroup wg_;
  OpList<Seq, Ops...> ops_;
  uint32_t subtile_ = 0; // subtiles visited so far; the buffer slot is its parity
};

} // namespace coda::epilogue::device

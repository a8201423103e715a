// The GPU epilogue driver: runs an ordered list of epilogue ops on the fp32 accumulator tile of
// the GEMM (ARCHITECTURE section 4) and satisfies the kernel's Epilogue contract
// (coda/gemm/epilogue_contract.hpp). docs/epilogue.md describes the design.
//
// Each warpgroup that runs the epilogue owns Shape::kRows x Shape::kCols of a tile, in 64 x 32
// subtiles. Per tile the driver calls, for every op in list order:
//   begin_tile(tile, slot)   before the values arrive (the mainloop, or the wait for the staged
//                            tile): issue per-tile loads (cp.async into shared memory, TMA,
//                            registers) whose latency that wait hides;
//   begin_visit(tile)        after it, once the cp.async copies have landed (e.g. finish rstd);
//   visit_block(regs, ...)   the prepass: the whole 64-row block in registers, for ops whose
//                            pairs straddle subtiles (RoPE's rotate-half partners);
//   visit(subtile, v)        per 64 x 32 subtile, on the 16 values this thread holds: the math,
//                            and stores into the op's shared-memory buffer;
//   issue(subtile)           one thread, after the subtile's barrier: the op's TMA stores (on a
//                            warp-local staged list, kWarpLocal: lane 0 of each warp after its
//                            __syncwarp, for the warp's 16 rows, Subtile::rows);
//   prefetch(next)           one thread, at the start of a subtile: TMA loads of the next one;
//   end_tile(tile)           per-tile reductions that cross warps.
// On the staged schedule the ops after the Stage also get
//   end_visits(tile, staged) after the tile's last subtile visit, before the staged tile's
//                            release: work on the whole staged tile (`staged`, its first byte;
//                            e.g. reading it back transposed), whose bulk stores from it the
//                            release waits for (on a warp-local list, each warp's own);
//   prefetch_tile(rows)      from the consumer warpgroups, as they start the tile's mainloop,
//                            each for its 64-row block: L2 prefetches of what the epilogue
//                            warpgroup will read, a whole mainloop ahead of its begin_tile.
// Subtiles alternate between two buffer slots, so the stores of one subtile and the loads of the
// next are in flight while this one is computed. All stores of a subtile form one bulk group.
//
// Two ways to run (Shape::kStaged):
//  - in the consumer warpgroups, on their accumulator registers (the cooperative and ping-pong
//    schedules): every op runs there, a Stage<T> op only rounds;
//  - staged (the staged schedule): the list is cut at its Stage<T> op. The consumers run the ops
//    before it on their registers (elementwise ones: a scale), round to T and write the tile to
//    shared memory (staged_tile.cuh); the epilogue warpgroup runs the ops after it on
//    values read back from there, while the consumers' next MMAs run. Its Shape is its own view:
//    one warpgroup owning the tile's 128 rows as two 64-row blocks.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

#include <cuda/ptx>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_pipeline_primitives.h>

#include "coda/arch/warpgroup.cuh"
#include "coda/core/convert.cuh"
#include "coda/core/fragment.hpp"
#include "coda/epilogue/device/staged_tile.cuh"
#include "coda/epilogue/device/subtile_store.cuh"
#include "coda/gemm/epilogue_contract.hpp"
#include "coda/gemm/pipeline.cuh"

namespace coda::epilogue::device {

// What one warpgroup running the epilogue owns of a tile: kRows (64-row blocks) x kCols, how many
// warpgroups share a tile's shared memory (each owns its own buffers), and whether it reads the
// staged tile (the staged schedule's epilogue warpgroup) instead of accumulator registers.
// kEpilogueWarps: the warps that read the staged tile, the last ones of their warpgroup (4; 3 on
// the staged_wide schedule, whose load issuer is warp 0 of the same warpgroup).
template <int kWarpgroups_, int kRows_, int kCols_, bool kStaged_ = false, int kEpilogueWarps_ = 4>
struct TileShape {
  static constexpr int kWarpgroups = kWarpgroups_;
  static constexpr int kRows = kRows_;
  static constexpr int kCols = kCols_;
  static constexpr bool kStaged = kStaged_;
  static constexpr int kEpilogueWarps = kEpilogueWarps_;
  static_assert(kEpilogueWarps == 4 || (kStaged && kEpilogueWarps >= 1 && kEpilogueWarps < 4),
                "fewer than 4 epilogue warps only read a staged tile");
  static constexpr int kFirstEpilogueWarp = 4 - kEpilogueWarps; // of their warpgroup
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
// warpgroup's tile it is, its buffer slot, and (staged) its place in the staged tile, which an
// in-place store may overwrite and TMA-store from (the driver has read it by then).
struct Subtile {
  int32_t row0, col0;
  int block; // 64-row block of the warpgroup's tile
  int slab;  // 32-column slab of the tile
  uint32_t slot;
  uint8_t* staged = nullptr; // the staged subtile (16-bit, Subtile16 layout), or null
  // Rows from row0 (and from `staged`) that issue() stores: the subtile's 64, or on a warp-local
  // list (FusedEpilogue::kWarpLocal) the 16 of the calling warp.
  int rows = 64;
};

// A warp's rows of a 64-row subtile (AccumulatorMap: warp w holds rows 16 w .. 16 w + 15): what
// a warp-local epilogue stores alone, and the box height of in-place stores (TileStore).
inline constexpr int kStripRows = Subtile16::kRows / (arch::kWarpgroupSize / arch::kWarpSize);

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
  // A rolled loop visits subtiles by pairs (fewer run-time register selects) unless an op of the
  // list says that spills.
  static constexpr bool kRollPairs = true;
  // The Stage<T> op (the staged schedule's hand-over point) says so. Ops that may run before
  // it, in the consumer warpgroups on their own 64-row blocks (so written for the cooperative
  // shape, whatever the list's), say kBeforeStage: no stores, no cross-warpgroup state.
  static constexpr bool kIsStage = false;
  static constexpr bool kBeforeStage = false;
  // Ops with a prepass (visit_block) see a register group of kGroupCols columns of a 64-row
  // block at once: the whole block on the register schedules, kGroupCols columns (e.g. one RoPE
  // head) of the staged tile on the staged one.
  static constexpr bool kPrepass = false;
  static constexpr int kGroupCols = 32;
  struct SharedStorage {};
  template <class Storage> __device__ static void init(Storage&) {}
  template <class C> __device__ void begin_kernel(const C&) {}
  template <class C> __device__ void begin_tile(const C&, sm90::EpilogueTile, uint32_t) {}
  template <class C> __device__ void begin_visit(const C&, sm90::EpilogueTile) {}
  template <class C, int kRegs>
  __device__ void visit_block(const C&, float (&)[kRegs], sm90::EpilogueTile, int) {}
  template <class C> __device__ void prefetch(const C&, const Subtile&) {}
  template <class C> __device__ void prefetch_tile(const C&, sm90::EpilogueTile) {}
  template <class C> __device__ void visit(const C&, const Subtile&, float (&)[16]) {}
  template <class C> __device__ void issue(const C&, const Subtile&) {}
  template <class C> __device__ void end_visits(const C&, sm90::EpilogueTile, uint8_t*) {}
  template <class C> __device__ void end_tile(const C&, sm90::EpilogueTile) {}
};

// The op contract (docs/epilogue.md, "The lifecycle"), which FusedEpilogue checks for every op of
// its list: an op derives from OpBase (whose hooks and traits are the defaults), its Params live
// in the kernel's __grid_constant__ parameter block (trivially copyable) and its SharedStorage in
// the kernel's shared memory (nothing to destroy), it states the driver's traits, and every hook
// takes the op's own context: OpContext<Params, SharedStorage>.
template <class Op>
concept EpilogueOp =
    std::derived_from<Op, OpBase> && std::is_trivially_copyable_v<typename Op::Params> &&
    std::is_trivially_destructible_v<typename Op::SharedStorage> &&
    requires {
      { Op::kRollSubtiles } -> std::convertible_to<bool>;
      { Op::kRollPairs } -> std::convertible_to<bool>;
      { Op::kIsStage } -> std::convertible_to<bool>;
      { Op::kBeforeStage } -> std::convertible_to<bool>;
      { Op::kPrepass } -> std::convertible_to<bool>;
      { Op::kGroupCols } -> std::convertible_to<int>;
    } &&
    requires(Op op, const OpContext<typename Op::Params, typename Op::SharedStorage>& c,
             typename Op::SharedStorage& smem, const Subtile& st, float (&v)[16],
             sm90::EpilogueTile tile, uint32_t slot, uint8_t* staged) {
      Op::init(smem);
      op.begin_kernel(c);
      op.begin_tile(c, tile, slot);
      op.begin_visit(c, tile);
      op.prefetch(c, st);
      op.prefetch_tile(c, tile);
      op.visit(c, st, v);
      op.issue(c, st);
      op.end_visits(c, tile, staged);
      op.end_tile(c, tile);
    };

// Whether an op lets each warp of the staged epilogue run on its own (no warpgroup barrier per
// subtile): by default, when it keeps no shared memory (so its only shared accesses are the
// staged subtile's own fragments, and its stores are in place); an op may say otherwise.
template <class Op> constexpr bool warp_local_op() {
  if constexpr (requires { Op::kWarpLocal; })
    return Op::kWarpLocal;
  else
    return std::is_empty_v<typename Op::SharedStorage>;
}

// A tuple addressed by position (the same op type may appear twice in a list).
template <int I, class T> struct Indexed { T value; };
template <class Seq, class... Ts> struct IndexedTupleOf;
template <int... Is, class... Ts>
struct IndexedTupleOf<std::integer_sequence<int, Is...>, Ts...> : Indexed<Is, Ts>... {};
template <class... Ts>
using IndexedTuple = IndexedTupleOf<std::make_integer_sequence<int, int(sizeof...(Ts))>, Ts...>;

template <int I, class T> CODA_HD T& get(Indexed<I, T>& x) { return x.value; }
template <int I, class T> CODA_HD const T& get(const Indexed<I, T>& x) { return x.value; }

// The ops' shared storage by position. An op without any (an empty SharedStorage) takes no
// bytes: as a member it would take one and pad the 1024-byte aligned buffers after it by a
// kilobyte (a Stage<T> before K7's ring cost its fourth pipeline stage so). Empty ones are empty
// bases of distinct types, so they share offset 0; get<I> hands their ops a T& that nothing
// reads or writes.
template <int I, class T, bool = std::is_empty_v<T>> struct IndexedStorage { T value; };
template <int I, class T> struct IndexedStorage<I, T, true> {};
template <int I, class T> CODA_HD T& get(IndexedStorage<I, T, false>& x) { return x.value; }
template <int I, class T> CODA_HD T& get(IndexedStorage<I, T, true>& x) {
  return *reinterpret_cast<T*>(&x);
}
template <class Seq, class... Ts> struct StorageTupleOf;
template <int... Is, class... Ts>
struct StorageTupleOf<std::integer_sequence<int, Is...>, Ts...> : IndexedStorage<Is, Ts>... {};
template <class... Ts>
using StorageTuple = StorageTupleOf<std::make_integer_sequence<int, int(sizeof...(Ts))>, Ts...>;

// The Stage<T> op: the fragment rounded to T. On the staged schedule it is where the consumer
// warpgroups hand the tile over (the driver writes the rounded values to the staged tile); on the
// others it rounds in place, so that every schedule computes the same numbers.
// kPrepass: on the register schedules, round in the prepass (before a prepass op such as RoPE).
template <class T, bool kPrepass_ = false> struct Stage : OpBase {
  static_assert(sizeof(T) == 2, "the staged tile holds 16-bit values");
  using Type = T;
  static constexpr bool kIsStage = true;
  static constexpr bool kPrepass = kPrepass_;
  struct Params {};
  template <class C> __device__ void visit(const C&, const Subtile&, float (&v)[16]) {
    if constexpr (!kPrepass)
#pragma unroll
      for (int i = 0; i < 16; ++i) v[i] = round_through<T>(v[i]);
  }
  template <class C, int kRegs>
  __device__ void visit_block(const C&, float (&regs)[kRegs], sm90::EpilogueTile, int) {
    if constexpr (kPrepass)
#pragma unroll
      for (int i = 0; i < kRegs; ++i) regs[i] = round_through<T>(regs[i]);
  }

private:
  template <class U> __device__ static float round_through(float x) {
    if constexpr (std::is_same_v<U, bf16>)
      return __bfloat162float(__float2bfloat16_rn(x));
    else
      return __half2float(__float2half_rn(x));
  }
};

// Position of the first Stage op in a list (kNone without one).
constexpr int kNoStage = -1;
template <class... Ops> constexpr int stage_index() {
  constexpr bool is_stage[] = {Ops::kIsStage..., false};
  for (int i = 0; i < int(sizeof...(Ops)); ++i)
    if (is_stage[i]) return i;
  return kNoStage;
}

// The 16-bit type a list's Stage op rounds to (bf16 where the list has none: unused).
template <int kIndex, class... Ops> struct StageTypeOf {
  using type = typename std::tuple_element_t<kIndex, std::tuple<Ops...>>::Type;
};
template <class... Ops> struct StageTypeOf<kNoStage, Ops...> { using type = bf16; };

template <class Seq, class... Ops> class OpList;
template <int... Is, class... Ops>
class OpList<std::integer_sequence<int, Is...>, Ops...> : Indexed<Is, Ops>... {
public:
  template <class Storage> __device__ static void init(Storage& smem) {
    (Ops::init(get<Is>(smem)), ...);
  }
  // f(op, context) for the ops at positions [kBegin, kEnd), in list order.
  template <int kBegin, int kEnd, class Params, class Storage, class F>
  __device__ __forceinline__ void for_each(const Params& params, Storage& smem, Warpgroup wg,
                                           F&& f) {
    (call<Is, kBegin, kEnd>(params, smem, wg, f), ...);
  }

private:
  template <int I, int kBegin, int kEnd, class Params, class Storage, class F>
  __device__ __forceinline__ void call(const Params& params, Storage& smem, Warpgroup wg, F& f) {
    if constexpr (I >= kBegin && I < kEnd) {
      using Op = std::remove_reference_t<decltype(get<I>(std::declval<OpList&>()))>;
      f(get<I>(*this), OpContext<typename Op::Params, typename Op::SharedStorage>{
                           get<I>(params), get<I>(smem), wg});
    }
  }
};

template <class Shape, class... Ops> class FusedEpilogue {
  static_assert((EpilogueOp<Ops> && ...),
                "every op of an epilogue list satisfies EpilogueOp (driver.cuh): derived from "
                "OpBase, trivially copyable Params, hooks taking OpContext<Params, SharedStorage>");
  using Seq = std::make_integer_sequence<int, int(sizeof...(Ops))>;
  static constexpr int kOps = int(sizeof...(Ops));
  static constexpr int kStage = stage_index<Ops...>();
  static constexpr bool kStaged = Shape::kStaged;
  // The ops the epilogue warpgroup runs, and those the consumers run before the hand-over.
  static constexpr int kFirstEpilogueOp = kStaged ? kStage + 1 : 0;
  static constexpr int kConsumerOps = kStaged ? kStage : 0;
  static_assert(!kStaged || kStage != kNoStage,
                "the staged schedule hands the tile over at a Stage<T> op: put one in the list");
  static_assert(!kStaged || Shape::kWarpgroups == 1,
                "the staged tile is read by one epilogue warpgroup owning all of its rows");
  // The staged epilogue's prepass ops (those after the Stage).
  static constexpr bool staged_prepass() {
    constexpr bool prepass[] = {Ops::kPrepass..., false};
    for (int i = kFirstEpilogueOp; i < kOps; ++i)
      if (prepass[i]) return true;
    return false;
  }
  static constexpr bool kHasPrepass = staged_prepass();
  // A staged list whose ops after the Stage all keep no shared memory and have no prepass runs
  // warp-local: each warp visits its 16 rows of every subtile and TMA-stores them itself, with
  // no warpgroup barrier per subtile (the ncu profile of the staged K7 had the epilogue
  // warpgroup wait at those barriers for a tenth of its samples: one warp per scheduler, so a
  // slow warp held the other three twice a subtile).
  static constexpr bool warp_local() {
    constexpr bool local[] = {warp_local_op<Ops>()..., true};
    for (int i = kFirstEpilogueOp; i < kOps; ++i)
      if (!local[i]) return false;
    return !kHasPrepass;
  }

public:
  static constexpr bool kWarpLocal = kStaged && warp_local();
  // Whether the consumer warpgroups run ops of this list: all of them off the staged schedules,
  // those before the Stage on them (the GEMM's register split follows, gemm/config.hpp).
  static constexpr bool kConsumersRunOps = !kStaged || kConsumerOps > 0;

private:
  // Fewer than 4 epilogue warps (staged_wide): the warps take the tile's strip-subtiles in turn
  // (16 rows by one subtile's columns; strip s of the tile: 64-row block s / 4, rows 16 (s % 4)
  // ..), each visiting one as the consumer thread that held those rows (wg_.thread = 32 (s % 4)
  // + lane), so the ops' fragment maps hold. Only warp-local lists can run so.
  static constexpr int kEpilogueWarps = Shape::kEpilogueWarps;
  static constexpr bool kStrips = kStaged && kEpilogueWarps < 4;
  static constexpr int kStripsPerBlock = Subtile16::kRows / kStripRows;
  static constexpr int kStripUnits = Shape::kBlocks * kStripsPerBlock * Shape::kSubtilesN;
  static_assert(!kStrips || kWarpLocal,
                "with fewer than 4 epilogue warps, the ops after the Stage must be warp-local");

  // The staged prepass group: the widest any op asks for.
  static constexpr int kGroupCols = std::max({Ops::kGroupCols..., 32});
  static constexpr int kSlabsPerGroup = kGroupCols / Shape::kSubCols;
  static_assert(kGroupCols % Shape::kSubCols == 0 && Shape::kCols % kGroupCols == 0,
                "prepass groups are whole subtiles and tile the warpgroup's columns");
  static constexpr bool consumer_ops_allowed() {
    constexpr bool allowed[] = {Ops::kBeforeStage..., true};
    for (int i = 0; i < kConsumerOps; ++i)
      if (!allowed[i]) return false;
    return true;
  }
  static_assert(consumer_ops_allowed(),
                "ops before the Stage run in the consumer warpgroups: kBeforeStage ones only");

  using StageT = typename StageTypeOf<kStage, Ops...>::type;
  // Warp-local: each warp releases the staged tile once its reads and bulk stores are done.
  using Staged = StagedTile<Shape::kBlocks, Shape::kCols, kWarpLocal ? kEpilogueWarps : 1>;
  // The staged tile (staged schedule only; an empty base elsewhere: a member would take a byte
  // and pad the 1024-byte aligned storage by a kilobyte).
  struct StagedTiles {
    typename Staged::Tiles staged_tiles;
  };
  struct StagedBarriers {
    typename Staged::Barriers staged;
  };
  struct NoStagedTiles {};
  struct NoStagedBarriers {};
  struct NoStaging {};
  // Per-thread state only the staged schedule has.
  struct StagedState {
    bool consumer = false; // a consumer warpgroup (else the epilogue warpgroup)
    uint32_t phase = 0;    // tiles staged (consumers) or read (the epilogue warpgroup)
  };

public:
  using TileShape = Shape;
  using Params = IndexedTuple<typename Ops::Params...>;
  // Staged: the 1024-byte aligned tile first, the ops' storage, then the tile's barriers
  // (empty bases elsewhere, which take no bytes).
  struct SharedStorage : std::conditional_t<kStaged, StagedTiles, NoStagedTiles>,
                         StorageTuple<typename Ops::SharedStorage...>,
                         std::conditional_t<kStaged, StagedBarriers, NoStagedBarriers> {};

  __device__ static void init(SharedStorage& smem) {
    OpList<Seq, Ops...>::init(smem);
    if constexpr (kStaged) Staged::init(smem.staged);
  }

  // `warpgroup`: a consumer warpgroup (0, 1), or, on the staged schedule, the epilogue
  // warpgroup (sm90::kEpilogueWarpgroupIndex), whose ops see warpgroup 0.
  __device__ FusedEpilogue(const Params& params, SharedStorage& smem, int warpgroup, int thread)
      : params_(params),
        smem_(smem), wg_{warpgroup == sm90::kEpilogueWarpgroupIndex ? 0 : warpgroup, thread} {
    if constexpr (kStaged) {
      staged_.consumer = warpgroup != sm90::kEpilogueWarpgroupIndex;
      if (staged_.consumer) {
        for_each<0, kConsumerOps>([&](auto& op, const auto& c) { op.begin_kernel(c); });
        return;
      }
    }
    for_each<kFirstEpilogueOp, kOps>([&](auto& op, const auto& c) { op.begin_kernel(c); });
  }

  // ---- The epilogue's own warpgroups (every schedule's; on the staged one, the epilogue
  // warpgroup, for which visit() is visit_staged()).

  __device__ void begin_tile(sm90::EpilogueTile tile) {
    const uint32_t slot = subtile_ & 1;
    for_each<kFirstEpilogueOp, kOps>(
        [&](auto& op, const auto& c) { op.begin_tile(c, tile, slot); });
    __pipeline_commit();
  }

  template <int kBlocks, int kN>
  __device__ void visit(Accumulator<kBlocks, kN>& acc, sm90::EpilogueTile tile) {
    static_assert(!kStaged, "the staged epilogue reads the staged tile: visit_staged()");
    static_assert(kBlocks == Shape::kBlocks && kN == Shape::kCols,
                  "the epilogue's TileShape must match the GEMM config's warpgroup tile");
    begin_visit(tile);
#pragma unroll // NOTE: registers cannot be indexed at run time: blocks are unrolled
    for (int block = 0; block < kBlocks; ++block) {
      for_each<0, kOps>(
          [&](auto& op, const auto& c) { op.visit_block(c, acc.reg[block], tile, block); });
      if constexpr (kRollSubtiles) {
        // Each subtile's 16 values are selected from the block's registers at run time
        // (load_slab); rolled by pairs, a pair's known parity halves the candidates (3 selects
        // per value instead of 7 on a 256-column block).
        if constexpr (kRollPairs) {
          static_assert(Shape::kSubtilesN % 2 == 0, "whole pairs of subtiles");
#pragma unroll 1
          for (int pair = 0; pair < Shape::kSubtilesN / 2; ++pair) {
            visit_subtile(acc.reg[block], tile, block, 2 * pair);
            visit_subtile(acc.reg[block], tile, block, 2 * pair + 1);
          }
        } else {
#pragma unroll 1
          for (int slab = 0; slab < Shape::kSubtilesN; ++slab)
            visit_subtile(acc.reg[block], tile, block, slab);
        }
      } else {
#pragma unroll
        for (int slab = 0; slab < Shape::kSubtilesN; ++slab)
          visit_subtile(acc.reg[block], tile, block, slab);
      }
    }
  }

  // The staged schedule's epilogue warpgroup: the tile the consumers staged, then its release.
  __device__ void visit_staged(sm90::EpilogueTile tile) {
    static_assert(kStaged, "only the staged schedule stages its tile");
    Staged::wait_full(smem_.staged, staged_.phase);
    begin_visit(tile);
    if constexpr (kStrips) {
      // The tile's strip-subtiles (unit u: strip u / kSubtilesN, slab u % kSubtilesN) dealt to
      // the warps in turn, so that none has more than one more than another: 22, 21, 21 of a
      // 128 x 256 tile's 64 for three warps, where whole strips (8 of them) gave 24, 24, 16 and
      // the consumers waited for the slowest warp's release.
      const int thread = wg_.thread, lane = wg_.lane();
      const int me = wg_.warp() - Shape::kFirstEpilogueWarp;
#pragma unroll 1
      for (int unit = me; unit < kStripUnits; unit += kEpilogueWarps) {
        const int strip = unit / Shape::kSubtilesN;
        wg_.thread = strip % kStripsPerBlock * arch::kWarpSize + lane;
        visit_staged_subtile(tile, strip / kStripsPerBlock, unit % Shape::kSubtilesN);
      }
      wg_.thread = thread;
    } else {
#pragma unroll // blocks unrolled: ops index per-block register state by the block
      for (int block = 0; block < Shape::kBlocks; ++block) {
        if constexpr (kHasPrepass) {
          // A group of subtiles in registers, its prepass, then its subtiles' chain.
#pragma unroll
          for (int group = 0; group < Shape::kCols / kGroupCols; ++group)
            visit_staged_group(tile, block, group);
        } else {
          visit_staged_slabs(tile, block);
        }
      }
    }
    uint8_t* const staged = &smem_.staged_tiles.subtile[0][0][0];
    for_each<kFirstEpilogueOp, kOps>(
        [&](auto& op, const auto& c) { op.end_visits(c, tile, staged); });
    // Every read of the staged tile is done (each thread's, before the last subtile's barrier;
    // the bulk stores', once thread 0's wait returns; warp-local: each warp's, its lane 0's):
    // the consumers may write the next one.
    if (kWarpLocal ? wg_.lane() == 0 : wg_.thread == 0) {
      cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{});
      Staged::release(smem_.staged);
    }
    staged_.phase ^= 1;
  }

  __device__ void end_tile(sm90::EpilogueTile tile) {
    for_each<kFirstEpilogueOp, kOps>([&](auto& op, const auto& c) { op.end_tile(c, tile); });
  }

  __device__ void finish() { drain_stores(kWarpLocal ? wg_.lane() == 0 : wg_.thread == 0); }

  // ---- The staged schedule's consumer warpgroups: their rows of the tile (one 64-row block).

  __device__ void begin_stage(sm90::EpilogueTile tile) {
    for_each<0, kConsumerOps>([&](auto& op, const auto& c) { op.begin_tile(c, tile, 0); });
    __pipeline_commit();
    for_each<kFirstEpilogueOp, kOps>([&](auto& op, const auto& c) { op.prefetch_tile(c, tile); });
  }

  // The ops before the Stage on the registers, then the rounded values into the staged tile.
  template <int kBlocks, int kN>
  __device__ void stage(Accumulator<kBlocks, kN>& acc, sm90::EpilogueTile tile) {
    static_assert(kStaged && kBlocks == 1 && kN == Shape::kCols,
                  "each consumer warpgroup stages one 64-row block of the tile");
    if constexpr (kConsumerOps > 0) {
      // The copies the ops issued before the mainloop are visible to the warpgroup.
      __pipeline_wait_prior(0);
      arch::named_barrier_sync(uint32_t(sm90::NamedBarrier::staged_consumer0) + wg_.index,
                               arch::kWarpgroupSize);
      for_each<0, kConsumerOps>([&](auto& op, const auto& c) { op.begin_visit(c, tile); });
    }
    Staged::wait_empty(smem_.staged, staged_.phase);
#pragma unroll
    for (int slab = 0; slab < Shape::kSubtilesN; ++slab) {
      const Subtile st{tile.row0, tile.col0 + slab * Shape::kSubCols, 0, slab, 0};
      float v[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) v[i] = acc.reg[0][16 * slab + i];
      for_each<0, kConsumerOps>([&](auto& op, const auto& c) { op.visit(c, st, v); });
      uint32_t packed[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) packed[i] = pack2<StageT>(v[2 * i], v[2 * i + 1]);
      Subtile16::store(smem_.staged_tiles.subtile[wg_.index][slab], wg_.thread, packed);
    }
    Staged::arrive_full(smem_.staged);
    staged_.phase ^= 1;
  }

private:
  static constexpr bool kRollSubtiles = (Ops::kRollSubtiles || ...);
  static constexpr bool kRollPairs = (Ops::kRollPairs && ...);

  // The per-tile cp.async copies of every thread are visible to all after the barrier.
  __device__ void begin_visit(sm90::EpilogueTile tile) {
    __pipeline_wait_prior(0);
    sync();
    for_each<kFirstEpilogueOp, kOps>([&](auto& op, const auto& c) { op.begin_visit(c, tile); });
  }

  // One 64 x 32 subtile through the op chain: wait for its buffers, visit, TMA-store.
  template <int kRegs>
  __device__ __forceinline__ void visit_subtile(float (&regs)[kRegs], sm90::EpilogueTile tile,
                                                int block, int slab) {
    float v[16]; // this thread's values of the subtile, in AccumulatorMap register order
    load_slab(v, regs, slab);
    run_subtile(v, tile, block, slab, nullptr);
  }

  __device__ __forceinline__ void load_staged(float (&v)[16], int block, int slab) {
    uint32_t packed[8];
    Subtile16::load(smem_.staged_tiles.subtile[block][slab], wg_.thread, packed);
#pragma unroll
    for (int i = 0; i < 8; ++i) unpack(packed[i], v[2 * i], v[2 * i + 1]);
  }

  __device__ __forceinline__ void visit_staged_subtile(sm90::EpilogueTile tile, int block,
                                                       int slab) {
    // Strips: the fragment addresses the thread derives (ldmatrix, stmatrix, the ops' offsets)
    // recomputed per subtile. Hoisted out of the rolled slab loop, they held ~20 of the epilogue
    // warps' registers across it (K6 spilled 380 bytes in 88).
    if constexpr (kStrips) asm volatile("" : "+r"(wg_.thread));
    float v[16];
    load_staged(v, block, slab);
    run_subtile(v, tile, block, slab, smem_.staged_tiles.subtile[block][slab]);
  }

  // A block's subtiles left to right (rolled where an op asks: kRollSubtiles).
  __device__ __forceinline__ void visit_staged_slabs(sm90::EpilogueTile tile, int block) {
    if constexpr (kRollSubtiles) {
#pragma unroll 1
      for (int slab = 0; slab < Shape::kSubtilesN; ++slab) visit_staged_subtile(tile, block, slab);
    } else {
#pragma unroll
      for (int slab = 0; slab < Shape::kSubtilesN; ++slab) visit_staged_subtile(tile, block, slab);
    }
  }

  // kGroupCols columns of a block: the prepass sees them as the register tile of a narrower
  // warpgroup tile starting at the group's first column (the same map: fragment.hpp), then each
  // of their subtiles goes through the chain.
  __device__ __forceinline__ void visit_staged_group(sm90::EpilogueTile tile, int block,
                                                     int group) {
    float regs[kGroupCols / 2];
#pragma unroll
    for (int s = 0; s < kSlabsPerGroup; ++s) {
      float v[16];
      load_staged(v, block, group * kSlabsPerGroup + s);
#pragma unroll
      for (int i = 0; i < 16; ++i) regs[16 * s + i] = v[i];
    }
    const sm90::EpilogueTile at{tile.row0, tile.col0 + group * kGroupCols};
    for_each<kFirstEpilogueOp, kOps>(
        [&](auto& op, const auto& c) { op.visit_block(c, regs, at, block); });
#pragma unroll
    for (int s = 0; s < kSlabsPerGroup; ++s) {
      const int slab = group * kSlabsPerGroup + s;
      float v[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) v[i] = regs[16 * s + i];
      run_subtile(v, tile, block, slab, smem_.staged_tiles.subtile[block][slab]);
    }
  }

  __device__ __forceinline__ void run_subtile(float (&v)[16], sm90::EpilogueTile tile, int block,
                                              int slab, uint8_t* staged) {
    const Subtile st{tile.row0 + block * Shape::kSubRows,
                     tile.col0 + slab * Shape::kSubCols,
                     block,
                     slab,
                     subtile_ & 1,
                     staged};
    if constexpr (kWarpLocal) {
      // No slots and no loads to wait for: the warp's fragments, then its rows' stores.
      for_each<kFirstEpilogueOp, kOps>([&](auto& op, const auto& c) { op.visit(c, st, v); });
      cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
      __syncwarp();
      if (wg_.lane() == 0) {
        Subtile strip = st;
        strip.row0 += kStripRows * wg_.warp();
        strip.staged += kStripRows * Subtile16::kRowBytes * wg_.warp();
        strip.rows = kStripRows;
        for_each<kFirstEpilogueOp, kOps>([&](auto& op, const auto& c) { op.issue(c, strip); });
        cuda::ptx::cp_async_bulk_commit_group();
      }
      ++subtile_;
      return;
    }
    const uint32_t barrier = uint32_t(sm90::NamedBarrier::epilogue_warpgroup0) + wg_.index;
    begin_slot_write(wg_.thread, barrier, kEpilogueWarps * arch::kWarpSize);
    const bool last = block == Shape::kBlocks - 1 && slab == Shape::kSubtilesN - 1;
    if (wg_.thread == 0 && !last) {
      const bool next_block = slab == Shape::kSubtilesN - 1;
      const Subtile next{next_block ? st.row0 + Shape::kSubRows : st.row0,
                         next_block ? tile.col0 : st.col0 + Shape::kSubCols,
                         next_block ? block + 1 : block,
                         next_block ? 0 : slab + 1,
                         st.slot ^ 1,
                         nullptr};
      for_each<kFirstEpilogueOp, kOps>([&](auto& op, const auto& c) { op.prefetch(c, next); });
    }
    for_each<kFirstEpilogueOp, kOps>([&](auto& op, const auto& c) { op.visit(c, st, v); });
    end_slot_write(barrier, kEpilogueWarps * arch::kWarpSize);
    if (wg_.thread == 0) {
      for_each<kFirstEpilogueOp, kOps>([&](auto& op, const auto& c) { op.issue(c, st); });
      commit_slot_stores();
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

  __device__ static void unpack(uint32_t word, float& lo, float& hi) {
    if constexpr (std::is_same_v<StageT, bf16>) {
      lo = __uint_as_float(word << 16);
      hi = __uint_as_float(word & 0xffff0000u);
    } else {
      const __half2 h = *reinterpret_cast<const __half2*>(&word);
      lo = __low2float(h);
      hi = __high2float(h);
    }
  }

  __device__ void sync() {
    arch::named_barrier_sync(uint32_t(sm90::NamedBarrier::epilogue_warpgroup0) + wg_.index,
                             kEpilogueWarps * arch::kWarpSize);
  }

  template <int kBegin, int kEnd, class F> __device__ __forceinline__ void for_each(F&& f) {
    ops_.template for_each<kBegin, kEnd>(params_, smem_, wg_, f);
  }

  const Params& params_;
  SharedStorage& smem_;
  Warpgroup wg_;
  OpList<Seq, Ops...> ops_;
  uint32_t subtile_ = 0; // subtiles visited so far; the buffer slot is its parity
  [[no_unique_address]] std::conditional_t<kStaged, StagedState, NoStaging> staged_;
};

} // namespace coda::epilogue::device

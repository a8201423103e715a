// What the GEMM kernel requires of its Epilogue template parameter (ARCHITECTURE section 4).
// The kernel knows nothing else about it.
//
//   struct Epilogue {
//     struct Params;         // trivially copyable; lives in the kernel parameter block
//                            // (tensor maps included, so they are __grid_constant__)
//     struct SharedStorage;  // its shared memory, part of the kernel's SharedStorage
//     static __device__ void init(SharedStorage&);          // one thread, before the CTA sync:
//                                                           // mbarrier inits
//     __device__ Epilogue(const Params&, SharedStorage&, int consumer_warpgroup, int thread);
//     __device__ void begin_tile(EpilogueTile);             // before the mainloop of the tile
//     template <int kBlocks, int kN>
//     __device__ void visit(Accumulator<kBlocks, kN>&, EpilogueTile);   // after it
//     __device__ void end_tile(EpilogueTile);
//     __device__ void finish();                             // once, before the kernel exits
//     // Optional: called once per k-block of every later mainloop, while that k-block's MMAs
//     // run; may finish the previous tile's stores (it must not touch the accumulators).
//     __device__ void overlap_with_mainloop(int32_t k_block_in_item);
//   };
//
// All 128 threads of a consumer warpgroup call every member; the warpgroup may synchronize on
// its own named barrier (NamedBarrier::epilogue_warpgroup0 + consumer index) and no other.
//
// On the staged schedule (config.hpp) the Epilogue is constructed in the two consumer warpgroups
// and in the epilogue warpgroup (warpgroup argument kEpilogueWarpgroupIndex), and:
//   consumers, per tile:     begin_stage(EpilogueTile) before the mainloop, stage(acc, tile)
//                            after it (their 64-row block: round and write the staged tile);
//   epilogue warpgroup:      begin_tile(tile), visit_staged(tile), end_tile(tile) per tile (the
//                            tile's 128 rows), finish() once; it synchronizes on
//                            NamedBarrier::epilogue_warpgroup0, each consumer warpgroup on
//                            NamedBarrier::staged_consumer0 + its index.
// The staged tile and its barriers are part of the Epilogue's SharedStorage.
// A stream-K piece that only contributes partial sums to a tile finished elsewhere gets no
// begin_tile / visit / end_tile (see scheduler.hpp); the tile's owner visits the full sum.
#pragma once

#include <cstdint>

#include "coda/core/fragment.hpp"

namespace coda::sm90 {

using coda::Accumulator; // the fp32 accumulator registers visit() receives

// bar.sync ids of the GEMM kernel; id 0 is __syncthreads. mma_turn_*: ping-pong hand-over of
// the tensor cores between the consumer warpgroups (the kernel's, not the epilogue's).
enum class NamedBarrier : uint32_t {
  epilogue_warpgroup0 = 1,
  epilogue_warpgroup1 = 2,
  mma_turn_warpgroup0 = 3,
  mma_turn_warpgroup1 = 4,
  stream_k_warpgroup0 = 5, // stream-K partial sums, per consumer warpgroup (kernel's)
  stream_k_warpgroup1 = 6,
  staged_consumer0 = 7, // the staged schedule's consumers, running the ops before the Stage
  staged_consumer1 = 8,
};

// The warpgroup index the staged schedule's epilogue warpgroup passes to the Epilogue (the
// consumers pass 0 and 1).
constexpr int kEpilogueWarpgroupIndex = 2;

// Where a consumer warpgroup's rows of the current tile start in D. The warpgroup owns
// kBlocks * 64 rows from row0 and kN columns from col0 (the accumulator's shape); rows and
// columns past the end of D exist in the accumulator (computed from zero-filled operands)
// and must not be written.
struct EpilogueTile {
  int32_t row0;
  int32_t col0;
};

} // namespace coda::sm90

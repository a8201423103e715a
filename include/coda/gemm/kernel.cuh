// The persistent, warp-specialized GEMM kernel: wiring only. Warpgroup 0 produces (one elected
// thread issues TMA loads), warpgroups 1 and 2 consume (wgmma) and run the epilogue, or, on the
// staged schedule, hand their tile to warpgroup 3, which runs the epilogue while they start the
// next tile. The kernel calls the scheduler, the mainloop and the epilogue; it knows neither
// operand layouts nor what the epilogue computes.
#pragma once

#include <cstdint>
#include <type_traits>

#include "coda/arch/cluster.cuh"
#include "coda/arch/tma.cuh"
#include "coda/arch/warpgroup.cuh"
#include "coda/gemm/config.hpp"
#include "coda/gemm/epilogue_contract.hpp"
#include "coda/gemm/scheduler.hpp"
#include "coda/gemm/stream_k.cuh"

namespace coda::sm90 {

// The tile of a work item: the staged schedule's roles divide in 32 bits (scheduler.hpp).
template <class Config>
__device__ __forceinline__ TileCoord tile_of(const TileScheduler& sched, int64_t unit,
                                             uint32_t cta_rank) {
  using Index = std::conditional_t<Config::kStaged, uint32_t, int64_t>;
  return sched.template tile<Index>(unit, int32_t(cta_rank));
}

template <class Mainloop, class Epilogue> struct KernelParams {
  typename Mainloop::Params mainloop;
  typename Epilogue::Params epilogue;
  TileScheduler scheduler;
  StreamKWorkspace stream_k; // used when the scheduler has stream-K units
};

template <class Mainloop, class Epilogue> struct KernelSharedStorage {
  typename Mainloop::SharedStorage mainloop;
  typename Epilogue::SharedStorage epilogue;
};

// Ping-pong turn-taking over two named barriers of both consumer warpgroups (256 threads): the
// warpgroup whose turn it is waits (bar.sync) on its barrier; the other arrives on it when done.
__device__ __forceinline__ void mma_turn(int warpgroup, bool arrive) {
  const uint32_t id = uint32_t(NamedBarrier::mma_turn_warpgroup0) + uint32_t(warpgroup);
  if (arrive)
    arch::named_barrier_arrive(id, 2 * arch::kWarpgroupSize);
  else
    arch::named_barrier_sync(id, 2 * arch::kWarpgroupSize);
}

// Producer warps besides the TMA one that stage data into the ring (the FP8 mainloop's scale
// warps, Fp8Mainloop::load_scales), or 0.
template <class Mainloop> constexpr int scale_warps() {
  if constexpr (requires { Mainloop::kScaleWarps; })
    return Mainloop::kScaleWarps;
  else
    return 0;
}

template <class Epilogue>
__device__ __forceinline__ void overlap_with_mainloop(Epilogue& epilogue, int32_t k_block) {
  if constexpr (requires { epilogue.overlap_with_mainloop(k_block); })
    epilogue.overlap_with_mainloop(k_block);
}

// Stream-K owner: add the partial sums of the contributors to the unit into `acc`, in worker
// order (so the sum is the same run to run).
template <class Config, class Accum>
__device__ void add_stream_k_partials(const TileScheduler& sched, const StreamKWorkspace& ws,
                                      const WorkItem& item, int32_t worker, uint32_t cta_rank,
                                      int consumer, int thread, Accum& acc) {
  using Slots = StreamKSlots<Config::kClusterM, Config::kConsumerWarpgroups>;
  const uint32_t barrier = uint32_t(NamedBarrier::stream_k_warpgroup0) + uint32_t(consumer);
  const int32_t first = sched.sk_contributors_begin(worker, int32_t(item.unit - sched.dp_units()));
  for (int32_t w = first; w < worker; ++w)
    if (sched.sk_contributes(w))
      stream_k_accumulate(acc, ws, Slots::slot(w, cta_rank, consumer), thread, barrier);
}

template <class Config, class Mainloop, class Epilogue>
__device__ void consume(const KernelParams<Mainloop, Epilogue>& params,
                        KernelSharedStorage<Mainloop, Epilogue>& smem,
                        typename Mainloop::Pipeline& pipe, uint32_t cta_rank) {
  const int consumer = int(threadIdx.x) / arch::kWarpgroupSize - 1;
  const int thread = int(threadIdx.x) % arch::kWarpgroupSize;
  const uint32_t lane = threadIdx.x % arch::kWarpSize;
  // Cooperative and staged: both warpgroups on one tile, each owning half of its rows.
  constexpr bool kCooperative = Config::kSchedule != Schedule::pingpong;
  constexpr bool kStaged = Config::kStaged;
  const TileScheduler& sched = params.scheduler;
  const int32_t k_blocks = sched.k_blocks;

  Epilogue epilogue(params.epilogue, smem.epilogue, consumer, thread);
  typename Mainloop::Accum acc;
  typename Mainloop::State st;
  // Ping-pong: the warpgroups take alternate tiles; each skips the other's k-blocks in the ring.
  // (Ping-pong launches have no stream-K units, so every item is a whole tile.)
  if (!kCooperative) st.advance(uint32_t(consumer * k_blocks));

  const int64_t cluster = blockIdx.x / Config::kClusterM;
  const int64_t clusters = gridDim.x / Config::kClusterM;
  WorkIterator work(sched, cluster, clusters);
  WorkItem item;
  for (int64_t iteration = 0; work.next(item); ++iteration) {
    if (!kCooperative && iteration % Config::kConsumerWarpgroups != consumer) continue;
    const TileCoord tile = tile_of<Config>(sched, item.unit, cta_rank);
    const int first_block = kCooperative ? consumer * Config::kMmaBlocksM : 0;
    const EpilogueTile rows{tile.m_block * Config::kTileM + first_block * 64,
                            tile.n_block * Config::kTileN};
    // Stream-K: a piece that stops short of the last k-block only contributes partial sums.
    const bool contributes = kCooperative && item.k_end < k_blocks;
    if (!contributes) {
      if constexpr (kStaged)
        epilogue.begin_stage(rows);
      else
        epilogue.begin_tile(rows);
    }
    // Ping-pong: wait for the other warpgroup to finish its tile's MMAs before starting ours.
    // NOTE: besides ordering the tensor cores, this keeps the pipeline barriers at most one phase
    // ahead of the waiter: a warpgroup that skipped the other's k-blocks would otherwise wait on
    // a barrier several phases behind, and parity waits cannot tell those phases apart.
    if (!kCooperative && iteration > 0) mma_turn(consumer, /*arrive=*/false);
    Mainloop::mma_tile(params.mainloop, smem.mainloop, pipe, st, acc, tile, first_block,
                       item.k_begin, item.k_end, lane,
                       [&](int32_t k_block) { overlap_with_mainloop(epilogue, k_block); });
    if (!kCooperative && item.unit + clusters < sched.num_units())
      mma_turn(1 - consumer, /*arrive=*/true);
    if constexpr (kCooperative) {
      if (contributes) {
        using Slots = StreamKSlots<Config::kClusterM, Config::kConsumerWarpgroups>;
        stream_k_publish(acc, params.stream_k, Slots::slot(cluster, cta_rank, consumer), thread,
                         uint32_t(NamedBarrier::stream_k_warpgroup0) + uint32_t(consumer));
        continue;
      }
      if (item.k_begin > 0)
        add_stream_k_partials<Config>(sched, params.stream_k, item, int32_t(cluster), cta_rank,
                                      consumer, thread, acc);
    }
    if constexpr (kStaged) {
      epilogue.stage(acc, rows); // the epilogue warpgroup takes it from here
    } else {
      epilogue.visit(acc, rows);
      epilogue.end_tile(rows);
      if (!kCooperative) st.advance(uint32_t((Config::kConsumerWarpgroups - 1) * k_blocks));
    }
  }
  if constexpr (!kStaged) epilogue.finish();
}

// The staged schedule's epilogue warpgroup: the same work list as the consumers, one staged tile
// (all of its rows) per item they finish; stream-K contributors stage nothing.
template <class Config, class Mainloop, class Epilogue>
__device__ void run_epilogue(const KernelParams<Mainloop, Epilogue>& params,
                             KernelSharedStorage<Mainloop, Epilogue>& smem, uint32_t cta_rank) {
  const TileScheduler& sched = params.scheduler;
  Epilogue epilogue(params.epilogue, smem.epilogue, kEpilogueWarpgroupIndex,
                    int(threadIdx.x) % arch::kWarpgroupSize);
  WorkIterator work(sched, blockIdx.x / Config::kClusterM, gridDim.x / Config::kClusterM);
  for (WorkItem item; work.next(item);) {
    if (item.k_end < sched.k_blocks) continue;
    const TileCoord tile = tile_of<Config>(sched, item.unit, cta_rank);
    const EpilogueTile rows{tile.m_block * Config::kTileM, tile.n_block * Config::kTileN};
    epilogue.begin_tile(rows);
    epilogue.visit_staged(rows);
    epilogue.end_tile(rows);
  }
  epilogue.finish();
}

template <class Config, class Mainloop, class Epilogue>
__global__ void __launch_bounds__(Config::kThreads, 1)
    gemm_kernel(const __grid_constant__ KernelParams<Mainloop, Epilogue> params) {
  using SharedStorage = KernelSharedStorage<Mainloop, Epilogue>;
  // The swizzled buffers need 1024-byte alignment: declared here (PTX `.align 1024` on the
  // dynamic shared memory), so the launch adds no slack (the kilobyte gave the ping-pong K0
  // a 5th stage). The round-up below is then an identity; it stays because
  // taking smem_raw directly cost the forced-cooperative K5 an 8-byte spill (ptxas, sm_90a).
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  auto& smem = *reinterpret_cast<SharedStorage*>((uintptr_t(smem_raw) + 1023) & ~uintptr_t(1023));

  const uint32_t cta_rank = Config::kClusterM > 1 ? arch::cluster_cta_rank() : 0;
  constexpr int kReleasersPerCta =
      (Config::kSchedule != Schedule::pingpong ? Config::kConsumerWarpgroups : 1) *
      (arch::kWarpgroupSize / arch::kWarpSize);
  typename Mainloop::Pipeline pipe{smem.mainloop.barriers};

  if (threadIdx.x == 0) {
    arch::prefetch_tensormap(&params.mainloop.a);
    arch::prefetch_tensormap(&params.mainloop.b);
    pipe.init(kReleasersPerCta);
    Epilogue::init(smem.epilogue);
  }
  // Barrier inits must be visible cluster-wide before any peer multicasts or arrives remotely.
  if constexpr (Config::kClusterM > 1)
    arch::cluster_sync();
  else
    __syncthreads();

  const int warpgroup = int(threadIdx.x) / arch::kWarpgroupSize;
  if (warpgroup == 0) {
    arch::setmaxnreg_dec<Config::kProducerRegisters>();
    if (threadIdx.x / arch::kWarpSize == 0) {
      if (arch::elect_one_sync()) {
        typename Mainloop::State st;
        WorkIterator work(params.scheduler, blockIdx.x / Config::kClusterM,
                          gridDim.x / Config::kClusterM);
        for (WorkItem item; work.next(item);)
          Mainloop::load_tile(params.mainloop, smem.mainloop, pipe, st,
                              tile_of<Config>(params.scheduler, item.unit, cta_rank), item.k_begin,
                              item.k_end, item.k_rotation, cta_rank);
      }
      __syncwarp();
    } else if constexpr (scale_warps<Mainloop>() > 0) {
      // Warps 1.. : each stage's block scales (Fp8Mainloop::load_scales), tile by tile in the TMA
      // warp's order. Whole tiles only, a lean loop for the producer's 32 or 40 registers: a launch
      // with stream-K units would leave the consumers waiting for their scales, so it traps.
      if (int(threadIdx.x) / arch::kWarpSize <= Mainloop::kScaleWarps) {
        const TileScheduler& sched = params.scheduler;
        if (sched.has_stream_k()) __trap();
        typename Mainloop::State st;
        const int64_t clusters = gridDim.x / Config::kClusterM;
        for (int64_t unit = blockIdx.x / Config::kClusterM; unit < sched.dp_units();
             unit += clusters)
          Mainloop::load_scales(params.mainloop, smem.mainloop, pipe, st,
                                tile_of<Config>(sched, unit, cta_rank), sched.k_blocks);
      }
    } else if constexpr (Config::kEpilogueInProducer) {
      run_epilogue<Config>(params, smem, cta_rank); // warps 1..3 (staged_wide)
    }
  } else if (warpgroup <= Config::kConsumerWarpgroups) {
    arch::setmaxnreg_inc<Config::kConsumerRegisters>();
    consume<Config>(params, smem, pipe, cta_rank);
  } else {
    if constexpr (Config::kStaged) {
      if constexpr (Config::kEpilogueRegisters > 65536 / Config::kThreads) // above the entry's
        arch::setmaxnreg_inc<Config::kEpilogueRegisters>();
      else if constexpr (Config::kEpilogueWarpgroups > 0 &&
                         Config::kEpilogueRegisters < 65536 / Config::kThreads) // FP8's split
        arch::setmaxnreg_dec<Config::kEpilogueRegisters>();
      run_epilogue<Config>(params, smem, cta_rank);
    }
  }
  // NOTE: no CTA may exit while a peer can still multicast into its shared memory or arrive on
  // its barriers; after this barrier every peer has consumed (and so received) all its stages.
  if constexpr (Config::kClusterM > 1) arch::cluster_sync();
}

} // namespace coda::sm90

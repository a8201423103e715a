// The staged schedule's accumulator tile in shared memory (Schedule::staged, gemm/config.hpp): the
// consumer warpgroups round their fp32 accumulators to a 16-bit T and write them here, then start
// the next tile's MMAs; the epilogue warpgroup reads the tile back subtile by subtile and releases
// it when it is done. One tile deep: a full / empty mbarrier pair, like a one-stage pipeline.
//
// Layout: kBlocks x kSlabs subtiles of 64 rows x 32 columns, each as TMA reads and writes a 64 x 32
// box of a 16-bit tensor (64-byte rows, 64-byte swizzle), so that an epilogue may TMA-store an
// output subtile from the place it read it (an in-place store, TileStore's kInPlace). A thread
// moves its 16 fragment values of a subtile (AccumulatorMap<32> order) with two stmatrix.x4 and
// reads them back with two ldmatrix.x4 at the same lane addresses.
#pragma once

#include <cstdint>

#include <cuda/ptx>

#include "coda/arch/warpgroup.cuh"
#include "coda/epilogue/device/tile_io.cuh"
#include "coda/gemm/pipeline.cuh"

namespace coda::epilogue::device {

// One 64 x 32 subtile of 16-bit elements (SubtileLayout's 16-bit form: 64-byte rows, 64-byte
// swizzle), moved as a thread's 8 packed pairs (AccumulatorMap<32> order).
struct Subtile16 : SubtileLayout<uint16_t> {
  // packed[i] holds the pair of fragment values (2i, 2i + 1), low half first.
  __device__ static void store(uint8_t* buffer, int thread, const uint32_t (&packed)[8]) {
    write_subtile<uint16_t>(buffer, thread, packed);
  }
  __device__ static void load(const uint8_t* buffer, int thread, uint32_t (&packed)[8]) {
    read_subtile<uint16_t>(buffer, thread, packed);
  }
};

// The tile of kBlocks 64-row blocks (one per consumer warpgroup) by kCols columns, released by
// kReleasers arrivals (one thread of the epilogue warpgroup, or one per warp where each warp
// finishes on its own).
template <int kBlocks, int kCols, int kReleasers = 1> struct StagedTile {
  static constexpr int kSlabs = kCols / Subtile16::kCols;
  static_assert(kCols % Subtile16::kCols == 0, "whole 32-column subtiles");
  static constexpr int kWriters = kBlocks * arch::kWarpgroupSize; // the consumer threads

  // The tile and its barriers apart: a 16-byte barrier pair beside the 1024-byte aligned tile
  // would pad it by a kilobyte, which is what a fourth pipeline stage lacked (K1 and K2 with 32
  // staged partials per row).
  struct Tiles {
    alignas(1024) uint8_t subtile[kBlocks][kSlabs][Subtile16::kBytes];
  };
  struct Barriers {
    uint64_t full;  // the consumers wrote the tile: kWriters arrivals
    uint64_t empty; // the epilogue has read it (and its in-place stores have): kReleasers
  };
  using SharedStorage = Barriers; // what the waits and arrivals below take

  __device__ static void init(SharedStorage& s) {
    cuda::ptx::mbarrier_init(&s.full, kWriters);
    cuda::ptx::mbarrier_init(&s.empty, kReleasers);
  }

  // Consumers, every thread. `phase` counts the tiles this thread has staged (its parity).
  __device__ static void wait_empty(SharedStorage& s, uint32_t phase) {
    // The first wait passes: a fresh barrier's phase 1 is done.
    sm90::mbarrier_wait(&s.empty, phase ^ 1);
  }
  // Every consumer thread, after writing its subtiles: the arrive releases them to the reader.
  __device__ static void arrive_full(SharedStorage& s) {
    (void)cuda::ptx::mbarrier_arrive(&s.full);
  }

  // The epilogue warpgroup, every thread, before reading a tile.
  __device__ static void wait_full(SharedStorage& s, uint32_t phase) {
    sm90::mbarrier_wait(&s.full, phase);
  }
  // Each releaser, once its reads of the tile (and its bulk stores from it) are complete.
  __device__ static void release(SharedStorage& s) { (void)cuda::ptx::mbarrier_arrive(&s.empty); }
};

} // namespace coda::epilogue::device

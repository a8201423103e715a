// The block-scaled FP8 GEMM's kernels (gpu::gemm_fp8, fp8.cu): 128 x 128 or 128 x 192 tiles
// (sm90::Fp8Tile; coda/gemm/fp8_mainloop.cuh says what fits each), two consumer warpgroups of 64
// rows (cooperative), clusters of 2 along M sharing (multicasting) the B tile, the FP8 mainloop
// with B scaled by blocks or by rows, and the plain GEMM's register epilogue storing D (bf16 or
// f32) by TMA, adding D's old value when the call accumulates. A header so that the GPU tests
// check its host side.
#pragma once

#include <algorithm>

#include "coda/core/fp8.hpp"
#include "coda/epilogue/device/epilogue.cuh"
#include "coda/epilogue/device/linear.cuh"
#include "coda/gemm/fp8_mainloop.cuh"
#include "coda/gemm/launch.cuh"

namespace coda::gpu::fp8 {

// No deferred stores: their 32 registers of packed pairs do not fit beside the accumulator and
// its partials (docs/fp8.md).
template <class OutT>
using Epilogue =
    epilogue::device::LinearEpilogue<OutT, /*kWarpgroups=*/2, /*kOverlapStores=*/false>;

// As many stages as fit the 227 KB beside the epilogue's subtile buffers (32 KB of 16-bit D and
// C buffers, 64 KB of fp32 ones) and the ring's barriers (launch.cuh asserts the sum): 32 KB a
// stage at 128 x 128 (A and B tiles of 128 rows x 128 bytes): 6 with a bf16 D, 5 with an f32
// one; 40 KB at 128 x 192: 4 with either (a fifth at bf16 would need the 16 KB of C buffers,
// which only the accumulating call reads).
template <class OutT, int kTileN>
inline constexpr int kStages = std::min<int>(
    8, int((sm90::kMaxSharedBytes - sizeof(typename Epilogue<OutT>::SharedStorage) - 1024) /
           ((128 + kTileN) * 128)));
static_assert(kStages<bf16, 128> == 6 && kStages<float, 128> == 5 && kStages<bf16, 192> == 4 &&
                  kStages<float, 192> == 4,
              "the depths docs/fp8.md gives (and the 128 x 128 kernels were measured with)");

template <class OutT, int kTileN>
using Config = sm90::GemmConfig<128, kTileN, kStages<OutT, kTileN>, 2, sm90::Schedule::cooperative,
                                /*kOperandBytes=*/1>;
// kOverlapPromotion: the blocks form's promotion overlaps the next batch of wgmmas (128 columns:
// two full-width partials; 192: the halves' partials); without it, one partial (the
// n192_one_partial study kernel). By rows the mainloop always takes one partial.
template <Fp8BScaling kBScaling, class OutT, int kTileN = 128, bool kOverlapPromotion = true>
using Kernel =
    sm90::GemmKernel<Config<OutT, kTileN>, GemmLayout::fwd, e4m3, Epilogue<OutT>,
                     sm90::Fp8Mainloop<Config<OutT, kTileN>, kBScaling, kOverlapPromotion>>;

// The staged forms (Fp8Tile::n128_staged and n128_staged_one_partial; sm90::Fp8Tile says why):
// the consumers on the staged schedule, each consumer warpgroup rounding its 64 x 128 to bf16
// into the 32 KB staged tile and starting the next tile, the fourth warpgroup storing it in place
// by TMA (the plain staged GEMM's list, gpu/gemm/instances.cuh, without alpha). As many stages
// as fit beside the staged tile. kPartials: 2 (the overlapped promotion and the two-partial
// register split, gemm_fp8's: 232 registers for the consumers, 24 for the epilogue warpgroup) or
// 1 (the fused kernels' staged FP8 consumers and split, Fp8StagedShape's: 192 and 104).
namespace staged {
namespace dev = coda::epilogue::device;
using Shape = dev::TileShape<1, 128, 128, /*staged=*/true>;
using Store = dev::TileStore<Shape, bf16, /*reduce_add=*/false, /*in_place=*/true>;
using Epilogue = dev::FusedEpilogue<Shape, dev::Stage<bf16>, Store>;
template <int kStages, int kPartials>
using ConfigAt =
    sm90::GemmConfig<128, 128, kStages, 2, sm90::Schedule::staged, /*bytes=*/1, kPartials>;
template <int kStages, int kPartials>
using MainloopAt =
    sm90::Fp8Mainloop<ConfigAt<kStages, kPartials>, Fp8BScaling::blocks, kPartials == 2>;
// The ring's depth (the consumers' form changes no shared memory).
template <int kStages = 8> constexpr int stages() {
  if constexpr (kStages <= 2 ||
                sizeof(sm90::KernelSharedStorage<MainloopAt<kStages, 2>, Epilogue>) <=
                    sm90::kMaxSharedBytes)
    return kStages;
  else
    return stages<kStages - 1>();
}
template <int kPartials>
using KernelWith = sm90::GemmKernel<ConfigAt<stages(), kPartials>, GemmLayout::fwd, e4m3, Epilogue,
                                    MainloopAt<stages(), kPartials>>;
using Kernel = KernelWith<2>; // n128_staged, gemm_fp8's default
} // namespace staged

} // namespace coda::gpu::fp8

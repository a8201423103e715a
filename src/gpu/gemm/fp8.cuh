// The block-scaled FP8 GEMM's kernels (gpu::gemm_fp8, fp8.cu): 128 x 128 tiles, two consumer
// warpgroups of 64 rows (cooperative), clusters of 2 along M sharing (multicasting) the B tile,
// the FP8 mainloop (coda/gemm/fp8_mainloop.cuh says why 128 columns) with B scaled by blocks or
// by rows, and the plain GEMM's register epilogue storing D (bf16 or f32) by TMA, adding D's old
// value when the call accumulates. A header so that the GPU tests check its host side.
#pragma once

#include "coda/core/fp8.hpp"
#include "coda/gemm/fp8_mainloop.cuh"
#include "coda/gemm/launch.cuh"
#include "coda/gemm/linear_epilogue.cuh"

namespace coda::gpu::fp8 {

// NOTE: 6 stages of 32 KB (A and B tiles of 128 rows x 128 bytes) beside the epilogue's 32 KB
// of 16-bit D and C subtile buffers fill the 227 KB (launch.cuh asserts it); a 7th does not fit.
// fp32 subtile buffers take 64 KB, leaving room for 5.
template <class OutT> inline constexpr int kStages = sizeof(OutT) == 2 ? 6 : 5;
template <class OutT>
using Config = sm90::GemmConfig<128, 128, kStages<OutT>, 2, sm90::Schedule::cooperative,
                                /*kOperandBytes=*/1>;
// No deferred stores: their 32 registers of packed pairs do not fit beside the two
// accumulators (docs/fp8.md).
template <class OutT>
using Epilogue =
    sm90::LinearEpilogue<OutT, Config<OutT>::kConsumerWarpgroups, /*kOverlapStores=*/false>;
template <Fp8BScaling kBScaling, class OutT>
using Kernel = sm90::GemmKernel<Config<OutT>, GemmLayout::fwd, e4m3, Epilogue<OutT>,
                                sm90::Fp8Mainloop<Config<OutT>, kBScaling>>;

} // namespace coda::gpu::fp8

// The fused kernels of the GPU backend (K0, K1, K2, K4, K5 and the backward K6, K7;
// coda/kernels/args.hpp has their math). Each is one launch of the persistent GEMM with a
// FusedEpilogue (coda/epilogue/device). Entry points take validated arguments on the current
// device, launch on `stream` and return without synchronizing; shapes the GPU path does not
// cover throw Status::not_supported.
#pragma once

#include "coda/kernels/args.hpp"

namespace coda::gpu {

// The GEMM schedule under the fused kernels (coda/epilogue/device/launch.cuh):
//   cooperative: 128 x 256 tiles, both consumer warpgroups on one tile, the epilogue on their
//                registers while the tensor cores wait (the plain GEMM's workhorse);
//   pingpong:    128 x 128 tiles on alternate warpgroups, so one's epilogue overlaps the other's
//                MMAs, at the cost of a smaller tile;
//   staged:      128 x 192 tiles whose accumulators the consumers hand over in shared memory
//                (rounded to the call's 16-bit type), the epilogue in a fourth warpgroup during
//                the next tile's MMAs (docs/epilogue.md, "The staged schedule").
// `automatic` takes each kernel's default, the faster one measured: sm90::fused_schedule
// (coda/gemm/heuristic.hpp, beside the plain GEMM's choice, with the numbers behind each). A
// forced schedule a kernel has no variant for runs its default (K0 and K4 with head_dim 128 have
// no staged one; K7 no cooperative one); forced staged is K6's staged_wide. Forcing lets
// benchmarks and tests compare the variants. Process-wide, not thread-safe.
enum class FusedSchedule : int { automatic = 0, cooperative = 1, pingpong = 2, staged = 3 };
void set_fused_schedule(FusedSchedule schedule);

// One function per row of CODA_FUSED_KERNELS (coda/kernels/args.hpp), in fused/<k>.cu. K4 runs
// head_dim 64 or 128 (a tile holds whole heads); K6 and K7 are input-gradient (dgrad) GEMMs.
#define CODA_DECLARE_FUSED(fn, Args) void fn(const Args& args, Stream stream);
CODA_FUSED_KERNELS(CODA_DECLARE_FUSED)
#undef CODA_DECLARE_FUSED

} // namespace coda::gpu

// K2's launch with the gated activation as a parameter, for K2 itself (gemm_rms_swiglu,
// fused/k2.cu) and its variants with another gate (fused/k2_*.cu):
//   z = round(rstd[m] * (a · wᵀ)) on the fused interleaved gate/up weight;
//   preact = z, act[m, j] = round(Gate(z[m, 2j], z[m, 2j + 1])) from z as stored.
#pragma once

#include "gpu/fused/common.cuh"

namespace coda::gpu::fused {

// kStaged rstd partials staged per row on the cooperative schedule: 32 fit every hidden size up
// to 4096 (one partial per 128 columns), but their 16 KB leave the cooperative kernel 3 pipeline
// stages; with 16 (hidden up to 2048, e.g. Llama-1B) the 8 KB saved buy a fourth
// (docs/epilogue.md). Rows with more partials than staged would read them from global memory
// after the mainloop, so the launch takes the variant that stages them all. On the staged
// schedule the consumers hold them in registers instead (dev::kPartialsInRegisters): 4 stages.
// T the outputs' 16-bit type, Operand a's and w's: T, or e4m3 on the FP8 mainloop's tiles
// (docs/fp8.md; Fp8Shape, cooperative 128 x 128, or Fp8StagedShape).
template <class Shape, class T, int kStaged, class Gate, class Operand = T, class GatedArgs>
void run_rms_gated(const GatedArgs& args, Stream stream) {
  using Ops = DeviceOps<Shape, T, kStaged>;
  Launch<kernels::RmsGatedOps<Ops, Gate>, Operand>::run_operands(
      args.a, args.a_scales, args.w, args.w_scales, stream, rstd_params<Ops>(args), {},
      Ops::MainStore::params("preact", args.preact),
      Ops::template GatedPairStore<Gate>::params("act", args.act));
}

// The entry point of a K2 variant named `kernel`, on the schedule and staging it runs best on.
template <class Gate, class GatedArgs>
void gemm_rms_gated(const char* kernel, const GatedArgs& args, Stream stream) {
  require_device(kernel);
  if (args.a.dtype == DType::e4m3)
    return with_half_type(args.preact.dtype, [&](auto t) {
      with_fp8_rstd_variant([&](auto shape, auto p) {
        run_rms_gated<decltype(shape), decltype(t), decltype(p)::value, Gate, e4m3>(args, stream);
      });
    });
  const bool few_partials = args.sumsq_partials.shape[1] <= 16;
  with_half_type(args.a.dtype, [&](auto t) {
    // Staged (4 stages with the partials in registers; with them in shared memory at the
    // Llama-8B width, 3 stages measured 1.31x the plain GEMM against the cooperative 1.15x).
    with_schedule<true>(default_schedule(sm90::FusedKernel::k2), [&](auto shape) {
      using Shape = decltype(shape);
      using T = decltype(t);
      if constexpr (Shape::kStaged)
        run_rms_gated<Shape, T, dev::kPartialsInRegisters, Gate>(args, stream);
      else if (few_partials)
        run_rms_gated<Shape, T, 16, Gate>(args, stream);
      else
        run_rms_gated<Shape, T, 32, Gate>(args, stream);
    });
  });
}

} // namespace coda::gpu::fused

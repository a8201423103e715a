// The argument rules of every public entry point, written in the vocabulary of validate.hpp.
// Each function throws coda::Error on the first violation and otherwise returns the device the
// call runs on. Shapes and dtypes are those of coda/gemm/problem.hpp and coda/kernels/args.hpp.
#pragma once

#include "coda/gemm/problem.hpp"
#include "coda/kernels/args.hpp"

namespace coda::api {

Device validate(const GemmArgs& args);
Device validate(const Fp8GemmArgs& args);
Device validate(const QuantizeWeightFp8Args& args);
Device validate(const QuantizeActivationFp8Args& args);
// One per kernel of the tables in coda/kernels/args.hpp: K0..K7 in checks_gemm.cpp, the
// auxiliary kernels in checks_aux.cpp.
#define CODA_DECLARE_VALIDATE(fn, Args) Device validate(const Args& args);
CODA_FUSED_KERNELS(CODA_DECLARE_VALIDATE)
CODA_AUX_KERNELS(CODA_DECLARE_VALIDATE)
#undef CODA_DECLARE_VALIDATE

// interleave_gate_up (src = stacked, dst = fused) and deinterleave_gate_up (the reverse):
// both [2F, K], one dtype, row-contiguous, not overlapping.
Device validate_gate_up(const char* op, const char* src_name, const TensorView& src,
                        const char* dst_name, const TensorView& dst);

} // namespace coda::api

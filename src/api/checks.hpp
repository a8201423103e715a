// The argument rules of every public entry point, written in the vocabulary of validate.hpp.
// Each function throws coda::Error on the first violation and otherwise returns the device the
// call runs on. Shapes and dtypes are those of coda/gemm/problem.hpp and coda/kernels/args.hpp.
#pragma once

#include "coda/gemm/problem.hpp"
#include "coda/kernels/args.hpp"

namespace coda::api {

Device validate(const GemmArgs& args);
Device validate(const ResidualRmsArgs& args);
Device validate(const RmsScaleArgs& args);
Device validate(const RmsSwigluArgs& args);
Device validate(const RmsRopeArgs& args);
Device validate(const RmsLseArgs& args);
Device validate(const RmsBackwardArgs& args);
Device validate(const SwigluBackwardArgs& args);

Device validate(const RmsStatsArgs& args);
Device validate(const RstdArgs& args);
Device validate(const RowReduceArgs& args);
Device validate(const ColReduceArgs& args);
Device validate(const RopeBackwardArgs& args);
Device validate(const CrossEntropyArgs& args);

// interleave_gate_up (src = stacked, dst = fused) and deinterleave_gate_up (the reverse):
// both [2F, K], one dtype, row-contiguous, not overlapping.
Device validate_gate_up(const char* op, const char* src_name, const TensorView& src,
                        const char* dst_name, const TensorView& dst);

} // namespace coda::api

// The GPU backend's memory-bound kernels outside the GEMMs (coda/kernels/args.hpp has their
// math): the finishing sums of row and column partials, rstd, the RoPE backward with zeta, and
// the cross-entropy forward-backward. Deterministic: fixed reduction orders, no float atomics.
// Entry points take validated arguments on the current device, launch on `stream` and return
// without synchronizing.
#pragma once

#include "coda/kernels/args.hpp"

namespace coda::gpu {

void rstd_from_partials(const RstdArgs& args, Stream stream);
void reduce_row_partials(const RowReduceArgs& args, Stream stream);
void reduce_col_partials(const ColReduceArgs& args, Stream stream);
void rope_backward(const RopeBackwardArgs& args, Stream stream);
void cross_entropy(const CrossEntropyArgs& args, Stream stream);

} // namespace coda::gpu

// The GPU backend's memory-bound kernels outside the GEMMs (coda/kernels/args.hpp has their
// math): the first layer's RMSNorm statistics, the finishing sums of row and column partials,
// rstd, the RoPE backward with zeta, and the cross-entropy forward-backward. Deterministic:
// fixed reduction orders, no float atomics. Entry points take validated arguments on the current
// device, launch on `stream` and return without synchronizing.
#pragma once

#include "coda/kernels/args.hpp"

namespace coda::gpu {

// One function per row of CODA_AUX_KERNELS (coda/kernels/args.hpp).
#define CODA_DECLARE_AUX(fn, Args) void fn(const Args& args, Stream stream);
CODA_AUX_KERNELS(CODA_DECLARE_AUX)
#undef CODA_DECLARE_AUX

} // namespace coda::gpu

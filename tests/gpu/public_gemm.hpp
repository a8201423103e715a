// The public coda::gemm, callable from translation units that also use the GEMM internals: the
// function coda::gemm (coda/coda.hpp) and the namespace coda::gemm cannot both be declared in
// one translation unit, so test_gemm_public.cpp wraps the function.
#pragma once

#include "coda/gemm/problem.hpp"
#include "coda/kernels/args.hpp"

namespace coda::test {

void public_gemm(const GemmArgs& args, Stream stream); // coda::gemm(args, stream)

} // namespace coda::test

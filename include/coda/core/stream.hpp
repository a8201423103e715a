// The stream every entry point takes: the same type as cudaStream_t, without including CUDA.
#pragma once

struct CUstream_st;

namespace coda {

using Stream = CUstream_st*; // nullptr is the default stream

} // namespace coda

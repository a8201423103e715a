// Where a call runs, and the checks that need the CUDA runtime. Without CODA_WITH_CUDA every
// CUDA-labelled tensor is not_supported and nothing here touches CUDA.
#pragma once

#include "api/validate.hpp"

namespace coda::api {

// A CUDA-labelled tensor in a build without the CUDA backend.
[[noreturn]] void no_cuda_backend(const Validator& v, const char* name);

// What the CUDA runtime says about t.data must match its label: device memory labelled cpu,
// or host memory labelled cuda (or on another device than t.device_index), is an error.
// Managed memory is accessible from both sides and passes either way.
void check_memory_matches_label(const Validator& v, const char* name, const TensorView& t);

// The GPU backend launches on the current device, so the tensors must live there.
void check_current_device(const Validator& v, const char* name, int32_t device_index);

// The GPU path needs an sm_90 (Hopper) device; anything else is not_supported, naming the
// device and its compute capability.
void require_supported_gpu(const char* op);

} // namespace coda::api

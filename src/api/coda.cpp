// The C++ entry points: validate, then run on the backend of the tensors' device. The CPU
// backend computes synchronously and ignores the stream.
#include "coda/coda.hpp"
#include <algorithm>

#include <string>

#include "api/checks.hpp"
#include "api/device.hpp"
#include "cpu/backend.hpp"

#if CODA_WITH_CUDA
#include "gpu/backend.hpp"
#include "gpu/gemm/workspace.hpp"
#include "gpu/auxiliary/kernels.hpp"
#include "gpu/fused/kernels.hpp"
#endif

namespace coda {

size_t gemm_workspace_size(const GemmArgs& args) {
  if (api::validate(args) == Device::cpu) return 0;
  api::require_supported_gpu("gemm_workspace_size");
#if CODA_WITH_CUDA
  return gpu::gemm_workspace_size(args);
#else
  return 0;
#endif
}

size_t gemm_workspace_size(GemmLayout layout, int64_t m, int64_t n, int64_t k, DType out) {
  if (m < 1 || n < 1 || k < 1)
    throw Error(Status::invalid_argument, "gemm_workspace_size: m, n and k must be >= 1; got " +
                                              std::to_string(m) + ", " + std::to_string(n) +
                                              " and " + std::to_string(k));
#if CODA_WITH_CUDA
  if (!gpu::device_supported()) return 0;
  // Shapes and dtypes only: the GPU query reads no data. The plan may differ by input dtype (the
  // 128 x 192 kernel is bf16 only), so the most either 16-bit input's plan needs.
  const bool wgrad = layout == GemmLayout::wgrad;
  size_t most = 0;
  for (DType in : {DType::bf16, DType::f16}) {
    GemmArgs g;
    g.layout = layout;
    g.a = wgrad ? make_view(nullptr, in, k, m, Device::cuda)
                : make_view(nullptr, in, m, k, Device::cuda);
    g.b = layout == GemmLayout::fwd ? make_view(nullptr, in, n, k, Device::cuda)
                                    : make_view(nullptr, in, k, n, Device::cuda);
    g.d = make_view(nullptr, out, m, n, Device::cuda);
    most = std::max(most, gpu::gemm_workspace_size(g));
  }
  return most;
#else
  (void)layout, (void)out;
  return 0;
#endif
}

namespace {

// Validate, then run on the backend of the tensors' device.
template <class Args, class CpuKernel, class GpuKernel>
void run(const char* name, const Args& args, Stream stream, CpuKernel cpu_kernel,
         GpuKernel gpu_kernel) {
  if (api::validate(args) == Device::cpu) return cpu_kernel(args);
  api::require_supported_gpu(name);
#if CODA_WITH_CUDA
  gpu_kernel(args, stream);
#else
  (void)stream, (void)gpu_kernel;
#endif
}

#if CODA_WITH_CUDA
#define CODA_GPU_KERNEL(fn) [](const auto& x, Stream s) { gpu::fn(x, s); }
#else
#define CODA_GPU_KERNEL(fn) [](const auto&, Stream) {}
#endif

} // namespace

// The GEMMs and every named and auxiliary kernel (the tables of coda/kernels/args.hpp): validate,
// then run on the CPU or the GPU backend's function of the same name.
#define CODA_ENTRY_POINT(fn, Args)                                                                 \
  void fn(const Args& args, Stream stream) {                                                       \
    run(                                                                                           \
        #fn, args, stream, [](const Args& x) { cpu::fn(x); }, CODA_GPU_KERNEL(fn));                \
  }
CODA_ENTRY_POINT(gemm, GemmArgs)
CODA_ENTRY_POINT(gemm_fp8, Fp8GemmArgs)
CODA_ENTRY_POINT(quantize_weight_fp8, QuantizeWeightFp8Args)
CODA_ENTRY_POINT(quantize_activation_fp8, QuantizeActivationFp8Args)
CODA_FUSED_KERNELS(CODA_ENTRY_POINT)
CODA_AUX_KERNELS(CODA_ENTRY_POINT)
#undef CODA_ENTRY_POINT

// One f32 loss and one i32 "counted" flag per row, each region 256-byte aligned, so the GPU
// reduces the loss deterministically without atomics.
size_t cross_entropy_workspace_size(int64_t m) {
  if (m < 0)
    throw Error(Status::invalid_argument,
                "cross_entropy_workspace_size: m must be >= 0; got " + std::to_string(m));
  // Each region rounded up to 256 bytes. A size past SIZE_MAX is an error, never a wrapped
  // (small) number: m >= 2^61 used to return 0 bytes.
  const auto padded = [m](size_t element, size_t* bytes) {
    return !__builtin_mul_overflow(size_t(m), element, bytes) &&
           !__builtin_add_overflow(*bytes, size_t(255), bytes);
  };
  size_t loss = 0, flags = 0, total = 0;
  if (!padded(sizeof(float), &loss) || !padded(sizeof(int32_t), &flags) ||
      __builtin_add_overflow(loss / 256 * 256, flags / 256 * 256, &total))
    throw Error(Status::invalid_argument,
                "cross_entropy_workspace_size: m = " + std::to_string(m) +
                    " rows need more than SIZE_MAX bytes of workspace");
  return total;
}

} // namespace coda

// What the auxiliary kernels (reductions.cu, rope_backward.cu, cross_entropy.cu) share: the launch
// checks, the dtype dispatch, and 16-bit vectors of W elements as fp32.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include <cuda_runtime.h>

#include "coda/core/error.hpp"
#include "coda/epilogue/device/tile_io.cuh"
#include "gpu/backend.hpp"

namespace coda::gpu::aux {

namespace dev = coda::epilogue::device;

using gpu::require_device;

// A launch error (bad configuration, no kernel image) as Status::cuda_error.
inline void check_launch(const char* kernel) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throw Error(Status::cuda_error,
                std::string("launching ") + kernel + ": " + cudaGetErrorString(e));
}

// f(bf16{}) or f(f16{}) for the call's 16-bit dtype.
template <class F> void with_half_type(DType dtype, F&& f) {
  gpu::with_half_type(dtype, "the GPU auxiliary kernels", std::forward<F>(f));
}

// The memory word of W 16-bit elements: one 16-, 8-, 4- or 2-byte load or store, and its
// 32-bit words (pairs of elements, the lower address in the low half) for W >= 2.
template <int W> struct HalfVector;
template <> struct HalfVector<8> {
  using type = uint4;
  __device__ static void split(const uint4& v, uint32_t (&w)[4]) {
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
  }
  __device__ static uint4 join(const uint32_t (&w)[4]) {
    return make_uint4(w[0], w[1], w[2], w[3]);
  }
};
template <> struct HalfVector<4> {
  using type = uint2;
  __device__ static void split(const uint2& v, uint32_t (&w)[2]) { w[0] = v.x, w[1] = v.y; }
  __device__ static uint2 join(const uint32_t (&w)[2]) { return make_uint2(w[0], w[1]); }
};
template <> struct HalfVector<2> {
  using type = uint32_t;
  __device__ static void split(uint32_t v, uint32_t (&w)[1]) { w[0] = v; }
  __device__ static uint32_t join(const uint32_t (&w)[1]) { return w[0]; }
};
template <> struct HalfVector<1> { using type = uint16_t; };

// W elements at p (aligned to 2 W bytes) as fp32.
template <class T, int W> __device__ __forceinline__ void load_halves(const T* p, float (&out)[W]) {
  using V = HalfVector<W>;
  const typename V::type v = *reinterpret_cast<const typename V::type*>(p);
  if constexpr (W == 1) {
    out[0] = dev::to_float<T>(v);
  } else {
    uint32_t w[W / 2];
    V::split(v, w);
#pragma unroll
    for (int k = 0; k < W / 2; ++k) {
      const float2 f = dev::unpack2<T>(w[k]);
      out[2 * k] = f.x;
      out[2 * k + 1] = f.y;
    }
  }
}

// W fp32 values rounded to T (round to nearest even, as the CPU backend rounds) at p.
template <class T, int W> __device__ __forceinline__ void store_halves(T* p, const float (&in)[W]) {
  using V = HalfVector<W>;
  auto* dst = reinterpret_cast<typename V::type*>(p);
  if constexpr (W == 1) {
    *dst = dev::from_float<T>(in[0]);
  } else {
    uint32_t w[W / 2];
#pragma unroll
    for (int k = 0; k < W / 2; ++k) w[k] = dev::pack2<T>(in[2 * k], in[2 * k + 1]);
    // st.global.wb is a plain store; spelled as the intrinsic because nvcc 13 split the plain
    // assignment of the joined vector into 4-byte stores in the RoPE kernel.
    __stwb(dst, V::join(w));
  }
}

} // namespace coda::gpu::aux

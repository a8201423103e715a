// The unfused path's GEMM on FP8 operands for the GPU suites of the fused kernels.
#pragma once

#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "coda/coda.hpp"
#include "tests/common/check.hpp"
#include "tests/common/fp8_case.hpp"
#include "tests/common/kernel_fixtures.hpp"
#include "tests/gpu/device_tensor.hpp"

namespace coda::test {

// gemm_fp8's f32 product of the device operands: the unfused path's GEMM on FP8 operands.
// Hopper's FP8 tensor cores sum a scale block's products with fewer bits than fp32 (about 14,
// docs/fp8.md), so an fp32 sum is no baseline for a kernel on that mainloop: on
// FusedRmsGatedFp8 (f16, M 37, 2F 272, K 144, seed 154620695687, H200 2026-12-05) the fused
// preact was one f16 ulp from the correctly rounded value, 0.068 from fp64 at 88.8, against the
// fp32 path's 0.031. The fused kernels run gemm_fp8's mainloop (FusedOps.Fp8MainloopUnderTheDriver
// GivesGemmFp8AndItsRowCopy), so this product's errors are theirs. It is held to the fp64 product
// within test_gemm_fp8.cu's bound (2^-8 of the sum of |A B|), so that a wrong scale shared by
// both kernels cannot widen the baseline unseen.
inline std::vector<double> fp8_product(const Fp8GemmCase& g, const TensorView& a,
                                       const TensorView& a_scales, const TensorView& w,
                                       const TensorView& w_scales) {
  HostTensor host(DType::f32, {a.shape[0], w.shape[0]});
  DeviceTensor d(host);
  gemm_fp8({.a = a, .a_scales = a_scales, .b = w, .b_scales = w_scales, .d = d.view()}, nullptr);
  synchronize_ok();
  EXPECT_TRUE(d.copy_back()) << "gemm_fp8 wrote past the end of d";
  const std::vector<double> product = host.values(), exact = g.exact(), magnitude = g.magnitude();
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < product.size(); ++i)
    if (!(std::fabs(product[i] - exact[i]) <=
          std::ldexp(magnitude[i], -8) + 4 * ulp_of(DType::f32, std::fabs(exact[i]))))
      first = bad++ == 0 ? i : first;
  EXPECT_EQ(bad, 0u) << "gemm_fp8's product from " << first << ": " << product[first] << " vs fp64 "
                     << exact[first] << " (seed " << test_seed() << ")";
  return product;
}

} // namespace coda::test

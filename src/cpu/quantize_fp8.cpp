// The FP8 quantizers on the CPU: a weight's codes and 128 x 128 block scales
// (QuantizeWeightFp8Args) and an activation's codes with 1 x 128 block scales
// (QuantizeActivationFp8Args), each with its transposed copy (a weight's may be the only one):
// the GPU kernels' math (coda/core/fp8.hpp), block by block.
#include <algorithm>
#include <utility>

#include "coda/core/fp8.hpp"
#include "coda/epilogue/host_tensor.hpp"
#include "cpu/backend.hpp"

namespace coda::cpu {

void quantize_weight_fp8(const QuantizeWeightFp8Args& args) {
  using epilogue::element_offset;
  const int64_t N = args.n(), K = args.k();
  const bool rows = args.codes.data != nullptr, transposed = args.codes_t.data != nullptr;
  for (int64_t n0 = 0; n0 < N; n0 += kFp8ScaleBlock)
    for (int64_t k0 = 0; k0 < K; k0 += kFp8ScaleBlock) {
      const int64_t n1 = std::min<int64_t>(N, n0 + kFp8ScaleBlock);
      const int64_t k1 = std::min<int64_t>(K, k0 + kFp8ScaleBlock);
      const int64_t cols = k1 - k0;
      const auto at = [&](int64_t i) { return std::pair{n0 + i / cols, k0 + i % cols}; };
      const int exponent =
          quantize_block_e4m3((n1 - n0) * cols,
                              [&](int64_t i) {
                                const auto [n, k] = at(i);
                                return epilogue::load_float(args.w, n, k);
                              },
                              [&](int64_t i, e4m3 q) {
                                const auto [n, k] = at(i);
                                if (rows)
                                  args.codes.ptr<e4m3>()[element_offset(args.codes, n, k)] = q;
                                if (transposed)
                                  args.codes_t.ptr<e4m3>()[element_offset(args.codes_t, k, n)] = q;
                              });
      const int64_t nb = n0 / kFp8ScaleBlock, kb = k0 / kFp8ScaleBlock;
      if (rows)
        args.scales.ptr<e8m0>()[element_offset(args.scales, nb, kb)] = e8m0::of_exponent(exponent);
      if (transposed)
        args.scales_t.ptr<e8m0>()[element_offset(args.scales_t, kb, nb)] =
            e8m0::of_exponent(exponent);
    }
}

void quantize_activation_fp8(const QuantizeActivationFp8Args& args) {
  using epilogue::element_offset;
  const int64_t M = args.m(), K = args.k();
  // codes: blocks of 128 columns of a row.
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k0 = 0; k0 < K; k0 += kFp8ScaleBlock) {
      const int exponent = quantize_block_e4m3(
          std::min<int64_t>(K - k0, kFp8ScaleBlock),
          [&](int64_t i) { return epilogue::load_float(args.x, m, k0 + i); },
          [&](int64_t i, e4m3 q) {
            args.codes.ptr<e4m3>()[element_offset(args.codes, m, k0 + i)] = q;
          });
      args.scales.ptr<e8m0>()[element_offset(args.scales, m, k0 / kFp8ScaleBlock)] =
          e8m0::of_exponent(exponent);
    }
  if (args.codes_t.data == nullptr) return;
  // codes_t: blocks of 128 rows of a column of x, each its own block (not the rows' codes,
  // transposed), stored along a row of codes_t.
  for (int64_t k = 0; k < K; ++k)
    for (int64_t m0 = 0; m0 < M; m0 += kFp8ScaleBlock) {
      const int exponent = quantize_block_e4m3(
          std::min<int64_t>(M - m0, kFp8ScaleBlock),
          [&](int64_t i) { return epilogue::load_float(args.x, m0 + i, k); },
          [&](int64_t i, e4m3 q) {
            args.codes_t.ptr<e4m3>()[element_offset(args.codes_t, k, m0 + i)] = q;
          });
      args.scales_t.ptr<e8m0>()[element_offset(args.scales_t, k, m0 / kFp8ScaleBlock)] =
          e8m0::of_exponent(exponent);
    }
}

} // namespace coda::cpu

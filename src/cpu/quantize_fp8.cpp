// A weight's FP8 codes and 128 x 128 block scales (QuantizeWeightFp8Args), and its transposed
// copy, on the CPU: the GPU kernel's math (coda/core/fp8.hpp), block by block.
#include <algorithm>
#include <utility>

#include "coda/core/fp8.hpp"
#include "coda/epilogue/host_tensor.hpp"
#include "cpu/backend.hpp"

namespace coda::cpu {

void quantize_weight_fp8(const QuantizeWeightFp8Args& args) {
  using epilogue::element_offset;
  const int64_t N = args.n(), K = args.k();
  const bool transposed = args.codes_t.data != nullptr;
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
                                args.codes.ptr<e4m3>()[element_offset(args.codes, n, k)] = q;
                                if (transposed)
                                  args.codes_t.ptr<e4m3>()[element_offset(args.codes_t, k, n)] = q;
                              });
      const int64_t nb = n0 / kFp8ScaleBlock, kb = k0 / kFp8ScaleBlock;
      args.scales.ptr<e8m0>()[element_offset(args.scales, nb, kb)] = e8m0::of_exponent(exponent);
      if (transposed)
        args.scales_t.ptr<e8m0>()[element_offset(args.scales_t, kb, nb)] =
            e8m0::of_exponent(exponent);
    }
}

} // namespace coda::cpu

// The block-scaled FP8 GEMM on the CPU, in the GPU kernel's order of operations: per output
// element, each 128-deep K block's products of codes are summed, and that partial sum is promoted
// into the fp32 accumulator with the block's scales (fp8_block_scale, fp8_promote: the functions
// the kernel calls), block after block in K order; with `accumulate` d's old value is added
// (ResidualAdd, as the 16-bit GEMM adds C), and the store rounds once to d's dtype.
//
// The one difference from the GPU is the partial sum itself: here it is exact, rounded once to
// fp32 (a product of two E4M3 codes has at most 8 significant bits and lies in [2^-18, 448^2],
// so 128 of them add up exactly in fp64's 53 bits); the tensor cores' FP8 accumulation is less
// precise than that (docs/fp8.md), which the GPU tests' tolerance covers.
#include <algorithm>
#include <vector>

#include "coda/core/fp8.hpp"
#include "coda/epilogue/ops/residual_add.hpp"
#include "coda/epilogue/ops/store.hpp"
#include "cpu/executor.hpp"

namespace coda::cpu {
namespace {

// A [rows, K] e4m3 view's codes as their (unscaled) values, row-major.
std::vector<float> code_values(const TensorView& t) {
  std::vector<float> v(size_t(t.shape[0] * t.shape[1]));
  for (int64_t i = 0; i < t.shape[0]; ++i)
    for (int64_t k = 0; k < t.shape[1]; ++k)
      v[size_t(i * t.shape[1] + k)] = t.ptr<const e4m3>()[i * t.stride[0] + k].to_float();
  return v;
}

uint8_t scale_at(const TensorView& scales, int64_t row, int64_t kb) {
  return scales.ptr<const uint8_t>()[row * scales.stride[0] + kb];
}

} // namespace

Fp8GemmMainloop::Fp8GemmMainloop(const Fp8GemmArgs& args)
    : k_(args.k()), k_blocks_(num_fp8_scale_blocks(k_)), a_(code_values(args.a)),
      b_(code_values(args.b)), a_scales_(args.a_scales), b_scales_(args.b_scales),
      b_rows_per_scale_(args.b_scaling == Fp8BScaling::rows ? 1 : kFp8ScaleBlock) {}

void Fp8GemmMainloop::operator()(const epilogue::HostFragment& frag) const {
  const epilogue::TileCoord& tile = frag.tile;
  for (int64_t r = 0; r < tile.rows; ++r) {
    const int64_t m = tile.m0 + r;
    for (int64_t c = 0; c < tile.cols; ++c) {
      const int64_t n = tile.n0 + c;
      float acc = 0.f;
      for (int64_t kb = 0; kb < k_blocks_; ++kb) {
        const float scale = fp8_block_scale(scale_at(a_scales_, m, kb),
                                            scale_at(b_scales_, n / b_rows_per_scale_, kb));
        acc = fp8_promote(acc, block_sum(m, n, kb), scale);
      }
      frag.value(r, c) = acc;
    }
  }
}

// Sum over block kb of a(m, k) b(n, k), exact in fp64, rounded once to fp32.
float Fp8GemmMainloop::block_sum(int64_t m, int64_t n, int64_t kb) const {
  const int64_t k0 = kb * kFp8ScaleBlock, k1 = std::min(k_, k0 + kFp8ScaleBlock);
  const float* a = a_.data() + m * k_;
  const float* b = b_.data() + n * k_;
  double sum = 0;
  for (int64_t k = k0; k < k1; ++k) sum += double(a[k]) * double(b[k]);
  return float(sum);
}

void gemm_fp8(const Fp8GemmArgs& args) {
  const Fp8GemmMainloop mainloop(args);
  epilogue::TileStore store({args.d});
  if (args.accumulate) {
    epilogue::ResidualAdd old_d({args.d, 1.f}); // each tile's d is read before it is stored
    run_epilogue(mainloop, args.m(), args.n(), Tile{}, old_d, store);
  } else {
    run_epilogue(mainloop, args.m(), args.n(), Tile{}, store);
  }
}

} // namespace coda::cpu

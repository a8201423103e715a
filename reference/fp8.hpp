// Block-scaled FP8 operands (docs/fp8.md, coda/core/fp8.hpp) as plain loops: quantizing a
// matrix in blocks, and the exact values a quantized matrix stands for. Plain C++: no CUDA.
#pragma once

#include <cstdint>
#include <vector>

namespace coda::ref {

// A [rows, cols] matrix quantized in blocks of block_rows x 128 (the last blocks of each
// dimension may be short): E4M3 codes [rows, cols] and one E8M0 scale byte per block,
// [ceil(rows / block_rows), ceil(cols / 128)], all row-major. Activations use block_rows = 1,
// weights 128.
struct Fp8Blocks {
  std::vector<uint8_t> codes;
  std::vector<uint8_t> scales;
};

// Each block's scale from its largest magnitude (e4m3_scale_exponent), each value quantized
// with it (quantize_e4m3).
Fp8Blocks quantize_fp8_blocks(const std::vector<float>& x, int64_t rows, int64_t cols,
                              int64_t block_rows);

// The values the codes and scales stand for, exactly: code * 2^(scale - 127) in fp64.
std::vector<double> dequantize_fp8_blocks(const Fp8Blocks& q, int64_t rows, int64_t cols,
                                          int64_t block_rows);

} // namespace coda::ref

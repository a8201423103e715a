// Shared-memory address math of the 128-byte-swizzled operand tiles: the wgmma matrix
// descriptor and the TMA swizzle patterns. Plain constexpr code, so the CPU tests check it.
#pragma once

#include <cstdint>

#include "coda/core/types.hpp"

namespace coda::arch {

// TMA / wgmma swizzle modes by their span in bytes (PTX ISA "Tensor Swizzling Modes"): the 16-byte
// chunk index inside a span is XORed with the row index (bits 7.. of the address), span/16
// chunks at a time. Swizzled buffers are 1024-byte aligned, so the pattern starts at row 0.
enum class Swizzle : uint32_t { none = 0, b32 = 32, b64 = 64, b128 = 128 };

// Byte offset of (row-major) byte `offset` once swizzled; the buffer base must be 1024-aligned.
CODA_HD constexpr uint32_t swizzle_offset(Swizzle mode, uint32_t offset) {
  const uint32_t chunks = uint32_t(mode) / 16; // 16-byte chunks per swizzle span: 0, 2, 4, 8
  return chunks == 0 ? offset : offset ^ (((offset >> 7) & (chunks - 1)) << 4);
}

// PTX ISA "Matrix Descriptor Format" (wgmma shared-memory matrix descriptor), 64 bits:
//   bits  0-13 start address >> 4      bits 16-29 leading-dimension byte offset >> 4
//   bits 32-45 stride-dimension byte offset >> 4
//   bits 49-51 base offset (0: every swizzle atom is 1024-byte aligned)
//   bits 62-63 swizzle: 0 none, 1 = 128B, 2 = 64B, 3 = 32B
// Only 128-byte swizzle is used for operands (a 64-element bf16/f16 row is one 128-byte span).
CODA_HD constexpr uint64_t make_wgmma_desc_sw128(uint32_t smem_addr, uint32_t leading_byte_offset,
                                                 uint32_t stride_byte_offset) {
  return uint64_t((smem_addr >> 4) & 0x3fffu) |
         (uint64_t((leading_byte_offset >> 4) & 0x3fffu) << 16) |
         (uint64_t((stride_byte_offset >> 4) & 0x3fffu) << 32) | (uint64_t(1) << 62);
}

// The descriptor of the same tile `bytes` further (a multiple of 16): the start-address field
// plus bytes >> 4. Shared-memory addresses are below 2^18 (228 KB per CTA), so the 14-bit field
// never carries into the leading offset: one 32-bit add where make_wgmma_desc_sw128 takes a
// shift, a mask and the merges.
CODA_HD constexpr uint64_t advance_wgmma_desc(uint64_t desc, uint32_t bytes) {
  return (desc & ~uint64_t(0xffffffffu)) | uint32_t(uint32_t(desc) + (bytes >> 4));
}

// Operand tiles in shared memory are 64 elements (128 bytes) deep in their contiguous dimension.
//   K-major   ([MN rows][64 k]):      8-row core groups 1024 B apart (stride offset); the leading
//             offset is unused; the k16 step moves the start address 32 B along the row.
//   MN-major  ([MN/64 atoms][64 k rows][64 mn]): 8-k-row groups 1024 B apart (stride offset),
//             64-wide MN atoms kBlockK * 128 B apart (leading offset); the k16 step is 16 rows.
constexpr uint32_t kSwizzleAtomBytes = 1024; // 8 rows x 128 B
constexpr uint32_t kOperandRowBytes = 128;

} // namespace coda::arch

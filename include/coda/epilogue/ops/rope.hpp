// RoPE, rotate-half (Hugging Face Llama, +theta): within each rotated head of head_dim columns,
// pair (i, i + head_dim/2) turns by theta_i = position[m] * inv_freq[i]:
//   out[i]              = x[i] cos - x[i + hd/2] sin
//   out[i + hd/2]       = x[i + hd/2] cos + x[i] sin
// The inverse (RoPE transposed, the backward) turns by -theta. On the device both members of a
// pair sit in one thread when the tile holds whole heads (coda/core/fragment.hpp).
#pragma once

#include <cstdint>
#include <vector>

#include "coda/core/types.hpp"
#include "coda/epilogue/host_tensor.hpp"
#include "coda/epilogue/math.hpp"
#include "coda/epilogue/tile.hpp"

namespace coda::epilogue {

struct RopeRotation {
  float cos;
  float sin;
};

// cos and sin of theta = position * inv_freq in fp32, accurate to a few ulps for positions below
// 2^24. theta reaches 1e5 rad and more, where rounding theta to fp32 first would already cost up to
// half an ulp of theta (4e-3 rad at 1e5). So:
//  1. theta = hi + lo exactly (the fma recovers the product's rounding error);
//  2. k = rint(hi / 2pi) and hi - k 2pi with 2pi split into two floats: the first step is exact
//     (the difference is a multiple of ulp(2pi) below 4), the second rounds once;
//  3. sin and cos of that remainder plus lo, an argument in [-pi, pi] (give or take an ulp): the
//     host's std::sin/cos, the device's hardware sin/cos (2^-21.4 absolute, math.hpp).
CODA_HD RopeRotation rope_rotation(int32_t position, float inv_freq) {
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  constexpr float kTwoPiHi = float(kTwoPi);
  constexpr float kTwoPiLo = float(kTwoPi - double(kTwoPiHi));
  constexpr float kInvTwoPi = float(1.0 / kTwoPi);
  const float p = float(position);
  const float hi = p * inv_freq;
  const float lo = math::fma(p, inv_freq, -hi);
  const float k = math::rint(hi * kInvTwoPi);
  const float reduced = math::fma(-k, kTwoPiLo, math::fma(-k, kTwoPiHi, hi)) + lo;
  RopeRotation rot;
  math::sincos_reduced(reduced, &rot.sin, &rot.cos);
  return rot;
}

// Turns (first, second) = (x[i], x[i + hd/2]) by +theta.
template <class T> CODA_HD void rope_rotate(T& first, T& second, T cos, T sin) {
  const T a = first, b = second;
  first = a * cos - b * sin;
  second = b * cos + a * sin;
}

// Turns by -theta: the transpose (and inverse) of rope_rotate.
template <class T> CODA_HD void rope_rotate_inverse(T& first, T& second, T cos, T sin) {
  const T a = first, b = second;
  first = a * cos + b * sin;
  second = b * cos - a * sin;
}

struct Rope {
  struct Args {
    TensorView positions;     // [M] i32
    TensorView inv_freq;      // [head_dim / 2] f32
    int64_t head_dim = 0;     // even
    int64_t rotated_cols = 0; // columns [0, rotated_cols) rotate (Q and K heads); V passes through
    bool inverse = false;     // turn by -theta (the backward)
  };

  // Precondition: every tile starts at a head boundary and holds whole heads.
  explicit Rope(const Args& args) : args_(args), half_(args.head_dim / 2) {}

  void begin_tile(const TileCoord& tile) {
    rotations_.clear();
    if (tile.n0 >= args_.rotated_cols) return; // only V heads in this tile
    rotations_.resize(size_t(tile.rows * half_));
    for (int64_t r = 0; r < tile.rows; ++r) {
      const int32_t position = load_int(args_.positions, tile.m0 + r);
      for (int64_t i = 0; i < half_; ++i)
        rotations_[size_t(r * half_ + i)] = rope_rotation(position, load_float(args_.inv_freq, i));
    }
  }

  void visit(const HostFragment& frag) const {
    const TileCoord& tile = frag.tile;
    for (int64_t head = 0; head < tile.cols && tile.n0 + head < args_.rotated_cols;
         head += args_.head_dim) {
      for (int64_t r = 0; r < tile.rows; ++r) {
        for (int64_t i = 0; i < half_; ++i) {
          const RopeRotation& rot = rotations_[size_t(r * half_ + i)];
          float& first = frag.value(r, head + i);
          float& second = frag.value(r, head + i + half_);
          if (args_.inverse)
            rope_rotate_inverse(first, second, rot.cos, rot.sin);
          else
            rope_rotate(first, second, rot.cos, rot.sin);
        }
      }
    }
  }

  void end_tile(const TileCoord&) {}

  // Device: positions in registers (two rows per thread), the frequency table in shared memory.
  int64_t shared_bytes(int64_t, int64_t) const { return half_ * 4; }

private:
  Args args_;
  int64_t half_;
  std::vector<RopeRotation> rotations_; // [tile rows, head_dim / 2]
};

} // namespace coda::epilogue

// A bool stored in 32 bits: the C ABI's int32_t flags (coda.h: "nonzero: ..."). The Args that hold
// one (RmsBackwardArgs::accumulate, ColReduceArgs::accumulate) are then layout-identical to their
// C structs, so the C ABI passes them on by a cast (src/api/abi_cast.hpp); to C++ code it reads and
// assigns as a bool, and any nonzero value from C is true.
#pragma once

#include <cstdint>

namespace coda {

struct Bool32 {
  int32_t value = 0;

  constexpr Bool32() = default;
  constexpr Bool32(bool b) : value(b ? 1 : 0) {}         // NOLINT(google-explicit-constructor)
  constexpr operator bool() const { return value != 0; } // NOLINT(google-explicit-constructor)
};

} // namespace coda

// The one vocabulary of argument checks that every public entry point uses.
//
// A Validator collects the tensors of one call. Each tensor is checked as it is added
// (presence, rank, shape, dtype, strides, element alignment); finish() then checks the call as a
// whole (one device, what the CUDA runtime says about each pointer, 16-byte alignment on the GPU
// path, outputs that overlap other arguments) and says where the call runs. Nothing here reads
// or writes tensor data, so every check happens before any output is touched.
//
// Every failure throws coda::Error; the message starts with the entry point's name, names the
// offending argument and says what to fix. Status taxonomy (coda/core/error.hpp):
//   invalid_argument  shape, rank, stride, alignment, null pointer, overlap, bad scalar, labels
//   type_error        a dtype outside what the argument accepts, or 16-bit dtypes that differ
//   not_supported     valid math this build or GPU cannot run: a GEMM dimension that is not a
//                     multiple of 8 (TMA needs 16-byte rows), a CUDA tensor without CUDA
//   cuda_error        the CUDA runtime failed while inspecting a pointer
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "coda/core/error.hpp"
#include "coda/core/tensor.hpp"

namespace coda::api {

// One expected dimension of a tensor: its documented name ("M", "ceil(N/128)") and the rule
// its size must follow.
struct Dim {
  enum class Rule { exactly, any, at_least_one };
  const char* name;
  int64_t value = 0; // for Rule::exactly
  Rule rule = Rule::exactly;
};
inline Dim exactly(const char* name, int64_t value) { return {name, value, Dim::Rule::exactly}; }
inline Dim any(const char* name) { return {name, 0, Dim::Rule::any}; }
inline Dim at_least_one(const char* name) { return {name, 0, Dim::Rule::at_least_one}; }

// The dtypes an argument accepts. All `half` (and 16-bit `half_or_f32`) tensors of one call
// share one dtype. Rank-2 `half`, `half_or_f32`, `bf16` and `e4m3` tensors are GEMM or TMA
// operands, so their rows must start 16 bytes apart (row stride a multiple of 16 bytes). `e4m3`
// and `e8m0` are the FP8 GEMM's codes and block scales (coda/core/fp8.hpp).
enum class Elem { half, f32, i32, half_or_f32, any, bf16, bf16_or_f32, e4m3, e8m0 };

class Validator {
public:
  explicit Validator(const char* op) : op_(op) {}

  const char* op() const { return op_; }
  [[noreturn]] void fail(Status status, const std::string& message) const;

  // Required tensors: data must be non-null. Optional ones are absent when data == nullptr and
  // are checked like the others when present.
  void input(const char* name, const TensorView& t, Elem elem, std::initializer_list<Dim> shape);
  void output(const char* name, const TensorView& t, Elem elem, std::initializer_list<Dim> shape);
  void optional_input(const char* name, const TensorView& t, Elem elem,
                      std::initializer_list<Dim> shape);
  void optional_output(const char* name, const TensorView& t, Elem elem,
                       std::initializer_list<Dim> shape);

  // A problem dimension read from tensor `source`: it must be >= 1.
  void at_least_one(const char* dim, int64_t value, const char* source) const;
  // A GEMM dimension (N or K, or a width stored in GEMM rows): >= 1 and a multiple of 8, or of
  // `multiple` (16 for the K of 1-byte FP8 operands): 16-byte rows for TMA.
  void gemm_dim(const char* dim, int64_t value, const char* source, int64_t multiple = 8) const;
  // Scalars: finite, and for eps also >= 0.
  void finite(const char* name, float value) const;
  void non_negative(const char* name, float value) const;

  // Documented aliases: `output` may be exactly `input` (same pointer, dtype, shape, strides).
  void allow_alias(const char* output, const char* input) { aliases_.push_back({output, input}); }

  // The checks that need every tensor of the call; returns the device the call runs on.
  Device finish() const;

private:
  struct Entry {
    const char* name;
    TensorView view;
    Elem elem;
    bool is_output;
  };

  void add(const char* name, const TensorView& t, Elem elem, std::initializer_list<Dim> shape,
           bool is_output);
  void check_shape(const char* name, const TensorView& t, std::initializer_list<Dim> shape) const;
  void check_dtype(const char* name, const TensorView& t, Elem elem) const;
  void check_layout(const char* name, const TensorView& t, Elem elem) const;
  void check_devices() const;
  void check_overlaps() const;
  bool alias_allowed(const Entry& out, const Entry& other) const;
  const Entry* find(const char* name) const;

  const char* op_;
  std::vector<Entry> entries_;
  std::vector<std::pair<const char*, const char*>> aliases_;
};

// "[3, 64]": a shape or stride list for messages.
std::string dims_string(const int64_t* dims, int rank);
// "0x7f3a10000004": a pointer for messages.
std::string pointer_string(const void* p);

} // namespace coda::api

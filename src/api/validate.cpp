#include "api/validate.hpp"

#include <cmath>
#include <cstdio>
#include <cstring>

#include "api/device.hpp"

namespace coda::api {
namespace {

bool is_half(DType t) { return t == DType::bf16 || t == DType::f16; }
bool valid_dtype(DType t) {
  return int32_t(t) >= int32_t(DType::bf16) && int32_t(t) <= int32_t(DType::e8m0);
}

std::string device_string(const TensorView& t) {
  if (t.device == Device::cpu) return "cpu";
  return "cuda:" + std::to_string(t.device_index);
}

constexpr uint32_t bit(DType t) { return 1u << int32_t(t); }

// What an Elem accepts, as a set of dtype bits, and how a message names that set.
struct Accepted {
  uint32_t dtypes;
  const char* names;
};
Accepted accepted(Elem elem) {
  const uint32_t half = bit(DType::bf16) | bit(DType::f16);
  switch (elem) {
  case Elem::half:
    return {half, "bf16 or f16"};
  case Elem::f32:
    return {bit(DType::f32), "f32"};
  case Elem::i32:
    return {bit(DType::i32), "i32"};
  case Elem::half_or_f32:
    return {half | bit(DType::f32), "bf16, f16 or f32"};
  case Elem::bf16:
    return {bit(DType::bf16), "bf16"};
  case Elem::bf16_or_f32:
    return {bit(DType::bf16) | bit(DType::f32), "bf16 or f32"};
  case Elem::e4m3:
    return {bit(DType::e4m3), "e4m3"};
  case Elem::e8m0:
    return {bit(DType::e8m0), "e8m0"};
  case Elem::any:
    return {~0u, "any dtype"};
  }
  return {0, "?"};
}

// Rank-2 GEMM/TMA operands need 16-byte row pitches; vectors, f32 partials and FP8 block scales
// (read a byte at a time) do not.
bool needs_16_byte_rows(const TensorView& t, Elem elem) {
  return t.rank == 2 && (elem == Elem::half || elem == Elem::half_or_f32 || elem == Elem::bf16 ||
                         elem == Elem::bf16_or_f32 || elem == Elem::e4m3);
}

std::string expected_names(std::initializer_list<Dim> shape) {
  std::string s = "[";
  for (const Dim& d : shape) s += std::string(s.size() > 1 ? ", " : "") + d.name;
  return s + "]";
}

std::string expected_values(std::initializer_list<Dim> shape) {
  std::string s = "[";
  for (const Dim& d : shape) {
    if (s.size() > 1) s += ", ";
    if (d.rule == Dim::Rule::exactly)
      s += std::to_string(d.value);
    else if (d.rule == Dim::Rule::at_least_one)
      s += std::string(d.name) + " >= 1";
    else
      s += d.name;
  }
  return s + "]";
}

bool dim_matches(const Dim& d, int64_t size) {
  switch (d.rule) {
  case Dim::Rule::exactly:
    return size == d.value;
  case Dim::Rule::any:
    return size >= 0;
  case Dim::Rule::at_least_one:
    return size >= 1;
  }
  return false;
}

// The memory a validated view covers, as rows of `width` bytes starting `pitch` bytes apart
// (a vector is one row). Validated views have an inner stride of 1.
struct Rows {
  int64_t begin, rows, width, pitch;
};

Rows rows_of(const TensorView& t) {
  const int64_t es = dtype_size(t.dtype);
  const auto begin = int64_t(reinterpret_cast<uintptr_t>(t.data));
  if (t.rank == 1) return {begin, 1, t.shape[0] * es, t.shape[0] * es};
  // A single row's stride is never used to address memory and may be any value (a huge one
  // would overflow stride * es): its pitch is its width.
  if (t.shape[0] == 1) return {begin, 1, t.shape[1] * es, t.shape[1] * es};
  return {begin, t.shape[0], t.shape[1] * es, t.stride[0] * es};
}

int64_t floor_div(int64_t a, int64_t b) { return a / b - (a % b != 0 && a < 0); }

// Exact when both views share a row pitch (or one is a single row), conservative (byte spans)
// otherwise.
bool overlap(const TensorView& x, const TensorView& y) {
  if (x.numel() == 0 || y.numel() == 0) return false;
  Rows a = rows_of(x), b = rows_of(y);
  const int64_t a_end = a.begin + (a.rows - 1) * a.pitch + a.width;
  const int64_t b_end = b.begin + (b.rows - 1) * b.pitch + b.width;
  if (a_end <= b.begin || b_end <= a.begin) return false;
  if (a.rows == 1) std::swap(a, b);
  const int64_t pitch = a.pitch;
  if (b.rows > 1 && b.pitch != pitch) return true;
  // Row q of b meets row r of a iff k = r - q satisfies a + k*pitch < b + b.width and
  // a + k*pitch + a.width > b, i.e. k in [k_lo, k_hi]; then some q in [0, b.rows) must put
  // r = q + k in [0, a.rows).
  const int64_t d = b.begin - a.begin;
  const int64_t k_lo = floor_div(d - a.width, pitch) + 1;
  const int64_t k_hi = floor_div(d + b.width - 1, pitch);
  if (k_lo > k_hi) return false;
  return k_lo <= a.rows - 1 && b.rows - 1 + k_hi >= 0;
}

bool same_view(const TensorView& x, const TensorView& y) {
  if (x.data != y.data || x.dtype != y.dtype || x.rank != y.rank) return false;
  for (int i = 0; i < x.rank; ++i)
    if (x.shape[i] != y.shape[i] || x.stride[i] != y.stride[i]) return false;
  return true;
}

} // namespace

std::string dims_string(const int64_t* dims, int rank) {
  std::string s = "[";
  for (int i = 0; i < rank; ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

std::string pointer_string(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%#llx",
                static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(p)));
  return buf;
}

void Validator::fail(Status status, const std::string& message) const {
  throw Error(status, std::string(op_) + ": " + message);
}

void Validator::input(const char* name, const TensorView& t, Elem elem,
                      std::initializer_list<Dim> shape) {
  add(name, t, elem, shape, /*is_output=*/false);
}
void Validator::output(const char* name, const TensorView& t, Elem elem,
                       std::initializer_list<Dim> shape) {
  add(name, t, elem, shape, /*is_output=*/true);
}
// An absent optional tensor is not registered at all: nothing is checked for it, and it overlaps
// nothing.
void Validator::optional_input(const char* name, const TensorView& t, Elem elem,
                               std::initializer_list<Dim> shape) {
  if (t.data != nullptr) input(name, t, elem, shape);
}
void Validator::optional_output(const char* name, const TensorView& t, Elem elem,
                                std::initializer_list<Dim> shape) {
  if (t.data != nullptr) output(name, t, elem, shape);
}

void Validator::add(const char* name, const TensorView& t, Elem elem,
                    std::initializer_list<Dim> shape, bool is_output) {
  if (t.data == nullptr)
    fail(Status::invalid_argument, std::string(name) + " is required; got a null data pointer");
  if (t.device != Device::cpu && t.device != Device::cuda)
    fail(Status::invalid_argument, std::string(name) + " has an unknown device label " +
                                       std::to_string(int(t.device)) +
                                       " (use cpu = 0 or cuda = 1)");
  check_shape(name, t, shape);
  check_dtype(name, t, elem);
  check_layout(name, t, elem);
  entries_.push_back({name, t, elem, is_output});
}

void Validator::check_shape(const char* name, const TensorView& t,
                            std::initializer_list<Dim> shape) const {
  const std::string n = name;
  const int rank = int(shape.size());
  if (t.rank != rank) {
    std::string got = "rank " + std::to_string(t.rank);
    if (t.rank >= 0 && t.rank <= kMaxRank) got += " with shape " + dims_string(t.shape, t.rank);
    fail(Status::invalid_argument, n + " must be a " + std::to_string(rank) + "-D tensor " +
                                       expected_names(shape) + "; got " + got);
  }
  int i = 0;
  for (const Dim& d : shape) {
    if (!dim_matches(d, t.shape[i++]))
      fail(Status::invalid_argument, n + " must have shape " + expected_names(shape) + " = " +
                                         expected_values(shape) + "; got " +
                                         dims_string(t.shape, t.rank));
  }
}

void Validator::check_dtype(const char* name, const TensorView& t, Elem elem) const {
  const std::string n = name;
  if (!valid_dtype(t.dtype))
    fail(Status::type_error, n + " has an unknown dtype " + std::to_string(int(t.dtype)) +
                                 " (bf16 = 0, f16 = 1, f32 = 2, i32 = 3, e4m3 = 4, e8m0 = 5)");
  const Accepted ok = accepted(elem);
  if (!(ok.dtypes & bit(t.dtype)))
    fail(Status::type_error, n + " must be " + ok.names + "; got " + dtype_name(t.dtype));
  if (!is_half(t.dtype) || elem == Elem::any) return;
  for (const Entry& e : entries_) {
    if (e.elem == Elem::any || !is_half(e.view.dtype) || e.view.dtype == t.dtype) continue;
    fail(Status::type_error,
         n + " and " + e.name +
             " must have the same dtype (the 16-bit tensors of one call are all "
             "bf16 or all f16); got " +
             n + " " + dtype_name(t.dtype) + ", " + e.name + " " + dtype_name(e.view.dtype));
  }
}

void Validator::check_layout(const char* name, const TensorView& t, Elem elem) const {
  const std::string n = name;
  const std::string strides = dims_string(t.stride, t.rank);
  // A dimension of size 1 has no stride to speak of (PyTorch reports any value there, e.g. 0
  // for an expanded scalar): only element 0 is ever addressed.
  if (t.rank == 1 && t.shape[0] > 1 && t.stride[0] != 1)
    fail(Status::invalid_argument,
         n + " must be contiguous (stride[0] == 1); got strides " + strides);
  if (t.rank == 2 && (t.stride[1] != 1 || t.stride[0] < t.shape[1]))
    fail(Status::invalid_argument,
         n + " must be row-contiguous (stride[1] == 1, stride[0] >= shape[1]); got strides " +
             strides);
  const int64_t es = dtype_size(t.dtype);
  // stride[0] % (16 / es), not (stride[0] * es) % 16: the product overflows for strides past
  // 2^62, which a single row may have (its stride addresses nothing).
  if (needs_16_byte_rows(t, elem) && t.stride[0] % (16 / es) != 0)
    fail(Status::invalid_argument,
         n + " must have a row stride (stride[0]) that is a multiple of " +
             std::to_string(16 / es) + " elements (16 bytes, for TMA); got " +
             std::to_string(t.stride[0]));
  // The last byte must be addressable: sum (shape - 1) * stride must not overflow.
  int64_t last = 0;
  for (int i = 0; i < t.rank; ++i) {
    int64_t term = 0;
    if (t.shape[i] > 0 && (__builtin_mul_overflow(t.shape[i] - 1, t.stride[i], &term) ||
                           __builtin_add_overflow(last, term, &last)))
      fail(Status::invalid_argument, n + " is too large to address: shape " +
                                         dims_string(t.shape, t.rank) + ", strides " + strides);
  }
  // The element count is last + 1, which itself overflows for last = INT64_MAX (found by the
  // C ABI fuzzer: a [2, 1] f32 view with stride[0] = 2^63 - 1).
  int64_t bytes = 0;
  if (__builtin_add_overflow(last, 1, &last) || __builtin_mul_overflow(last, es, &bytes))
    fail(Status::invalid_argument,
         n + " is too large to address: shape " + dims_string(t.shape, t.rank));
  if (reinterpret_cast<uintptr_t>(t.data) % uintptr_t(es) != 0)
    fail(Status::invalid_argument, n + " must be aligned to its " + std::to_string(es) +
                                       "-byte elements; got pointer " + pointer_string(t.data));
}

void Validator::at_least_one(const char* dim, int64_t value, const char* source) const {
  if (value >= 1) return;
  const Entry* e = find(source);
  fail(Status::invalid_argument,
       std::string(dim) + " must be >= 1; got " + std::to_string(value) + " (from " + source +
           (e ? ", shape " + dims_string(e->view.shape, e->view.rank) : std::string()) + ")");
}

void Validator::gemm_dim(const char* dim, int64_t value, const char* source,
                         int64_t multiple) const {
  at_least_one(dim, value, source);
  if (value % multiple == 0) return;
  const Entry* e = find(source);
  fail(Status::not_supported,
       std::string(dim) + " must be a multiple of " + std::to_string(multiple) +
           " (16-byte rows for TMA); got " + std::to_string(value) + " (from " + source +
           (e ? ", shape " + dims_string(e->view.shape, e->view.rank) : std::string()) +
           "); pad it to " + std::to_string((value + multiple - 1) / multiple * multiple));
}

void Validator::finite(const char* name, float value) const {
  if (!std::isfinite(value))
    fail(Status::invalid_argument,
         std::string(name) + " must be finite; got " + std::to_string(value));
}

void Validator::non_negative(const char* name, float value) const {
  finite(name, value);
  if (value < 0.f)
    fail(Status::invalid_argument,
         std::string(name) + " must be >= 0; got " + std::to_string(value));
}

const Validator::Entry* Validator::find(const char* name) const {
  for (const Entry& e : entries_)
    if (std::strcmp(e.name, name) == 0) return &e;
  return nullptr;
}

Device Validator::finish() const {
  if (entries_.empty()) fail(Status::internal, "no tensors to validate");
  check_devices();
  check_overlaps();
  return entries_.front().view.device;
}

void Validator::check_devices() const {
  const Entry& first = entries_.front();
  for (const Entry& e : entries_) {
    const bool same =
        e.view.device == first.view.device &&
        (e.view.device == Device::cpu || e.view.device_index == first.view.device_index);
    if (!same)
      fail(Status::invalid_argument, std::string(e.name) + " is on " + device_string(e.view) +
                                         " but " + first.name + " is on " +
                                         device_string(first.view) +
                                         "; all tensors of one call must be on one device");
  }
#if CODA_WITH_CUDA
  for (const Entry& e : entries_) check_memory_matches_label(*this, e.name, e.view);
  if (first.view.device == Device::cpu) return;
  check_current_device(*this, first.name, first.view.device_index);
  for (const Entry& e : entries_) {
    if (e.view.numel() > 1 && reinterpret_cast<uintptr_t>(e.view.data) % 16 != 0)
      fail(Status::invalid_argument, std::string(e.name) +
                                         " must be 16-byte aligned for the GPU path; got pointer " +
                                         pointer_string(e.view.data));
  }
#else
  if (first.view.device == Device::cuda) no_cuda_backend(*this, first.name);
#endif
}

bool Validator::alias_allowed(const Entry& out, const Entry& other) const {
  for (const auto& [o, i] : aliases_) {
    const bool pair = (std::strcmp(o, out.name) == 0 && std::strcmp(i, other.name) == 0) ||
                      (std::strcmp(i, out.name) == 0 && std::strcmp(o, other.name) == 0);
    if (!pair) continue;
    if (same_view(out.view, other.view)) return true;
    fail(Status::invalid_argument,
         std::string(o) + " may alias " + i +
             " only exactly (the same pointer, dtype, shape and strides); they overlap partially");
  }
  return false;
}

void Validator::check_overlaps() const {
  for (size_t i = 0; i < entries_.size(); ++i) {
    for (size_t j = 0; j < entries_.size(); ++j) {
      const Entry& out = entries_[i];
      const Entry& other = entries_[j];
      // Each unordered pair once, and only pairs with an output in them.
      if (i == j || !out.is_output || (other.is_output && j < i)) continue;
      if (!overlap(out.view, other.view) || alias_allowed(out, other)) continue;
      fail(Status::invalid_argument,
           std::string(out.name) + " overlaps " + other.name + " in memory (" +
               pointer_string(out.view.data) + " and " + pointer_string(other.view.data) +
               "); an output must not share memory with another argument" +
               (aliases_.empty() ? "" : " except its documented alias"));
    }
  }
}

} // namespace coda::api

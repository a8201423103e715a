// The C structs of coda.h and block/llama.h and their C++ twins (coda::GemmArgs,
// coda::llama::Config, ...) are one layout: checked here at compile time, field by field, from the
// list tools/gen_abi.py writes from the headers (abi_layout.inc). So the C ABI hands a C struct on
// as its C++ twin with `from_c`, a bit-for-bit copy, instead of converting it field by field.
//
// Each field of a C++ twin sits at its C field's offset and holds the same representation: the C
// type itself, an enum over it (DType, GemmLayout, ... over int32_t), Bool32 for an int32_t flag,
// or the C++ twin of a nested C struct. The cast is std::bit_cast, not a reinterpret_cast of the
// pointer, so no object is read through the other type's name (defined behaviour; the copy is a
// few hundred bytes per call). A member that only the C++ struct had would break the cast: the
// size assertion catches it unless it hides in the C struct's tail padding, so keep the two in
// step.
#pragma once

#include <bit>
#include <cstddef>
#include <type_traits>

#include "coda/coda.h"
#include "coda/coda.hpp"

namespace coda::api {

// The enums' values.
static_assert(CODA_OK == int(Status::ok) &&
                  CODA_INVALID_ARGUMENT == int(Status::invalid_argument) &&
                  CODA_TYPE_ERROR == int(Status::type_error) &&
                  CODA_NOT_SUPPORTED == int(Status::not_supported) &&
                  CODA_CUDA_ERROR == int(Status::cuda_error) &&
                  CODA_INTERNAL == int(Status::internal),
              "coda_status must equal coda::Status");
static_assert(CODA_BF16 == int(DType::bf16) && CODA_F16 == int(DType::f16) &&
                  CODA_F32 == int(DType::f32) && CODA_I32 == int(DType::i32) &&
                  CODA_E4M3 == int(DType::e4m3) && CODA_E8M0 == int(DType::e8m0),
              "coda_dtype must equal coda::DType");
static_assert(CODA_DEVICE_CPU == int(Device::cpu) && CODA_DEVICE_CUDA == int(Device::cuda),
              "coda_device must equal coda::Device");
static_assert(CODA_GEMM_FWD == int(GemmLayout::fwd) && CODA_GEMM_DGRAD == int(GemmLayout::dgrad) &&
                  CODA_GEMM_WGRAD == int(GemmLayout::wgrad),
              "coda_gemm_layout must equal coda::GemmLayout");
static_assert(CODA_LOSS_MEAN == int(LossReduction::mean) &&
                  CODA_LOSS_SUM == int(LossReduction::sum),
              "coda_loss_reduction must equal coda::LossReduction");
static_assert(CODA_FP8_B_BLOCKS == int(Fp8BScaling::blocks) &&
                  CODA_FP8_B_ROWS == int(Fp8BScaling::rows),
              "coda_fp8_b_scaling must equal coda::Fp8BScaling");
static_assert(CODA_REDUCE_BLOCK == kReduceBlock && CODA_STAGED_REDUCE_BLOCK == kStagedReduceBlock &&
                  CODA_MAX_RANK == kMaxRank,
              "coda.h constants must equal the C++ ones");

static_assert(CODA_LLAMA_FIRST == int(llama::Layer::first) &&
                  CODA_LLAMA_MIDDLE == int(llama::Layer::middle) &&
                  CODA_LLAMA_LAST == int(llama::Layer::last),
              "coda_llama_layer must equal coda::llama::Layer");
static_assert(CODA_LLAMA_FORWARD == int(llama::Pass::forward) &&
                  CODA_LLAMA_BACKWARD == int(llama::Pass::backward),
              "coda_llama_pass must equal coda::llama::Pass");
static_assert(CODA_LLAMA_NATIVE == int(llama::Precision::native) &&
                  CODA_LLAMA_FP8 == int(llama::Precision::fp8),
              "coda_llama_precision must equal coda::llama::Precision");
static_assert(CODA_LLAMA_FP8_WEIGHTS_IN_WORKSPACE == int(llama::Fp8WeightCopies::in_workspace) &&
                  CODA_LLAMA_FP8_WEIGHTS_GIVEN == int(llama::Fp8WeightCopies::given),
              "coda_llama_fp8_weight_copies must equal coda::llama::Fp8WeightCopies");

// The C++ twin of a C struct (CppOf<coda_gemm_args>::type is coda::GemmArgs), and back.
template <class C> struct CppOf;
template <class Cpp> struct COf;

template <class Cpp, class C> constexpr bool same_representation() {
  if constexpr (std::is_same_v<Cpp, C>)
    return true; // int32_t, int64_t, float, void*, arrays
  else if constexpr (std::is_enum_v<Cpp>)
    return std::is_same_v<std::underlying_type_t<Cpp>, C>;
  else if constexpr (std::is_same_v<Cpp, Bool32>)
    return std::is_same_v<C, int32_t>;
  else if constexpr (std::is_class_v<C>)
    return std::is_same_v<Cpp, typename CppOf<C>::type>;
  else
    return false;
}

#define CODA_ABI_STRUCT(C, Cpp)                                                                    \
  template <> struct CppOf<C> { using type = Cpp; };                                               \
  template <> struct COf<Cpp> { using type = C; };                                                 \
  static_assert(sizeof(C) == sizeof(Cpp) && alignof(C) == alignof(Cpp),                            \
                #Cpp " must have the size and alignment of " #C);                                  \
  static_assert(std::is_trivially_copyable_v<Cpp> && std::is_standard_layout_v<Cpp>,               \
                #Cpp " must stay a plain struct to be cast from " #C);
#define CODA_ABI_FIELD(C, Cpp, field)                                                              \
  static_assert(offsetof(Cpp, field) == offsetof(C, field),                                        \
                #Cpp "::" #field " must sit where " #C "::" #field " does");                       \
  static_assert(same_representation<decltype(Cpp::field), decltype(C::field)>(),                   \
                #Cpp "::" #field " must hold the C type of " #C "::" #field);
#include "api/abi_layout.inc"
#undef CODA_ABI_FIELD
#undef CODA_ABI_STRUCT

// A C argument struct as its C++ twin, and a C++ one as its C twin (for tests that drive both
// interfaces with one call).
template <class C> typename CppOf<C>::type from_c(const C& c) {
  return std::bit_cast<typename CppOf<C>::type>(c);
}
template <class Cpp> typename COf<Cpp>::type to_c(const Cpp& cpp) {
  return std::bit_cast<typename COf<Cpp>::type>(cpp);
}

} // namespace coda::api

// The FP8 copies of a layer's weights (coda/block/llama.hpp, Fp8Weight): quantize_weights, their
// size, and their checks where a layer call is given them.
#include <string>
#include <utility>
#include <vector>

#include "block/validate.hpp"
#include "coda/coda.hpp"
#include "coda/core/fp8.hpp"

namespace coda::llama {

using namespace detail;

namespace {

// The names of one weight's four copy tensors in messages. String literals: the Validator keeps
// the pointers.
struct Fp8WeightNames {
  const char *codes, *scales, *codes_t, *scales_t;
};

// One weight with FP8 copies: its names where a layer call is given its copies (`given`) and
// where quantize_weights writes them (`written`), its dims [N, K] as the Config names them, the
// 16-bit weight and its copies.
struct Fp8WeightEntry {
  const char* weight_name;
  Fp8WeightNames given, written;
  api::Dim n, k, n_blocks, k_blocks;
  const TensorView& weight;
  const Fp8Weight& copies;
};

// The entry of the field `field` of a layer's Weights `weights` and Fp8Weights `fp8`, a weight
// [n, k] whose dims are named n_name and k_name (string literals).
#define CODA_FP8_WEIGHT(field, n_name, n, k_name, k)                                               \
  Fp8WeightEntry {                                                                                 \
    "weights." #field,                                                                             \
        {"inputs.fp8_weights." #field ".codes", "inputs.fp8_weights." #field ".scales",            \
         "inputs.fp8_weights." #field ".codes_t", "inputs.fp8_weights." #field ".scales_t"},       \
        {"fp8_weights." #field ".codes", "fp8_weights." #field ".scales",                          \
         "fp8_weights." #field ".codes_t", "fp8_weights." #field ".scales_t"},                     \
        api::exactly(n_name, n), api::exactly(k_name, k),                                          \
        api::exactly("ceil(" n_name "/128)", num_fp8_scale_blocks(n)),                             \
        api::exactly("ceil(" k_name "/128)", num_fp8_scale_blocks(k)), weights.field, fp8.field    \
  }

std::vector<Fp8WeightEntry> entries(const Config& c, const FirstWeights& weights,
                                    const FirstFp8Weights& fp8) {
  return {CODA_FP8_WEIGHT(w_qkv, "qkv_width", c.qkv_width(), "hidden", c.hidden)};
}

// The MLP's three weights, which the middle and last layers share.
#define CODA_FP8_MLP_WEIGHTS                                                                       \
  CODA_FP8_WEIGHT(w_out, "hidden", c.hidden, "n_heads*head_dim", c.attention_width()),             \
      CODA_FP8_WEIGHT(w_gate_up, "2*intermediate", 2 * c.intermediate, "hidden", c.hidden),        \
      CODA_FP8_WEIGHT(w_down, "hidden", c.hidden, "intermediate", c.intermediate)

std::vector<Fp8WeightEntry> entries(const Config& c, const MiddleWeights& weights,
                                    const MiddleFp8Weights& fp8) {
  return {CODA_FP8_MLP_WEIGHTS,
          CODA_FP8_WEIGHT(w_qkv, "qkv_width", c.qkv_width(), "hidden", c.hidden)};
}

std::vector<Fp8WeightEntry> entries(const Config& c, const LastWeights& weights,
                                    const LastFp8Weights& fp8) {
  return {CODA_FP8_MLP_WEIGHTS};
}

#undef CODA_FP8_MLP_WEIGHTS
#undef CODA_FP8_WEIGHT

// The config of a call that makes or sizes the copies: valid for the layer, and FP8 (whose GEMM
// width rules are the copies': quantize_weight_fp8 takes N and K multiples of 16).
void check_fp8_config(const api::Validator& v, const Config& c, Layer layer) {
  check_config(v, c, layer);
  if (c.precision != Precision::fp8)
    v.fail(Status::invalid_argument,
           "config.precision must be Precision::fp8 (the weights' FP8 copies are what an FP8 "
           "call reads); got " +
               std::to_string(int(c.precision)));
  check_precision(v, c, layer);
}

// One weight's four copy tensors under `names`, as inputs of a call or outputs of one.
void add_copies(api::Validator& v, Role role, const Fp8WeightNames& names,
                const Fp8WeightEntry& e) {
  using api::Elem;
  add(v, role, names.codes, e.copies.codes, Elem::e4m3, {e.n, e.k});
  add(v, role, names.scales, e.copies.scales, Elem::e8m0, {e.n_blocks, e.k_blocks});
  add(v, role, names.codes_t, e.copies.codes_t, Elem::e4m3, {e.k, e.n});
  add(v, role, names.scales_t, e.copies.scales_t, Elem::e8m0, {e.k_blocks, e.n_blocks});
}

template <class Weights, class Fp8Weights>
void quantize_layer(Layer layer, const Config& config, const Weights& weights,
                    const Fp8Weights& fp8_weights, Stream stream) {
  api::Validator v("coda::llama::quantize_weights");
  check_fp8_config(v, config, layer);
  const std::vector<Fp8WeightEntry> all = entries(config, weights, fp8_weights);
  for (const Fp8WeightEntry& e : all) {
    v.input(e.weight_name, e.weight, api::Elem::half, {e.n, e.k});
    add_copies(v, Role::output, e.written, e);
  }
  v.finish();

  for (const Fp8WeightEntry& e : all) { // both copies in one pass over the weight
    QuantizeWeightFp8Args q;
    q.w = e.weight;
    q.codes = e.copies.codes;
    q.scales = e.copies.scales;
    q.codes_t = e.copies.codes_t;
    q.scales_t = e.copies.scales_t;
    quantize_weight_fp8(q, stream);
  }
}

// Whether a layer call's inputs.fp8_weights are given, checked (check_given_fp8_weights).
Fp8WeightCopies check_given(api::Validator& v, const Config& c,
                            const std::vector<Fp8WeightEntry>& all) {
  const char *present = nullptr, *absent = nullptr;
  for (const Fp8WeightEntry& e : all) {
    const std::pair<const char*, const TensorView*> tensors[] = {
        {e.given.codes, &e.copies.codes},
        {e.given.scales, &e.copies.scales},
        {e.given.codes_t, &e.copies.codes_t},
        {e.given.scales_t, &e.copies.scales_t}};
    for (const auto& [name, t] : tensors) {
      const char*& first = t->data != nullptr ? present : absent;
      if (first == nullptr) first = name;
    }
  }
  if (present == nullptr) return Fp8WeightCopies::in_workspace;
  if (c.precision != Precision::fp8)
    v.fail(Status::invalid_argument,
           std::string(present) +
               " is given, but config.precision is not fp8: only an FP8 call reads the "
               "weights' FP8 copies (pass none)");
  if (absent != nullptr)
    v.fail(Status::invalid_argument,
           std::string("inputs.fp8_weights: a layer's FP8 copies are given all or none "
                       "(quantize_weights writes them all); ") +
               present + " is given but " + absent + " is absent");
  for (const Fp8WeightEntry& e : all) add_copies(v, Role::input, e.given, e);
  return Fp8WeightCopies::given;
}

} // namespace

size_t fp8_weights_size(Layer layer, const Config& config) {
  api::Validator v("coda::llama::fp8_weights_size");
  if (layer != Layer::first && layer != Layer::middle && layer != Layer::last)
    v.fail(Status::invalid_argument,
           "layer must be Layer::first, middle or last; got " + std::to_string(int(layer)));
  check_fp8_config(v, config, layer);
  // The entries' dims, of weights not given.
  const FirstWeights first;
  const MiddleWeights middle;
  const LastWeights last;
  const FirstFp8Weights first_fp8;
  const MiddleFp8Weights middle_fp8;
  const LastFp8Weights last_fp8;
  const std::vector<Fp8WeightEntry> all = layer == Layer::first ? entries(config, first, first_fp8)
                                          : layer == Layer::middle
                                              ? entries(config, middle, middle_fp8)
                                              : entries(config, last, last_fp8);
  size_t bytes = 0;
  for (const Fp8WeightEntry& e : all) {
    // Both copies: codes and scales, 1 byte an element each.
    int64_t codes = 0, scales = 0;
    if (__builtin_mul_overflow(e.n.value, e.k.value, &codes) ||
        __builtin_mul_overflow(codes, 2, &codes) ||
        __builtin_mul_overflow(e.n_blocks.value, e.k_blocks.value, &scales) ||
        __builtin_mul_overflow(scales, 2, &scales) ||
        __builtin_add_overflow(bytes, size_t(codes) + size_t(scales), &bytes))
      v.fail(Status::invalid_argument, std::string("the FP8 copies' size overflows 64 bits (") +
                                           e.weight_name + "); check the config");
  }
  return bytes;
}

void quantize_weights(const Config& config, const FirstWeights& weights,
                      const FirstFp8Weights& fp8_weights, Stream stream) {
  quantize_layer(Layer::first, config, weights, fp8_weights, stream);
}
void quantize_weights(const Config& config, const MiddleWeights& weights,
                      const MiddleFp8Weights& fp8_weights, Stream stream) {
  quantize_layer(Layer::middle, config, weights, fp8_weights, stream);
}
void quantize_weights(const Config& config, const LastWeights& weights,
                      const LastFp8Weights& fp8_weights, Stream stream) {
  quantize_layer(Layer::last, config, weights, fp8_weights, stream);
}

namespace detail {

Fp8WeightCopies check_given_fp8_weights(api::Validator& v, const Config& c,
                                        const FirstWeights& weights,
                                        const FirstFp8Weights& fp8_weights) {
  return check_given(v, c, entries(c, weights, fp8_weights));
}
Fp8WeightCopies check_given_fp8_weights(api::Validator& v, const Config& c,
                                        const MiddleWeights& weights,
                                        const MiddleFp8Weights& fp8_weights) {
  return check_given(v, c, entries(c, weights, fp8_weights));
}
Fp8WeightCopies check_given_fp8_weights(api::Validator& v, const Config& c,
                                        const LastWeights& weights,
                                        const LastFp8Weights& fp8_weights) {
  return check_given(v, c, entries(c, weights, fp8_weights));
}

} // namespace detail

} // namespace coda::llama

#include <string>

#include "block/scratch.hpp"
#include "block/validate.hpp"

namespace coda::llama {

size_t workspace_size(Layer layer, Pass pass, const Config& config, int64_t tokens) {
  return workspace_size(layer, pass, config, tokens, Fp8WeightCopies::in_workspace);
}

size_t workspace_size(Layer layer, Pass pass, const Config& config, int64_t tokens,
                      Fp8WeightCopies copies) {
  api::Validator v("coda::llama::workspace_size");
  detail::check_config(v, config, layer);
  v.at_least_one("tokens", tokens, "the tokens argument");
  const bool part = pass == Pass::backward_part1 || pass == Pass::backward_part2;
  if (pass != Pass::forward && pass != Pass::backward && !part)
    v.fail(Status::invalid_argument,
           "pass must be Pass::forward, backward, backward_part1 or backward_part2; got " +
               std::to_string(int(pass)));
  if (part && layer != Layer::middle)
    v.fail(Status::invalid_argument,
           "Pass::backward_part1 and backward_part2 are the middle layer's (Layer::middle); got "
           "layer " +
               std::to_string(int(layer)));

  if (copies != Fp8WeightCopies::in_workspace && copies != Fp8WeightCopies::given)
    v.fail(Status::invalid_argument, "copies must be Fp8WeightCopies::in_workspace or given; got " +
                                         std::to_string(int(copies)));
  if (copies == Fp8WeightCopies::given && config.precision != Precision::fp8)
    v.fail(Status::invalid_argument,
           "Fp8WeightCopies::given needs config.precision = Precision::fp8 (only an FP8 call reads "
           "the weights' FP8 copies; a native call's size is the in_workspace one); got "
           "config.precision " +
               std::to_string(int(config.precision)));

  detail::check_precision(v, config, layer);
  // The activation dtype does not matter here: bf16 and f16 are both 2 bytes.
  constexpr DType act = DType::bf16;
  detail::Arena counter;
  // The layer's carve for the pass, into the counting arena.
  const auto carve = [&](auto carve_forward, auto carve_backward) {
    if (pass == Pass::forward)
      carve_forward(counter, config, tokens, act, copies);
    else
      carve_backward(counter, config, tokens, act, copies);
  };
  switch (layer) {
  case Layer::first:
    carve(detail::carve_first_forward, detail::carve_first_backward);
    break;
  case Layer::middle:
    if (pass == Pass::backward_part2)
      detail::carve_middle_backward_part2(counter, config, tokens, act, copies);
    else
      carve(detail::carve_middle_forward, detail::carve_middle_backward);
    break;
  case Layer::last:
    carve(detail::carve_last_forward, detail::carve_last_backward);
    break;
  default:
    v.fail(Status::invalid_argument,
           "layer must be Layer::first, middle or last; got " + std::to_string(int(layer)));
  }
  return counter.used();
}

} // namespace coda::llama

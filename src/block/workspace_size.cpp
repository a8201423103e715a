#include <string>

#include "block/scratch.hpp"
#include "block/validate.hpp"

namespace coda::llama {

size_t workspace_size(Layer layer, Pass pass, const Config& config, int64_t tokens) {
  api::Validator v("coda::llama::workspace_size");
  detail::check_config(v, config, layer);
  v.at_least_one("tokens", tokens, "the tokens argument");
  if (pass != Pass::forward && pass != Pass::backward)
    v.fail(Status::invalid_argument,
           "pass must be Pass::forward or backward; got " + std::to_string(int(pass)));

  // The activation dtype does not matter here: bf16 and f16 are both 2 bytes.
  constexpr DType act = DType::bf16;
  detail::Arena counter;
  const bool forward = pass == Pass::forward;
  switch (layer) {
  case Layer::first:
    if (forward)
      detail::carve_first_forward(counter, config, tokens, act);
    else
      detail::carve_first_backward(counter, config, tokens, act);
    break;
  case Layer::middle:
    if (forward)
      detail::carve_mlp_forward(counter, config, tokens, act);
    else
      detail::carve_middle_backward(counter, config, tokens, act);
    break;
  case Layer::last:
    if (forward)
      detail::carve_last_forward(counter, config, tokens, act);
    else
      detail::carve_last_backward(counter, config, tokens, act);
    break;
  default:
    v.fail(Status::invalid_argument,
           "layer must be Layer::first, middle or last; got " + std::to_string(int(layer)));
  }
  return counter.used();
}

} // namespace coda::llama

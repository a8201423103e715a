// Status codes and the one exception type of the C++ API. The C ABI catches it and returns the
// code, keeping the message for coda_last_error().
#pragma once

#include <stdexcept>
#include <string>

namespace coda {

// Values match coda.h's coda_status.
enum class Status : int {
  ok = 0,
  invalid_argument = 1, // wrong shape, stride, alignment, null pointer, bad scalar
  type_error = 2,       // wrong or mismatched dtype
  not_supported = 3,    // a valid request this build or GPU cannot run (callers may fall back)
  cuda_error = 4,       // the CUDA runtime or a kernel launch failed
  internal = 5,         // a bug in coda
};

class Error : public std::runtime_error {
public:
  Error(Status status, const std::string& message) : std::runtime_error(message), status_(status) {}
  Status status() const { return status_; }

private:
  Status status_;
};

} // namespace coda

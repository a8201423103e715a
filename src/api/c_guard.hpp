// The one boundary between C++ and the C ABI: every extern "C" entry point (coda.h, and the
// block's coda/block/llama.h) runs its body inside `guarded`, which turns any exception into a
// coda_status and keeps the message for coda_last_error(). Nothing thrown below crosses it.
#pragma once

#include <exception>
#include <new>
#include <string>

#include "coda/coda.h"
#include "coda/core/error.hpp"

namespace coda::api {

// The calling thread's last failure message; coda_last_error() returns it.
void set_last_error(const std::string& message) noexcept;
const char* last_error() noexcept;

template <class Body> coda_status guarded(const char* fn, Body&& body) noexcept {
  try {
    try {
      body();
      return CODA_OK;
    } catch (const Error& e) {
      set_last_error(e.what());
      return e.status() == Status::ok ? CODA_INTERNAL : coda_status(int(e.status()));
    } catch (const std::bad_alloc&) {
      set_last_error(std::string(fn) + ": out of host memory");
    } catch (const std::exception& e) {
      set_last_error(std::string(fn) + ": internal error: " + e.what());
    } catch (...) {
      set_last_error(std::string(fn) + ": internal error: an unknown exception");
    }
  } catch (...) { // building the message itself failed (out of memory)
    set_last_error("");
  }
  return CODA_INTERNAL;
}

// A required C argument struct: NULL is an error naming it.
template <class T> const T& deref(const char* fn, const char* what, const T* p) {
  if (p == nullptr)
    throw Error(Status::invalid_argument, std::string(fn) + ": " + what + " is NULL");
  return *p;
}

// The body of a size query: `bytes` NULL is an error naming it, else *bytes = query().
template <class Query>
coda_status size_query(const char* fn, size_t* bytes, Query&& query) noexcept {
  return guarded(fn, [&] {
    if (bytes == nullptr)
      throw Error(Status::invalid_argument, std::string(fn) + ": bytes is NULL");
    *bytes = query();
  });
}

} // namespace coda::api

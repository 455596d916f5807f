// Small helpers for calling the PJRT C API (runtime-internal).
#pragma once

#include <cstring>
#include <string>

#include "xla/pjrt/c/pjrt_c_api.h"

namespace torch_pjrt::runtime {

template <typename T>
T make_args(size_t size) {
  T args;
  std::memset(&args, 0, sizeof(args));
  args.struct_size = size;
  return args;
}
#define PJRT_ARGS(T) ::torch_pjrt::runtime::make_args<T>(T##_STRUCT_SIZE)

// The error's message; frees the error.
inline std::string take_message(const PJRT_Api* api, PJRT_Error* error) {
  auto m = PJRT_ARGS(PJRT_Error_Message_Args);
  m.error = error;
  api->PJRT_Error_Message(&m);
  std::string msg(m.message, m.message_size);
  auto d = PJRT_ARGS(PJRT_Error_Destroy_Args);
  d.error = error;
  api->PJRT_Error_Destroy(&d);
  return msg;
}

// The error's code (UNKNOWN when the plugin cannot say); does not free it.
inline PJRT_Error_Code error_code(const PJRT_Api* api, PJRT_Error* error) {
  auto c = PJRT_ARGS(PJRT_Error_GetCode_Args);
  c.error = error;
  if (PJRT_Error* e = api->PJRT_Error_GetCode(&c)) {
    auto d = PJRT_ARGS(PJRT_Error_Destroy_Args);
    d.error = e;
    api->PJRT_Error_Destroy(&d);
    return PJRT_Error_Code_UNKNOWN;
  }
  return c.code;
}

// Frees an error nobody can act on (destructors, readiness polling).
inline void discard(const PJRT_Api* api, PJRT_Error* err) {
  if (!err) return;
  auto d = PJRT_ARGS(PJRT_Error_Destroy_Args);
  d.error = err;
  api->PJRT_Error_Destroy(&d);
}

}  // namespace torch_pjrt::runtime

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
// A PJRT_Program over MLIR text (which must outlive it).
inline PJRT_Program mlir_program(const std::string& text) {
  auto p = PJRT_ARGS(PJRT_Program);
  p.code = const_cast<char*>(text.data());
  p.code_size = text.size();
  p.format = "mlir";
  p.format_size = 4;
  return p;
}

// Destroys an unloaded PJRT_Executable at the end of a scope.
struct ExecutableRelease {
  const PJRT_Api* api;
  PJRT_Executable* exe;
  ~ExecutableRelease();
};

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

// A named value's value as text (plugin attributes, topology attributes).
inline std::string named_value_string(const PJRT_NamedValue& v) {
  switch (v.type) {
    case PJRT_NamedValue_kString:
      return std::string(v.string_value, v.value_size);
    case PJRT_NamedValue_kInt64:
      return std::to_string(v.int64_value);
    case PJRT_NamedValue_kInt64List: {
      std::string s;
      for (size_t i = 0; i < v.value_size; ++i)
        s += (i ? "," : "") + std::to_string(v.int64_array_value[i]);
      return s;
    }
    case PJRT_NamedValue_kFloat:
      return std::to_string(v.float_value);
    case PJRT_NamedValue_kBool:
      return v.bool_value ? "true" : "false";
  }
  return "";
}

// A scalar client option; the caller sets the value field.
inline PJRT_NamedValue named_value(const char* name, PJRT_NamedValue_Type type) {
  PJRT_NamedValue v;
  std::memset(&v, 0, sizeof(v));
  v.struct_size = PJRT_NamedValue_STRUCT_SIZE;
  v.name = name;
  v.name_size = std::strlen(name);
  v.type = type;
  v.value_size = 1;
  return v;
}

inline ExecutableRelease::~ExecutableRelease() {
  if (!exe) return;
  auto d = PJRT_ARGS(PJRT_Executable_Destroy_Args);
  d.executable = exe;
  discard(api, api->PJRT_Executable_Destroy(&d));
}

}  // namespace torch_pjrt::runtime

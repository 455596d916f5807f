// PJRT_Client_Create's key-value callbacks over a KeyValueStore.
#include "runtime/kv_store.h"

#include <cstring>
#include <exception>
#include <memory>
#include <stdexcept>

#include "runtime/pjrt_util.h"

namespace torch_pjrt::runtime {
namespace {

KeyValueStore* store_of(void* user_arg) { return static_cast<KeyValueStore*>(user_arg); }

PJRT_Error* fail(PJRT_CallbackError* error, PJRT_Error_Code code, const std::string& message) {
  return (*error)(code, message.data(), message.size());
}

void free_value(char* value) { delete[] value; }

char* copy_out(const std::string& s) {
  char* out = new char[s.size() + 1];
  std::memcpy(out, s.data(), s.size());
  out[s.size()] = '\0';
  return out;
}

// Hands a value read to the plugin (it copies it, then calls the deleter).
template <class Args>
PJRT_Error* give(Args* args, const std::string& v) {
  args->value = copy_out(v);
  args->value_size = v.size();
  args->value_deleter_callback = &free_value;
  return nullptr;
}

PJRT_Error* kv_get(PJRT_KeyValueGetCallback_Args* args) {
  std::string key(args->key, args->key_size);
  try {
    if (auto v = store_of(args->user_arg)->get(key, args->timeout_in_ms)) return give(args, *v);
    return fail(args->callback_error, PJRT_Error_Code_DEADLINE_EXCEEDED,
                "torch_pjrt: key '" + key + "' did not appear in the store within " +
                    std::to_string(args->timeout_in_ms) + " ms");
  } catch (const std::exception& e) {
    return fail(args->callback_error, PJRT_Error_Code_INTERNAL, e.what());
  }
}

PJRT_Error* kv_try_get(PJRT_KeyValueTryGetCallback_Args* args) {
  std::string key(args->key, args->key_size);
  try {
    if (auto v = store_of(args->user_arg)->try_get(key)) return give(args, *v);
    return fail(args->callback_error, PJRT_Error_Code_NOT_FOUND, "torch_pjrt: key '" + key + "' not set");
  } catch (const std::exception& e) {
    return fail(args->callback_error, PJRT_Error_Code_INTERNAL, e.what());
  }
}

PJRT_Error* kv_put(PJRT_KeyValuePutCallback_Args* args) {
  try {
    store_of(args->user_arg)->put(std::string(args->key, args->key_size),
                                  std::string(args->value, args->value_size));
    return nullptr;
  } catch (const std::exception& e) {
    return fail(args->callback_error, PJRT_Error_Code_INTERNAL, e.what());
  }
}

// call_kv_callback's stand-in for the plugin's errors.
struct TestError {
  PJRT_Error_Code code;
  std::string message;
};
PJRT_Error* make_test_error(PJRT_Error_Code code, const char* message, size_t size) {
  return reinterpret_cast<PJRT_Error*>(new TestError{code, std::string(message, size)});
}
[[noreturn]] void throw_test_error(PJRT_Error* e) {
  std::unique_ptr<TestError> err(reinterpret_cast<TestError*>(e));
  throw std::runtime_error("code " + std::to_string(static_cast<int>(err->code)) + ": " + err->message);
}

}  // namespace

void attach_kv_callbacks(PJRT_Client_Create_Args& args, KeyValueStore* kv) {
  args.kv_get_callback = &kv_get;
  args.kv_get_user_arg = kv;
  args.kv_try_get_callback = &kv_try_get;
  args.kv_try_get_user_arg = kv;
  args.kv_put_callback = &kv_put;
  args.kv_put_user_arg = kv;
}

std::string call_kv_callback(KeyValueStore* kv, const std::string& op, const std::string& key,
                             const std::string& value, int timeout_ms) {
  PJRT_CallbackError error_fn = &make_test_error;
  auto fetch = [&](auto& a, PJRT_Error* err) {
    if (err) throw_test_error(err);
    std::string out(a.value, a.value_size);
    a.value_deleter_callback(a.value);
    return out;
  };
  if (op == "get") {
    auto a = PJRT_ARGS(PJRT_KeyValueGetCallback_Args);
    a.key = key.data();
    a.key_size = key.size();
    a.timeout_in_ms = timeout_ms;
    a.callback_error = &error_fn;
    a.user_arg = kv;
    return fetch(a, kv_get(&a));
  }
  if (op == "try_get") {
    auto a = PJRT_ARGS(PJRT_KeyValueTryGetCallback_Args);
    a.key = key.data();
    a.key_size = key.size();
    a.callback_error = &error_fn;
    a.user_arg = kv;
    return fetch(a, kv_try_get(&a));
  }
  if (op == "put") {
    auto a = PJRT_ARGS(PJRT_KeyValuePutCallback_Args);
    a.key = key.data();
    a.key_size = key.size();
    a.value = value.data();
    a.value_size = value.size();
    a.callback_error = &error_fn;
    a.user_arg = kv;
    if (PJRT_Error* err = kv_put(&a)) throw_test_error(err);
    return "";
  }
  throw std::invalid_argument("torch_pjrt: unknown key-value callback '" + op + "'");
}

}  // namespace torch_pjrt::runtime

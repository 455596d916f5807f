// The key-value store a PJRT client uses to find the other processes of a
// distributed job (PJRT_Client_Create's kv callbacks). The runtime knows no
// PyTorch: the distributed layer adapts c10d's store to this interface
// (csrc/distributed/store_kv.cpp).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "xla/pjrt/c/pjrt_c_api.h"

namespace torch_pjrt::runtime {

class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;
  // Blocks until `key` is set or `timeout_ms` passes (nullopt then).
  virtual std::optional<std::string> get(const std::string& key, int timeout_ms) = 0;
  // nullopt at once when `key` is not set.
  virtual std::optional<std::string> try_get(const std::string& key) = 0;
  virtual void put(const std::string& key, const std::string& value) = 0;
};
using KeyValueStorePtr = std::shared_ptr<KeyValueStore>;

// Points the create arguments' kv_get / kv_try_get / kv_put callbacks at
// `kv`, which must outlive the client.
void attach_kv_callbacks(PJRT_Client_Create_Args& args, KeyValueStore* kv);

// Calls the callbacks as a plugin does ("get", "try_get", "put"), with an
// error constructor of its own; returns the value read ("" for put) or
// throws std::runtime_error with the callback's error code and message.
// Lets tests check the bridge without a plugin that uses it.
std::string call_kv_callback(KeyValueStore* kv, const std::string& op, const std::string& key,
                             const std::string& value, int timeout_ms);

}  // namespace torch_pjrt::runtime

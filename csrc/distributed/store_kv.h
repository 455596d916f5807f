// c10d's store as the PJRT client's key-value store (runtime/kv_store.h).
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "runtime/kv_store.h"

namespace torch_pjrt::distributed {

runtime::KeyValueStorePtr store_as_kv(c10::intrusive_ptr<c10d::Store> store);

}  // namespace torch_pjrt::distributed

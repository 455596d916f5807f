#include "distributed/store_kv.h"

#include <chrono>

namespace torch_pjrt::distributed {
namespace {

class StoreKv : public runtime::KeyValueStore {
 public:
  explicit StoreKv(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}

  std::optional<std::string> get(const std::string& key, int timeout_ms) override {
    try {
      store_->wait({key}, std::chrono::milliseconds(timeout_ms < 0 ? 0 : timeout_ms));
    } catch (const c10::DistStoreError&) {
      return std::nullopt;  // not set in time
    }
    return read(key);
  }
  std::optional<std::string> try_get(const std::string& key) override {
    if (!store_->check({key})) return std::nullopt;
    return read(key);
  }
  void put(const std::string& key, const std::string& value) override {
    store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }

 private:
  std::string read(const std::string& key) {
    std::vector<uint8_t> v = store_->get(key);
    return std::string(v.begin(), v.end());
  }
  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace

runtime::KeyValueStorePtr store_as_kv(c10::intrusive_ptr<c10d::Store> store) {
  return std::make_shared<StoreKv>(std::move(store));
}

}  // namespace torch_pjrt::distributed

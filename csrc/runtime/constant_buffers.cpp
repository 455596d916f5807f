#include "runtime/constant_buffers.h"

#include <mutex>
#include <string>
#include <unordered_map>

namespace torch_pjrt::runtime {

namespace {

constexpr size_t kMaxEntries = 512;

struct Table {
  std::mutex mutex;
  std::unordered_map<std::string, BufferPtr> entries;
};

// (The client is only ever replaced before the first host-to-device copy,
// Runtime::make_distributed, so every entry belongs to the current one.)
// Never destroyed: at exit the plugin may be gone before static destructors
// run, and destroying a buffer then would call into it.
Table& table() {
  static Table* t = new Table();
  return *t;
}

}  // namespace

BufferPtr constant_buffer(const void* data, PJRT_Buffer_Type type, const std::vector<int64_t>& dims, int device,
                          bool internal) {
  Runtime& rt = Runtime::get();
  size_t bytes = element_size(type);
  for (int64_t d : dims) bytes *= static_cast<size_t>(d);
  if (bytes > kConstantBufferMaxBytes || in_forked_child())
    return rt.buffer_from_host(data, type, dims, device, /*tracked=*/!internal);
  thread_local std::string key;  // reused: a lookup that hits allocates nothing
  key.clear();
  key.push_back(static_cast<char>(device));
  key.push_back(static_cast<char>(type));
  key.push_back(static_cast<char>(dims.size()));
  key.append(reinterpret_cast<const char*>(dims.data()), dims.size() * sizeof(int64_t));
  key.append(static_cast<const char*>(data), bytes);
  Table& t = table();
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    auto it = t.entries.find(key);
    if (it != t.entries.end()) return it->second;
  }
  BufferPtr buf = rt.buffer_from_host(data, type, dims, device, /*tracked=*/false);
  std::lock_guard<std::mutex> lock(t.mutex);
  if (t.entries.size() >= kMaxEntries) t.entries.clear();  // values that vary (random keys): start again
  t.entries.emplace(key, buf);
  return buf;
}

size_t constant_buffer_count() {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  return t.entries.size();
}

}  // namespace torch_pjrt::runtime

#include "runtime/prefetch.h"

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <thread>

namespace torch_pjrt::runtime::prefetch {
namespace {

struct State {
  std::mutex mutex;
  std::condition_variable cv;
  bool noting = false;
  std::vector<std::pair<std::string, int64_t>> noted;
  std::set<std::string> noted_set;
  std::map<std::string, ExecutablePtr> loaded;
  std::set<std::string> loading;  // being loaded by the thread now
  std::vector<std::pair<std::string, int64_t>> queue;
  bool stopping = false;
  std::thread thread;
  Stats stats;
};

State& state() {
  static auto* s = new State();  // (never destroyed: stop() joins the thread at exit)
  return *s;
}

bool from_hex(const std::string& hex, Sha256::Digest* out) {
  if (hex.size() != 64) return false;
  for (size_t i = 0; i < 32; ++i) {
    unsigned v = 0;
    for (int k = 0; k < 2; ++k) {
      char c = hex[2 * i + k];
      int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      if (d < 0) return false;
      v = v * 16 + static_cast<unsigned>(d);
    }
    (*out)[i] = static_cast<uint8_t>(v);
  }
  return true;
}

void run(Loader load) {
  State& s = state();
  for (;;) {
    std::pair<std::string, int64_t> next;
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      if (s.stopping || s.queue.empty()) return;
      next = s.queue.back();
      s.queue.pop_back();
      if (s.loaded.count(next.first)) continue;
      s.loading.insert(next.first);
    }
    Sha256::Digest key{};
    ExecutablePtr exe;
    if (from_hex(next.first, &key)) {
      try {
        exe = load(key, static_cast<size_t>(next.second));
      } catch (...) {
        exe = nullptr;  // compile() loads or compiles it as usual
      }
    }
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      s.loading.erase(next.first);
      if (exe) {
        s.loaded[next.first] = std::move(exe);
        s.stats.loaded++;
      }
    }
    s.cv.notify_all();
  }
}

}  // namespace

void set_noting(bool on) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.noting = on;
  if (on) {
    s.noted.clear();
    s.noted_set.clear();
  }
}

std::vector<std::pair<std::string, int64_t>> noted() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.noted;
}

void note(const Sha256::Digest& key, size_t program_size) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.noting) return;
  std::string hex = Sha256::hex(key);
  if (s.noted_set.insert(hex).second) s.noted.emplace_back(hex, static_cast<int64_t>(program_size));
}

void start(const std::vector<std::pair<std::string, int64_t>>& keys, Loader load) {
  stop();
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.stopping = false;
  // Largest program first (a fused step's, asked for last and slowest to
  // load), so it loads while the step's first calls load the small ones
  // themselves; the queue is taken from its back.
  s.queue.assign(keys.begin(), keys.end());
  std::stable_sort(s.queue.begin(), s.queue.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  s.thread = std::thread(run, std::move(load));
}

ExecutablePtr take(const Sha256::Digest& key) {
  State& s = state();
  std::unique_lock<std::mutex> lock(s.mutex);
  if (s.loaded.empty() && s.loading.empty() && s.queue.empty()) return nullptr;  // the common case
  std::string hex = Sha256::hex(key);
  for (auto it = s.queue.begin(); it != s.queue.end(); ++it)
    if (it->first == hex) {  // not reached yet: the caller loads it now, the thread skips it
      s.queue.erase(it);
      return nullptr;
    }
  s.cv.wait(lock, [&] { return !s.loading.count(hex); });
  auto it = s.loaded.find(hex);
  if (it == s.loaded.end()) return nullptr;
  ExecutablePtr exe = std::move(it->second);
  s.loaded.erase(it);
  s.stats.taken++;
  return exe;
}

void stop() {
  State& s = state();
  std::thread t;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.stopping = true;
    t = std::move(s.thread);
  }
  if (t.joinable()) t.join();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.stats.unused += static_cast<int64_t>(s.loaded.size());
  s.loaded.clear();
  s.queue.clear();
}

Stats stats() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.stats;
}

}  // namespace torch_pjrt::runtime::prefetch

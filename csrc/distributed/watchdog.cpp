#include "distributed/watchdog.h"

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>

namespace torch_pjrt::distributed {

struct Watch::Item {
  runtime::DeviceEventPtr done;  // null while the launch call runs
  std::chrono::steady_clock::time_point deadline;
  std::chrono::milliseconds timeout;
  std::string what;
};

namespace {

struct Watchdog {
  std::mutex mu;
  std::deque<std::shared_ptr<Watch::Item>> items;  // launch order
  bool started = false;

  void loop() {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      std::lock_guard<std::mutex> lock(mu);
      while (!items.empty() && items.front()->done && items.front()->done->ready()) items.pop_front();
      auto now = std::chrono::steady_clock::now();
      for (const auto& w : items) {
        if (now < w->deadline || (w->done && w->done->ready())) continue;
        std::fprintf(stderr,
                     "torch_pjrt (c10d backend 'tpu'): %s did not complete within the process group's timeout "
                     "(%lld ms): a peer process died, hung or called a different collective. Ending this "
                     "process, as PyTorch's NCCL watchdog does (TORCH_PJRT_DEVICE_COLLECTIVES=0 selects the "
                     "host path, whose collectives raise instead).\n",
                     w->what.c_str(), static_cast<long long>(w->timeout.count()));
        std::fflush(stderr);
        std::abort();
      }
    }
  }
};

Watchdog& dog() {
  static auto* d = new Watchdog();  // never destroyed: its thread outlives static destruction
  return *d;
}

}  // namespace

Watch::Watch(std::chrono::milliseconds timeout, std::string what) {
  if (timeout.count() <= 0) return;
  item_ = std::make_shared<Item>(Item{nullptr, std::chrono::steady_clock::now() + timeout, timeout, std::move(what)});
  Watchdog& d = dog();
  std::lock_guard<std::mutex> lock(d.mu);
  if (!d.started) {
    std::thread([&d] { d.loop(); }).detach();
    d.started = true;
  }
  d.items.push_back(item_);
}

void Watch::launched(runtime::DeviceEventPtr done) {
  if (!item_) return;
  std::lock_guard<std::mutex> lock(dog().mu);
  item_->done = std::move(done);
}

}  // namespace torch_pjrt::distributed

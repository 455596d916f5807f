// Compiles on background threads: eager builds a program per new op and
// shape, and XLA takes tens of milliseconds for each. A new op's program
// compiles while the caller goes on to the next ops (recording them, lowering
// them, starting their compiles on other threads); the launch thread waits
// for each program in queue order. A cold eager model compiles its programs
// side by side, on up to TORCH_PJRT_COMPILE_THREADS threads (default: the
// CPU count, at most 8; 0 compiles on the caller).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>

#include "runtime/pjrt_runtime.h"

namespace torch_pjrt::runtime {
namespace {

int configured_threads() {
  const char* v = std::getenv("TORCH_PJRT_COMPILE_THREADS");
  if (!v || !*v) return std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 8);
  char* end = nullptr;
  long n = std::strtol(v, &end, 10);
  if (*end != '\0' || n < 0 || n > 256)
    throw std::invalid_argument(std::string("torch_pjrt: TORCH_PJRT_COMPILE_THREADS must be a number of threads "
                                            "from 0 (compile on the calling thread) to 256, got '") + v + "'");
  return static_cast<int>(n);
}

// Never destroyed (as the runtime): its threads may still be compiling when
// the process exits; exit waits for the compiles in flight (drain).
struct Pool {
  std::mutex mutex;
  std::condition_variable work, idle;
  std::deque<std::function<void()>> jobs;
  int threads = 0, running = 0;
  bool exiting = false;
  // Programs being compiled, by text: a second plan with the same program
  // (another op key, the same shapes) waits for the first compile instead of
  // compiling it again before the persistent cache has it.
  std::unordered_map<std::string, std::shared_future<ExecutablePtr>> in_flight;

  void submit(std::function<void()> job, int max_threads) {
    std::lock_guard<std::mutex> lock(mutex);
    jobs.push_back(std::move(job));
    if (threads < max_threads && threads - running < static_cast<int>(jobs.size())) {  // none idle for it
      ++threads;
      std::thread([this] { loop(); }).detach();
    }
    work.notify_one();
  }

  void loop() {
    std::unique_lock<std::mutex> lock(mutex);
    for (;;) {
      work.wait(lock, [&] { return !jobs.empty() || exiting; });
      if (jobs.empty()) return;
      auto job = std::move(jobs.front());
      jobs.pop_front();
      ++running;
      lock.unlock();
      job();  // (sets its promise, value or error: never throws)
      lock.lock();
      --running;
      if (jobs.empty() && running == 0) idle.notify_all();
    }
  }

  void wait_idle(std::unique_lock<std::mutex>& lock) {
    idle.wait(lock, [&] { return jobs.empty() && running == 0; });
  }

  void drain() {
    if (in_forked_child()) return;  // (the parent's threads and lock state: not ours to wait for)
    std::unique_lock<std::mutex> lock(mutex);
    wait_idle(lock);
    exiting = true;
    work.notify_all();
  }
};

std::atomic<Pool*> g_pool{nullptr};

Pool& pool() {
  static Pool* p = [] {
    auto* made = new Pool();
    std::atexit([] { pool().drain(); });
    g_pool.store(made);
    return made;
  }();
  return *p;
}

}  // namespace

int Runtime::compile_threads() {
  static const int n = configured_threads();
  return n;
}

void Runtime::wait_for_compiles() {
  Pool* p = g_pool.load();
  if (!p || in_forked_child()) return;
  std::unique_lock<std::mutex> lock(p->mutex);
  p->wait_idle(lock);
}

ExecutablePtr Runtime::compile_async(std::string mlir_text, std::vector<int64_t> output_bytes, std::string what) {
  const int max_threads = compile_threads();
  if (max_threads == 0) return compile(mlir_text);
  Pool& p = pool();
  auto promise = std::make_shared<std::promise<ExecutablePtr>>();
  std::shared_future<ExecutablePtr> compiled = promise->get_future().share();
  {
    std::lock_guard<std::mutex> lock(p.mutex);
    auto [at, added] = p.in_flight.emplace(mlir_text, compiled);
    if (!added) {
      metrics().thread_compiles_joined++;
      return std::make_shared<Executable>(std::move(output_bytes), at->second);
    }
  }
  metrics().thread_compiles++;
  auto exe = std::make_shared<Executable>(output_bytes, compiled);
  p.submit(
      [this, &p, promise, text = std::move(mlir_text), expected = std::move(output_bytes), what = std::move(what)] {
        struct Done {  // (however the compile ends)
          Pool& p;
          const std::string& text;
          ~Done() {
            std::lock_guard<std::mutex> lock(p.mutex);
            p.in_flight.erase(text);
          }
        } done_with{p, text};
        try {
          auto start = std::chrono::steady_clock::now();
          ExecutablePtr done = compile(text);
          done->thread_compile_seconds =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          // (`expected` empty: the caller takes the outputs the program has.)
          bool same = expected.empty() || done->num_outputs() == expected.size();
          for (size_t i = 0; same && i < expected.size(); ++i) same = done->output_bytes(i) == expected[i];
          if (!same)
            throw std::logic_error("torch_pjrt: internal error: a program's outputs are not the sizes its plan "
                                   "expected (compile_async)");
          promise->set_value(std::move(done));
        } catch (const std::exception& e) {
          promise->set_exception(std::make_exception_ptr(
              std::runtime_error("torch_pjrt: the program of " + what + " did not compile: " + e.what())));
        } catch (...) {
          promise->set_exception(std::current_exception());
        }
      },
      max_threads);
  return exe;
}

}  // namespace torch_pjrt::runtime

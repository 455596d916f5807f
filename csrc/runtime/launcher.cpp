// The launch thread: Runtime::launch queues an execution and returns its
// outputs as pending buffers; one thread makes the plugin's execute calls in
// queue order. On the CPU plugin that call costs ~0.4-1.2 us per argument and
// output buffer (a captured GPT step's 256 buffers: ~100-300 us), all of it
// host time the caller no longer spends. Readers of a pending buffer
// (Buffer::get) and synchronize wait for the launch; donation decisions
// count the queue's references instead (QueueHold).
#include <pthread.h>
#include <sched.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <span>
#include <thread>

#include "runtime/pjrt_runtime.h"

namespace torch_pjrt::runtime {
namespace {

struct Job {
  ExecutablePtr exe;  // null: only drops `dropped` (Runtime::release_later)
  std::vector<BufferPtr> dropped;
  // The arguments, then the outputs (pending until launched): the only
  // references the job holds, which its queued execution takes over.
  QueueHold hold;
  size_t num_args = 0;
  int device = 0;
  std::vector<int64_t> not_donated;
  std::span<const BufferPtr> args() const { return {hold.buffers().data(), num_args}; }
  std::span<const BufferPtr> outputs() const {
    return std::span<const BufferPtr>(hold.buffers()).subspan(num_args);
  }
};

// A caller this far ahead of the launch thread waits (memory stays bounded)
// until the queue is down to kResume: one wake-up per kMaxQueued - kResume
// launches, not one per launch, when the caller outpaces the thread.
constexpr size_t kMaxQueued = 64;
constexpr size_t kResume = 16;
// How long the thread looks for more work before it sleeps.
constexpr int kSpinMicros = 30;

struct Launcher {
  std::mutex mutex;
  std::condition_variable work;  // jobs queued
  std::condition_variable done;  // a job launched (or failed)
  std::deque<Job> jobs;
  std::atomic<size_t> queued{0};  // jobs.size(), read without the lock while spinning
  bool busy = false;  // one job (taken off `jobs`) is being launched, by the thread or a caller
  int waiters = 0;    // callers waiting on `done` (woken after each job)
  int full_waiters = 0;  // callers waiting for room (woken at kResume)
  bool started = false;
  std::thread::id thread_id;
  std::exception_ptr unreported;  // first failure since the last synchronize
};

// Leaked on purpose: the thread is detached and may still hold the lock at exit.
Launcher& launcher() {
  static Launcher* l = new Launcher;
  return *l;
}

bool env_enabled() {
  const char* v = std::getenv("TORCH_PJRT_ASYNC_LAUNCH");
  return !v || !(std::strcmp(v, "0") == 0 || std::strcmp(v, "false") == 0 || std::strcmp(v, "off") == 0);
}

std::atomic<bool> g_enabled{env_enabled()};

}  // namespace

bool async_launch_enabled() { return g_enabled.load(std::memory_order_relaxed); }
void set_async_launch(bool on) {
  if (!on) Runtime::get().await_launches();
  g_enabled.store(on);
}

std::vector<BufferPtr> Runtime::launch(const ExecutablePtr& exe, std::vector<BufferPtr> args, int device,
                                       std::vector<int64_t> donated, std::vector<int64_t> not_donated) {
  if (!async_launch_enabled()) return execute(*exe, args, device, donated, not_donated);
  check_device(device);
  ensure_outputs_fit(*exe, args, donated, device);
  // Donation is marked now, as execute() does after its call, and before the
  // outputs count: the memory moves to them, and no later decision may
  // donate or count it again.
  // (Counted once for all: a captured step donates and makes a hundred or more.)
  int64_t donated_bytes = 0, donated_count = 0;
  for (int64_t i : donated) {
    Buffer& b = *args[i];
    if (b.donated_) continue;
    if (b.tracked_) {
      donated_bytes += b.bytes_;
      donated_count++;
    }
    b.mark_donated(/*count=*/false);
  }
  account_buffers(device, donated_bytes, donated_count, false);
  Job job;
  std::vector<BufferPtr> result;
  result.reserve(exe->num_outputs());
  for (size_t i = 0; i < exe->num_outputs(); ++i)
    result.push_back(std::make_shared<Buffer>(api_, nullptr, device, exe->output_bytes(i), true, true));
  account_buffers(device, exe->total_output_bytes(), static_cast<int64_t>(exe->num_outputs()), true);
  job.exe = exe;
  job.num_args = args.size();
  args.insert(args.end(), result.begin(), result.end());
  job.hold = QueueHold(std::move(args));
  job.device = device;
  job.not_donated = std::move(not_donated);
  Launcher& l = launcher();
  {
    std::unique_lock<std::mutex> lock(l.mutex);
    if (!l.started) {
      l.started = true;
      std::thread t([this] { launch_loop(); });
      l.thread_id = t.get_id();
      t.detach();
    }
    if (l.jobs.size() >= kMaxQueued) {
      metrics().launch_waits++;
      if (!l.busy) {
        run_front_job(lock);  // the thread is not running: do one ourselves
      } else {
        l.full_waiters++;
        l.done.wait(lock, [&] { return l.jobs.size() <= kResume; });
        l.full_waiters--;
      }
    }
    l.jobs.push_back(std::move(job));
    l.queued.store(l.jobs.size(), std::memory_order_release);
  }
  l.work.notify_one();  // no system call while the thread spins (not waiting)
  metrics().async_launches++;
  return result;
}

void Runtime::launch_loop() {
  {
    sched_param none{};
    pthread_setschedparam(pthread_self(), SCHED_BATCH, &none);
  }
  Launcher& l = launcher();
  std::unique_lock<std::mutex> lock(l.mutex);
  for (;;) {
    if (l.jobs.empty()) {
      // Spin a little before sleeping: a caller issuing ops back to back
      // then finds the thread awake, and queueing costs no wake-up (a
      // system call per op, on the caller).
      lock.unlock();
      auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinMicros);
      for (int i = 1; l.queued.load(std::memory_order_acquire) == 0; ++i) {
        if (i % 64 == 0 && std::chrono::steady_clock::now() > until) break;
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
      }
      lock.lock();
    }
    l.work.wait(lock, [&] { return !l.jobs.empty() && !l.busy; });
    run_front_job(lock);
  }
}

// Makes the oldest queued job's execute call: on the launch thread, or on a
// caller that would otherwise wait for it (the thread not running one: it
// may not have woken up yet). One job at a time (`busy`), in queue order, so
// executions keep the order they were queued in. Called and returns with
// `lock` held.
void Runtime::run_front_job(std::unique_lock<std::mutex>& lock) {
  Launcher& l = launcher();
  Job job = std::move(l.jobs.front());
  l.jobs.pop_front();
  l.queued.store(l.jobs.size(), std::memory_order_release);
  l.busy = true;
  if (std::this_thread::get_id() != l.thread_id) metrics().caller_launches++;
  lock.unlock();
  std::exception_ptr failed;
  if (job.exe) try {
      execute_call(*job.exe, job.args(), job.device, nullptr, job.not_donated, job.outputs(), &job.hold);
    } catch (...) {
      failed = std::current_exception();
    }
  if (failed) {
    lock.lock();
    for (const BufferPtr& b : job.outputs()) b->failed_ = failed;
    if (!l.unreported) l.unreported = failed;
    lock.unlock();
  }
  // What the job held goes before it counts as done (a caller that waited
  // for the launches then sees the memory freed), outside the lock
  // (destroying buffers calls the plugin).
  job = Job{};
  lock.lock();
  l.busy = false;
  // (A notify with no one waiting is cheap; a wake-up is not.)
  if (l.waiters > 0 || (l.full_waiters > 0 && l.jobs.size() <= kResume)) l.done.notify_all();
  if (!l.jobs.empty() && std::this_thread::get_id() != l.thread_id) l.work.notify_one();
}

void Runtime::await_launches() {
  Launcher& l = launcher();
  std::unique_lock<std::mutex> lock(l.mutex);
  if (!l.started || std::this_thread::get_id() == l.thread_id) return;
  if (l.jobs.empty() && !l.busy) return;
  metrics().launch_waits++;
  while (!l.jobs.empty() || l.busy) {
    if (!l.busy) {
      run_front_job(lock);
      continue;
    }
    l.waiters++;
    l.done.wait(lock);
    l.waiters--;
  }
}

std::exception_ptr Runtime::take_launch_error() {
  Launcher& l = launcher();
  std::lock_guard<std::mutex> lock(l.mutex);
  std::exception_ptr e = l.unreported;
  l.unreported = nullptr;
  return e;
}

void Runtime::release_later(std::vector<BufferPtr> buffers) {
  Launcher& l = launcher();
  {
    std::lock_guard<std::mutex> lock(l.mutex);
    if (!l.started || !async_launch_enabled()) return;  // dropped here, on return
    Job job;
    job.dropped = std::move(buffers);
    l.jobs.push_back(std::move(job));
    l.queued.store(l.jobs.size(), std::memory_order_release);
  }
  l.work.notify_one();
}

PJRT_Buffer* Buffer::await_launch() const {
  Launcher& l = launcher();
  std::unique_lock<std::mutex> lock(l.mutex);
  if (!buffer_.load(std::memory_order_acquire) && !failed_) metrics().launch_waits++;
  while (!buffer_.load(std::memory_order_acquire) && !failed_) {
    if (!l.busy && !l.jobs.empty()) {
      Runtime::get().run_front_job(lock);  // ours is queued: launch up to it here
      continue;
    }
    l.waiters++;
    l.done.wait(lock);
    l.waiters--;
  }
  if (failed_) {
    if (l.unreported == failed_) l.unreported = nullptr;  // raised here: not again at synchronize
    std::rethrow_exception(failed_);
  }
  return buffer_.load(std::memory_order_acquire);
}

}  // namespace torch_pjrt::runtime

// Asynchronous execution: launches, the bounded queue of executions in
// flight per device (their arguments and outputs stay alive, and counted,
// until they finish), waiting, and the device-side value checks reported at
// host reads.
#include <algorithm>
#include <chrono>
#include <unordered_set>

#include "runtime/pjrt_runtime.h"
#include "runtime/pjrt_util.h"

namespace torch_pjrt::runtime {

std::vector<BufferPtr> Runtime::execute(const Executable& exe, const std::vector<BufferPtr>& args, int device,
                                        const std::vector<int64_t>& donated,
                                        const std::vector<int64_t>& not_donated) {
  check_device(device);
  ensure_outputs_fit(exe, args, donated, device);
  return execute_call(exe, args, device, &donated, not_donated);
}

void Runtime::ensure_outputs_fit(const Executable& exe, const std::vector<BufferPtr>& args,
                                 const std::vector<int64_t>& donated, int device) {
  int64_t reused = 0;  // donated inputs' memory becomes outputs' memory
  for (int64_t i : donated) reused += args[i]->bytes();
  ensure_fits(device, exe.total_output_bytes() - reused, "the program");
}

std::vector<BufferPtr> Runtime::execute_call(const Executable& exe, std::span<const BufferPtr> args, int device,
                                             const std::vector<int64_t>* donated,
                                             const std::vector<int64_t>& not_donated,
                                             std::span<const BufferPtr> pending, QueueHold* hold) {
  auto options = PJRT_ARGS(PJRT_ExecuteOptions);
  options.non_donatable_input_indices = not_donated.data();
  options.num_non_donatable_input_indices = not_donated.size();
  std::vector<PJRT_Buffer*> arg_list(args.size());
  for (size_t i = 0; i < args.size(); ++i) arg_list[i] = args[i]->get();
  std::vector<PJRT_Buffer*> outputs(exe.num_outputs(), nullptr);
  PJRT_Buffer* const* arg_ptr = arg_list.data();
  PJRT_Buffer** out_list = outputs.data();
  PJRT_Event* done = nullptr;
  auto ex = PJRT_ARGS(PJRT_LoadedExecutable_Execute_Args);
  ex.executable = exe.get();
  ex.options = &options;
  ex.argument_lists = &arg_ptr;
  ex.num_devices = 1;
  ex.num_args = args.size();
  ex.output_lists = &out_list;
  ex.device_complete_events = &done;
  ex.execute_device = devices_[device];
  auto launch = std::chrono::steady_clock::now();
  check(api_->PJRT_LoadedExecutable_Execute(&ex), "execute");
  metrics().executions++;
  metrics().execute_call_seconds =
      metrics().execute_call_seconds.load() +
      std::chrono::duration<double>(std::chrono::steady_clock::now() - launch).count();
  // Donated memory leaves its inputs before the outputs count (the peak
  // never holds both).
  if (donated)
    for (int64_t i : *donated) args[i]->mark_donated();
  if (hold) {  // a launch: its pending outputs are filled, and its hold is queued
    for (size_t i = 0; i < outputs.size(); ++i) pending[i]->buffer_.store(outputs[i], std::memory_order_release);
    enqueue(device, done, std::move(*hold));
    return {};
  }
  std::vector<BufferPtr> result;
  result.reserve(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i)
    result.push_back(std::make_shared<Buffer>(api_, outputs[i], device, exe.output_bytes(i)));
  std::vector<BufferPtr> held(args.begin(), args.end());
  held.insert(held.end(), result.begin(), result.end());
  enqueue(device, done, QueueHold(std::move(held)));
  return result;
}

QueueHold::QueueHold(std::vector<BufferPtr> buffers) : buffers_(std::move(buffers)) {
  for (const BufferPtr& b : buffers_) b->queue_refs_.fetch_add(1);
}

QueueHold& QueueHold::operator=(QueueHold&& o) noexcept {
  if (this != &o) {
    release();
    buffers_ = std::move(o.buffers_);
    o.buffers_.clear();
  }
  return *this;
}

void QueueHold::release() {
  for (const BufferPtr& b : buffers_) b->queue_refs_.fetch_sub(1);
  buffers_.clear();
}

void Runtime::choose_donations(const std::vector<BufferPtr>& args, const std::vector<int64_t>& candidates,
                               int device, bool queued, std::vector<int64_t>& donated, std::vector<int64_t>& kept) {
  // An execution made on this thread would run ahead of queued ones: where
  // an execution holds a candidate, the queue is launched first (as it
  // holds the device lock, nothing is queued again before this one runs).
  bool held = false;
  for (int64_t x : candidates) held |= args[x]->queue_refs_.load() > 0;
  if (held && !queued) await_launches();
  // Executions' holds, finished or not, are subtracted below, so finished
  // ones need not be retired first: their buffers are released by the
  // enqueue after this execute call, while the program runs. (Retiring here
  // put 7-14 us of buffer releases before a fused decode read's execute
  // call, on the read's critical path.)
  for (int64_t x : candidates) {
    const BufferPtr& b = args[x];
    // The references, then their count: a count falls before its reference
    // goes, so an execution finishing between the two reads can only make
    // this keep a buffer, never donate one an owner holds.
    long refs = b.use_count();
    std::atomic_thread_fence(std::memory_order_seq_cst);
    long counted = b->queue_refs_.load();
    (refs - counted == 1 && !b->donated() ? donated : kept).push_back(x);
  }
}

void Runtime::enqueue(int device, PJRT_Event* done, QueueHold held) {
  Pending p{done, std::move(held)};
  std::lock_guard<std::mutex> lock(pending_mutex_);
  auto& queue = pending_[device];
  queue.push_back(std::move(p));
  launched_[device]++;
  retire_ready_locked(device);
  int bound = max_inflight_.load();
  if (static_cast<int>(queue.size()) > bound) {
    // Backpressure: a producer far ahead of the device waits for the oldest
    // execution instead of growing memory without bound.
    metrics().queue_full_waits++;
    while (static_cast<int>(queue.size()) > bound) {
      retire(queue.front(), true);
      queue.pop_front();
    }
  }
}

void Runtime::retire(Pending& p, bool wait) {
  if (!p.event) return;
  if (wait) {
    auto aw = PJRT_ARGS(PJRT_Event_Await_Args);
    aw.event = p.event;
    discard(api_, api_->PJRT_Event_Await(&aw));
  } else {
    auto e = PJRT_ARGS(PJRT_Event_Error_Args);
    e.event = p.event;
    discard(api_, api_->PJRT_Event_Error(&e));
  }
  auto d = PJRT_ARGS(PJRT_Event_Destroy_Args);
  d.event = p.event;
  api_->PJRT_Event_Destroy(&d);
  p.event = nullptr;
  p.held.release();
}

// Executions finish in launch order on a device; the finished prefix goes.
void Runtime::retire_ready_locked(int device) {
  auto& queue = pending_[device];
  while (!queue.empty()) {
    auto r = PJRT_ARGS(PJRT_Event_IsReady_Args);
    r.event = queue.front().event;
    PJRT_Error* err = r.event ? api_->PJRT_Event_IsReady(&r) : nullptr;
    if (err) {
      discard(api_, err);
      return;
    }
    if (r.event && !r.is_ready) return;
    retire(queue.front(), false);
    queue.pop_front();
  }
}

std::vector<std::deque<Runtime::Pending>> Runtime::take_pending(int device,
                                                                std::vector<std::pair<int, int64_t>>* counts) {
  await_launches();
  std::vector<std::deque<Pending>> taken;
  std::lock_guard<std::mutex> lock(pending_mutex_);
  for (size_t d = 0; d < pending_.size(); ++d)
    if (device < 0 || static_cast<int>(d) == device) {
      taken.push_back(std::move(pending_[d]));
      pending_[d].clear();
      if (counts) counts->emplace_back(static_cast<int>(d), launched_[d]);
    }
  return taken;
}

void Runtime::mark_awaited(const std::vector<std::pair<int, int64_t>>& counts) {
  for (const auto& [d, n] : counts) {
    int64_t seen = awaited_[d].load();
    while (seen < n && !awaited_[d].compare_exchange_weak(seen, n)) {
    }
  }
}

void Runtime::drain(int device) {
  std::vector<std::pair<int, int64_t>> counts;
  for (auto& queue : take_pending(device, &counts))
    for (auto& p : queue) retire(p, true);
  mark_awaited(counts);
}

int64_t Runtime::held_by_queue(int device) {
  // Buffers whose only owners are executions (their QueueHold count is all
  // their references), each counted once.
  await_launches();
  std::unordered_set<const Buffer*> seen;
  int64_t bytes = 0;
  std::lock_guard<std::mutex> lock(pending_mutex_);
  for (const auto& p : pending_[device])
    for (const auto& b : p.held.buffers())
      if (seen.insert(b.get()).second && b.use_count() == b->queue_refs_.load()) bytes += b->bytes();
  return bytes;
}

void Runtime::synchronize(int device) {
  metrics().host_waits++;
  std::string first_error;
  await_launches();
  if (std::exception_ptr failed = take_launch_error()) {
    drain(device);
    std::rethrow_exception(failed);
  }
  std::vector<std::pair<int, int64_t>> counts;
  for (auto& queue : take_pending(device, &counts)) {
    for (auto& p : queue) {
      PJRT_Event* ev = p.event;
      p.event = nullptr;
      p.held.release();
      try {
        await_and_destroy(ev, "execution");
      } catch (const std::exception& e) {
        if (first_error.empty()) first_error = e.what();
      }
    }
  }
  mark_awaited(counts);
  if (!first_error.empty()) raise(ErrorKind::Runtime, first_error);
  report_checks(device);
}

// ---- events ----

namespace {

int64_t steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// What one completion callback needs; freed by the callback.
struct EventArrival {
  const PJRT_Api* api;
  DeviceEventPtr event;
};

void on_execution_ready(PJRT_Error* error, void* arg) {
  int64_t now = steady_now_ns();
  auto* a = static_cast<EventArrival*>(arg);
  // A failed execution still completes the event; its error surfaces at the
  // next host read or synchronize, as for any asynchronous failure.
  discard(a->api, error);
  a->event->arrive(now);
  delete a;
}

}  // namespace

// Complete when every awaited execution's callback came, or when a
// synchronize already awaited them (its callbacks may run a little later on
// the plugin's threads).
bool DeviceEvent::ready() const {
  if (Runtime::get().awaited(device_) >= serial_) return true;
  std::lock_guard<std::mutex> lock(mutex_);
  return remaining_ == 0;
}

void DeviceEvent::wait() const {
  if (Runtime::get().awaited(device_) >= serial_) return;
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [this] { return remaining_ == 0; });
}

int64_t DeviceEvent::time_ns() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return time_ns_;
}

void DeviceEvent::arrive(int64_t now_ns) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (now_ns > time_ns_) time_ns_ = now_ns;
  if (remaining_ > 0 && --remaining_ == 0) cv_.notify_all();
}

DeviceEventPtr Runtime::record_event(int device) {
  check_device(device);
  await_launches();
  auto event = std::make_shared<DeviceEvent>(device);
  event->time_ns_ = steady_now_ns();
  std::lock_guard<std::mutex> lock(pending_mutex_);
  retire_ready_locked(device);
  // Every queued execution, not only the newest: a plugin may run
  // independent programs of one device concurrently. The queue lock keeps
  // the events alive while callbacks are registered (retire destroys them).
  event->serial_ = launched_[device];
  std::vector<PJRT_Event*> waits;
  for (const auto& p : pending_[device])
    if (p.event) waits.push_back(p.event);
  event->remaining_ = static_cast<int>(waits.size()) + 1;  // +1: until all are registered
  for (PJRT_Event* e : waits) {
    auto on = PJRT_ARGS(PJRT_Event_OnReady_Args);
    on.event = e;
    on.callback = &on_execution_ready;
    auto* arrival = new EventArrival{api_, event};
    on.user_arg = arrival;
    if (PJRT_Error* err = api_->PJRT_Event_OnReady(&on)) {
      // Cannot be told: wait for that execution here instead.
      discard(api_, err);
      delete arrival;
      auto aw = PJRT_ARGS(PJRT_Event_Await_Args);
      aw.event = e;
      discard(api_, api_->PJRT_Event_Await(&aw));
      event->arrive(steady_now_ns());
    }
  }
  event->arrive(event->time_ns_);  // registration done; the recording time is the earliest possible
  return event;
}

bool Runtime::idle(int device) {
  check_device(device);
  await_launches();
  std::lock_guard<std::mutex> lock(pending_mutex_);
  retire_ready_locked(device);
  return pending_[device].empty();
}

void Runtime::release_finished(int device) {
  await_launches();
  std::lock_guard<std::mutex> lock(pending_mutex_);
  for (size_t d = 0; d < pending_.size(); ++d)
    if (device < 0 || static_cast<int>(d) == device) retire_ready_locked(static_cast<int>(d));
}

// ---- value checks ----

int Runtime::register_check(ErrorKind kind, const std::string& message) {
  std::lock_guard<std::mutex> lock(check_mutex_);
  for (size_t i = 0; i < checks_.size(); ++i)
    if (checks_[i].first == kind && checks_[i].second == message) return static_cast<int>(i) + 1;
  checks_.emplace_back(kind, message);
  return static_cast<int>(checks_.size());
}

BufferPtr Runtime::check_word(int device) {
  check_device(device);
  {
    std::lock_guard<std::mutex> lock(check_mutex_);
    if (check_words_[device]) return check_words_[device];
  }
  int32_t zero = 0;
  BufferPtr word = buffer_from_host(&zero, PJRT_Buffer_Type_S32, {}, device);
  std::lock_guard<std::mutex> lock(check_mutex_);
  if (!check_words_[device]) check_words_[device] = word;
  return check_words_[device];
}

void Runtime::set_check_word(int device, BufferPtr word) {
  std::lock_guard<std::mutex> lock(check_mutex_);
  check_words_[device] = std::move(word);
  check_dirty_[device] = true;
}

void Runtime::defer_checks(int device) {
  std::lock_guard<std::mutex> lock(check_mutex_);
  check_deferred_[device] = check_dirty_[device];
}

void Runtime::discard_checks(int device) {
  std::lock_guard<std::mutex> lock(check_mutex_);
  check_words_[device] = nullptr;
  check_dirty_[device] = false;
  check_deferred_[device] = false;
}

void Runtime::report_checks(int device, bool at_op, bool reading) {
  for (size_t d = 0; d < check_words_.size(); ++d) {
    if (device >= 0 && static_cast<int>(d) != device) continue;
    BufferPtr word;
    {
      std::lock_guard<std::mutex> lock(check_mutex_);
      if (!check_dirty_[d]) continue;
      bool deferred = check_deferred_[d];
      check_deferred_[d] = false;
      if (reading && deferred) continue;
      word = check_words_[d];
      check_dirty_[d] = false;
    }
    int32_t code = 0;
    read_to_host(word->get(), &code, sizeof(code), "reading the check word");
    if (code == 0) continue;
    std::pair<ErrorKind, std::string> failed;
    {
      std::lock_guard<std::mutex> lock(check_mutex_);
      check_words_[d] = nullptr;  // a fresh zero word next time
      failed = code > 0 && code <= static_cast<int>(checks_.size())
                   ? checks_[code - 1]
                   : std::make_pair(ErrorKind::Runtime, std::string("unknown check ") + std::to_string(code));
    }
    metrics().device_check_failures++;
    if (!at_op)
      failed.second += " (found at the next host read or synchronize on tpu:" + std::to_string(d) +
                       ": the op ran asynchronously; TORCH_PJRT_EAGER=debug raises at the op itself)";
    raise(failed.first, failed.second);
  }
}

}  // namespace torch_pjrt::runtime

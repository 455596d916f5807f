// Fused eager: recording op calls into a trace and running the trace as one
// program (or op by op the first time a trace is seen).
//
// A recorded op is its cached one-op plan plus where each of its inputs comes
// from: a buffer that existed when it was recorded (an external input of the
// trace) or a value an earlier op of the trace computes. Storages the trace
// writes hold no buffer meanwhile (StorageBuffer::pending names the value);
// whatever reads such a storage through ensure_buffer runs the trace first.
// The fused program is a module with each distinct op program as a private
// function and a main that calls them in order (XLA inlines the calls and
// fuses across them); runtime scalars, storage offsets and random keys of all
// ops travel in one f64 and one s64 vector. Only values of storages still
// alive at the flush leave the program.
#include "eager/fused.h"
#include "eager/fused_trace.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <cstdlib>
#include <iostream>
#include <set>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include "device/device_lock.h"
#include "device/dtype_map.h"
#include "eager/env.h"
#include "eager/executor.h"
#include "eager/plan.h"
#include "eager/python_line.h"
#include "runtime/constant_buffers.h"
#include "runtime/pjrt_runtime.h"

namespace torch_pjrt::eager {

using device::StorageBuffer;
using lowering::Builder;
using lowering::DType;
using lowering::TensorType;
using lowering::Value;

using namespace fused_detail;

namespace {

runtime::Runtime& rt() { return runtime::Runtime::get(); }

Trace g_trace;  // under the device lock
Trace g_spare;  // the last flushed trace, reset: g_trace's next (its capacity reused)
std::unordered_map<uint64_t, std::vector<std::shared_ptr<Entry>>> g_entries;
int64_t g_entry_count = 0;
FusedStats g_stats;
std::atomic<int> g_regions{0};
thread_local const char* t_reason = nullptr;

bool env_fused() {
  static bool fused = env_choice("TORCH_PJRT_EAGER", "async", {"async", "debug", "fused"}) == "fused";
  return fused;
}

int64_t env_int(const char* name, int64_t dflt) {
  const char* v = std::getenv(name);
  if (!v || !*v) return dflt;
  char* end = nullptr;
  long long n = std::strtoll(v, &end, 10);
  TORCH_CHECK(end && *end == '\0' && n > 0, "torch_pjrt: ", name, "=", v, " is not a positive integer");
  return n;
}

// TORCH_PJRT_FUSED_LINES=1: the Python line of every recorded op, named when
// a trace fails (about 1-2 us per op on this machine's CPU, so off by default:
// errors name the op and its place in the trace).
bool record_lines() {
  static bool on = env_choice("TORCH_PJRT_FUSED_LINES", "0", {"0", "1"}) == "1";
  return on;
}

size_t max_ops() {
  static size_t n = static_cast<size_t>(env_int("TORCH_PJRT_FUSED_MAX_OPS", 2048));
  return n;
}

// Pipelined flushes (TORCH_PJRT_FUSED_PIPELINE, on by default): a trace that
// repeats and is flushed because one of its values is needed now (a host
// read, a CPU fallback), where that value is computed well before the trace's
// end, is cut after the op that computes it from its next sighting on. The
// first part runs as soon as it is recorded, so the value is ready (or nearly)
// when it is needed, and the rest runs on the device after it, without the
// host waiting: a training step whose loss is read after the optimizer step
// finds the loss computed by the forward part, and backward and optimizer run
// while the next step records. A cut is found by the trace's hash where it
// falls; the part after a cut is flushed (not waited for) at the next host
// read, where the whole trace would have been (a trace begun at a cut is never
// learned from).
std::atomic<int> g_pipeline{-1};  // -1: not read from the environment yet
// Which fused programs compile on compile threads (compile_fused):
// TORCH_PJRT_FUSED_BACKGROUND_COMPILE=auto (those of traces that do not
// repeat in a tight loop), all, or off.
enum Background : int { kBackgroundOff = 0, kBackgroundAuto = 1, kBackgroundAll = 2 };
int background_compile() {
  static const int v = [] {
    std::string s = env_choice("TORCH_PJRT_FUSED_BACKGROUND_COMPILE", "auto", {"auto", "all", "off"});
    return s == "all" ? kBackgroundAll : s == "auto" ? kBackgroundAuto : kBackgroundOff;
  }();
  return v;
}

bool pipeline_on() {
  int on = g_pipeline.load(std::memory_order_relaxed);
  if (on < 0) {
    on = env_choice("TORCH_PJRT_FUSED_PIPELINE", "1", {"0", "1"}) == "1";
    g_pipeline.store(on);
  }
  return on == 1;
}
// Each part at least this long: an extra launch costs the host little (the
// launch thread makes it), and the benchmarks' MLP step (31 ops) ran 1.3x
// faster with its cut (0.81x against 0.63x PyTorch CPU, one run).
constexpr size_t kMinCutOps = 4;

// A trace read at its end is split when it has at least kMinSplitOps ops,
// into parts that end at these fractions of the ops before the value read
// (TORCH_PJRT_FUSED_SPLITS, comma-separated, increasing, in (0, 1)): each
// part runs while the next is recorded, so the read waits only for the last.
// One cut leaves the read waiting for most of the work before it: the tiny
// Llama's decode step (108 ops, tests/ and benchmarks/) cut at 0.85 had its
// first part (92 ops) still running on the plugin's threads when the last 16
// were recorded (its run took 80-120 us from launch against 15-30 us for the
// last part; the host records an op in about 3.5 us). Per token, fused
// against PyTorch CPU, 5 alternating generate calls per run (2026-12-06,
// docs/results.md "session 46"): 0.85 alone 0.93x (two runs); 0.5,0.85
// 0.98-1.02x (eight runs); 0.5,0.8 0.94-0.95x; 0.4,0.8 0.97x; 0.55,0.88
// 0.96x; 0.5,0.85,0.95 0.97x; 0.45,0.8,0.93 0.94x; and in a shorter
// measure, 0.6,0.9 0.90-0.92x and 0.4,0.75,0.9 0.89-0.91x (each flush costs
// the host 4-9 us, and with a late middle cut that part is still running at
// the read). Earlier, with one cut, 0.85 was the best of 0.65-0.95.
constexpr size_t kMinSplitOps = 16;
const std::vector<double>& split_fractions() {
  static const std::vector<double> f = [] {
    const char* v = std::getenv("TORCH_PJRT_FUSED_SPLITS");
    if (!v || !*v) return std::vector<double>{0.5, 0.85};
    std::vector<double> out;
    std::string s(v);
    for (size_t at = 0; at <= s.size();) {
      size_t end = std::min(s.find(',', at), s.size());
      std::string item = s.substr(at, end - at);
      char* stop = nullptr;
      double x = std::strtod(item.c_str(), &stop);
      TORCH_CHECK(!item.empty() && stop && *stop == '\0' && x > 0 && x < 1 && (out.empty() || x > out.back()),
                  "torch_pjrt: TORCH_PJRT_FUSED_SPLITS=", v,
                  " is not a comma-separated increasing list of fractions in (0, 1)");
      out.push_back(x);
      at = end + 1;
    }
    return out;
  }();
  return f;
}

// Learned cuts: by position, the trace's hashes there, each with the cuts
// planned in the parts after it.
struct Cut {
  uint64_t hash;
  std::shared_ptr<std::vector<PlannedCut>> then;
};
std::vector<std::vector<Cut>> g_cuts;

// Whether the trace is cut after its last op; `planned`, `next`: the planned
// cuts of the part after it.
bool cut_here(Trace& t, std::shared_ptr<std::vector<PlannedCut>>& planned, size_t& next) {
  size_t k = t.ops.size();  // (called after every recorded op: the cheap tests first)
  if (t.after_cut) {
    if (!t.planned || t.planned_at >= t.planned->size()) return false;
    PlannedCut& c = (*t.planned)[t.planned_at];
    if (k != c.ops || capturing() || !pipeline_on()) return false;
    if (!c.known) {
      c.hash = t.hash;
      c.known = true;
    } else if (c.hash != t.hash) {
      return false;  // another part than the one planned for
    }
    planned = t.planned;
    next = t.planned_at + 1;
    return true;
  }
  if (k >= g_cuts.size() || g_cuts[k].empty() || capturing() || !pipeline_on()) return false;
  for (const Cut& c : g_cuts[k])
    if (c.hash == t.hash) {
      planned = c.then;
      next = 0;
      return true;
    }
  return false;
}

// Learns a cut from a trace seen before that was flushed because its value
// `wanted` was needed; true when it did.
bool learn_cut(const Trace& t, Entry& e, int32_t wanted) {
  if (!pipeline_on() || wanted < 0 || t.after_cut || e.cut_learned || capturing()) return false;
  // The op that computes `wanted` (ops are in value order).
  auto it = std::upper_bound(t.ops.begin(), t.ops.end(), wanted,
                             [](int32_t v, const TraceOp& op) { return v < op.first_value; });
  size_t k = static_cast<size_t>(it - t.ops.begin());  // the cut: after that op
  if (k < kMinCutOps) return false;
  std::vector<size_t> at;
  if (t.ops.size() < k + kMinCutOps) {
    // The value is computed at the trace's end (a generated token, a norm of
    // everything recorded): no part can run after the read, but the first
    // part can run while the rest is recorded, so the read waits only for the
    // last part.
    if (k < kMinSplitOps) return false;
    size_t last = 0;
    for (double f : split_fractions()) {
      auto c = static_cast<size_t>(static_cast<double>(k) * f);
      if (c < last + kMinCutOps || t.ops.size() < c + kMinCutOps) continue;
      at.push_back(c);
      last = c;
    }
    if (at.empty()) return false;
  } else {
    at.push_back(k);
  }
  auto then = std::make_shared<std::vector<PlannedCut>>();
  for (size_t i = 1; i < at.size(); ++i) then->push_back(PlannedCut{at[i] - at[i - 1]});
  if (g_cuts.size() <= at[0]) g_cuts.resize(at[0] + 1);
  g_cuts[at[0]].push_back(Cut{t.op_hash[at[0]], std::move(then)});
  e.cut_learned = true;
  g_stats.pipeline_cuts_learned++;
  return true;
}

// After each recorded op: the trace is flushed at a learned cut.
void after_op() {
  std::shared_ptr<std::vector<PlannedCut>> planned;
  size_t next = 0;
  if (cut_here(g_trace, planned, next)) {
    fused_flush("pipeline");
    g_trace.after_cut = true;
    g_trace.planned = std::move(planned);
    g_trace.planned_at = next;
  }
}

// When a trace seen before gets its fused program. One that comes back
// within a few flushes is in a tight loop (a training step, a decode step
// over a fixed-size cache, a few reads per step) and is compiled at its
// second sighting. One that comes back only after many others may never pay
// a compile back: with Hugging Face's generate and its cache that grows by
// one position per token, each token's trace is new and seen again only in
// the next generate call, and compiling them there made a tiny Llama's second
// call of 16 tokens take 20 s (one compile per token) against 0.6 s op by
// op. Such a trace runs op by op until those runs have taken as long as its
// compile is expected to (rent or buy: at most about twice the cost of the
// better choice in hindsight), the expected compile time being the measured
// compile time per op of this process's fused programs so far. A long trace
// is held to that rule even in a tight loop: 2048 single-row writes
// (x[i, :, :] = src[j] in a Python loop, a size-bound flush each) took XLA:CPU
// 80 s to compile, where running them op by op takes 0.12 s per trace.
constexpr int64_t kHotGap = 8;  // flushes from one sighting to the next

size_t hot_max_ops() {
  static size_t n = static_cast<size_t>(env_int("TORCH_PJRT_FUSED_HOT_OPS", 512));
  return n;
}
constexpr double kCompileSecondsPerOp = 0.01;  // until a compile has been measured

double expected_compile_seconds(size_t ops) {
  double per_op = g_stats.compiled_ops > 0 ? g_stats.compile_seconds / static_cast<double>(g_stats.compiled_ops)
                                           : kCompileSecondsPerOp;
  return per_op * static_cast<double>(ops);
}

// TORCH_PJRT_FUSED_COMPILE=second: every trace at its second sighting.
bool compile_at_second() {
  static bool on = env_choice("TORCH_PJRT_FUSED_COMPILE", "auto", {"auto", "second"}) == "second";
  return on;
}

// For a trace seen before with no program yet (and none that failed):
// compiled at once (a tight loop, step capture, TORCH_PJRT_FUSED_COMPILE=second).
bool compile_at_once(const Trace& t, int64_t gap) {
  return capturing() || (gap <= kHotGap && t.ops.size() <= hot_max_ops()) || compile_at_second();
}
// ... or once its op-by-op runs have cost about its compile.
bool compile_due(const Trace& t, const Entry& e, int64_t gap) {
  return compile_at_once(t, gap) || e.op_by_op_seconds >= expected_compile_seconds(t.ops.size());
}

// A trace's fused program compiled (on the caller or a thread) or not.
void count_compiled(const Trace& t, double seconds) {
  g_stats.programs_compiled++;
  g_stats.compiled_ops += static_cast<int64_t>(t.ops.size());
  g_stats.compile_seconds += seconds;
}
void fused_compile_failed(Entry& e, const std::exception& err) {
  e.failed = true;
  g_stats.compile_failures++;
  if (std::getenv("TORCH_PJRT_DUMP")) std::cerr << "[torch_pjrt] fused program failed to compile: " << err.what() << "\n";
}

// A trace's fused program compiling on a thread: taken once done.
void compiled_fused(const Trace& t, Entry& e) {
  if (!e.compiling->ready()) return;
  runtime::ExecutablePtr compiling = std::move(e.compiling);
  e.compiling.reset();
  try {
    e.exe = compiling->compiled();
    count_compiled(t, e.exe->thread_compile_seconds);
  } catch (const std::exception& err) {
    fused_compile_failed(e, err);
  }
}

// The fused program of a trace that repeats. Where it compiles:
// - On a compile thread (compile_pool.cpp), as eager programs do, for a trace
//   that earned its compile by rent or buy (compile_due): it has run op by
//   op for a while and goes on doing so until its program is there (the
//   same values: op by op is strict eager's semantics), instead of a stall
//   of XLA's seconds in the middle of, say, a generate call.
// - On the caller for a trace in a tight loop (compile_at_once): its next
//   sighting runs the program, so a loop's speed is its fused speed from its
//   second step on, not after a compile on a core the loop shares (on this
//   2-core machine a GPT step's programs took 2.8 s on the caller and about
//   7 s on a thread, the loop running op by op meanwhile). `all` compiles
//   those on a thread too (the first steps come sooner); `off` none.
// - On the caller under step capture (the capture needs the program) and
//   with TORCH_PJRT_COMPILE_THREADS=0.
void compile_fused(const Trace& t, Entry& e, std::string text, const std::vector<std::pair<int32_t, int32_t>>& aliases,
                   bool at_once) {
  std::string what = "fused eager trace of " + std::to_string(t.ops.size()) + " ops";
  e.aliases = aliases;
  int background = background_compile();
  bool on_thread = background == kBackgroundAll || (background == kBackgroundAuto && !at_once);
  if (on_thread && !capturing() && runtime::Runtime::compile_threads() > 0 && runtime::async_launch_enabled()) {
    note_compiled_program(text, what);
    e.compiling = rt().compile_async(std::move(text), {}, std::move(what));
    compiled_fused(t, e);  // (found at once in the persistent cache, or compiled by another trace)
    return;
  }
  auto start = std::chrono::steady_clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  try {
    e.exe = compile_program(text, what);
    count_compiled(t, seconds());
  } catch (const std::exception& err) {
    fused_compile_failed(e, err);
    g_stats.compile_seconds += seconds();
  }
}

int64_t max_entries() {
  static int64_t n = env_int("TORCH_PJRT_FUSED_CACHE_ENTRIES", 1024);
  return n;
}

// The cache is full: the least recently flushed half goes, so the traces of
// the loop that runs now (compiled or on their way to it) keep their state.
// The learned cuts are relearned by the traces that stay.
void evict_oldest_half() {
  std::vector<int64_t> last;
  last.reserve(static_cast<size_t>(g_entry_count));
  for (const auto& [hash, bucket] : g_entries)
    for (const auto& e : bucket) last.push_back(e->last_flush);
  auto mid = last.begin() + static_cast<std::ptrdiff_t>(last.size() / 2);
  std::nth_element(last.begin(), mid, last.end());
  int64_t keep_from = last.empty() ? 0 : *mid;
  g_entry_count = 0;
  for (auto it = g_entries.begin(); it != g_entries.end();) {
    auto& bucket = it->second;
    bucket.erase(std::remove_if(bucket.begin(), bucket.end(),
                                [&](const auto& e) { return e->last_flush < keep_from; }),
                 bucket.end());
    for (auto& e : bucket) e->cut_learned = false;
    g_entry_count += static_cast<int64_t>(bucket.size());
    it = bucket.empty() ? g_entries.erase(it) : std::next(it);
  }
  g_cuts.clear();
}

std::shared_ptr<Entry> find_or_add(const Trace& t) {
  auto& bucket = g_entries[t.hash];
  for (const auto& e : bucket)
    if (e->structure == t.structure) return e;
  if (g_entry_count >= max_entries()) {
    evict_oldest_half();
    if (g_entry_count >= max_entries()) {  // all flushed at once (a bound of 1)
      g_entries.clear();
      g_entry_count = 0;
    }
  }
  auto e = std::make_shared<Entry>();
  e->structure = t.structure;
  g_entries[t.hash].push_back(e);
  ++g_entry_count;
  return e;
}

[[noreturn]] void rethrow_at(const TraceOp& op, size_t k, size_t n, const char* why) {
  std::string line = describe(op.where);
  std::string where = "torch_pjrt: fused eager: " + op.plan->op_name + " failed (op " + std::to_string(k + 1) +
                      " of " + std::to_string(n) + " in a trace run at " + why + ")" +
                      (!record_lines() ? std::string("; TORCH_PJRT_FUSED_LINES=1 records each op's Python line")
                       : line.empty()  ? std::string(", called with no Python frame (autograd's backward)")
                                       : ", called at " + line) +
                      "; TORCH_PJRT_EAGER=debug runs ops one by one and raises at the op";
  try {
    throw;
  } catch (c10::Error& e) {
    e.add_context(where);
    throw;
  } catch (const std::exception& e) {
    TORCH_CHECK(false, where, ": ", e.what());
  }
}

// Walks one recorded op's program parameters in order: fn(kind, at, n, i)
// with `at` the input code (Storage: a value id, or ~external index) or the
// parameter's offset in its pack (n elements), and i the parameter index.
template <typename Fn>
void for_each_param(const Trace& t, const TraceOp& op, Fn&& fn) {
  const Plan& p = *op.plan;
  int32_t code = op.first_code, fa = op.fpack_at, ia = op.ipack_at;
  for (size_t i = 0; i < p.params.size(); ++i) {
    int64_t n = p.param_types[i].shape.empty() ? 1 : p.param_types[i].shape[0];
    ParamSource::Kind kind = p.params[i].kind;
    switch (kind) {
      case ParamSource::Storage:
        fn(kind, t.codes[code++], n, i);
        break;
      case ParamSource::Scalars:
        fn(kind, fa, n, i);
        fa += n;
        break;
      case ParamSource::Offsets:
      case ParamSource::Rng:
        fn(kind, ia, n, i);
        ia += n;
        break;
      case ParamSource::CheckWord:
        fn(kind, 0, 0, i);
        break;
    }
  }
}

// Each op's own program, in order: a trace seen for the first time (most
// never repeat, and their op programs are compiled already), one whose fused
// program did not compile, and the replay that finds a failing op. Values are
// dropped after their last use (unless they leave the trace), so the run
// holds no more than strict eager would.
void run_op_by_op(const Trace& t, std::vector<runtime::BufferPtr>& values, const std::vector<int32_t>& outputs,
                  const char* why) {
  int device = t.device;
  runtime::BufferPtr word = t.checks ? rt().check_word(device) : nullptr;
  std::vector<int32_t> last_use(t.next_value, -1);
  for (size_t k = 0; k < t.ops.size(); ++k)
    for_each_param(t, t.ops[k], [&](ParamSource::Kind kind, int64_t at, int64_t, size_t) {
      if (kind == ParamSource::Storage && at >= 0) last_use[at] = static_cast<int32_t>(k);
    });
  for (int32_t v : outputs) last_use[v] = static_cast<int32_t>(t.ops.size());
  for (size_t k = 0; k < t.ops.size(); ++k) {
    const TraceOp& op = t.ops[k];
    const Plan& p = *op.plan;
    try {
      runtime::OpLabel label(p.op_name);
      std::vector<runtime::BufferPtr> params;
      params.reserve(p.params.size());
      for_each_param(t, op, [&](ParamSource::Kind kind, int64_t at, int64_t n, size_t i) {
        switch (kind) {
          case ParamSource::Storage:
            params.push_back(at >= 0 ? values[at] : t.externals[~at]);
            break;
          case ParamSource::Scalars:
            params.push_back(scalar_pack_buffer(&t.fpack[at], n, device));
            break;
          case ParamSource::Offsets:
          case ParamSource::Rng: {
            // (A compiled graph's view offset is a 0-d s64. Random keys are
            // new at every run: not kept as constants.)
            std::vector<int64_t> dims;
            if (!p.param_types[i].shape.empty()) dims.push_back(n);
            params.push_back(kind == ParamSource::Rng
                                 ? rt().buffer_from_host(&t.ipack[at], PJRT_Buffer_Type_S64, dims, device)
                                 : runtime::constant_buffer(&t.ipack[at], PJRT_Buffer_Type_S64, dims, device));
            break;
          }
          case ParamSource::CheckWord:
            params.push_back(word);
            break;
        }
      });
      std::vector<runtime::BufferPtr> outs = rt().execute(*p.exe, params, device);
      for (size_t j = 0; j < outs.size(); ++j)
        if (last_use[op.first_value + j] > static_cast<int32_t>(k)) values[op.first_value + j] = outs[j];
      if (p.check_output >= 0) word = outs[p.check_output];
      for_each_param(t, op, [&](ParamSource::Kind kind, int64_t at, int64_t, size_t) {
        if (kind == ParamSource::Storage && at >= 0 && last_use[at] == static_cast<int32_t>(k)) values[at].reset();
      });
    } catch (...) {
      if (t.checks) rt().set_check_word(device, word);
      rethrow_at(op, k, t.ops.size(), why);
    }
  }
  if (t.checks) rt().set_check_word(device, word);
}

std::string private_function(const std::string& text, const std::string& name) {
  static const std::string head = "module @torch_pjrt {\n  func.func public @main(";
  TORCH_CHECK(text.compare(0, head.size(), head) == 0 && text.size() > head.size() + 2,
              "torch_pjrt: fused eager: unexpected op program text");
  return "  func.func private @" + name + "(" + text.substr(head.size(), text.size() - head.size() - 2);
}

// The fused program: the op programs as private functions, called in order.
std::string fused_text(const Trace& t, const std::vector<int32_t>& outputs,
                       const std::vector<std::pair<int32_t, int32_t>>& aliases) {
  Builder b;
  std::vector<TensorType> ext_type(t.externals.size());
  for (const TraceOp& op : t.ops)
    for_each_param(t, op, [&](ParamSource::Kind kind, int64_t at, int64_t, size_t i) {
      if (kind == ParamSource::Storage && at < 0) ext_type[~at] = op.plan->param_types[i];
    });
  std::vector<Value> ext;
  for (const TensorType& type : ext_type) ext.push_back(b.param(type));
  for (const auto& [x, out] : aliases) b.alias(static_cast<size_t>(x), static_cast<size_t>(out));
  std::optional<Value> fpack, ipack, word;
  if (!t.fpack.empty()) fpack = b.param(TensorType{scalar_pack_dtype(), {static_cast<int64_t>(t.fpack.size())}});
  if (!t.ipack.empty()) ipack = b.param(TensorType{DType::I64, {static_cast<int64_t>(t.ipack.size())}});
  if (t.checks) word = b.param(TensorType{DType::I32, {}});
  std::vector<std::optional<Value>> values(t.next_value);
  std::set<uint64_t> defined;
  for (const TraceOp& op : t.ops) {
    const Plan& p = *op.plan;
    std::string fn = "p" + std::to_string(p.serial);
    if (defined.insert(p.serial).second) b.add_function(private_function(p.text, fn));
    std::vector<Value> operands;
    for_each_param(t, op, [&](ParamSource::Kind kind, int64_t at, int64_t n, size_t i) {
      switch (kind) {
        case ParamSource::Storage:
          operands.push_back(at >= 0 ? *values[at] : ext[~at]);
          break;
        case ParamSource::Scalars:
          operands.push_back(b.slice(*fpack, {at}, {at + n}));
          break;
        case ParamSource::Offsets:
        case ParamSource::Rng: {
          Value v = b.slice(*ipack, {at}, {at + n});
          operands.push_back(p.param_types[i].shape.empty() ? b.reshape(v, {}) : v);
          break;
        }
        case ParamSource::CheckWord:
          operands.push_back(*word);
          break;
      }
    });
    std::vector<Value> res = b.op_multi("func.call", operands, p.output_types, "callee = @" + fn);
    for (size_t j = 0; j < res.size(); ++j) values[op.first_value + j] = res[j];
    if (p.check_output >= 0) word = res[p.check_output];
  }
  std::vector<Value> outs;
  for (int32_t v : outputs) outs.push_back(*values[v]);
  if (t.checks) outs.push_back(*word);
  return b.finish(outs);
}

}  // namespace

namespace {
// Bitwise, not ==: -0.0 and 0.0 are different scalars, a NaN the same.
template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// The pack a cached program last uploaded (`last`, `buf`: its Entry's), while
// this flush's is bitwise the same and on the same device (an entry is shared
// by its runs on every device); else this one, kept in its place. Kept packs
// are internal constants, not the program's user's memory.
template <typename T>
const runtime::BufferPtr& kept_pack(std::vector<T>& last, runtime::BufferPtr& buf, const std::vector<T>& now,
                                    int device) {
  if (!buf || buf->device_index() != device || !same_bits(last, now)) {
    auto n = static_cast<int64_t>(now.size());
    if constexpr (std::is_same_v<T, double>)
      buf = scalar_pack_buffer(now.data(), n, device, /*internal=*/true);
    else
      buf = s64_buffer(now.data(), n, device, /*internal=*/true);
    last = now;
  }
  return buf;
}
}  // namespace

// Each aliased input is donated when the trace holds its only reference
// besides queued or running executions' (no tensor or other storage still
// reads that buffer; PJRT orders the donation after the earlier executions'
// uses of it); otherwise XLA gives that output a buffer of its own.
std::vector<runtime::BufferPtr> fused_detail::run_fused(const Trace& t, const Entry& e, size_t n_outputs,
                                                        bool on_launch_thread) {
  std::vector<int64_t> donated, kept;
  if (!e.aliases.empty()) {
    std::vector<int64_t> candidates;
    candidates.reserve(e.aliases.size());
    for (const auto& [x, out] : e.aliases) candidates.push_back(x);
    rt().choose_donations(t.externals, candidates, t.device, on_launch_thread && runtime::async_launch_enabled(),
                          donated, kept);
  }
  std::vector<runtime::BufferPtr> params(t.externals.begin(), t.externals.end());
  if (t.fpack_buffer) {
    params.push_back(t.fpack_buffer);
  } else if (!t.fpack.empty()) {
    params.push_back(kept_pack(e.last_fpack, e.last_fpack_buffer, t.fpack, t.device));
  }
  if (t.ipack_buffer) {
    params.push_back(t.ipack_buffer);
  } else if (!t.rng_at.empty()) {
    // (Random keys differ at every run: not kept.)
    params.push_back(s64_buffer(t.ipack.data(), static_cast<int64_t>(t.ipack.size()), t.device));
  } else if (!t.ipack.empty()) {
    params.push_back(kept_pack(e.last_ipack, e.last_ipack_buffer, t.ipack, t.device));
  }
  if (t.checks) params.push_back(rt().check_word(t.device));
  for (int64_t x : donated) g_stats.donated_bytes += t.externals[x]->bytes();
  std::vector<runtime::BufferPtr> outs = on_launch_thread
                                             ? rt().launch(e.exe, std::move(params), t.device, donated, kept)
                                             : rt().execute(*e.exe, params, t.device, donated, kept);
  g_stats.donated_buffers += static_cast<int64_t>(donated.size());
  g_stats.not_donated_buffers += static_cast<int64_t>(kept.size());
  if (t.checks) rt().set_check_word(t.device, outs.at(n_outputs));
  outs.resize(n_outputs);
  return outs;
}

void read_fused_settings() { compile_at_second(); }

bool fused_active() { return (g_regions.load(std::memory_order_relaxed) > 0 || env_fused()) && !debug_mode(); }

void fused_enter() { g_regions.fetch_add(1); }

void fused_leave() {
  // An exit without its enter would leave the count below zero and every
  // later region off: refused, the count kept.
  int open = g_regions.load();
  do {
    if (open <= 0) throw std::runtime_error("torch_pjrt.fused: exit without a matching enter (no region is open)");
  } while (!g_regions.compare_exchange_weak(open, open - 1));
  if (open == 1) fused_flush("region_end");
}

FlushReason::FlushReason(const char* why) : previous_(t_reason) { t_reason = why; }
FlushReason::~FlushReason() { t_reason = previous_; }
const char* FlushReason::current() { return t_reason ? t_reason : "read"; }

namespace {

// The trace (flushed first when it is on another device or full) and a new
// op of it for `plan`.
TraceOp begin_op(const std::shared_ptr<Plan>& plan, int device) {
  if (!g_trace.ops.empty() && g_trace.device != device) fused_flush("device");
  if (g_trace.ops.size() >= max_ops()) fused_flush("size_bound");
  Trace& t = g_trace;
  t.device = device;
  t.op_hash.push_back(t.hash);
  t.mix(static_cast<int64_t>(plan->serial));
  return TraceOp{plan, static_cast<int32_t>(t.codes.size()), t.next_value, static_cast<int32_t>(t.fpack.size()),
                 static_cast<int32_t>(t.ipack.size()), record_lines() ? current_python_line() : PythonLine{}};
}

// The input code of a buffer that exists now (an external input of the trace).
// `holder`: its storage (none for a buffer made for this call), kept weakly
// while a step is captured.
int32_t external_code(Trace& t, const runtime::BufferPtr& buf, const TensorType* type, const c10::Storage& holder) {
  auto [it, fresh] = t.external_index.emplace(buf.get(), static_cast<int32_t>(t.externals.size()));
  if (fresh) {
    t.externals.push_back(buf);
    t.external_types.push_back(type);
    if (capturing()) {
      t.external_storage.emplace_back(holder.getWeakStorageImpl());
      t.external_serial.push_back(holder ? device::storage_of(holder).serial : 0);
    }
  }
  return ~it->second;
}

// The storage of `sb` among the op's tensors (step capture only).
c10::Storage holder_of(const OpInstance& inst, const StorageBuffer* sb) {
  if (!capturing()) return c10::Storage();
  for (const Slot& s : inst.slots)
    if (inst.storages[s.storage] == sb) return s.tensor.storage();
  return c10::Storage();
}

// The input code of a storage read as parameter `pi` of the op's plan.
int32_t storage_code(Trace& t, StorageBuffer* sb, DType dtype, const Plan& p, size_t pi,
                     const c10::Storage& holder) {
  int32_t code = sb->pending >= 0 ? sb->pending.load()
                                  : external_code(t, device::ensure_buffer(*sb, dtype), &p.param_types[pi], holder);
  t.codes.push_back(code);
  t.mix(code);
  return code;
}

// `sb` now holds the op's program output `output` (not yet computed).
void owe(Trace& t, const TraceOp& op, StorageBuffer* sb, int output, const c10::Storage& holder) {
  if (sb->pending_slot < 0) {
    sb->pending_slot = static_cast<int32_t>(t.written.size());
    t.written.push_back(sb);
    t.written_types.push_back(nullptr);
    if (capturing()) t.written_storage.emplace_back(holder.getWeakStorageImpl());
  }
  if (sb->buffer) {  // the old value: an external input where this op (or an earlier one) reads it
    auto it = t.external_index.find(sb->buffer.get());
    if (it != t.external_index.end()) t.overwritten.emplace_back(it->second, sb->pending_slot);
    sb->buffer.reset();
  }
  sb->pending = op.first_value + output;
  t.written_types[sb->pending_slot] = &op.plan->output_types[output];
}

void end_op(Trace& t, const TraceOp& op) {
  t.next_value += static_cast<int32_t>(op.plan->output_types.size());
  t.ops.push_back(op);
}

}  // namespace

void fused_record_program(const std::shared_ptr<Plan>& plan, int device, const std::vector<ProgramInput>& inputs,
                          const std::vector<int64_t>& ivalues,
                          const std::vector<std::pair<c10::Storage, int>>& writes) {
  const Plan& p = *plan;
  TraceOp op = begin_op(plan, device);
  Trace& t = g_trace;
  size_t next_input = 0, next_ivalue = 0;
  for (size_t pi = 0; pi < p.params.size(); ++pi) {
    switch (p.params[pi].kind) {
      case ParamSource::Storage: {
        const ProgramInput& in = inputs.at(next_input++);
        if (in.storage) {
          storage_code(t, &device::storage_of(in.storage), in.dtype, p, pi, in.storage);
        } else {
          int32_t code = external_code(t, in.buffer, &p.param_types[pi], c10::Storage());
          t.codes.push_back(code);
          t.mix(code);
        }
        break;
      }
      case ParamSource::Offsets:
      case ParamSource::Rng: {
        int64_t n = p.param_types[pi].shape.empty() ? 1 : p.param_types[pi].shape[0];
        if (p.params[pi].kind == ParamSource::Rng) t.rng_at.push_back(static_cast<int32_t>(t.ipack.size()));
        for (int64_t k = 0; k < n; ++k) t.ipack.push_back(ivalues.at(next_ivalue++));
        break;
      }
      case ParamSource::CheckWord:
        t.checks = true;
        break;
      case ParamSource::Scalars:
        TORCH_CHECK(false, "torch_pjrt: fused eager: a program with runtime scalars cannot be recorded");
    }
  }
  for (const auto& [storage, output] : writes) {
    StorageBuffer* sb = &device::storage_of(storage);
    sb->dtype = p.output_types.at(output).dtype;
    owe(t, op, sb, output, storage);
  }
  end_op(t, op);
  g_stats.ops_recorded++;
  g_stats.programs_recorded++;
  after_op();
}

bool fused_record(const std::shared_ptr<Plan>& plan, OpInstance& inst, c10::ArrayRef<c10::IValue> args,
                  torch::jit::Stack* stack, size_t nargs) {
  const Plan& p = *plan;
  if (!p.exe || p.text.empty() || p.param_types.size() != p.params.size()) return false;
  for (const ReturnPlan& r : p.returns)
    if (r.kind == ReturnPlan::HostScalar) return false;  // the caller needs the value now
  int device = inst.device >= 0 ? inst.device : 0;
  // Recording makes no buffers, so an op whose new tensors would not fit
  // raises here, at the op, as strict eager's launch and PyTorch's
  // allocation of a structured op's outputs do (the flush would be too late).
  if (p.fresh_bytes > 0) rt().ensure_fits(device, p.fresh_bytes, "a new tensor");
  TraceOp op = begin_op(plan, device);
  Trace& t = g_trace;
  for (size_t pi = 0; pi < p.params.size(); ++pi) {
    const ParamSource& ps = p.params[pi];
    switch (ps.kind) {
      case ParamSource::Storage: {
        StorageBuffer* sb = inst.storages[ps.storage];
        storage_code(t, sb, ps.dtype, p, pi, holder_of(inst, sb));
        break;
      }
      case ParamSource::Rng: {
        if (capturing())
          for (const auto& a : args) t.explicit_generator |= a.isGenerator() && a.toGenerator().defined();
        t.rng_at.push_back(static_cast<int32_t>(t.ipack.size()));
        auto key = rng_values(args, device);
        t.ipack.push_back(key.first);
        t.ipack.push_back(key.second);
        break;
      }
      case ParamSource::Scalars: {
        auto v = scalar_values(p, inst);
        t.fpack.insert(t.fpack.end(), v.begin(), v.end());
        break;
      }
      case ParamSource::Offsets: {
        auto v = offset_values(inst);
        t.ipack.insert(t.ipack.end(), v.begin(), v.end());
        break;
      }
      case ParamSource::CheckWord:
        t.checks = true;
        break;
    }
  }
  for (const Write& w : p.writes) {
    StorageBuffer* sb = inst.storages[w.storage];
    sb->dtype = w.dtype;
    owe(t, op, sb, w.output, holder_of(inst, sb));
  }
  end_op(t, op);
  g_stats.ops_recorded++;
  torch::jit::drop(*stack, nargs);
  push_returns(p, inst, stack, [&](const ReturnPlan& rp) -> c10::IValue {
    at::Tensor r = device::wrap_buffer(rp.sizes, rp.strides, rp.dtype, device, nullptr);
    StorageBuffer& sb = device::storage_of(r);
    if (sb.nbytes > 0) owe(t, op, &sb, rp.output, capturing() ? r.storage() : c10::Storage());
    return r;
  });
  after_op();
  return true;
}

void fused_forget(StorageBuffer* sb) {
  device::DeviceLock lock;
  auto& w = g_trace.written;
  if (sb->pending_slot >= 0 && sb->pending_slot < static_cast<int32_t>(w.size()) && w[sb->pending_slot] == sb)
    w[sb->pending_slot] = nullptr;
  sb->pending = -1;
  sb->pending_slot = -1;
}

namespace {
thread_local int32_t t_wanted = -1;  // the value a flush runs for (fused_flush_for)
}  // namespace

// The part after a cut is launched at the read, after the checks of what
// came before it are reported (this read raises for those, as strict eager's
// would); its own checks are reported at the next read or synchronize, so
// this read does not wait for it.
void fused_at_host_read() {
  device::DeviceLock lock;
  if (!g_trace.after_cut) return;
  int device = g_trace.device;
  try {
    rt().report_checks(device);
  } catch (...) {
    // This read raises for an op before the cut. The rest, recorded before
    // the read too, still runs (as strict eager's ops after a bad index do),
    // and its own failures are dropped: strict eager's one word keeps only
    // the first failure before a read, so a second bad op there is never
    // reported at a later, unrelated read.
    try {
      fused_flush("pipeline");
      rt().discard_checks(device);
    } catch (...) {
    }
    throw;
  }
  bool checks = g_trace.checks;
  fused_flush("pipeline");
  if (checks) rt().defer_checks(device);
}

void fused_flush_for(int32_t value) {
  t_wanted = value;
  fused_flush(nullptr);
}

namespace {
// Flush reasons whose values the caller does not wait for (see fused_flush).
bool launched_later(const char* why) {
  for (const char* r : {"pipeline", "capture", "region_end", "size_bound"})
    if (std::strcmp(why, r) == 0) return true;
  return false;
}
}  // namespace

void fused_flush(const char* reason) {
  int32_t wanted = std::exchange(t_wanted, -1);
  device::DeviceLock lock;
  if (g_trace.ops.empty()) return;
  Trace t = std::move(g_trace);
  g_trace = std::move(g_spare);
  // (Declared after t, so it runs first, still under the lock.)
  struct Recycle {
    Trace& t;
    ~Recycle() {
      t.reset();
      g_spare = std::move(t);
    }
  } recycle{t};
  const char* why = reason ? reason : FlushReason::current();
  g_stats.flushes++;
  g_stats.flushes_by_reason[why]++;
  g_stats.max_ops_per_flush = std::max<int64_t>(g_stats.max_ops_per_flush, static_cast<int64_t>(t.ops.size()));

  // The values that leave: those of storages still alive, by value id.
  std::vector<std::pair<int32_t, StorageBuffer*>> live;
  for (StorageBuffer* sb : t.written)
    if (sb && sb->pending >= 0) live.emplace_back(sb->pending, sb);
  std::sort(live.begin(), live.end());
  std::vector<int32_t> outputs;
  t.mix(-1);
  for (const auto& [v, sb] : live) {
    outputs.push_back(v);
    t.mix(v);
  }
  if (outputs.empty() && !t.checks) {  // nothing it computes is observable
    g_stats.dead_traces++;
    return;
  }
  // Inputs the trace overwrites whose storage's new value leaves with the
  // same type: the fused program aliases them (donation, in run_fused).
  std::vector<std::pair<int32_t, int32_t>> aliases;
  if (!t.overwritten.empty()) {
    std::vector<int32_t> output_of_slot(t.written.size(), -1);
    for (size_t i = 0; i < live.size(); ++i) output_of_slot[live[i].second->pending_slot] = static_cast<int32_t>(i);
    std::vector<char> input_used(t.externals.size(), 0), output_used(live.size(), 0);
    for (const auto& [x, slot] : t.overwritten) {
      int32_t out = output_of_slot[slot];
      if (out < 0 || input_used[x] || output_used[out]) continue;
      if (*t.external_types[x] != *t.written_types[slot]) continue;
      input_used[x] = output_used[out] = 1;
      aliases.emplace_back(x, out);
    }
    t.mix(-2);
    for (const auto& [x, out] : aliases) {
      t.mix(x);
      t.mix(out);
    }
  }
  // Storages keep their marks until here, so one that dies on another thread
  // meanwhile waits in fused_forget for this flush to finish.
  auto assign = [&](const std::vector<runtime::BufferPtr>& results) {
    for (size_t i = 0; i < live.size(); ++i) {
      StorageBuffer* sb = live[i].second;
      sb->buffer = results[i];
      sb->pending_slot = -1;
      sb->pending.store(-1);
    }
  };

  std::shared_ptr<Entry> e = find_or_add(t);
  int64_t gap = e->last_flush < 0 ? -1 : g_stats.flushes - e->last_flush;
  e->last_flush = g_stats.flushes;
  if (e->compiling) {
    if (capturing()) e->compiling->wait();  // (a captured step replays the program)
    compiled_fused(t, *e);
  }
  bool repeat = e->seen >= 1 && !e->exe && !e->compiling && !e->failed;
  bool due = repeat && compile_due(t, *e, gap);
  // Seen before: it will be cut from now on, so its whole program would not
  // be used (compiled all the same if the cut is never reached).
  bool cut = !e->failed && e->seen >= 1 && learn_cut(t, *e, wanted);
  if (due && !cut) {
    // This trace repeats, so its fused program pays off.
    compile_fused(t, *e, fused_text(t, outputs, aliases), aliases, compile_at_once(t, gap));
  } else if (e->exe) {
    g_stats.cache_hits++;
  }
  e->seen++;
  if (capturing()) capture_flushed(t, live, e, why);
  if (e->exe) {
    try {
      // A flush that nothing waits for (a pipelined part, the trace before a
      // captured step's replay, a region's end, a size bound) is launched
      // by the launch thread while the caller goes on; a caller execution
      // would first wait for the launches queued before it. A flush for a
      // read, a synchronize or a fallback waits for its program in any
      // case: its execute call is made here.
      bool later = launched_later(why);
      assign(run_fused(t, *e, outputs.size(), /*on_launch_thread=*/later));
      return;
    } catch (...) {
      // Replayed op by op below: the op that fails again is named.
    }
  }
  g_stats.op_by_op_runs++;
  if (repeat && !due && !cut) g_stats.deferred_compiles++;
  if (e->compiling) g_stats.runs_while_compiling++;
  std::vector<runtime::BufferPtr> values(t.next_value);
  // The ops' own programs finish compiling first (compile threads): that is
  // not what running the trace op by op costs, which decides its compile.
  for (const TraceOp& op : t.ops)
    if (op.plan->exe) op.plan->exe->wait();
  auto start = std::chrono::steady_clock::now();
  try {
    run_op_by_op(t, values, outputs, why);
    e->op_by_op_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  } catch (...) {
    std::vector<runtime::BufferPtr> done;
    for (int32_t v : outputs) done.push_back(values[v]);
    assign(done);  // what ran before the failing op (the rest reads as zeros)
    throw;
  }
  std::vector<runtime::BufferPtr> results;
  for (int32_t v : outputs) results.push_back(values[v]);
  assign(results);
}

bool set_fused_pipeline(bool on) {
  bool was = pipeline_on();
  g_pipeline.store(on ? 1 : 0);
  return was;
}

void fused_clear_programs() {
  device::DeviceLock lock;
  g_entries.clear();
  g_entry_count = 0;
  g_cuts.clear();
}

FusedStats fused_stats() {
  device::DeviceLock lock;
  FusedStats s = g_stats;
  s.cache_size = g_entry_count;
  return s;
}

}  // namespace torch_pjrt::eager

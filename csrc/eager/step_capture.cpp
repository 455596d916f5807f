// Step capture: recording a step's fused trace with where each of its inputs
// and outputs lives, checking that two consecutive recordings agree, and
// replaying the trace's fused program on new arguments.
//
// An input of the trace (an "external") is resolved to one of: an argument
// of the step (read from the argument passed at replay), a storage that
// existed before the step (read from that storage's current buffer: weights,
// optimizer state, accumulated gradients), or a constant (a buffer made
// during the step, such as a host upload, or a compiled graph's constant).
// Values that leave go back to the argument's or existing storage, or into a
// new tensor for each value the step returned. Whatever the Python did around
// the ops (host scalars, view offsets, uploads) is checked to be the same in
// two recordings; if it is not, the step is not replayed (see
// capture_problem) and runs traced on every call instead, which is always
// correct.
#include "eager/step_capture.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/record_function.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>
#include <cstring>
#include <unordered_map>

#include "device/device_lock.h"
#include "device/dtype_map.h"
#include "device/generator.h"
#include "eager/fused.h"
#include "eager/fused_trace.h"
#include "eager/ivalue_tensors.h"
#include "eager/plan.h"

namespace torch_pjrt::eager {

using device::StorageBuffer;
using fused_detail::Entry;
using fused_detail::Trace;
using fused_detail::WeakStorage;
using lowering::DType;

namespace {

runtime::Runtime& rt() { return runtime::Runtime::get(); }

// One flush while a step is recorded: a copy of what replay and the
// comparison need.
struct Flushed {
  std::shared_ptr<Entry> entry;
  std::string why;
  int device = 0;
  bool checks = false, explicit_generator = false;
  std::vector<runtime::BufferPtr> externals;  // null unless made during the step
  std::vector<int64_t> external_bytes;
  std::vector<WeakStorage> external_storage;
  std::vector<uint64_t> external_serial;
  std::vector<DType> external_dtypes;
  std::vector<double> fpack;
  std::vector<int64_t> ipack;
  std::vector<int32_t> rng_at;  // (after the comparison: only keys a replay draws anew)
  // Keys a replay copies from an earlier one, (to, from): the same key used
  // twice in a recording (activation checkpointing rewinds the generator to
  // recompute a dropout with the forward's key).
  std::vector<std::pair<int32_t, int32_t>> rng_copies;
  std::vector<WeakStorage> output_storage;
  std::vector<DType> output_dtypes;
  // Per op, for messages: its name and where its scalars and offsets start.
  std::vector<std::string> op_names;
  std::vector<std::pair<int32_t, int32_t>> op_packs;
};

std::atomic<bool> g_on{false};
uint64_t g_begin_serial = 0;     // storages with a serial below existed before the step
std::vector<Flushed> g_flushed;  // under the device lock
CaptureStats g_stats;
std::string g_host_read;         // the first host read of tpu values in the step (under the device lock)

// CPU tensors the step writes in place (an optimizer's step count on the
// CPU): a replay runs only the tpu program, so one that outlives the step
// would not advance. Watched with a RecordFunction callback on the recording
// thread (ThreadLocalState carries it to autograd's device threads).
struct CpuWrite {
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;
  std::string op;
};
std::mutex g_cpu_writes_mu;
std::vector<CpuWrite> g_cpu_writes;
std::optional<at::CallbackHandle> g_cpu_watch;

void note_cpu_write(const c10::IValue& v, const std::string& op) {
  auto one = [&](const at::Tensor& t) {
    if (!t.defined() || !t.device().is_cpu() || !t.has_storage()) return;
    std::lock_guard<std::mutex> g(g_cpu_writes_mu);
    for (const CpuWrite& w : g_cpu_writes)
      if (!w.storage.expired() && w.storage._unsafe_get_target() == t.storage().unsafeGetStorageImpl()) return;
    if (g_cpu_writes.size() >= 256)  // temporaries: only what is still alive matters
      g_cpu_writes.erase(std::remove_if(g_cpu_writes.begin(), g_cpu_writes.end(),
                                        [](const CpuWrite& w) { return w.storage.expired(); }),
                         g_cpu_writes.end());
    g_cpu_writes.push_back({c10::weak_intrusive_ptr<c10::StorageImpl>(t.storage().getWeakStorageImpl()), op});
  };
  if (v.isTensor()) one(v.toTensor());
  else if (v.isTensorList())
    for (const at::Tensor& t : v.toTensorVector()) one(t);
}

// Leaf tpu tensors that existed before the step and that its ops took with
// grad mode on (parameters in the forward, frozen ones included), or that a
// compiled graph took (its graph depends on their flags): whether each
// requires grad decided what autograd did in the step (which grads it
// computed, so which parameters the optimizer stepped), and a replay cannot
// see that flag change (p.requires_grad_(False) between calls). Under no_grad
// (the optimizer, clipping, the backward) the flags change nothing, and the
// fewer tensors, the cheaper the replay's check. The recording keeps their
// flags at its end and a replay compares them (see Recording::leaves). Noted
// by the same callback, under g_cpu_writes_mu.
using WeakTensor = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;
struct LeafSeen {
  WeakTensor impl;
  uint64_t serial;  // its storage's
};
std::vector<LeafSeen> g_leaves;
std::unordered_map<const c10::TensorImpl*, size_t> g_leaf_index;

void note_leaf(const at::Tensor& t) {
  if (!t.defined() || t.device().type() != c10::DeviceType::PrivateUse1 || !t.has_storage()) return;
  // Only floating and complex tensors can require grad; a non-leaf's flag
  // follows its graph (its leaves are noted where the graph read them).
  if (!(at::isFloatingType(t.scalar_type()) || at::isComplexType(t.scalar_type())) || !t.is_leaf()) return;
  const c10::DataPtr& ptr = t.storage().data_ptr();
  if (!ptr.get_context()) return;
  uint64_t serial;
  try {
    serial = device::storage_of(t).serial;
  } catch (...) {
    return;  // not a tpu allocation
  }
  if (serial >= g_begin_serial) return;  // made during the step: a new tensor each call
  std::lock_guard<std::mutex> g(g_cpu_writes_mu);
  auto [it, fresh] = g_leaf_index.emplace(t.unsafeGetTensorImpl(), g_leaves.size());
  if (!fresh) {
    if (!g_leaves[it->second].impl.expired()) return;
    it->second = g_leaves.size();  // a dead tensor's address, reused
  }
  g_leaves.push_back({WeakTensor(t.getIntrusivePtr()), serial});
}

std::unique_ptr<at::ObserverContext> watch_cpu_writes(const at::RecordFunction& fn) {
  if (!g_on.load(std::memory_order_relaxed)) return nullptr;
  auto schema = fn.operator_schema();
  if (!schema) return nullptr;
  auto inputs = fn.inputs();
  const auto& args = schema->arguments();
  const bool grad_mode = at::GradMode::is_enabled();
  for (size_t i = 0; i < args.size() && i < inputs.size(); ++i) {
    if (args[i].alias_info() && args[i].alias_info()->isWrite()) note_cpu_write(inputs[i], schema->name());
    if (grad_mode) for_each_tensor(c10::ArrayRef<c10::IValue>(inputs[i]), note_leaf);
  }
  return nullptr;
}

void stop_cpu_watch() {
  if (g_cpu_watch) at::removeCallback(*g_cpu_watch);
  g_cpu_watch.reset();
}

// The first CPU tensor written in the step that is still alive ("" if none).
std::string cpu_write_problem() {
  std::lock_guard<std::mutex> g(g_cpu_writes_mu);
  for (const CpuWrite& w : g_cpu_writes)
    if (!w.storage.expired())
      return "the step writes a CPU tensor that outlives it in place (" + w.op +
             ", e.g. an optimizer's step count kept on the CPU: use capturable=True), and a replay runs only "
             "the tpu program";
  return "";
}

void forget_leaves() {
  std::lock_guard<std::mutex> g(g_cpu_writes_mu);
  g_leaves.clear();
  g_leaf_index.clear();
}

}  // namespace

// Where a value of the recorded trace comes from or goes to.
struct Source {
  enum Kind { Arg, Held, Const, Returned } kind = Const;
  int index = -1;            // Arg: the argument; Returned: the returned storage
  // Held: referenced weakly. One nothing else holds any more (a grad another
  // step set to None) means this call's state is not the recorded one.
  std::optional<WeakStorage> held;
  runtime::BufferPtr buffer; // Const: the value (also kept for the comparison)
  uint64_t serial = 0;       // Held and Arg: the storage's serial when recorded
  DType dtype = DType::F32;
  int64_t bytes = 0;         // inputs: the buffer's size when recorded
};

struct ReturnedTensor {
  int fresh = -1;  // >= 0: the index of its storage among those the step made and wrote
  at::Tensor same;  // fresh < 0: returned as it is
  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;
  bool whole = false;  // contiguous at offset 0
  c10::ScalarType dtype = c10::kFloat;
};

struct Recording {
  std::string problem;  // non-empty: not replayable
  // Per argument, the first argument sharing its storage (or -1: not a tpu
  // tensor), and the serials of held storages, sorted: a replay whose
  // arguments alias differently, or alias a held storage, is not this
  // recording's step.
  std::vector<int> arg_alias;
  std::vector<uint64_t> held_serials;
  // The scalar and offset packs uploaded once (the offsets only when the
  // step draws no random keys), under the device lock.
  mutable runtime::BufferPtr fpack_buffer, ipack_buffer;
  Flushed f;
  std::vector<Source> inputs, outputs;
  std::vector<ReturnedTensor> returned;
  int fresh_storages = 0;
  // The leaf tensors noted while recording (see g_leaves) that existed
  // before the step, arguments aside (their flags are part of the
  // signature), with whether each required grad when the recording ended
  // (capture_keep_leaves): a call finding one changed (a parameter frozen or
  // unfrozen since, capture_leaves_changed) marks the recording stale.
  // Weak: a tensor that died cannot have changed. `seen`: as noted, until
  // capture_keep_leaves.
  std::vector<LeafSeen> seen;
  std::vector<std::pair<WeakTensor, bool>> leaves;
  mutable bool stale = false;  // a held storage gone, or a leaf's flag changed: record the step again
};

bool fused_detail::capturing() { return g_on.load(std::memory_order_relaxed); }

void capture_note_leaves(const std::vector<at::Tensor>& inputs) {
  if (!g_on.load(std::memory_order_relaxed)) return;
  for (const at::Tensor& t : inputs) note_leaf(t);
}

void capture_host_read(const char* what) {
  if (g_on.load(std::memory_order_relaxed) && g_host_read.empty()) g_host_read = what;
}

void fused_detail::capture_flushed(const Trace& t, const std::vector<std::pair<int32_t, StorageBuffer*>>& live,
                                   const std::shared_ptr<Entry>& e, const char* why) {
  Flushed f;
  f.entry = e;
  f.why = why;
  f.device = t.device;
  f.checks = t.checks;
  f.explicit_generator = t.explicit_generator;
  f.external_storage = t.external_storage;
  f.external_serial = t.external_serial;
  // Only values made during the step (possible constants) are kept: holding
  // the others would stop the fused run from donating them.
  for (size_t x = 0; x < t.externals.size(); ++x) {
    uint64_t serial = t.external_serial[x];
    f.externals.push_back(serial == 0 || serial >= g_begin_serial ? t.externals[x] : nullptr);
    f.external_bytes.push_back(t.externals[x]->bytes());
  }
  for (const auto* type : t.external_types) f.external_dtypes.push_back(type->dtype);
  f.fpack = t.fpack;
  f.ipack = t.ipack;
  f.rng_at = t.rng_at;
  for (const auto& [v, sb] : live) {
    f.output_storage.push_back(t.written_storage.at(sb->pending_slot));
    f.output_dtypes.push_back(t.written_types.at(sb->pending_slot)->dtype);
  }
  for (const auto& op : t.ops) {
    f.op_names.push_back(op.plan->op_name);
    f.op_packs.emplace_back(op.fpack_at, op.ipack_at);
  }
  g_flushed.push_back(std::move(f));
}

void capture_begin() {
  fused_flush("capture");  // work recorded before the step is not part of it
  device::DeviceLock lock;
  TORCH_CHECK(!g_on.load(), "torch_pjrt: capture_step: a step is already being recorded (steps do not nest)");
  g_flushed.clear();
  g_host_read.clear();
  {
    std::lock_guard<std::mutex> g(g_cpu_writes_mu);
    g_cpu_writes.clear();
    g_leaves.clear();
    g_leaf_index.clear();
  }
  stop_cpu_watch();
  g_cpu_watch = at::addThreadLocalCallback(
      at::RecordFunctionCallback(watch_cpu_writes).needsInputs(true).scopes({at::RecordScope::FUNCTION}));
  g_begin_serial = StorageBuffer::next_serial();
  g_on.store(true);
}

void capture_abort() {
  device::DeviceLock lock;
  g_on.store(false);
  stop_cpu_watch();
  g_flushed.clear();
  forget_leaves();
}

namespace {

uint64_t serial_of(const at::Tensor& t) {
  return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1 && t.storage()
             ? device::storage_of(t).serial
             : 0;
}

std::vector<int> alias_pattern(const std::vector<uint64_t>& serials) {
  std::vector<int> pattern;
  for (size_t i = 0; i < serials.size(); ++i) {
    int first = serials[i] ? static_cast<int>(i) : -1;
    for (size_t j = 0; j < i && serials[i]; ++j)
      if (serials[j] == serials[i]) {
        first = static_cast<int>(j);
        break;
      }
    pattern.push_back(first);
  }
  return pattern;
}

int arg_with_serial(const std::vector<uint64_t>& serials, uint64_t s) {
  for (size_t i = 0; i < serials.size(); ++i)
    if (serials[i] == s && s != 0) return static_cast<int>(i);
  return -1;
}

void resolve(Recording& r, const std::vector<at::Tensor>& args, const std::vector<at::Tensor>& returned) {
  const Flushed& f = r.f;
  if (f.explicit_generator) {
    r.problem = "a random op in the step uses a generator of its own (replay draws from the default generator)";
    return;
  }
  std::vector<uint64_t> arg_serials;
  for (const at::Tensor& a : args) arg_serials.push_back(serial_of(a));
  r.arg_alias = alias_pattern(arg_serials);
  for (size_t x = 0; x < f.externals.size(); ++x) {
    Source s;
    s.dtype = f.external_dtypes[x];
    s.serial = f.external_serial[x];
    s.bytes = f.external_bytes[x];
    c10::Storage st(f.external_storage[x].lock());
    int arg = arg_with_serial(arg_serials, s.serial);
    if (arg >= 0) {
      s.kind = Source::Arg;
      s.index = arg;
    } else if (s.serial == 0 || s.serial >= g_begin_serial) {
      s.kind = Source::Const;  // made during the step (an upload), or no storage (a graph's constant)
      s.buffer = f.externals[x];
    } else if (!st) {
      r.problem = "a tensor the step reads was replaced during the step (its storage died), so a replay "
                  "could not find its next value";
      return;
    } else {
      s.kind = Source::Held;
      s.held = WeakStorage(st.getWeakStorageImpl());
    }
    r.inputs.push_back(std::move(s));
  }
  std::vector<uint64_t> returned_serials;
  for (const at::Tensor& t : returned) returned_serials.push_back(serial_of(t));
  std::vector<uint64_t> fresh;  // serials of returned storages the step made and writes
  for (size_t j = 0; j < f.output_storage.size(); ++j) {
    Source s;
    s.dtype = f.output_dtypes[j];
    c10::Storage st(f.output_storage[j].lock());
    TORCH_CHECK(st, "torch_pjrt: capture_step: a value that leaves the step has no storage");
    s.serial = device::storage_of(st).serial;
    int arg = arg_with_serial(arg_serials, s.serial);
    bool made_here = s.serial >= g_begin_serial;
    if (arg >= 0) {
      s.kind = Source::Arg;
      s.index = arg;
    } else if (made_here && arg_with_serial(returned_serials, s.serial) >= 0) {
      s.kind = Source::Returned;
      s.index = static_cast<int>(fresh.size());
      fresh.push_back(s.serial);
    } else {
      s.kind = Source::Held;
      s.held = WeakStorage(st.getWeakStorageImpl());
    }
    r.outputs.push_back(std::move(s));
  }
  r.fresh_storages = static_cast<int>(fresh.size());
  for (const Source& s : r.inputs)
    if (s.kind == Source::Held) r.held_serials.push_back(s.serial);
  for (const Source& s : r.outputs)
    if (s.kind == Source::Held) r.held_serials.push_back(s.serial);
  std::sort(r.held_serials.begin(), r.held_serials.end());
  for (const at::Tensor& t : returned) {
    ReturnedTensor rt_;
    uint64_t s = serial_of(t);
    int k = arg_with_serial(fresh, s);
    if (k < 0 && arg_with_serial(arg_serials, s) >= 0) {
      r.problem = "the step returns one of its arguments (or a view of one)";
      return;
    }
    rt_.fresh = k;
    if (k < 0) {
      rt_.same = t;
    } else {
      rt_.sizes = t.sizes().vec();
      rt_.strides = t.strides().vec();
      rt_.offset = t.storage_offset();
      rt_.dtype = t.scalar_type();
      rt_.whole = rt_.offset == 0 && t.is_contiguous();
    }
    r.returned.push_back(std::move(rt_));
  }
}

std::vector<char> host_bytes(const runtime::BufferPtr& b) {
  std::vector<char> v(static_cast<size_t>(b->bytes()));
  if (!v.empty()) rt().buffer_to_host(*b, v.data(), v.size());
  return v;
}

// The op whose pack entry `at` is (fpack when `scalars`, else ipack).
std::string op_at(const Flushed& f, int64_t at, bool scalars) {
  std::string name = "an op";
  for (size_t k = 0; k < f.op_packs.size(); ++k)
    if ((scalars ? f.op_packs[k].first : f.op_packs[k].second) <= at) name = f.op_names[k];
  return name;
}

}  // namespace

std::shared_ptr<Recording> capture_end(const std::vector<at::Tensor>& args, const std::vector<at::Tensor>& returned) {
  fused_flush("capture");
  device::DeviceLock lock;
  g_on.store(false);
  stop_cpu_watch();
  std::vector<Flushed> flushed = std::move(g_flushed);
  g_flushed.clear();
  auto r = std::make_shared<Recording>();
  g_stats.recordings++;
  auto early = std::find_if(flushed.begin(), flushed.end(), [](const Flushed& f) { return f.why != "capture"; });
  std::string cpu_write = cpu_write_problem();
  if (flushed.empty()) {
    r->problem = "the step recorded no work on tpu";
  } else if (!g_host_read.empty()) {
    r->problem = "the step reads a tpu tensor's value on the host (" + g_host_read +
                 "), and a replay would reuse the value read while recording";
  } else if (!cpu_write.empty()) {
    r->problem = cpu_write;
  } else if (early != flushed.end()) {
    // A value the step's Python read (or the host needed) during the step: a
    // replay would not produce it there.
    r->problem = "something needed a value during the step (flush reason '" + early->why +
                 "': a host read such as .item() or print, a CPU fallback, a collective on the device, or more "
                 "ops than TORCH_PJRT_FUSED_MAX_OPS), so the step ran in " + std::to_string(flushed.size()) + " piece(s)";
  } else {
    r->f = std::move(flushed[0]);
    resolve(*r, args, returned);
    r->f.externals.clear();  // (the constants are in r->inputs)
    if (r->problem.empty()) {
      std::vector<uint64_t> arg_serials;
      for (const at::Tensor& a : args) arg_serials.push_back(serial_of(a));
      std::lock_guard<std::mutex> g(g_cpu_writes_mu);
      for (LeafSeen& l : g_leaves)  // (less arguments and views of them)
        if (arg_with_serial(arg_serials, l.serial) < 0) r->seen.push_back(std::move(l));
    }
  }
  forget_leaves();
  return r;
}

std::string recording_problem(const Recording& r) { return r.problem; }

namespace {

// Whether the tensor `w` refers to requires grad (nothing: it died). The
// caller holds the GIL: a tensor with a Python object is kept alive by it,
// which only dies under the GIL, so its flag is read without taking a
// reference (taking one would touch the Python object's refcount, ~50 ns a
// tensor); the others are locked, which touches no Python object.
std::optional<bool> requires_grad_of(const WeakTensor& w) {
  if (w.expired()) return std::nullopt;
  const c10::TensorImpl* t = w._unsafe_get_target();  // (its memory lives while `w` does)
  if (t->pyobj_slot()->load_pyobj()) return t->requires_grad();
  auto held = w.lock();
  if (!held) return std::nullopt;
  return held->requires_grad();
}

}  // namespace

void capture_keep_leaves(Recording& r) {
  for (const LeafSeen& l : r.seen)
    if (auto rg = requires_grad_of(l.impl)) r.leaves.emplace_back(l.impl, *rg);
  r.seen.clear();
}

bool capture_leaves_changed(const Recording& r) {
  for (const auto& [weak, requires_grad] : r.leaves) {
    auto rg = requires_grad_of(weak);
    if (rg && *rg != requires_grad) {
      r.stale = true;
      return true;
    }
  }
  return false;
}

bool recording_stale(const Recording& r) { return r.stale; }

std::string capture_problem(const Recording& a, Recording& b) {
  if (!b.problem.empty()) return b.problem;
  if (!a.problem.empty()) return a.problem;
  if (a.f.entry != b.f.entry) return "two calls recorded different work (other ops, shapes or values leaving)";
  if (!b.f.entry->exe) return "its fused program did not compile";
  if (a.inputs.size() != b.inputs.size() || a.outputs.size() != b.outputs.size()) return "two calls recorded different inputs";
  for (size_t x = 0; x < a.inputs.size(); ++x) {
    const Source &p = a.inputs[x], &q = b.inputs[x];
    if (p.kind != q.kind || p.index != q.index || (p.kind == Source::Held && p.serial != q.serial))
      return "two calls read different tensors (state replaced between steps rather than updated in place)";
    if (p.kind == Source::Const && p.buffer != q.buffer && host_bytes(p.buffer) != host_bytes(q.buffer))
      return "data copied from the host during the step changes between calls (a CPU tensor moved to tpu, "
             "torch.tensor(...)): pass it to the step as a tpu tensor argument";
  }
  for (size_t j = 0; j < a.outputs.size(); ++j)
    if (a.outputs[j].kind != b.outputs[j].kind || a.outputs[j].index != b.outputs[j].index ||
        a.outputs[j].dtype != b.outputs[j].dtype)
      return "two calls wrote different tensors";
  for (size_t k = 0; k < a.f.fpack.size(); ++k)
    if (a.f.fpack[k] != b.f.fpack[k] && !(a.f.fpack[k] != a.f.fpack[k] && b.f.fpack[k] != b.f.fpack[k]))
      return "a host scalar of " + op_at(b.f, static_cast<int64_t>(k), true) +
             " changes between calls (a Python number that changes each step, such as a learning rate "
             "schedule or an optimizer's step count kept on the CPU: pass capturable=True to the optimizer)";
  std::vector<char> is_rng(a.f.ipack.size(), 0);
  for (int32_t at : b.f.rng_at) is_rng.at(at) = is_rng.at(at + 1) = 1;
  // A random key equal in both recordings comes from a generator the step
  // seeds itself (torch.manual_seed inside it): a replay keeps it, as eager
  // would draw it again. The others advance with the default generator.
  // A key used again in both recordings (the same key at two places) is
  // used again in a replay, not drawn twice.
  auto same = [](const Flushed& f, int32_t x, int32_t y) {
    return f.ipack[x] == f.ipack[y] && f.ipack[x + 1] == f.ipack[y + 1];
  };
  std::vector<int32_t> drawn;
  b.f.rng_copies.clear();
  for (int32_t at : b.f.rng_at) {
    if (a.f.ipack[at] == b.f.ipack[at] && a.f.ipack[at + 1] == b.f.ipack[at + 1]) continue;
    auto earlier = std::find_if(drawn.begin(), drawn.end(),
                                [&](int32_t d) { return same(a.f, d, at) && same(b.f, d, at); });
    if (earlier != drawn.end())
      b.f.rng_copies.emplace_back(at, *earlier);
    else
      drawn.push_back(at);
  }
  b.f.rng_at = std::move(drawn);
  for (size_t k = 0; k < a.f.ipack.size(); ++k)
    if (!is_rng[k] && a.f.ipack[k] != b.f.ipack[k])
      return "a view offset of " + op_at(b.f, static_cast<int64_t>(k), false) + " changes between calls";
  if (a.returned.size() != b.returned.size()) return "two calls returned different tensors";
  for (size_t i = 0; i < a.returned.size(); ++i)
    if ((a.returned[i].fresh < 0) != (b.returned[i].fresh < 0)) return "two calls returned different tensors";
  return "";
}

std::optional<std::vector<at::Tensor>> replay(const Recording& r, const std::vector<at::Tensor>& args) {
  TORCH_CHECK(r.problem.empty(), "torch_pjrt: capture_step: not replayable: ", r.problem);
  fused_flush("capture");  // work recorded before this call comes first
  device::DeviceLock lock;
  std::vector<uint64_t> serials;
  serials.reserve(args.size());
  for (const at::Tensor& a : args) {
    serials.push_back(serial_of(a));
    if (std::binary_search(r.held_serials.begin(), r.held_serials.end(), serials.back())) return std::nullopt;
  }
  if (alias_pattern(serials) != r.arg_alias) return std::nullopt;
  const Flushed& f = r.f;
  const int device = f.device;
  Trace t;
  t.device = device;
  t.checks = f.checks;
  // The packs are uploaded once per recording; only random keys change the
  // offset pack, which is then copied and uploaded per call.
  if (!f.fpack.empty() && !r.fpack_buffer)
    r.fpack_buffer = scalar_pack_buffer(f.fpack.data(), static_cast<int64_t>(f.fpack.size()), device);
  if (!f.ipack.empty() && f.rng_at.empty() && !r.ipack_buffer)
    r.ipack_buffer = s64_buffer(f.ipack.data(), static_cast<int64_t>(f.ipack.size()), device);
  t.fpack_buffer = r.fpack_buffer;
  t.ipack_buffer = r.ipack_buffer;
  if (!f.rng_at.empty()) t.ipack = f.ipack;
  // The held storages, alive for the call (or the recording is stale).
  std::vector<c10::Storage> alive_in(r.inputs.size()), alive_out(r.outputs.size());
  auto hold = [&](const std::vector<Source>& sources, std::vector<c10::Storage>& alive) {
    for (size_t x = 0; x < sources.size(); ++x)
      if (sources[x].kind == Source::Held) {
        alive[x] = c10::Storage(sources[x].held->lock());
        if (!alive[x]) return false;
      }
    return true;
  };
  if (!hold(r.inputs, alive_in) || !hold(r.outputs, alive_out)) {
    r.stale = true;
    return std::nullopt;
  }
  auto storage_for = [&](const Source& s, const c10::Storage& held) -> StorageBuffer& {
    if (s.kind == Source::Held) return device::storage_of(held);
    const at::Tensor& a = args.at(s.index);
    TORCH_CHECK(a.device().type() == c10::DeviceType::PrivateUse1 && a.device().index() == device,
                "torch_pjrt: capture_step: argument ", s.index, " is on ", a.device(), ", recorded on tpu:", device);
    return device::storage_of(a);
  };
  // Three passes over the inputs: storages, then their buffers, then the
  // checks and references. Right after a sync the device's threads (on the
  // CPU plugin, the host's cores) have evicted these from the cache; loads
  // alone, each pass's misses overlap, where one loop with a reference
  // count's atomic increment per input would take them one at a time.
  const size_t n_in = r.inputs.size();
  std::vector<StorageBuffer*> in_sb(n_in, nullptr);
  for (size_t x = 0; x < n_in; ++x)
    if (r.inputs[x].kind != Source::Const) {
      in_sb[x] = &storage_for(r.inputs[x], alive_in[x]);
      __builtin_prefetch(in_sb[x]);
    }
  std::vector<const runtime::BufferPtr*> in_buf(n_in, nullptr);
  for (size_t x = 0; x < n_in; ++x)
    if (in_sb[x]) {
      in_buf[x] = &device::ensure_buffer(*in_sb[x], r.inputs[x].dtype);
      __builtin_prefetch(in_buf[x]->get());
    }
  t.externals.reserve(n_in);
  for (size_t x = 0; x < n_in; ++x) {
    const Source& s = r.inputs[x];
    if (s.kind == Source::Const) {
      t.externals.push_back(s.buffer);
      continue;
    }
    const runtime::BufferPtr& b = *in_buf[x];
    // Another size: an argument viewing a larger or smaller base, or a held
    // storage resized since; not the recorded step (nothing has changed yet).
    if (b->bytes() != s.bytes) return std::nullopt;
    t.externals.push_back(b);
  }
  for (int32_t at : f.rng_at) {
    auto key = device::next_rng_key(std::nullopt, device);
    t.ipack[at] = static_cast<int64_t>(key.first);
    t.ipack[at + 1] = static_cast<int64_t>(key.second);
  }
  for (const auto& [to, from] : f.rng_copies) {
    t.ipack[to] = t.ipack[from];
    t.ipack[to + 1] = t.ipack[from + 1];
  }
  // Inputs the program overwrites leave their storages for the call, so the
  // program may reuse their memory (donation); put back if the run fails.
  std::vector<std::pair<StorageBuffer*, int32_t>> taken;  // (storage, external)
  for (const auto& [x, out] : f.entry->aliases) {
    const Source& s = r.inputs[x];
    if (s.kind == Source::Const) continue;
    StorageBuffer& sb = *in_sb[x];
    if (sb.buffer == t.externals[x]) {
      taken.emplace_back(&sb, x);
      sb.buffer.reset();
    }
  }
  std::vector<runtime::BufferPtr> outs;
  try {
    // Launched on the launch thread: the call returns without waiting for
    // the plugin's execute call (issue 15's per-call host time).
    outs = fused_detail::run_fused(t, *f.entry, r.outputs.size(), /*on_launch_thread=*/true);
  } catch (...) {
    for (auto& [sb, x] : taken)
      if (!t.externals[x]->donated()) sb->buffer = t.externals[x];
    throw;
  }
  std::vector<runtime::BufferPtr> fresh(r.fresh_storages);
  std::vector<DType> fresh_dtypes(r.fresh_storages);
  // The buffers the outputs replace are let go on the launch thread.
  std::vector<runtime::BufferPtr> dropped = std::move(t.externals);
  dropped.reserve(dropped.size() + r.outputs.size());
  std::vector<StorageBuffer*> out_sb(r.outputs.size(), nullptr);  // (loads first, as for the inputs)
  for (size_t j = 0; j < r.outputs.size(); ++j)
    if (r.outputs[j].kind != Source::Returned) {
      out_sb[j] = &storage_for(r.outputs[j], alive_out[j]);
      __builtin_prefetch(out_sb[j]);
    }
  for (size_t j = 0; j < r.outputs.size(); ++j) {
    const Source& s = r.outputs[j];
    if (s.kind == Source::Returned) {
      fresh[s.index] = outs[j];
      fresh_dtypes[s.index] = s.dtype;
      continue;
    }
    StorageBuffer& sb = *out_sb[j];
    if (sb.buffer) dropped.push_back(std::move(sb.buffer));
    sb.buffer = outs[j];
    sb.dtype = s.dtype;
  }
  // One new storage per returned value; returned tensors are views of it.
  std::vector<at::Tensor> bases(r.fresh_storages);
  std::vector<at::Tensor> result;
  for (const ReturnedTensor& rt_ : r.returned) {
    if (rt_.fresh < 0) {
      result.push_back(rt_.same);
      continue;
    }
    at::Tensor& base = bases[rt_.fresh];
    const runtime::BufferPtr& b = fresh[rt_.fresh];
    int64_t n = b->bytes() / static_cast<int64_t>(c10::elementSize(rt_.dtype));
    if (!base.defined() && rt_.whole && n == c10::multiply_integers(rt_.sizes)) {
      base = device::wrap_buffer(rt_.sizes, rt_.strides, rt_.dtype, device, b);  // no view needed
      device::storage_of(base).dtype = fresh_dtypes[rt_.fresh];
      result.push_back(base);
      continue;
    }
    if (!base.defined()) {
      base = device::wrap_buffer({n}, {1}, rt_.dtype, device, b);
      device::storage_of(base).dtype = fresh_dtypes[rt_.fresh];
    }
    result.push_back(base.as_strided(rt_.sizes, rt_.strides, rt_.offset));
  }
  rt().release_later(std::move(dropped));
  g_stats.replays++;
  return result;
}

CaptureStats capture_stats() {
  device::DeviceLock lock;
  return g_stats;
}

void count_not_replayable() {
  device::DeviceLock lock;
  g_stats.not_replayable++;
}

}  // namespace torch_pjrt::eager

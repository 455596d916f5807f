// One ATen call on tpu tensors, described for the executor: its tpu tensors
// (slots) and their distinct storages, its runtime scalars, and the cache keys
// (with float arguments by value, and as runtime inputs).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/SmallVector.h>

#include <string>
#include <string_view>
#include <vector>

#include "device/storage.h"
#include "lowering/strided_access.h"

namespace torch_pjrt::eager {

// Every tpu tensor among the arguments (lists flattened), in order.
struct Slot {
  at::Tensor tensor;
  int arg_index;
  bool pure_output;  // a keyword-only mutable argument (out=): never read
  int storage;       // index into `storages`
};

// A runtime scalar input: a float or integer CPU 0-d tensor (often a wrapped
// Python number), a float argument, an int `Scalar` argument, or an element of
// a _foreach_ scalar list. Integers travel in the same pack, exactly
// (exact_in_pack).
struct ScalarInput {
  double value;
  bool from_arg;        // a `float`/`Scalar` argument (runtime only in dynamic mode)
  int arg = -1;         // that argument's index (not for list elements and float tensors)
  bool is_int = false;  // a Python int (or an integer CPU scalar)
};

struct OpInstance {
  // (Inline capacity: an op's call allocates nothing for its description.)
  c10::SmallVector<Slot, 4> slots;
  c10::SmallVector<device::StorageBuffer*, 4> storages;  // distinct storages, in first-seen order
  int device = -1;
  bool foreach = false;    // _foreach_*: the element op, once per list index, in one program
  // The cache key with float arguments as runtime inputs ('~' where each
  // is); static_key() adds their values (keyed by value). One string is
  // built per call, not two, in place (no allocation below 512 bytes: three
  // 4-d tensors take about 300).
  c10::SmallVector<char, 512> key;
  std::string_view key_view() const { return {key.data(), key.size()}; }
  c10::SmallVector<ScalarInput, 4> scalars;
  // (The same as `key` when there are no float arguments.)
  std::string static_key() const {
    std::string k;
    static_key_into(k);
    return k;
  }
  // The same into `k` (a caller's reused buffer: no allocation per call).
  std::string_view static_key_into(std::string& k) const {
    k.assign(key.data(), key.size());
    for (const ScalarInput& s : scalars)
      if (s.from_arg) k.append(reinterpret_cast<const char*>(&s.value), sizeof(s.value));
    return k;
  }

  void put_raw(const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    key.append(c, c + n);
  }
  void put(int64_t v) { put_raw(&v, sizeof(v)); }
  void put(char c) { put_raw(&c, 1); }
  void put(c10::IntArrayRef a) {
    put(static_cast<int64_t>(a.size()));
    for (auto v : a) put(v);
  }
  void put(const std::string& s) { put_raw(s.data(), s.size()); put('\0'); }
  // A float (or an int Scalar, runtime_int_arg) that is a runtime input in
  // dynamic mode, part of the key otherwise.
  void put_scalar_arg(double d, int arg = -1, bool is_int = false) {
    key.push_back('~');
    scalars.push_back(ScalarInput{d, true, arg, is_int});
  }
};

// A Python int in [2**63, 2**64): PyTorch's uint64 Scalar, an IValue that is
// not isInt() (IValue's UInt tag).
inline bool is_uint64_scalar(const c10::IValue& v) { return v.isUnsigned() && !v.isInt(); }
// A CPU scalar's integer value as the lowering's Scalar (uint64 beyond int64's range as UInt).
inline lowering::Scalar int_scalar(const c10::Scalar& s) {
  return s.type() == c10::ScalarType::UInt64 ? lowering::Scalar::from_uint(s.toUInt64())
                                             : lowering::Scalar::from_int(s.toLong());
}

// TORCH_PJRT_RUNTIME_INTS=on (default) | off: off keys every int by value,
// as before (benchmarks/int_scalars.py compares the two).
bool runtime_ints_enabled();
// Whether integer `v` is carried exactly by the runtime scalar pack
// (scalar_pack_dtype: f64, or f32 on TPUs); larger ones are keyed by value.
bool exact_in_pack(int64_t v);
// An int passed for a `Scalar` argument (x.clamp(max=n), fill_(n),
// masked_fill(m, n), add(alpha=n)) is a runtime input, learned per operator as
// float arguments are, unless it is the argument's schema default (add's
// alpha=1 stays a constant: the common call has no extra input) or too large.
// int arguments (dims, sizes) always stay keyed.
bool runtime_int_arg(const c10::Argument& a, int64_t v);
// An integer CPU 0-d tensor (x + n wraps n into one) is a runtime input, as
// a float one is (no mode: its value reaches the lowering only as a value).
bool runtime_int_scalar(c10::ScalarType t, const c10::Scalar& v);

bool is_write(const c10::Argument& a);
std::string tpu_name(int index);
// A Scalar[] argument (a list of doubles/ints that is not an int[]).
bool is_scalar_list(const c10::IValue& v);
// Fills `inst` (set inst.foreach first) from the op's arguments.
void describe(OpInstance& inst, const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args);
// "aten::add.Tensor"
std::string op_display_name(const c10::FunctionSchema& schema);
lowering::StridedView view_of(const at::Tensor& t);

}  // namespace torch_pjrt::eager

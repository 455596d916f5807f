// The few ATen kernels a PrivateUse1 backend must provide itself (allocation,
// views, resize, copies across devices, host reads), plus the boxed fallback
// that sends every other op to the eager executor and its lowering registry.
#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/addr_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/set_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <cmath>
#include <limits>
#include <unordered_map>

#include "device/current_device.h"
#include "device/device_lock.h"
#include "device/dtype_map.h"
#include "device/storage.h"
#include "eager/cpu_fallback.h"
#include "eager/executor.h"
#include "eager/fused.h"
#include "eager/step_capture.h"
#include "lowering/builder.h"

namespace torch_pjrt::device {
namespace {

constexpr auto kTpu = c10::DeviceType::PrivateUse1;

c10::Device resolve(std::optional<c10::Device> d) {
  if (d && d->has_index()) return *d;
  return c10::Device(kTpu, static_cast<c10::DeviceIndex>(current_device()));
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory,
                               std::optional<c10::MemoryFormat> memory_format) {
  c10::Device dev = resolve(device);
  runtime::Runtime::get().check_device(dev.index());
  c10::DeviceGuard guard(dev);
  auto st = dtype.value_or(c10::get_default_dtype_as_scalartype());
  to_dtype(st);  // rejects dtypes the backend cannot hold
  return at::detail::empty_generic(size, allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   st, memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                         std::optional<c10::Device> device, std::optional<bool> pin_memory) {
  c10::Device dev = resolve(device);
  runtime::Runtime::get().check_device(dev.index());
  c10::DeviceGuard guard(dev);
  auto st = dtype.value_or(c10::get_default_dtype_as_scalartype());
  to_dtype(st);
  return at::detail::empty_strided_generic(size, stride, allocator(),
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), st);
}

// Grows the storage to `nbytes`, keeping its contents (new bytes read as zero).
void grow_storage(const at::Tensor& self, size_t nbytes) {
  c10::Storage storage = self.storage();
  StorageBuffer& old = storage_of(storage);
  eager::settle(old);  // a fused trace owes its value
  c10::DeviceGuard guard(self.device());
  c10::DataPtr fresh = allocator()->allocate(nbytes);
  auto* sb = static_cast<StorageBuffer*>(fresh.get_context());
  if (old.buffer && old.nbytes > 0 && nbytes % lowering::itemsize(old.dtype) == 0) {
    int64_t old_n = old.numel();
    int64_t new_n = static_cast<int64_t>(nbytes) / lowering::itemsize(old.dtype);
    lowering::DType dt = old.dtype;
    std::string key = "$grow|" + std::to_string(int(dt)) + "|" + std::to_string(old_n) + "|" +
                      std::to_string(new_n);
    sb->buffer = eager::run_cached(key, {old.buffer}, old.device, [&](lowering::Builder& b) {
      auto v = b.param(lowering::TensorType{dt, {old_n}});
      return std::vector<lowering::Value>{b.pad(v, b.constant_int(0, dt), {0}, {new_n - old_n})};
    })[0];
    sb->dtype = dt;
  } else if (old.buffer && old.nbytes > 0) {
    // Odd byte counts: go through the host.
    std::vector<char> host(nbytes, 0);
    runtime::Runtime::get().buffer_to_host(*old.buffer, host.data(), old.nbytes);
    sb->buffer = runtime::Runtime::get().buffer_from_host(host.data(), PJRT_Buffer_Type_U8,
                                                          {static_cast<int64_t>(nbytes)}, old.device);
    sb->dtype = lowering::DType::U8;
  }
  storage.set_data_ptr_noswap(std::move(fresh));
  storage.set_nbytes(nbytes);
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  DeviceLock lock;
  auto* impl = self.unsafeGetTensorImpl();
  // As ATen's resize_: a tensor that already has these sizes keeps its strides.
  if (self.sizes() != size) {
    // The byte count with CPU's overflow check ("Storage size calculation
    // overflowed"), before the sizes change: 2^62 floats left a tensor whose
    // storage was 24 bytes.
    bool negative = std::any_of(size.begin(), size.end(), [](int64_t d) { return d < 0; });
    size_t needed = negative ? 0 : at::detail::computeStorageNbytesContiguous(size, self.itemsize(),
                                                                              self.storage_offset());
    impl->set_sizes_contiguous(size);
    if (self.numel() > 0 && needed > self.storage().nbytes()) grow_storage(self, needed);
  }
  if (memory_format && *memory_format != c10::MemoryFormat::Preserve)
    impl->empty_tensor_restride(*memory_format);
  return self;
}

// Host -> tpu, tpu -> host and tpu -> tpu (same or another device).
at::Tensor& copy_(at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  bool dst_tpu = self.device().type() == kTpu, src_tpu = src.device().type() == kTpu;
  auto& rt = runtime::Runtime::get();
  // As ATen's copy_impl: a ZeroTensor (from autograd's and functorch's
  // efficient zeros, run on the CPU) has no data, not even a pointer.
  TORCH_CHECK(!self._is_zerotensor(), "ZeroTensors are immutable. Please materialize the tensor using `.clone()`, "
              "if you want a mutable zero tensor.");
  if (src._is_zerotensor()) return self.zero_();
  if (self.numel() == 0) {
    // A read of nothing still reports a failed device-side check of the work
    // before it (an out-of-range index into an empty tensor), as a read of
    // data would, not at a later, unrelated read.
    if (src_tpu && self.device().is_cpu()) {
      eager::capture_host_read("a copy to the host: .cpu(), .tolist(), .numpy() or print");
      eager::fused_flush("synchronize");
      rt.synchronize(src.device().index());
    }
    return self;
  }
  if (!dst_tpu) {
    // tpu -> host: the lock only while the source is read; the wait for the
    // device happens outside it, so other threads' ops can be queued meanwhile.
    TORCH_CHECK(self.device().is_cpu(), "torch_pjrt: cannot copy from ", src.device(), " to ", self.device());
    at::Tensor host = at::empty(src.sizes(), src.options().device(c10::kCPU));
    runtime::BufferPtr values;
    {
      DeviceLock lock;
      values = eager::materialize(src);
      eager::fused_at_host_read();  // a pipelined trace's rest runs now, not waited for
      eager::capture_host_read("a copy to the host: .cpu(), .tolist(), .numpy() or print");
    }
    rt.buffer_to_host(*values, host.data_ptr(), host.nbytes());
    // The raw values carry src's lazy conj/neg bits; CPU's copy_ resolves them.
    if (src.is_conj()) host._set_conj(true);
    if (src.is_neg()) host._set_neg(true);
    self.copy_(host);
    return self;
  }
  if (dst_tpu && src_tpu && self.device() == src.device() &&
      (self.is_conj() || src.is_conj() || self.is_neg() || src.is_neg())) {
    // Lazy conj/neg bits on either side: self's raw values from src's, no bits
    // either side (equal bits cancel: neg(dst) = neg(src) writes src's raw values).
    at::Tensor v = src.is_conj() ? src.conj() : src, raw = self.is_conj() ? self.conj() : self;
    if (v.is_neg()) v = v._neg_view();
    if (raw.is_neg()) raw = raw._neg_view();
    if (self.is_conj() != src.is_conj()) v = at::conj_physical(v);
    if (self.is_neg() != src.is_neg()) v = at::neg(v);
    raw.copy_(v);
    return self;
  }
  if (dst_tpu && src_tpu && self.device() == src.device()) {
    static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::copy_", "");
    torch::jit::Stack stack{self, src, non_blocking};
    eager::lowering_fallback(op, &stack);
    return self;
  }
  if (dst_tpu && src_tpu) {
    DeviceLock lock;
    at::Tensor dense = src.contiguous();
    auto moved = rt.copy_to_device(*eager::materialize(dense), self.device().index(), dense.nbytes());
    at::Tensor staged = wrap_buffer(dense.sizes(), dense.strides(), dense.scalar_type(), self.device().index(), moved);
    return self.copy_(staged);
  }
  TORCH_CHECK(src.device().is_cpu(), "torch_pjrt: cannot copy from ", src.device(), " to ", self.device());
  // Dtype conversion and broadcasting happen on the host, with PyTorch's CPU rules.
  at::Tensor host = src.to(self.scalar_type()).expand(self.sizes()).contiguous();
  if (self.is_conj() || self.is_neg() || host.is_conj() || host.is_neg()) {
    // Raw values for self's bits: conj/neg of the logical values where self has them.
    at::Tensor h = self.is_conj() ? host.conj() : host;
    if (self.is_neg()) h = h._neg_view();
    host = h.resolve_conj().resolve_neg().contiguous();
  }
  auto buffer = rt.buffer_from_host(host.data_ptr(), to_pjrt(to_dtype(host.scalar_type())),
                                    {host.numel()}, self.device().index());
  DeviceLock lock;
  eager::assign(self, buffer);
  return self;
}

at::Tensor _copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  at::Tensor out = dst;
  copy_(out, self, non_blocking);
  return dst;
}

// The CPU fallback's write-back of a mutated or out= argument: `self` is the
// CPU kernel's result in the host copy of `dst`. dst takes self's sizes, and
// self's strides where the CPU kernel chose them: when it resized the out=
// tensor (CPU's rules, its warning already given), or restrided a dense one
// (whose host copy had dst's own strides, see to_cpu). A correctly sized
// out= tensor keeps its strides, as on CPU.
at::Tensor _copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  at::Tensor out = dst;
  bool resized = out.sizes() != self.sizes();
  bool was_dense = out.is_non_overlapping_and_dense();
  if (resized) out.resize_(self.sizes());
  // (Strides of size-1 dims say nothing; an empty tensor's neither.)
  bool restrided = false;
  for (int64_t d = 0; d < self.dim(); ++d) restrided |= self.size(d) > 1 && self.stride(d) != out.stride(d);
  if (!resized && self.numel() == 0) restrided = false;
  if (resized && out.strides() != self.strides()) restrided = true;
  if ((resized || was_dense) && restrided && self.is_non_overlapping_and_dense()) {
    DeviceLock lock;
    size_t needed = (static_cast<size_t>(out.storage_offset()) + static_cast<size_t>(out.numel())) *
                    out.itemsize();
    if (out.numel() > 0 && needed > out.storage().nbytes()) grow_storage(out, needed);
    out.unsafeGetTensorImpl()->set_sizes_and_strides(self.sizes(), self.strides(), out.storage_offset());
  }
  copy_(out, self, false);
  return dst;
}

// The CPU fallback's copies of tpu arguments keep their exact layout (sizes,
// strides, offset into a host copy of the storage): some CPU kernels pick a
// convention from the layout (linalg's LU of a row- vs column-major matrix)
// that their backward reads back from the input's strides. Views much smaller
// than their storage are copied compactly instead (.cpu() resolves their bits).
std::vector<at::Tensor> to_cpu(at::TensorList tensors) {
  DeviceLock lock;
  std::vector<at::Tensor> out;
  // Arguments that view one tpu storage view one host copy of it, so the CPU
  // kernel sees their aliasing (its overlap checks, e.g. masked_select(x, m,
  // out=x), and reads of an input that the op writes).
  std::unordered_map<const StorageBuffer*, at::Tensor> host_copies;
  for (const at::Tensor& t : tensors) {
    if (!t.defined() || t.device().type() != kTpu || t.is_nested()) {  // nested: nested.cpp
      out.push_back(t.defined() ? t.cpu() : t);
      continue;
    }
    StorageBuffer& sb = storage_of(t);
    int64_t item = lowering::itemsize(to_dtype(t.scalar_type()));
    if (t.numel() == 0 || sb.nbytes % item != 0 || static_cast<int64_t>(sb.nbytes) > 2 * t.numel() * item) {
      out.push_back(t.cpu());
      continue;
    }
    at::Tensor& bytes = host_copies[&sb];
    if (!bytes.defined()) {
      bytes = at::empty({static_cast<int64_t>(sb.nbytes)}, at::TensorOptions().dtype(at::kByte));
      eager::capture_host_read("an op run on the CPU (a CPU fallback) reads its tpu arguments");
      runtime::Runtime::get().buffer_to_host(*ensure_buffer(sb, sb.dtype), bytes.data_ptr(), sb.nbytes);
    }
    at::Tensor host = bytes.view(t.scalar_type()).as_strided(t.sizes(), t.strides(), t.storage_offset());
    // The raw values, so the lazy conj/neg bits too (ops that handle a conj
    // view themselves, linalg_solve_triangular's out=, reach the fallback with one).
    if (t.is_conj()) host._set_conj(true);
    if (t.is_neg()) host._set_neg(true);
    out.push_back(host);
  }
  return out;
}

c10::Scalar local_scalar_dense(const at::Tensor& self) {
  at::Tensor host = at::empty({}, self.options().device(c10::kCPU));
  runtime::BufferPtr values;
  {
    DeviceLock lock;
    values = eager::materialize(self);
    eager::fused_at_host_read();
    eager::capture_host_read("a scalar read: .item(), int(), float() or bool()");
  }
  runtime::Runtime::get().buffer_to_host(*values, host.data_ptr(), host.nbytes());
  return host.item();
}

// Data-dependent output shapes: computed on the host, as TorchTPU also does.
at::Tensor nonzero(const at::Tensor& self) { return at::nonzero(self.cpu()).to(self.device()); }

// repeat_interleave(repeats): the indices [0]*r0 + [1]*r1 + ...; their count
// depends on the data, so they are made on the host like nonzero's (the
// composite x.repeat_interleave(n, dim) then gathers on the device).
at::Tensor repeat_interleave_indices(const at::Tensor& repeats, std::optional<int64_t> output_size) {
  return at::repeat_interleave(repeats.cpu(), output_size).to(repeats.device());
}

// Index tensors of index / index_put and their _unsafe forms. Masks
// (bool/uint8) become the long indices of their nonzeros, a host step like
// nonzero (the result's shape depends on the data); then the op runs as an
// ordinary lowered gather or scatter. index_put keeps a lone mask on the
// device (its lowering needs no nonzero, masked_index_put).
//
// Index tensors on the host are accepted, as CUDA accepts them (these ops are
// `device_check: NoCheck` in native_functions.yaml and ATen's AdvancedIndex
// moves the indices to self's device): a CPU mask's nonzero runs on the host
// (no wait for the device), and each CPU index tensor goes to the device in
// one transfer. Their ranges are checked in the program like device indices.
void with_device_indices(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& sargs = op.schema().arguments();
  size_t nargs = sargs.size();
  auto args = torch::jit::last(*stack, nargs);
  size_t self_pos = 0, idx_pos = nargs;
  for (size_t i = 0; i < nargs; ++i) {
    if (sargs[i].name() == "self") self_pos = i;
    if (sargs[i].name() == "indices") idx_pos = i;
  }
  bool is_index = op.schema().name() == "aten::index" || op.schema().name() == "aten::_unsafe_index";
  if (idx_pos == nargs || !args[self_pos].isTensor() || !args[idx_pos].isList()) {
    eager::lowering_fallback(op, stack);
    return;
  }
  at::Tensor self = args[self_pos].toTensor();
  auto indices = args[idx_pos].to<c10::List<std::optional<at::Tensor>>>();
  bool warned = false;
  for (const std::optional<at::Tensor>& e : indices) {
    if (!e.has_value() || !e->defined()) continue;
    auto st = e->scalar_type();
    // (The Meta kernel raises RuntimeError here; CPU raises IndexError.)
    TORCH_CHECK_INDEX(st == at::kLong || st == at::kInt || st == at::kByte || st == at::kBool,
                      "tensors used as indices must be long, int, byte or bool tensors");
    if (st == at::kByte && !warned) {  // CPU's warning, once per call
      TORCH_WARN("indexing with dtype torch.uint8 is now deprecated, please use a dtype torch.bool instead.");
      warned = true;
    }
  }
  // index_put's lowering takes a mask as it is only when it is the one index
  // tensor; with others it becomes long indices too, as for index.
  int defined = 0;
  for (const std::optional<at::Tensor>& e : indices) defined += e.has_value() && e->defined();
  bool expand_masks = is_index || defined > 1;
  bool changed = false;
  c10::List<std::optional<at::Tensor>> expanded;
  int64_t dim = 0;
  for (const std::optional<at::Tensor>& e : indices) {
    if (!e.has_value() || !e->defined()) {
      expanded.push_back(e);
      ++dim;
      continue;
    }
    const at::Tensor& t = *e;
    bool on_host = t.device().is_cpu() && self.device().type() == kTpu;
    bool mask = t.scalar_type() == at::kBool || t.scalar_type() == at::kByte;
    if (mask && (on_host || expand_masks)) {
      for (int64_t k = 0; k < t.dim(); ++k) {
        TORCH_CHECK_INDEX(dim + k < self.dim() && t.size(k) == self.size(dim + k), "The shape of the mask ",
                          t.sizes(), " at index ", k, " does not match the shape of the indexed tensor ",
                          self.sizes(), " at index ", dim + k);
      }
      at::Tensor nz = at::nonzero(t);  // CPU's kernel, or our host kernel above
      if (on_host) nz = nz.to(self.device());
      for (int64_t k = 0; k < t.dim(); ++k) expanded.push_back(nz.select(1, k));
      dim += t.dim();
      changed = true;
    } else if (on_host) {
      expanded.push_back(t.to(self.device()));
      dim += mask ? t.dim() : 1;
      changed = true;
    } else {
      expanded.push_back(t);
      dim += mask ? t.dim() : 1;
    }
  }
  if (changed) (*stack)[stack->size() - nargs + idx_pos] = c10::IValue(expanded);
  eager::lowering_fallback(op, stack);
}

// nonzero(out=) on the host like nonzero, through PyTorch's CPU fallback
// (the out= tensor's device checked first, CPU's resize and stride rules;
// not counted as a fallback: nonzero is a host op by design).
void nonzero_out(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  eager::check_fallback_devices(op, torch::jit::last(*stack, op.schema().arguments().size()));
  at::native::cpu_fallback(op, stack);
}

// equal on the device: one bool comes back to the host, not both tensors.
// As CUDA's: tensors on two devices raise; dtypes may differ (compared as
// eq does); NaN is unequal to itself.
bool equal(const at::Tensor& self, const at::Tensor& other) {
  TORCH_CHECK(self.device() == other.device(), "Cannot compare two tensors on different devices. Got: ",
              self.device(), " and ", other.device());
  if (self.sizes() != other.sizes()) return false;
  if (self.numel() == 0) return true;
  return at::eq(self, other).all().item<bool>();
}

// histc with min == max takes its range from the data, and CPU (and CUDA,
// which reads the extremes to the host too) raises at the call when that
// range is not finite, naming it. So the extremes are read here (one host
// read) and checked with CPU's message; the lowering computes the histogram.
void histc_checked(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  size_t n = op.schema().arguments().size();
  const at::Tensor& self = (*stack)[stack->size() - n].toTensor();
  double lo = (*stack)[stack->size() - n + 2].toScalar().toDouble();
  double hi = (*stack)[stack->size() - n + 3].toScalar().toDouble();
  if (lo == hi && self.numel() > 0 && at::isFloatingType(self.scalar_type())) {
    auto [mn, mx] = at::aminmax(self);
    at::Tensor both = at::stack({mn, mx}).to(at::kDouble).cpu();
    lo = both[0].item<double>();
    hi = both[1].item<double>();
    at::ScalarType st = self.scalar_type();
    if (lo == hi) {  // as the lowering: -1/+1, for float and double at least one step of the type
      double l0 = lo, h0 = hi, inf = std::numeric_limits<double>::infinity();
      lo -= 1;
      hi += 1;
      if (st == at::kFloat || st == at::kDouble) {
        auto step = [&](double v, double toward) {
          at::TensorOptions o = at::TensorOptions().dtype(st);
          return at::nextafter(at::scalar_tensor(v, o), at::scalar_tensor(toward, o)).item<double>();
        };
        lo = std::min(lo, step(l0, -inf));
        hi = std::max(hi, step(h0, inf));
      }
    }
    TORCH_CHECK(std::isfinite(lo) && std::isfinite(hi), "torch.histc: range of [", lo, ", ", hi,
                "] is not finite");
    TORCH_CHECK(lo < hi, "torch.histc: max must be larger than min");
  }
  eager::lowering_fallback(op, stack);
}

// The boxed call's argument named `name` on the stack, or nullptr.
c10::IValue* stack_arg(const c10::OperatorHandle& op, torch::jit::Stack* stack, const char* name) {
  const auto& sargs = op.schema().arguments();
  size_t base = stack->size() - sargs.size();
  for (size_t i = 0; i < sargs.size(); ++i)
    if (sargs[i].name() == name) return &(*stack)[base + i];
  return nullptr;
}

// The *_ex linear-algebra ops with check_errors=True raise at the call on
// CPU, with a message that names the failing order and batch element. The
// lowering's in-program check (kept for compiled graphs) can do neither, so
// eager runs the op without it, reads `info` and raises as CPU does.
void linalg_ex_checked(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  c10::IValue* flag = stack_arg(op, stack, "check_errors");
  if (!flag || !flag->toBool()) {
    eager::lowering_fallback(op, stack);
    return;
  }
  bool is_matrix = (*stack)[stack->size() - op.schema().arguments().size()].toTensor().dim() == 2;
  *flag = false;
  eager::lowering_fallback(op, stack);
  const auto& rets = op.schema().returns();
  const std::string& name = op.schema().name();
  const char* api = name == "aten::linalg_inv_ex"           ? "linalg.inv_ex"
                    : name == "aten::linalg_cholesky_ex"    ? "linalg.cholesky_ex"
                    : name == "aten::linalg_lu_factor_ex"   ? "torch.linalg.lu_factor_ex"
                                                            : "torch.linalg.solve_ex";
  for (size_t j = 0; j < rets.size(); ++j)
    if (rets[j].name() == "info")
      at::_linalg_check_errors((*stack)[stack->size() - rets.size() + j].toTensor(), api, is_matrix);
}

// cholesky (deprecated) as CPU composes it: the factor from linalg_cholesky_ex,
// then a host read of info, so a matrix that is not positive-definite raises
// at the call (the lowering's in-program check, kept for compiled graphs,
// raised at the next host read).
at::Tensor cholesky_checked(const at::Tensor& self, bool upper) {
  auto [factor, info] = at::linalg_cholesky_ex(self, upper, /*check_errors=*/false);
  at::_linalg_check_errors(info, "cholesky", self.dim() == 2);
  return factor;
}

// nn.EmbeddingBag(sparse=True)'s backward makes a sparse gradient, which tpu
// has not; PyTorch's Meta kernel for it (run before any lowering) fails on
// nonzero with an unrelated message, so the refusal comes first.
void embedding_bag_backward_checked(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  c10::IValue* sparse = stack_arg(op, stack, "sparse");
  TORCH_CHECK_NOT_IMPLEMENTED(!sparse || !sparse->toBool(),
                              "torch_pjrt: sparse tensors are not supported on device tpu: "
                              "nn.EmbeddingBag(sparse=True) makes one for the weight's gradient; use "
                              "sparse=False (a dense gradient) on tpu.");
  eager::lowering_fallback(op, stack);
}

// CPU's nll_loss takes a uint8 (Byte) target as well as a Long one;
// PyTorch's Meta function for the backward (a scatter) takes Long only, so
// the target is widened first.
void nll_loss_backward_byte_target(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  c10::IValue* target = stack_arg(op, stack, "target");
  if (target && target->isTensor() && target->toTensor().scalar_type() == at::kByte)
    *target = target->toTensor().to(at::kLong);
  eager::lowering_fallback(op, stack);
}

// normal_ of an integer or bool tensor: CPU's kernel dispatch fails with
// NotImplementedError after returning an empty tensor untouched; PyTorch's
// Meta function (run before any lowering) raises a RuntimeError instead.
// (torch.randn(..., dtype=torch.int64) is empty + normal_.)
void normal_checked(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const at::Tensor& self = (*stack)[stack->size() - op.schema().arguments().size()].toTensor();
  if (!at::isFloatingType(self.scalar_type()) && !at::isComplexType(self.scalar_type())) {
    TORCH_CHECK_NOT_IMPLEMENTED(self.numel() == 0, "\"normal_kernel_cpu\" not implemented for '",
                                c10::toString(self.scalar_type()), "'");
    at::Tensor same = self;
    torch::jit::drop(*stack, op.schema().arguments().size());
    torch::jit::push(*stack, same);
    return;
  }
  eager::lowering_fallback(op, stack);
}

// The fused attention's backward with an undefined output gradient (the
// output unused, or gradcheck's undefined-grad check): no gradients, as
// PyTorch's math attention gives, rather than a lowering of a missing tensor.
void attention_backward_undefined_grad(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  size_t n = op.schema().arguments().size();
  if ((*stack)[stack->size() - n].isTensor() && (*stack)[stack->size() - n].toTensor().defined()) {
    eager::lowering_fallback(op, stack);
    return;
  }
  torch::jit::drop(*stack, n);
  for (size_t i = 0; i < op.schema().returns().size(); ++i) torch::jit::push(*stack, at::Tensor());
}

// addr on tpu is PyTorch's composite (math_addr), which skips the scalar
// checks CPU's and CUDA's kernels make; they are made here first.
void check_addr_scalars(const at::Tensor& self, const at::Tensor& vec1, const at::Tensor& vec2,
                        const at::Scalar& beta, const at::Scalar& alpha) {
  at::ScalarType dtype = at::promoteTypes(at::promoteTypes(self.scalar_type(), vec1.scalar_type()), vec2.scalar_type());
  for (auto [scalar, name] : {std::pair<const at::Scalar&, const char*>{beta, "beta"}, {alpha, "alpha"}}) {
    TORCH_CHECK(!scalar.isBoolean() || dtype == at::kBool, "Boolean ", name, " only supported for Boolean results.");
    TORCH_CHECK(at::isFloatingType(dtype) || at::isComplexType(dtype) || scalar.isIntegral(true),
                "For integral input tensors, argument ", name, " must not be a floating point number.");
  }
}

at::Tensor addr(const at::Tensor& self, const at::Tensor& vec1, const at::Tensor& vec2, const at::Scalar& beta,
                const at::Scalar& alpha) {
  check_addr_scalars(self, vec1, vec2, beta, alpha);
  return at::native::math_addr(self, vec1, vec2, beta, alpha);
}

at::Tensor& addr_out(const at::Tensor& self, const at::Tensor& vec1, const at::Tensor& vec2, const at::Scalar& beta,
                     const at::Scalar& alpha, at::Tensor& out) {
  check_addr_scalars(self, vec1, vec2, beta, alpha);
  return at::native::math_addr_out(self, vec1, vec2, beta, alpha, out);
}

at::Tensor masked_select(const at::Tensor& self, const at::Tensor& mask) {
  return at::masked_select(self.cpu(), mask.cpu()).to(self.device());
}

at::Tensor& set_source_storage(at::Tensor& self, c10::Storage source, c10::SymInt offset,
                               c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  // CPU's checks and messages (offset, size/stride lengths, devices); no
  // stride given means contiguous, as in CPU's set_.
  at::native::checkSetStorage(self, source, offset, size, stride, /*check_offset_in_bounds=*/false);
  std::vector<c10::SymInt> contiguous;
  if (!stride.data() || (stride.empty() && !size.empty())) {
    contiguous.resize(size.size(), c10::SymInt(1));
    for (int64_t i = static_cast<int64_t>(size.size()) - 2; i >= 0; --i)
      contiguous[i] = contiguous[i + 1] * size[i + 1].max(c10::SymInt(1));
    stride = contiguous;
  }
  self.unsafeGetTensorImpl()->set_sizes_and_strides(size, stride, offset);
  // As CPU's set_: a view past the storage's end grows the storage.
  if (self.numel() > 0) {
    size_t needed = at::detail::computeStorageNbytes(self.sizes(), self.strides(), self.itemsize(),
                                                     self.storage_offset());
    if (needed > self.storage().nbytes()) {
      TORCH_CHECK(self.storage().resizable(), "Trying to resize storage that is not resizable");
      DeviceLock lock;
      grow_storage(self, needed);
    }
  }
  return self;
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& src) {
  return set_source_storage(self, src.storage(), src.sym_storage_offset(), src.sym_sizes(), src.sym_strides());
}

at::Tensor& set_storage_only(at::Tensor& self, c10::Storage source) {
  int64_t n = static_cast<int64_t>(source.nbytes()) / self.itemsize();
  std::vector<c10::SymInt> size{c10::SymInt(n)}, stride{c10::SymInt(1)};
  return set_source_storage(self, std::move(source), c10::SymInt(0), size, stride);
}

// _scaled_mm.out: the functional op (lowered), written into out, with CPU's
// rule: out_dtype, when given, must be out's dtype. (PyTorch has no Meta
// kernel for the out= form, which the executor would need.)
at::Tensor& scaled_mm_out(const at::Tensor& self, const at::Tensor& mat2, const at::Tensor& scale_a,
                          const at::Tensor& scale_b, const std::optional<at::Tensor>& bias,
                          const std::optional<at::Tensor>& scale_result, std::optional<at::ScalarType> out_dtype,
                          bool use_fast_accum, at::Tensor& out) {
  TORCH_CHECK_VALUE(!out_dtype || *out_dtype == out.scalar_type(), "out_dtype must match output matrix type");
  at::Tensor r = at::_scaled_mm(self, mat2, scale_a, scale_b, bias, scale_result,
                                out_dtype ? out_dtype : std::optional<at::ScalarType>(out.scalar_type()), use_fast_accum);
  at::native::resize_output(out, r.sizes());
  out.copy_(r);
  return out;
}

// Autograd's and functorch's "efficient" zeros: a dense tpu zero tensor
// (made inside its consumer's program, see param_for). CPU's kernel would
// make a data-less ZeroTensor on the host, copied over and warned about.
at::Tensor efficient_zeros(c10::SymIntArrayRef size, std::optional<at::ScalarType> dtype,
                           std::optional<at::Layout> layout, std::optional<at::Device> device,
                           std::optional<bool> pin_memory) {
  return at::zeros_symint(size, at::TensorOptions().dtype(dtype).layout(layout).device(device));
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage s(c10::Storage::use_byte_size_t(), 0, allocator(), true);
  return set_storage_only(self, s);
}

}  // namespace

// CUDA code marks a tensor used on a side stream so its caching allocator does
// not reuse the memory early (FSDP, communication hooks). PJRT buffers stay
// alive while work that reads them is queued, so there is nothing to record.
void record_stream(at::Tensor& self, c10::Stream stream) {
  TORCH_CHECK(stream.device_type() == self.device().type(), "record_stream: expected a stream of ", self.device(),
              ", got one of ", stream.device());
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("record_stream", record_stream);
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", at::native::as_strided_tensorimpl);
  m.impl("view", at::native::view);
  m.impl("_reshape_alias", at::native::_reshape_alias);
  m.impl("unfold", at::native::unfold);
  m.impl("resize_", resize_);
  m.impl("copy_", copy_);
  m.impl("_copy_from", _copy_from);
  m.impl("_copy_from_and_resize", _copy_from_and_resize);
  m.impl("_local_scalar_dense", local_scalar_dense);
  m.impl("_to_cpu", to_cpu);
  m.impl("nonzero", nonzero);
  m.impl("repeat_interleave.Tensor", repeat_interleave_indices);
  m.impl("nonzero.out", torch::CppFunction::makeFromBoxedFunction<&nonzero_out>());
  for (const char* op : {"index.Tensor", "index.Tensor_out", "_unsafe_index.Tensor", "index_put", "index_put_",
                         "_index_put_impl_", "_unsafe_index_put"})
    m.impl(op, torch::CppFunction::makeFromBoxedFunction<&with_device_indices>());
  m.impl("masked_select", masked_select);
  m.impl("equal", equal);
  m.impl("histc", torch::CppFunction::makeFromBoxedFunction<&histc_checked>());
  m.impl("addr", addr);
  m.impl("_scaled_dot_product_fused_attention_overrideable_backward",
         torch::CppFunction::makeFromBoxedFunction<&attention_backward_undefined_grad>());
  m.impl("normal_", torch::CppFunction::makeFromBoxedFunction<&normal_checked>());
  for (const char* op : {"nll_loss_backward", "nll_loss_backward.grad_input"})
    m.impl(op, torch::CppFunction::makeFromBoxedFunction<&nll_loss_backward_byte_target>());
  m.impl("_embedding_bag_backward", torch::CppFunction::makeFromBoxedFunction<&embedding_bag_backward_checked>());
  m.impl("addr.out", addr_out);
  m.impl("histc.out", torch::CppFunction::makeFromBoxedFunction<&histc_checked>());
  for (const char* op : {"linalg_inv_ex", "linalg_inv_ex.inverse", "linalg_cholesky_ex", "linalg_cholesky_ex.L",
                         "linalg_lu_factor_ex", "linalg_lu_factor_ex.out", "_linalg_solve_ex", "_linalg_solve_ex.result"})
    m.impl(op, torch::CppFunction::makeFromBoxedFunction<&linalg_ex_checked>());
  m.impl("cholesky", cholesky_checked);
  // PyTorch's CompositeExplicitAutograd mode_out accepts CPU, CUDA and XPU
  // only: the out= form takes the fallback's path as the functional one does.
  m.impl("mode.values", torch::CppFunction::makeFromBoxedFunction<&eager::lowering_fallback>());
  m.impl("set_.source_Storage_storage_offset", set_source_storage);
  m.impl("set_.source_Tensor", set_source_tensor);
  m.impl("set_.source_Storage", set_storage_only);
  m.impl("set_", set_empty);
  m.impl("_efficientzerotensor", efficient_zeros);
  m.impl("_scaled_mm.out", scaled_mm_out);
  m.impl("is_set_to", at::native::is_set_to);  // (the CPU fallback compared host copies)
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&eager::lowering_fallback>());
}

}  // namespace torch_pjrt::device

// Ops without a lowering run on the CPU (PyTorch's cpu_fallback), warn once,
// and are counted; TORCH_PJRT_FALLBACK=error makes them NotImplementedError.
#include "eager/cpu_fallback.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/native/CPUFallback.h>
#include <c10/util/Exception.h>

#include <mutex>
#include <vector>
#include <optional>

#include "device/current_device.h"
#include "device/generator.h"
#include "eager/cpu_check.h"
#include "eager/cpu_threads.h"
#include "eager/env.h"
#include "eager/fused.h"
#include "eager/op_instance.h"
#include "runtime/pjrt_runtime.h"

namespace torch_pjrt::eager {
namespace {

std::mutex g_fallback_mutex;
std::map<std::string, int64_t> g_fallback_counts;

bool fallback_is_error() {
  static bool error = env_choice("TORCH_PJRT_FALLBACK", "cpu", {"cpu", "error"}) == "error";
  return error;
}

bool is_generator_arg(const c10::Argument& a) {
  c10::TypePtr t = a.type();
  if (auto o = t->cast<c10::OptionalType>()) t = o->getElementType();
  return t->kind() == c10::TypeKind::GeneratorType;
}

// The tpu device a fallback op works on: its first tpu tensor, else its
// device= argument (randperm), else the current device; nullopt when it
// names no tpu at all (a CPU op reaches here only through a tpu generator).
std::optional<int> fallback_device(c10::ArrayRef<c10::IValue> args) {
  for (const c10::IValue& v : args) {
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().device().type() == c10::DeviceType::PrivateUse1)
      return v.toTensor().device().index();
    if (v.isTensorList())
      for (const at::Tensor& t : v.toTensorList())
        if (t.defined() && t.device().type() == c10::DeviceType::PrivateUse1) return t.device().index();
    if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1)
      return v.toDevice().has_index() ? v.toDevice().index() : device::current_device();
  }
  return std::nullopt;
}

// CPU kernels take CPU generators only. A random op run here draws from the
// tpu generator it was given, or from its device's default one (so that
// torch.tpu.manual_seed governs it, as it does lowered random ops): a CPU
// generator runs the kernel from that generator's state, which is written
// back after. (The tpu generator has CPU's engine and state format:
// device/hooks.cpp; so the numbers are CPU's for the same seed.)
class TpuGeneratorsOnCpu {
 public:
  TpuGeneratorsOnCpu(const c10::FunctionSchema& schema, torch::jit::Stack* stack) {
    const auto& sargs = schema.arguments();
    size_t base = stack->size() - sargs.size();
    for (size_t i = 0; i < sargs.size(); ++i) {
      if (!is_generator_arg(sargs[i])) continue;
      c10::IValue& v = (*stack)[base + i];
      std::optional<int> dev = fallback_device(torch::jit::last(*stack, sargs.size()));
      at::Generator tpu;
      if (v.isGenerator() && v.toGenerator().defined() && !dev) {
        // A CPU op given a tpu generator (dispatched here by the generator's key): CPU's error.
        TORCH_CHECK(v.toGenerator().device().type() != c10::DeviceType::PrivateUse1,
                    "Expected a 'cpu' device type for generator but found 'tpu'");
        continue;
      }
      if (!dev) continue;
      if (v.isGenerator() && v.toGenerator().defined()) {
        tpu = v.toGenerator();
        // (As lowered random ops and CUDA's kernels: a CPU generator is refused.)
        TORCH_CHECK(tpu.device().type() == c10::DeviceType::PrivateUse1,
                    "torch_pjrt: expected a tpu generator, got one for ", tpu.device());
      } else if (const auto& key = device::forced_rng_key()) {
        // Under a forced key (checkpointing's recomputation, rng_state.py):
        // a generator seeded from it, so both runs draw the same; the
        // device's generator does not move (as for a lowered op).
        v = at::detail::createCPUGenerator(key->first ^ key->second);
        continue;
      } else {
        tpu = device::default_generator(*dev);
      }
      at::Generator cpu = at::detail::createCPUGenerator();
      {
        std::lock_guard<std::mutex> lock(tpu.mutex());
        cpu.set_state(tpu.get_state());
      }
      pairs_.emplace_back(tpu, cpu);
      v = cpu;
    }
  }
  ~TpuGeneratorsOnCpu() {
    for (auto& [tpu, cpu] : pairs_) {
      std::lock_guard<std::mutex> lock(tpu.mutex());
      tpu.set_state(cpu.get_state());
    }
  }

 private:
  std::vector<std::pair<at::Generator, at::Generator>> pairs_;
};

}  // namespace

// What PyTorch's generated device check (ATen/core/adaption.cpp) raises on
// CUDA for an op given tensors on two devices. The CPU kernel would
// otherwise write into a CPU out= tensor, or read a CPU operand, and succeed.
void read_fallback_setting() { fallback_is_error(); }

void check_fallback_devices(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args) {
  const auto& sargs = op.schema().arguments();
  std::optional<c10::Device> common;
  auto visit_all = [&](auto&& fn) {
    for (size_t i = 0; i < args.size() && i < sargs.size(); ++i) {
      const c10::IValue& v = args[i];
      if (v.isTensor()) {
        fn(v.toTensor(), i);
      } else if (v.isTensorList()) {
        for (const at::Tensor& t : v.toTensorList()) fn(t, i);
      } else if (v.isList()) {
        for (const c10::IValue& e : v.toListRef())
          if (e.isTensor()) fn(e.toTensor(), i);
      }
    }
  };
  visit_all([&](const at::Tensor& t, size_t) {
    if (!common && t.defined() && t.device().type() == c10::DeviceType::PrivateUse1) common = t.device();
  });
  if (!common) return;
  std::string method = op_display_name(op.schema());
  // Read arguments too, as for lowered ops (op_instance.cpp): a CPU tensor
  // may stand for a scalar (0-d); packed sequences keep their lengths and
  // batch sizes on the host by design. Otherwise the CPU kernel would take a
  // CPU operand as it is and return a CPU result.
  visit_all([&](const at::Tensor& t, size_t i) {
    if (!t.defined() || is_write(sargs[i]) || t.device() == *common) return;
    if (t.device().is_cpu() && (t.dim() == 0 || sargs[i].name() == "lengths" || sargs[i].name() == "batch_sizes"))
      return;
    TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ", *common,
                " and ", t.device(), "!");
  });
  visit_all([&](const at::Tensor& t, size_t i) {
    if (!t.defined() || !is_write(sargs[i]) || t.device() == *common) return;
    TORCH_CHECK(false, "Expected all tensors to be on the same device, but got ", sargs[i].name(), " is on ",
                t.device(), ", different from other tensors on ", *common, " (when checking argument in method ",
                method, ")");
  });
}

void enter_cpu_fallback(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args, bool dtype_limited) {
  check_fallback_devices(op, args);
  std::string name = op_display_name(op.schema());
  TORCH_CHECK_NOT_IMPLEMENTED(!fallback_is_error(), "torch_pjrt: ", name,
                              " has no lowering for device tpu (plugin '", runtime::Runtime::get().info().name,
                              "') and TORCH_PJRT_FALLBACK=error forbids running it on CPU; "
                              "see torch_pjrt.supported_ops()");
  bool first;
  {
    std::lock_guard<std::mutex> lock(g_fallback_mutex);
    first = g_fallback_counts[name]++ == 0;
  }
  if (!first) return;
  // (TORCH_WARN is a statement block: no if/else chain around it.)
  if (dtype_limited) {
    TORCH_WARN("torch_pjrt: ", name, " has no lowering for device tpu for these dtypes (", dtypes_of(args),
               "); it runs on the CPU (inputs copied to the host and results back). Counted in "
               "torch_pjrt.metrics()['cpu_fallbacks'].");
    return;
  }
  TORCH_WARN("torch_pjrt: ", name, " has no lowering for device tpu; it runs on the CPU "
             "(inputs copied to the host and results back). Counted in "
             "torch_pjrt.metrics()['cpu_fallbacks'].");
}

void run_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack, bool dtype_limited) {
  FlushReason reason("cpu_fallback");  // its inputs' host copies run a fused trace that owes them
  enter_cpu_fallback(op, torch::jit::last(*stack, op.schema().arguments().size()), dtype_limited);
  SerialCpuOffHome serial;
  // A written argument with a lazy conj/neg bit (ops that handle conj views
  // themselves get them) would not receive the write-back through PyTorch's
  // math-bits fallback: the kernel writes a plain temporary, copied in after.
  const auto& sargs = op.schema().arguments();
  size_t base = stack->size() - sargs.size();
  std::vector<std::pair<at::Tensor, at::Tensor>> bits;  // (argument, temporary)
  for (size_t i = 0; i < sargs.size(); ++i) {
    c10::IValue& v = (*stack)[base + i];
    if (!is_write(sargs[i]) || !v.isTensor()) continue;
    const at::Tensor& t = v.toTensor();
    if (!t.defined() || !(t.is_conj() || t.is_neg())) continue;
    bits.emplace_back(t, t.resolve_conj().resolve_neg());
    v = bits.back().second;
  }
  {
    TpuGeneratorsOnCpu generators(op.schema(), stack);
    at::native::cpu_fallback(op, stack);
  }
  // A sparse result (to_sparse_csr and the other compressed layouts reach
  // here: COO is refused at its own constructor, device/sparse.cpp).
  for (size_t r = stack->size() - op.schema().returns().size(); r < stack->size(); ++r) {
    const c10::IValue& v = (*stack)[r];
    if (!v.isTensor() || !v.toTensor().defined() || v.toTensor().layout() == c10::kStrided) continue;
    TORCH_CHECK_NOT_IMPLEMENTED(false, "torch_pjrt: sparse tensors are not supported on device tpu (",
                                op_display_name(op.schema()), " returns a ", v.toTensor().layout(),
                                " tensor); keep sparse tensors on the CPU");
  }
  for (auto& [arg, tmp] : bits) {
    if (!arg.sizes().equals(tmp.sizes())) arg.resize_(tmp.sizes());
    arg.copy_(tmp);
    for (size_t r = stack->size() - op.schema().returns().size(); r < stack->size(); ++r)
      if ((*stack)[r].isTensor() && (*stack)[r].toTensor().is_same(tmp)) (*stack)[r] = arg;
  }
}


std::map<std::string, int64_t> cpu_fallback_counts() {
  std::lock_guard<std::mutex> lock(g_fallback_mutex);
  return g_fallback_counts;
}

}  // namespace torch_pjrt::eager

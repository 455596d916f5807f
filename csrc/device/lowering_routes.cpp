// Routes ops that PyTorch implements as CompositeExplicitAutograd (a generic
// kernel made of other ops) to the lowering registry when a lowering exists,
// so that one registered lowering is all a new op needs. Ops with a
// CompositeImplicitAutograd kernel are left alone: a backend kernel would
// take their autograd formula away; unless PyTorch's own backends have a
// kernel and the op its own autograd kernel (silu_backward, mish_backward:
// CPU computes them in float32 for bfloat16, their math decompositions round
// every step).
// Functional and in-place forms of
// structured ops (CompositeExplicitAutogradNonFunctional: empty output + the
// out= kernel) are routed too: that path's TensorIterator set-up, output
// allocation and boxed out= call cost ~0.4 us per op, a third of a small
// op's launch on CPU; the plan cache decides the output instead. Their metas
// still come from PyTorch's C++ structured meta functions, not the Python
// ones on their Meta key (plan_build.cpp, run_meta).
// TORCH_PJRT_ROUTE_STRUCTURED=0 leaves them on PyTorch's path (A/B in
// benchmarks/fused_eager.py --launch-only). Ops that take a `device` argument (factories,
// _to_copy) keep PyTorch's kernels: those move data between devices, which the
// device glue does; their lowerings serve compiled graphs.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <cstdlib>
#include <memory>
#include <set>
#include <string>

#include "device/lowering_routes.h"
#include "eager/executor.h"
#include "lowering/registry.h"

namespace torch_pjrt::device {
namespace {

// The element op of _foreach_X / _foreach_X_ and the base of X_ / X.out.
std::string base_name(std::string name) {
  if (name.rfind("_foreach_", 0) == 0) name = name.substr(9);
  if (name.size() > 1 && name.back() == '_' && name.compare(0, 2, "__") != 0) name.pop_back();
  return name;
}

}  // namespace

std::vector<std::string> route_composite_ops_to_lowerings() {
  static std::vector<std::string> routed;
  static bool done = false;
  if (done) return routed;
  done = true;
  std::set<std::string> lowered;
  for (const auto& n : lowering::registered_lowerings()) lowered.insert(n.substr(0, n.find('.')));
  const char* env = std::getenv("TORCH_PJRT_ROUTE_STRUCTURED");
  bool route_structured = !(env && std::string(env) == "0");
  static auto* library = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1,
                                            __FILE__, __LINE__);
  // Lowerings for compiled graphs only: eager keeps PyTorch's kernel.
  // (_linalg_check_errors reads `info` on the host and raises CPU's exact
  // message, with the failing order and batch element; in a graph it is a
  // device check with a fixed message.)
  static const std::set<std::string> graph_only = {"_linalg_check_errors"};
  for (const c10::OperatorName& op_name : c10::Dispatcher::singleton().getAllOpNames()) {
    if (op_name.name.rfind("aten::", 0) != 0) continue;
    std::string name = op_name.name.substr(6);
    if (!lowered.count(base_name(name)) || graph_only.count(name)) continue;
    auto handle = c10::Dispatcher::singleton().findOp(op_name);
    if (!handle) continue;
    bool structured = route_structured &&
                      handle->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional);
    bool implicit = handle->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd);
    bool native_elsewhere = implicit && handle->hasKernelForDispatchKey(c10::DispatchKey::CPU) &&
                            handle->hasKernelForDispatchKey(c10::DispatchKey::Autograd);
    if (handle->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1) || (implicit && !native_elsewhere) ||
        !(native_elsewhere || structured || handle->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd)))
      continue;
    bool takes_device = false;
    for (const auto& a : handle->schema().arguments()) takes_device |= a.name() == "device";
    if (takes_device) continue;
    std::string full = name + (op_name.overload_name.empty() ? "" : "." + op_name.overload_name);
    library->impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<&eager::lowering_fallback>());
    routed.push_back(full);
  }
  return routed;
}

}  // namespace torch_pjrt::device

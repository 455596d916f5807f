#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "device/dtype_map.h"
#include "device/generator.h"
#include "eager/fused.h"
#include "eager/step_capture.h"
#include "eager/plan.h"
#include "runtime/constant_buffers.h"

namespace torch_pjrt::eager {

using device::StorageBuffer;
using lowering::DType;

namespace {
runtime::Runtime& rt() { return runtime::Runtime::get(); }
}  // namespace

c10::SmallVector<double, 8> scalar_values(const Plan& plan, const OpInstance& inst) {
  c10::SmallVector<double, 8> host;
  host.reserve(inst.scalars.size());
  for (const auto& s : inst.scalars)
    if (!s.from_arg || plan.dynamic_floats) host.push_back(s.value);
  return host;
}

c10::SmallVector<int64_t, 8> offset_values(const OpInstance& inst) {
  c10::SmallVector<int64_t, 8> host;
  host.reserve(inst.slots.size());
  for (const Slot& s : inst.slots) host.push_back(s.tensor.storage_offset());
  return host;
}

std::pair<int64_t, int64_t> rng_values(c10::ArrayRef<c10::IValue> args, int device) {
  std::optional<at::Generator> gen;
  for (const auto& v : args)
    if (v.isGenerator()) gen = v.toGenerator();
  auto key = device::next_rng_key(gen, device);
  return {static_cast<int64_t>(key.first), static_cast<int64_t>(key.second)};
}

// Small packs come from the table of constant buffers (most repeat: alpha,
// a learning rate, offset 0), so a call makes no host-to-device copy.
runtime::BufferPtr scalar_pack_buffer(const double* v, int64_t n, int device, bool internal) {
  if (scalar_pack_dtype() == DType::F32) {
    c10::SmallVector<float, 8> narrow(v, v + n);
    return runtime::constant_buffer(narrow.data(), PJRT_Buffer_Type_F32, {n}, device, internal);
  }
  return runtime::constant_buffer(v, PJRT_Buffer_Type_F64, {n}, device, internal);
}

runtime::BufferPtr s64_buffer(const int64_t* v, int64_t n, int device, bool internal) {
  return runtime::constant_buffer(v, PJRT_Buffer_Type_S64, {n}, device, internal);
}

c10::IValue make_return(const ReturnPlan& rp, const OpInstance& inst,
                        c10::function_ref<c10::IValue(const ReturnPlan&)> fresh) {
  switch (rp.kind) {
    case ReturnPlan::Undefined:
      return at::Tensor();
    case ReturnPlan::Constant:
      return rp.constant;
    case ReturnPlan::Aliased:
      return inst.slots[rp.slot].tensor;
    case ReturnPlan::Fresh:
    case ReturnPlan::HostScalar:
      return fresh(rp);
  }
  return c10::IValue();
}

void push_returns(const Plan& plan, const OpInstance& inst, torch::jit::Stack* stack,
                  c10::function_ref<c10::IValue(const ReturnPlan&)> make) {
  size_t next = 0;
  for (int arity : plan.return_arity) {
    if (arity < 0) {
      stack->push_back(make_return(plan.returns[next++], inst, make));
    } else {
      c10::List<at::Tensor> list;
      for (int k = 0; k < arity; ++k) list.push_back(make_return(plan.returns[next++], inst, make).toTensor());
      stack->push_back(std::move(list));
    }
  }
}

void run_plan(const Plan& plan, const c10::FunctionSchema& schema, OpInstance& inst,
              c10::ArrayRef<c10::IValue> args, torch::jit::Stack* stack, size_t nargs) {
  int device = inst.device >= 0 ? inst.device : 0;
  std::vector<runtime::BufferPtr> outputs;
  if (plan.exe) {
    FlushReason reason("strict_op");  // a pending (fused) input is computed first
    std::vector<runtime::BufferPtr> params;
    params.reserve(plan.params.size() + plan.exe->num_outputs());  // (launch appends the outputs)
    for (const ParamSource& p : plan.params) {
      switch (p.kind) {
        case ParamSource::Storage:
          params.push_back(device::ensure_buffer(*inst.storages[p.storage], p.dtype));
          break;
        case ParamSource::Rng: {
          auto key = rng_values(args, device);
          int64_t host[2] = {key.first, key.second};  // new every call: not kept as a constant
          params.push_back(rt().buffer_from_host(host, PJRT_Buffer_Type_S64, {2}, device));
          break;
        }
        case ParamSource::Scalars: {
          auto host = scalar_values(plan, inst);
          params.push_back(scalar_pack_buffer(host.data(), static_cast<int64_t>(host.size()), device));
          break;
        }
        case ParamSource::Offsets: {
          auto host = offset_values(inst);
          params.push_back(s64_buffer(host.data(), static_cast<int64_t>(host.size()), device));
          break;
        }
        case ParamSource::CheckWord:
          params.push_back(rt().check_word(device));
          break;
      }
    }
    // A storage this op replaces while a fused trace still owes its value:
    // the trace runs first, so its later result cannot overwrite this one.
    for (const Write& w : plan.writes) settle(*inst.storages[w.storage]);
    // The plugin's execute call is made on the launch thread (its outputs
    // come back pending), except in debug mode, which waits for each op.
    outputs = debug_mode() ? rt().execute(*plan.exe, params, device)
                           : rt().launch(plan.exe, std::move(params), device);
    if (plan.check_output >= 0) rt().set_check_word(device, outputs[plan.check_output]);
    if (debug_mode()) {
      // Wait here, so that a device error names this op (and Python's
      // traceback points at the line that called it); failed checks raise here.
      if (plan.check_output >= 0) rt().report_checks(device, /*at_op=*/true);
      try {
        rt().synchronize(device);
      } catch (const std::exception& e) {
        TORCH_CHECK(false, "torch_pjrt: ", op_display_name(schema), " failed on ", tpu_name(device), ": ",
                    e.what());
      }
    }
  }
  for (const Write& w : plan.writes) {
    StorageBuffer* sb = inst.storages[w.storage];
    sb->buffer = outputs[w.output];
    sb->dtype = w.dtype;
  }
  torch::jit::drop(*stack, nargs);
  push_returns(plan, inst, stack, [&](const ReturnPlan& rp) -> c10::IValue {
    if (rp.kind == ReturnPlan::Fresh)
      return device::wrap_buffer(rp.sizes, rp.strides, rp.dtype, device, outputs[rp.output]);
    at::Tensor host = at::empty({}, at::TensorOptions().dtype(rp.dtype));
    capture_host_read("an op that returns a host number");
    rt().buffer_to_host(*outputs[rp.output], host.data_ptr(), host.nbytes());
    if (rp.type->kind() == c10::TypeKind::BoolType) return host.item<bool>();
    if (rp.type->kind() == c10::TypeKind::IntType) return host.item<int64_t>();
    return host.item<double>();
  });
}

}  // namespace torch_pjrt::eager

#include "graph/graph_program.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <c10/util/Exception.h>

#include "device/device_lock.h"
#include "device/dtype_map.h"
#include "device/matmul_precision.h"
#include "device/generator.h"
#include "device/storage.h"
#include "eager/executor.h"
#include "eager/fused.h"
#include "eager/op_instance.h"
#include "eager/plan.h"
#include "eager/step_capture.h"
#include "runtime/constant_buffers.h"
#include "runtime/program_cache.h"

namespace torch_pjrt::graph {

using lowering::Builder;
using lowering::DType;
using lowering::StridedView;
using lowering::TensorType;
using lowering::Value;

int GraphProgram::add(const Value& v) {
  values_.push_back(v);
  return static_cast<int>(values_.size()) - 1;
}

int GraphProgram::input(int input_index, const TensorType& type) {
  // Storages hold flat arrays; the program reshapes.
  Value flat = b_.param(TensorType{type.dtype, {type.numel()}});
  params_.push_back(ParamSource{ParamSource::Input, input_index});
  return add(b_.reshape(flat, type.shape));
}

int GraphProgram::input_view(int input_index, const at::Tensor& t) {
  device::DeviceLock lock;
  device::StorageBuffer& sb = device::storage_of(t);
  DType dt = device::to_dtype(t.scalar_type());
  // The element type ensure_buffer would give a storage never written, without
  // making it: lowering allocates nothing (readiness captures huge models so).
  DType st = sb.buffer || sb.pending >= 0 ? sb.dtype : sb.nbytes % lowering::itemsize(dt) == 0 ? dt : DType::U8;
  int64_t numel = static_cast<int64_t>(sb.nbytes) / lowering::itemsize(st);
  ParamSource src{ParamSource::Storage, input_index, {}, st};
  src.storage_numel = numel;
  src.view = eager::view_of(t);
  Value flat = lowering::reinterpret_flat(b_, b_.param(TensorType{st, {numel}}), dt);
  params_.push_back(src);
  // The offset is a runtime input: a view at another offset (a batch sliced
  // out of one long tensor) runs the same program.
  Value offset = b_.param(TensorType{DType::I64, {}});
  params_.push_back(ParamSource{ParamSource::Offset, input_index});
  int id = add(lowering::read_strided(b_, flat, src.view, offset));
  storage_reads_[id] = StorageRead{flat, offset};
  return id;
}

bool covers_storage(const at::Tensor& t) {
  device::StorageBuffer& sb = device::storage_of(t);
  DType dt = device::to_dtype(t.scalar_type());
  return sb.nbytes % lowering::itemsize(dt) == 0 &&
         eager::view_of(t).covers_whole(static_cast<int64_t>(sb.nbytes) / lowering::itemsize(dt));
}

std::vector<int> GraphProgram::cpu_inputs(const std::vector<std::pair<int, TensorType>>& inputs) {
  std::vector<int> ids(inputs.size(), -1);
  std::vector<DType> dtypes;
  for (const auto& in : inputs)
    if (std::find(dtypes.begin(), dtypes.end(), in.second.dtype) == dtypes.end()) dtypes.push_back(in.second.dtype);
  for (DType dt : dtypes) {
    ParamSource src{ParamSource::CpuPack, -1, {}, dt};
    int64_t total = 0;
    for (const auto& in : inputs)
      if (in.second.dtype == dt) total += in.second.numel();
    Value pack = b_.param(TensorType{dt, {total}});
    int64_t at = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const TensorType& t = inputs[i].second;
      if (t.dtype != dt) continue;
      src.inputs.push_back(inputs[i].first);
      ids[i] = add(b_.reshape(b_.slice(pack, {at}, {at + t.numel()}), t.shape));
      at += t.numel();
    }
    params_.push_back(src);
  }
  return ids;
}

GraphProgram::GraphProgram() { b_.set_f32_precision(device::f32_matmul_precision()); }

GraphProgram::CallResult GraphProgram::call(const std::string& name, const std::string& overload,
                                            std::vector<lowering::Arg> args,
                                            const std::vector<std::optional<TensorType>>& outputs,
                                            std::optional<int> rng_id) {
  const lowering::LoweringInfo* info = lowering::find_lowering(name, overload);
  if (!info) throw std::runtime_error("torch_pjrt: no lowering for aten::" + name + "." + overload);
  std::optional<Value> rng;
  if (info->needs_rng)  // (each its own key per run, as the same op in eager mode)
    rng = values_.at(rng_id ? *rng_id : rng_key());
  lowering::LoweringContext ctx{b_, name, overload, std::move(args), {}, rng};
  ctx.checks_enabled = eager::checks_enabled();
  ctx.default_float = device::to_dtype(c10::get_default_dtype_as_scalartype());
  for (const auto& o : outputs) ctx.outputs.push_back(o ? *o : TensorType{DType::F32, {0}});
  std::vector<Value> res = info->fn(ctx);
  for (const auto& c : ctx.checks) {
    std::string op = "aten::" + name + (overload.empty() ? "" : "." + overload) + " (in a compiled graph)";
    checks_.push_back(Check{c.ok, eager::register_check(op, c), std::nullopt});
  }
  if (res.size() != outputs.size())
    throw std::runtime_error("torch_pjrt: lowering of aten::" + name + " produced " + std::to_string(res.size()) +
                             " results, expected " + std::to_string(outputs.size()));
  CallResult out;
  for (size_t i = 0; i < res.size(); ++i) {
    if (!outputs[i]) {
      out.results.push_back(std::nullopt);
      continue;
    }
    Value v = b_.convert(res[i], outputs[i]->dtype);
    if (v.shape() != outputs[i]->shape) v = b_.broadcast_to(v, outputs[i]->shape);
    out.results.push_back(add(v));
  }
  for (const auto& m : ctx.mutations) out.mutations.emplace_back(m.name, m.index, add(m.value));
  out.read_dynamic = ctx.scalar_value_read;
  return out;
}

int GraphProgram::rng_key() {
  Value key = b_.param(TensorType{DType::I64, {2}});
  params_.push_back(ParamSource{ParamSource::Rng, -1});
  return add(key);
}

int GraphProgram::view(int base, const StridedView& base_view, const StridedView& out_view, DType out_dtype,
                       std::optional<int> shift) {
  const Value& x = values_.at(base);
  if (lowering::numel(out_view.sizes) == 0) return add(b_.zeros(TensorType{out_dtype, out_view.sizes}));
  auto plus_shift = [&](Value at) { return shift ? b_.binary("add", at, values_.at(*shift)) : at; };
  auto storage = storage_reads_.find(base);
  if (storage != storage_reads_.end() && out_dtype == x.dtype()) {
    // A view of an input read from its storage: from the storage, at the
    // input's runtime offset plus the view's offset from the input's.
    const StorageRead& s = storage->second;
    Value at = b_.binary("add", s.offset, b_.constant(lowering::Scalar::from_int(out_view.offset - base_view.offset),
                                                      DType::I64));
    return add(lowering::read_strided(b_, s.flat, out_view, plus_shift(at)));
  }
  // Offsets count elements of each view's own dtype (view_as_real: the base's
  // offset in float32s is twice its offset in complex64s).
  int64_t base_offset = base_view.offset * lowering::itemsize(x.dtype()) / lowering::itemsize(out_dtype);
  StridedView rel = out_view;
  Value flat;
  std::vector<int64_t> perm;
  int64_t n = lowering::numel(base_view.sizes);
  if (lowering::dense_permutation(base_view.sizes, base_view.strides, &perm)) {
    // The base's elements in memory order, from its storage offset on.
    flat = b_.reshape(b_.transpose(x, perm), {n});
    rel.offset = out_view.offset - base_offset;
  } else {
    // An irregular base (gaps, broadcast): lay its elements out in a
    // zero-filled segment of the storage it spans.
    int64_t extent = 1;
    for (size_t d = 0; d < base_view.sizes.size(); ++d)
      extent += (base_view.sizes[d] - 1) * base_view.strides[d];
    StridedView bv = base_view;
    bv.offset = 0;
    flat = lowering::write_strided(b_, b_.zeros(TensorType{x.dtype(), {extent}}), x, bv);
    rel.offset = out_view.offset - base_offset;
  }
  if (out_dtype != x.dtype()) flat = lowering::reinterpret_flat(b_, flat, out_dtype);
  if (shift) return add(lowering::read_strided(b_, flat, rel, plus_shift(b_.constant_int(rel.offset, DType::I64))));
  return add(lowering::read_strided(b_, flat, rel));
}

int GraphProgram::view_scatter(int base, const StridedView& base_view, const StridedView& out_view, int src,
                               std::optional<int> shift) {
  const Value& x = values_.at(base);
  std::vector<int64_t> perm;
  if (!lowering::dense_permutation(base_view.sizes, base_view.strides, &perm))
    throw std::runtime_error("torch_pjrt: a scatter into a view of a tensor with gaps or broadcast dims");
  if (lowering::numel(out_view.sizes) == 0) return base;
  // The base's elements in memory order, the source written where the view
  // reads, then back to the base's logical order.
  lowering::Shape memory_shape;
  for (int64_t d : perm) memory_shape.push_back(base_view.sizes[d]);
  Value flat = b_.reshape(b_.transpose(x, perm), {lowering::numel(base_view.sizes)});
  StridedView rel = out_view;
  rel.offset = out_view.offset - base_view.offset;
  std::optional<Value> at;
  if (shift) at = b_.binary("add", b_.constant_int(rel.offset, DType::I64), values_.at(*shift));
  flat = lowering::write_strided(b_, flat, b_.convert(values_.at(src), x.dtype()), rel, at);
  std::vector<int64_t> inverse(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inverse[perm[i]] = static_cast<int64_t>(i);
  return add(b_.transpose(b_.reshape(flat, memory_shape), inverse));
}

std::string GraphProgram::finish(const std::vector<int>& outputs, const std::vector<std::vector<int64_t>>& strides) {
  std::vector<Value> flat;
  for (size_t i = 0; i < outputs.size(); ++i) {
    Value v = values_.at(outputs[i]);
    std::vector<int64_t> perm;
    if (i < strides.size() && strides[i].size() == v.shape().size() &&
        lowering::dense_permutation(v.shape(), strides[i], &perm))
      v = b_.transpose(v, perm);
    flat.push_back(b_.reshape(v, {v.type.numel()}));
  }
  if (!checks_.empty()) {
    Value word = b_.param(TensorType{DType::I32, {}});
    params_.push_back(ParamSource{ParamSource::CheckWord, -1});
    check_output_ = static_cast<int>(flat.size());
    flat.push_back(fold_checks(word, 0));
  }
  output_types_.clear();
  for (const Value& v : flat) output_types_.push_back(v.type);
  return b_.finish(flat);
}

Value GraphProgram::fold_checks(const Value& word, size_t from) {
  // Front to back through the shared fold (an earlier failure is kept), a
  // control-flow op's computed code taking the place of a fixed one.
  Value folded = word;
  std::vector<std::pair<Value, int>> run;
  for (size_t i = from; i < checks_.size(); ++i) {
    const Check& c = checks_[i];
    if (!c.failed) {
      run.emplace_back(c.ok, c.code);
      continue;
    }
    if (!run.empty()) folded = lowering::fold_checks(b_, folded, run);
    run.clear();
    Value zero = b_.splat(lowering::Scalar::from_int(0), TensorType{DType::I32, {}});
    folded = b_.select(b_.compare(lowering::Cmp::NE, folded, zero), folded, *c.failed);
  }
  return run.empty() ? folded : lowering::fold_checks(b_, folded, run);
}

std::vector<int> GraphProgram::open_region(const std::vector<TensorType>& types, bool loop) {
  OpenRegion r{checks_.size(), loop, eager::checks_enabled(), std::nullopt};
  std::vector<TensorType> all = types;
  if (r.code && loop) all.push_back(TensorType{DType::I32, {}});
  std::vector<Value> args = b_.open_region(all);
  if (r.code && loop) {
    r.code_arg = args.back();
    args.pop_back();
  }
  open_.push_back(r);
  std::vector<int> ids;
  for (const Value& v : args) ids.push_back(add(v));
  return ids;
}

int GraphProgram::close_region(const std::vector<int>& results, bool yields_code) {
  if (open_.empty()) throw std::logic_error("torch_pjrt: close_region without an open region");
  OpenRegion r = open_.back();
  std::vector<Value> yields;
  for (int id : results) yields.push_back(values_.at(id));
  if (r.code && yields_code) {
    Value word = r.code_arg ? *r.code_arg : b_.splat(lowering::Scalar::from_int(0), TensorType{DType::I32, {}});
    yields.push_back(fold_checks(word, r.checks_from));
  } else if (checks_.size() > r.checks_from) {
    throw std::runtime_error("torch_pjrt: a value check (index range, division by zero) in a loop's condition");
  }
  checks_.resize(r.checks_from);  // (their values live in the region)
  open_.pop_back();
  Region out{b_.close_region(yields), {}, r.code};
  for (const Value& v : yields) out.yields.push_back(v.type);
  regions_.push_back(std::move(out));
  return static_cast<int>(regions_.size()) - 1;
}

std::vector<int> GraphProgram::control_results(const std::vector<Value>& results, bool code) {
  std::vector<int> ids;
  for (size_t i = 0; i + (code ? 1 : 0) < results.size(); ++i) ids.push_back(add(results[i]));
  if (code) checks_.push_back(Check{results.back(), 0, results.back()});
  return ids;
}

std::vector<int> GraphProgram::if_op(int pred, int then_region, int else_region) {
  const Region& a = regions_.at(then_region);
  const Region& b = regions_.at(else_region);
  if (a.yields != b.yields || a.code != b.code)
    throw std::runtime_error("torch_pjrt: the branches of a cond yield different types");
  Value p = b_.convert(values_.at(pred), DType::Bool);
  if (!p.shape().empty()) p = b_.reshape(p, {});
  return control_results(b_.op_multi("stablehlo.if", {p}, a.yields, "", a.text + ", " + b.text), a.code);
}

std::vector<int> GraphProgram::while_op(const std::vector<int>& init, int cond_region, int body_region) {
  const Region& c = regions_.at(cond_region);
  const Region& body = regions_.at(body_region);
  std::vector<Value> carried;
  for (int id : init) carried.push_back(values_.at(id));
  if (body.code) carried.push_back(b_.splat(lowering::Scalar::from_int(0), TensorType{DType::I32, {}}));
  std::vector<TensorType> types;
  for (const Value& v : carried) types.push_back(v.type);
  if (body.yields != types || c.yields.size() != 1)
    throw std::runtime_error("torch_pjrt: a while_loop body yields other types than it carries");
  return control_results(b_.op_multi("stablehlo.while", carried, types, "", c.text + ", " + body.text), body.code);
}

void prepare_fused(CompiledGraph& g, const GraphProgram& prog, const std::string& text, const std::string& name) {
  auto plan = std::make_shared<eager::Plan>();
  plan->text = text;
  plan->param_types = prog.param_types();
  plan->output_types = prog.output_types();
  plan->check_output = g.check_output;
  plan->serial = eager::next_plan_serial();
  plan->op_name = "compiled graph '" + name + "'";
  for (const ParamSource& p : g.params) {
    eager::ParamSource e{eager::ParamSource::Storage};
    switch (p.kind) {
      case ParamSource::Offset:
        e.kind = eager::ParamSource::Offsets;
        break;
      case ParamSource::Rng:
        e.kind = eager::ParamSource::Rng;
        break;
      case ParamSource::CheckWord:
        e.kind = eager::ParamSource::CheckWord;
        break;
      default:  // Input, Storage, CpuPack: a buffer
        break;
    }
    plan->params.push_back(e);
  }
  if (plan->params.size() == plan->param_types.size()) g.fused_plan = std::move(plan);
}

void make_resident(CompiledGraph& g, runtime::ExecutablePtr exe) {
  static std::atomic<int64_t> next{0};
  g.cache_key = "graph#" + std::to_string(next++);
  int64_t bytes = std::max<int64_t>(exe->code_bytes(), 64 << 10);
  runtime::ProgramCache::get().put(g.cache_key, std::move(exe), bytes);
}

bool resident(const CompiledGraph& g) { return runtime::ProgramCache::get().find(g.cache_key) != nullptr; }

namespace {

int graph_device(const std::vector<at::Tensor>& inputs, int fallback) {
  int device = -1;
  for (const auto& t : inputs) {
    if (!t.defined() || t.device().type() != c10::DeviceType::PrivateUse1) continue;
    int d = t.device().index() < 0 ? 0 : t.device().index();
    TORCH_CHECK(device < 0 || device == d, "torch_pjrt: a compiled graph got inputs on tpu:", device, " and tpu:", d,
                "; move them to one device");
    device = d;
  }
  return device < 0 ? fallback : device;
}

// A CPU tensor's elements, dense, as a device buffer. (A tpu tensor where a
// CPU one belongs is brought to the host first: its data_ptr is a handle,
// not host memory; such an int pack under set_default_device("tpu") crashed.)
runtime::BufferPtr upload(const at::Tensor& t, int device) {
  at::Tensor c = t.device().is_cpu() ? t.contiguous() : t.to(at::kCPU).contiguous();
  return runtime::Runtime::get().buffer_from_host(c.data_ptr(), device::to_pjrt(device::to_dtype(c.scalar_type())),
                                                  {c.numel()}, device);
}

at::Tensor download(const runtime::BufferPtr& buffer, const OutputSpec& spec) {
  // The program laid the value out in the memory order of its strides (finish()).
  auto options = at::TensorOptions().dtype(device::to_scalar_type(spec.dtype));
  at::Tensor host = spec.strides.empty() ? at::empty(spec.sizes, options)
                                         : at::empty_strided(spec.sizes, spec.strides, options);
  if (host.numel() > 0) runtime::Runtime::get().buffer_to_host(*buffer, host.data_ptr(), host.nbytes());
  return host;
}

// A CpuPack parameter's CPU inputs, concatenated, as one device buffer.
runtime::BufferPtr upload_pack(const ParamSource& p, const std::vector<at::Tensor>& inputs, int device) {
  // A few bytes already of the pack's dtype (step counts, the runtime ints of
  // int_pack): copied into one host array and taken from the constant-buffer
  // table, which skips the transfer (and its wait) when the values repeat.
  auto st = device::to_scalar_type(p.dtype);
  char bytes[runtime::kConstantBufferMaxBytes];
  size_t used = 0;
  bool small = true;
  for (int i : p.inputs) {
    const at::Tensor& t = inputs.at(i);
    size_t n = t.numel() * t.element_size();
    if (t.scalar_type() != st || !t.is_contiguous() || !t.device().is_cpu() || used + n > sizeof(bytes)) {
      small = false;
      break;
    }
    if (n) std::memcpy(bytes + used, t.data_ptr(), n);
    used += n;
  }
  if (small)
    return runtime::constant_buffer(bytes, device::to_pjrt(p.dtype),
                                    {static_cast<int64_t>(used / lowering::itemsize(p.dtype))}, device);
  std::vector<at::Tensor> parts;
  for (int i : p.inputs) parts.push_back(inputs.at(i).reshape({-1}).to(device::to_scalar_type(p.dtype)));
  return upload(at::cat(parts), device);
}

// A dense graph input given as a CPU tensor.
runtime::BufferPtr upload_cpu_input(const ParamSource& p, const at::Tensor& t, int device) {
  TORCH_CHECK(t.device().is_cpu(), "torch_pjrt: compiled graph input ", p.input, " is on ", t.device(),
              "; a tpu graph takes tpu tensors (and CPU scalars)");
  return upload(t, device);
}

bool same_geometry(const ParamSource& p, const device::StorageBuffer& sb, const at::Tensor& t) {
  lowering::StridedView v = eager::view_of(t);
  return sb.dtype == p.dtype && sb.numel() == p.storage_numel && v.sizes == p.view.sizes &&
         v.strides == p.view.strides &&
         (t.numel() == 0 || v.covers_whole(p.storage_numel) == p.view.covers_whole(p.storage_numel));
}

bool on_device(const at::Tensor& t, int device) {
  return t.device().type() == c10::DeviceType::PrivateUse1 && std::max<int>(t.device().index(), 0) == device;
}

// A tpu tensor passed whole as a dense program input: its storage's buffer.
bool whole_storage(const at::Tensor& t) {
  device::StorageBuffer& sb = device::storage_of(t);
  DType dt = device::to_dtype(t.scalar_type());
  return covers_storage(t) && (sb.buffer || sb.pending >= 0 ? sb.dtype == dt : true) &&
         static_cast<int64_t>(sb.nbytes) == t.numel() * lowering::itemsize(dt);
}

enum class Recorded { Yes, No, OtherGeometry };

// Fused eager: the graph's program becomes one step of the trace, its
// results owed by it, when every input and result can be named without a
// host value (no CPU results or mutated CPU inputs, dense inputs whole).
Recorded record(const CompiledGraph& g, const runtime::ExecutablePtr& exe, const std::vector<at::Tensor>& inputs,
                int device, std::vector<at::Tensor>* results) {
  for (const OutputSpec& o : g.outputs)
    if (o.on_cpu) return Recorded::No;
  for (const auto& [input, output] : g.mutations)
    if (!on_device(inputs.at(input), device) || !covers_storage(inputs.at(input))) return Recorded::No;
  for (const ParamSource& p : g.params) {
    if (p.kind == ParamSource::Storage) {
      const at::Tensor& t = inputs.at(p.input);
      if (!on_device(t, device)) return Recorded::OtherGeometry;
      device::StorageBuffer& sb = device::storage_of(t);
      if (!sb.buffer && sb.pending < 0) device::ensure_buffer(sb, p.dtype);
      if (!same_geometry(p, sb, t)) return Recorded::OtherGeometry;
    } else if (p.kind == ParamSource::Input) {
      const at::Tensor& t = inputs.at(p.input);
      if (t.device().type() == c10::DeviceType::PrivateUse1 && (!on_device(t, device) || !whole_storage(t)))
        return Recorded::No;
    }
  }
  std::vector<eager::ProgramInput> ins;
  std::vector<int64_t> ivalues;
  for (const ParamSource& p : g.params) {
    switch (p.kind) {
      case ParamSource::Storage:
        ins.push_back({inputs.at(p.input).storage(), nullptr, p.dtype});
        break;
      case ParamSource::Input: {
        const at::Tensor& t = inputs.at(p.input);
        if (t.device().type() == c10::DeviceType::PrivateUse1)
          ins.push_back({t.storage(), nullptr, device::to_dtype(t.scalar_type())});
        else
          ins.push_back({c10::Storage(), upload_cpu_input(p, t, device), device::to_dtype(t.scalar_type())});
        break;
      }
      case ParamSource::CpuPack:
        ins.push_back({c10::Storage(), upload_pack(p, inputs, device), p.dtype});
        break;
      case ParamSource::Offset:
        ivalues.push_back(inputs.at(p.input).storage_offset());
        break;
      case ParamSource::Rng: {
        auto key = device::next_rng_key(std::nullopt, device);
        ivalues.push_back(static_cast<int64_t>(key.first));
        ivalues.push_back(static_cast<int64_t>(key.second));
        break;
      }
      case ParamSource::CheckWord:
        break;
    }
  }
  std::vector<std::pair<c10::Storage, int>> writes;
  for (const auto& [input, output] : g.mutations) writes.emplace_back(inputs.at(input).storage(), output);
  results->reserve(g.outputs.size());
  for (const OutputSpec& o : g.outputs) {
    std::vector<int64_t> strides = o.strides;
    if (strides.empty()) {
      auto cs = c10::contiguous_strides(o.sizes);
      strides.assign(cs.begin(), cs.end());
    }
    results->push_back(device::wrap_buffer(o.sizes, strides, device::to_scalar_type(o.dtype), device, nullptr));
    if (device::storage_of(results->back()).nbytes > 0) writes.emplace_back(results->back().storage(), o.program_output);
  }
  g.fused_plan->exe = exe;  // (the cache may evict and reload it)
  eager::fused_record_program(g.fused_plan, device, ins, ivalues, writes);
  return Recorded::Yes;
}

}  // namespace

std::optional<std::vector<at::Tensor>> run(const CompiledGraph& g, const std::vector<at::Tensor>& inputs) {
  device::DeviceLock lock;
  auto exe = std::static_pointer_cast<runtime::Executable>(runtime::ProgramCache::get().find(g.cache_key));
  if (!exe) return std::nullopt;  // evicted
  int device = graph_device(inputs, g.device);
  eager::capture_note_leaves(inputs);  // (while a step is recorded)
  if (g.fused_plan && eager::fused_active()) {
    std::vector<at::Tensor> results;
    Recorded r = record(g, exe, inputs, device, &results);
    if (r == Recorded::Yes) return results;
    if (r == Recorded::OtherGeometry) return std::nullopt;
  }
  auto& rt = runtime::Runtime::get();
  std::vector<runtime::BufferPtr> keep;
  for (const ParamSource& p : g.params) {
    if (p.kind == ParamSource::Storage) {
      const at::Tensor& t = inputs.at(p.input);
      if (!on_device(t, device)) return std::nullopt;
      device::StorageBuffer& sb = device::storage_of(t);
      if (!sb.buffer) {
        eager::FlushReason reason("compiled_graph");
        device::ensure_buffer(sb, p.dtype);  // also runs a fused trace that owes it
      }
      if (!same_geometry(p, sb, t)) return std::nullopt;
      keep.push_back(sb.buffer);
    } else if (p.kind == ParamSource::Offset) {
      int64_t offset = inputs.at(p.input).storage_offset();
      keep.push_back(runtime::constant_buffer(&offset, PJRT_Buffer_Type_S64, {}, device));
    } else if (p.kind == ParamSource::CpuPack) {
      keep.push_back(upload_pack(p, inputs, device));
    } else if (p.kind == ParamSource::Rng) {
      auto key = device::next_rng_key(std::nullopt, device);
      int64_t host[2] = {static_cast<int64_t>(key.first), static_cast<int64_t>(key.second)};
      keep.push_back(rt.buffer_from_host(host, PJRT_Buffer_Type_S64, {2}, device));
    } else if (p.kind == ParamSource::CheckWord) {
      keep.push_back(rt.check_word(device));
    } else {
      const at::Tensor& t = inputs.at(p.input);
      if (t.device().type() == c10::DeviceType::PrivateUse1) {
        int d = t.device().index() < 0 ? 0 : t.device().index();
        keep.push_back(d == device ? eager::materialize(t) : nullptr);
        TORCH_CHECK(keep.back(), "torch_pjrt: compiled graph input ", p.input, " is on tpu:", d, ", expected tpu:", device);
      } else {
        keep.push_back(upload_cpu_input(p, t, device));
      }
    }
  }
  std::vector<runtime::BufferPtr> outs =
      g.replica_ids.empty() ? rt.execute(*exe, keep, device) : rt.execute_replicated(*exe, {device}, {keep})[0];
  if (g.check_output >= 0) rt.set_check_word(device, outs.at(g.check_output));
  for (const auto& [input, output] : g.mutations) {
    const at::Tensor& t = inputs.at(input);
    if (t.device().is_cpu()) {
      OutputSpec spec{device::to_dtype(t.scalar_type()), t.sizes().vec(), {}, true, output};
      t.copy_(download(outs.at(output), spec));
    } else {
      eager::assign(t, outs.at(output));
    }
  }
  std::vector<at::Tensor> results;
  results.reserve(g.outputs.size());
  for (const OutputSpec& o : g.outputs) {
    if (o.on_cpu) {
      results.push_back(download(outs.at(o.program_output), o));
      continue;
    }
    std::vector<int64_t> strides = o.strides;
    if (strides.empty()) {
      auto cs = c10::contiguous_strides(o.sizes);
      strides.assign(cs.begin(), cs.end());
    }
    results.push_back(device::wrap_buffer(o.sizes, strides, device::to_scalar_type(o.dtype), device,
                                          outs.at(o.program_output)));
  }
  return results;
}

}  // namespace torch_pjrt::graph

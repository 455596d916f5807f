#include "distributed/device_backend.h"

#include <ATen/ATen.h>

#include <set>
#include <string>

#include "device/device_lock.h"
#include "device/dtype_map.h"
#include "device/storage.h"
#include "eager/executor.h"
#include "eager/fused.h"
#include "distributed/watchdog.h"

namespace torch_pjrt::distributed {

std::atomic<int64_t>& device_collectives() {
  static std::atomic<int64_t> n{0};
  return n;
}

namespace {

using c10d::OpType;

int tpu_index(const at::Tensor& t) { return t.device().index() < 0 ? 0 : t.device().index(); }

// A completed work: the program is queued on the device in order with
// everything else, so later ops (and host reads) see its results, as CUDA
// streams order NCCL's.
class DeviceWork : public c10d::Work {
 public:
  DeviceWork(std::vector<at::Tensor> result, OpType type) : c10d::Work(-1, type), result_(std::move(result)) {
    future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    future_->markCompleted(c10::IValue(result_));
  }
  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds) override { return true; }
  std::vector<at::Tensor> result() override { return result_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  std::vector<at::Tensor> result_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

std::optional<Reduction> reduction_of(c10d::ReduceOp op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return Reduction::Sum;
    case c10d::ReduceOp::AVG: return Reduction::Avg;
    case c10d::ReduceOp::PRODUCT: return Reduction::Product;
    case c10d::ReduceOp::MIN: return Reduction::Min;
    case c10d::ReduceOp::MAX: return Reduction::Max;
    default: return std::nullopt;  // bitwise ops, PREMUL_SUM: the host path
  }
}

CollectiveSpec spec_of(Collective kind, const at::Tensor& input, int ranks) {
  CollectiveSpec s;
  s.kind = kind;
  s.dtype = device::to_dtype(input.scalar_type());
  s.numel = input.numel();
  s.ranks = ranks;
  return s;
}

// The executable of `spec` over `devices` (global ids, replica order), one
// per process: participants in one process (the local run, ranks as threads)
// must launch the same executable for the plugin to pair their parts.
runtime::ExecutablePtr program(const CollectiveSpec& spec, const std::vector<int64_t>& devices) {
  static std::mutex mu;
  static auto* cache = new std::map<std::string, runtime::ExecutablePtr>();  // never destroyed (exit order)
  std::string key = spec.key();
  for (int64_t d : devices) key += "|" + std::to_string(d);
  std::lock_guard<std::mutex> guard(mu);
  auto it = cache->find(key);
  if (it != cache->end()) return it->second;
  auto exe = runtime::Runtime::get().compile_replicated(collective_program(spec), devices);
  cache->emplace(key, exe);
  return exe;
}

at::Tensor flat_result(const runtime::BufferPtr& buffer, const CollectiveSpec& spec, const at::Tensor& like) {
  int64_t n = output_numel(spec);
  return device::wrap_buffer({n}, {1}, like.scalar_type(), tpu_index(like), buffer);
}

// Writes a flat result into `out` (any layout).
void write(at::Tensor& out, const at::Tensor& flat) { out.copy_(flat.view(out.sizes())); }

}  // namespace

std::vector<at::Tensor> run_collective_locally(const CollectiveSpec& spec, const std::vector<at::Tensor>& inputs) {
  device::DeviceLock lock;
  auto& rt = runtime::Runtime::get();
  TORCH_CHECK_VALUE(static_cast<int>(inputs.size()) == spec.ranks, "torch_pjrt: ", spec.ranks,
                    " replicas need as many inputs, got ", inputs.size());
  std::vector<int> devices;
  std::vector<int64_t> ids;
  std::vector<std::vector<runtime::BufferPtr>> args;
  for (const at::Tensor& t : inputs) {
    TORCH_CHECK_VALUE(t.device().is_privateuseone(), "torch_pjrt: collective inputs must be tpu tensors");
    devices.push_back(tpu_index(t));
    ids.push_back(rt.global_id(devices.back()));
    args.push_back({eager::materialize(t)});
  }
  TORCH_CHECK_VALUE(std::set<int>(devices.begin(), devices.end()).size() == devices.size(),
                    "torch_pjrt: each replica of a collective needs a device of its own");
  auto exe = program(spec, ids);
  auto outs = rt.execute_replicated(*exe, devices, args);
  device_collectives()++;
  std::vector<at::Tensor> result;
  for (size_t r = 0; r < inputs.size(); ++r) result.push_back(flat_result(outs[r][0], spec, inputs[r]));
  return result;
}

DeviceBackend::DeviceBackend(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                             c10::intrusive_ptr<c10d::Backend> fallback, std::chrono::milliseconds timeout)
    : c10d::Backend(rank, size), store_(std::move(store)), fallback_(std::move(fallback)), timeout_(timeout) {}

bool DeviceBackend::on_device(const std::vector<at::Tensor>& tensors) const {
  if (tensors.empty()) return false;
  for (const at::Tensor& t : tensors)
    if (!t.defined() || !t.device().is_privateuseone() || tpu_index(t) != tpu_index(tensors[0])) return false;
  return true;
}

const std::vector<int64_t>& DeviceBackend::ids(int device) {
  if (device_ >= 0) {
    TORCH_CHECK(device == device_, "torch_pjrt (c10d backend 'tpu'): rank ", rank_, " ran collectives on tpu:", device_,
                " and now on tpu:", device, "; a rank's collectives use one device (torch.tpu.set_device)");
    return ids_;
  }
  int64_t mine = runtime::Runtime::get().global_id(device);
  std::string v = std::to_string(mine);
  store_->set("device/" + std::to_string(rank_), std::vector<uint8_t>(v.begin(), v.end()));
  std::vector<int64_t> all;
  std::set<int64_t> seen;
  for (int r = 0; r < size_; ++r) {
    auto bytes = store_->get("device/" + std::to_string(r));  // waits up to the store's timeout
    all.push_back(std::stoll(std::string(bytes.begin(), bytes.end())));
    TORCH_CHECK(seen.insert(all.back()).second, "torch_pjrt (c10d backend 'tpu'): ranks share the device with global id ",
                all.back(), "; on-device collectives need one device per rank");
  }
  ids_ = std::move(all);
  device_ = device;
  std::set<int64_t> local;
  for (const auto& g : runtime::Runtime::get().global_devices())
    if (g.local >= 0) local.insert(g.id);
  shared_client_ = size_ > 1;
  for (int64_t id : ids_) shared_client_ = shared_client_ && local.count(id) > 0;
  return ids_;
}

at::Tensor DeviceBackend::run(const CollectiveSpec& spec, const std::vector<int64_t>& devices, const at::Tensor& input) {
  if (spec.numel == 0) return at::empty({output_numel(spec)}, input.options());
  int device = tpu_index(input);
  runtime::BufferPtr in;
  {
    device::DeviceLock lock;
    // Fused eager: the ops queued before the collective run first (a step
    // capture then says a collective split the step).
    eager::fused_flush("collective");
    in = eager::materialize(input);
  }
  runtime::ExecutablePtr exe = program(spec, devices);
  // Outside the device lock: a plugin may launch (and wait for the other
  // participants) in this call; ranks that share this process (threads, one
  // device each) must still reach theirs.
  auto& rt = runtime::Runtime::get();
  Watch watch(timeout_, std::string(collective_name(spec.kind)) + " on rank " + std::to_string(rank_) + " (tpu:" +
                            std::to_string(device) + ", " + std::to_string(spec.numel) + " elements)");
  auto outs = rt.execute_replicated(*exe, {device}, {{in}});
  auto launched = rt.record_event(device);
  watch.launched(launched);
  device_collectives()++;
  if (shared_client_) launched->wait();
  return flat_result(outs[0][0], spec, input);
}

c10::intrusive_ptr<c10d::Work> DeviceBackend::done(std::vector<at::Tensor> result, OpType type) {
  return c10::make_intrusive<DeviceWork>(std::move(result), type);
}

c10::intrusive_ptr<c10d::Work> DeviceBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                        const c10d::AllreduceOptions& opts) {
  auto red = reduction_of(opts.reduceOp);
  if (!on_device(tensors) || !red) return fallback_->allreduce(tensors, opts);
  const auto& all = ids(tpu_index(tensors[0]));
  for (at::Tensor& t : tensors) {
    CollectiveSpec s = spec_of(Collective::AllReduce, t, size_);
    s.reduction = *red;
    write(t, run(s, all, t));
  }
  return done(tensors, OpType::ALLREDUCE);
}

c10::intrusive_ptr<c10d::Work> DeviceBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                  const c10d::AllreduceCoalescedOptions& opts) {
  c10d::AllreduceOptions one;
  one.reduceOp = opts.reduceOp;
  one.timeout = opts.timeout;
  if (!on_device(tensors) || !reduction_of(opts.reduceOp)) return fallback_->allreduce_coalesced(tensors, opts);
  allreduce(tensors, one);
  return done(tensors, OpType::ALLREDUCE_COALESCED);
}

c10::intrusive_ptr<c10d::Work> DeviceBackend::reduce(std::vector<at::Tensor>& tensors,
                                                     const c10d::ReduceOptions& opts) {
  auto red = reduction_of(opts.reduceOp);
  if (!on_device(tensors) || !red) return fallback_->reduce(tensors, opts);
  const auto& all = ids(tpu_index(tensors[0]));
  CollectiveSpec s = spec_of(Collective::AllReduce, tensors[0], size_);
  s.reduction = *red;
  at::Tensor r = run(s, all, tensors[0]);
  if (rank_ == opts.rootRank) write(tensors[0], r);  // everyone computes it; only the root keeps it
  return done(tensors, OpType::REDUCE);
}

c10::intrusive_ptr<c10d::Work> DeviceBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                        const c10d::BroadcastOptions& opts) {
  if (!on_device(tensors)) return fallback_->broadcast(tensors, opts);
  const auto& all = ids(tpu_index(tensors[0]));
  CollectiveSpec s = spec_of(Collective::Broadcast, tensors[0], size_);
  s.root = static_cast<int>(opts.rootRank);
  write(tensors[0], run(s, all, tensors[0]));
  return done(tensors, OpType::BROADCAST);
}

c10::intrusive_ptr<c10d::Work> DeviceBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                        std::vector<at::Tensor>& inputs,
                                                        const c10d::AllgatherOptions& opts) {
  if (!on_device(inputs) || inputs.size() != 1 || outputs.size() != 1 ||
      static_cast<int>(outputs[0].size()) != size_ || !on_device(outputs[0]) ||
      tpu_index(outputs[0][0]) != tpu_index(inputs[0]))
    return fallback_->allgather(outputs, inputs, opts);
  for (const at::Tensor& o : outputs[0])
    TORCH_CHECK(o.numel() == inputs[0].numel() && o.scalar_type() == inputs[0].scalar_type(),
                "torch_pjrt (c10d backend 'tpu'): all_gather: output tensors must match the input's size and dtype");
  const auto& all = ids(tpu_index(inputs[0]));
  at::Tensor flat = run(spec_of(Collective::AllGather, inputs[0], size_), all, inputs[0]);
  int64_t n = inputs[0].numel();
  for (int r = 0; r < size_; ++r) write(outputs[0][r], flat.narrow(0, r * n, n));
  return done(outputs[0], OpType::ALLGATHER);
}

c10::intrusive_ptr<c10d::Work> DeviceBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                              const c10d::AllgatherOptions& opts) {
  if (!on_device({input, output})) return fallback_->_allgather_base(output, input, opts);
  TORCH_CHECK(output.numel() == input.numel() * size_ && output.scalar_type() == input.scalar_type(),
              "torch_pjrt (c10d backend 'tpu'): all_gather_into_tensor: output of ", output.numel(), " ",
              output.scalar_type(), " elements for ", size_, " inputs of ", input.numel(), " ", input.scalar_type());
  const auto& all = ids(tpu_index(input));
  write(output, run(spec_of(Collective::AllGather, input, size_), all, input));
  return done({output}, OpType::_ALLGATHER_BASE);
}

c10::intrusive_ptr<c10d::Work> DeviceBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  return fallback_->gather(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> DeviceBackend::scatter(std::vector<at::Tensor>& outputs,
                                                      std::vector<std::vector<at::Tensor>>& inputs,
                                                      const c10d::ScatterOptions& opts) {
  return fallback_->scatter(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> DeviceBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                             std::vector<std::vector<at::Tensor>>& inputs,
                                                             const c10d::ReduceScatterOptions& opts) {
  auto red = reduction_of(opts.reduceOp);
  if (!red || outputs.size() != 1 || inputs.size() != 1 || static_cast<int>(inputs[0].size()) != size_ ||
      !on_device(outputs) || !on_device(inputs[0]) || tpu_index(outputs[0]) != tpu_index(inputs[0][0]))
    return fallback_->reduce_scatter(outputs, inputs, opts);
  std::vector<at::Tensor> flat;
  for (const at::Tensor& t : inputs[0]) {
    TORCH_CHECK(t.numel() == outputs[0].numel() && t.scalar_type() == outputs[0].scalar_type(),
                "torch_pjrt (c10d backend 'tpu'): reduce_scatter: input tensors must match the output's size and dtype");
    flat.push_back(t.reshape({-1}));
  }
  at::Tensor joined = at::cat(flat);
  CollectiveSpec s = spec_of(Collective::ReduceScatter, joined, size_);
  s.reduction = *red;
  write(outputs[0], run(s, ids(tpu_index(joined)), joined));
  return done(outputs, OpType::REDUCE_SCATTER);
}

c10::intrusive_ptr<c10d::Work> DeviceBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                   const c10d::ReduceScatterOptions& opts) {
  auto red = reduction_of(opts.reduceOp);
  if (!red || !on_device({input, output})) return fallback_->_reduce_scatter_base(output, input, opts);
  TORCH_CHECK(input.numel() == output.numel() * size_ && output.scalar_type() == input.scalar_type(),
              "torch_pjrt (c10d backend 'tpu'): reduce_scatter_tensor: input of ", input.numel(), " ",
              input.scalar_type(), " elements for ", size_, " outputs of ", output.numel(), " ", output.scalar_type());
  CollectiveSpec s = spec_of(Collective::ReduceScatter, input, size_);
  s.reduction = *red;
  write(output, run(s, ids(tpu_index(input)), input));
  return done({output}, OpType::_REDUCE_SCATTER_BASE);
}

c10::intrusive_ptr<c10d::Work> DeviceBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                            std::vector<int64_t>& output_splits,
                                                            std::vector<int64_t>& input_splits,
                                                            const c10d::AllToAllOptions& opts) {
  // Equal splits only: uneven ones change shapes per rank (the host path).
  if (!output_splits.empty() || !input_splits.empty() || !on_device({input, output}) ||
      input.numel() != output.numel() || input.numel() % size_ != 0 || input.scalar_type() != output.scalar_type())
    return fallback_->alltoall_base(output, input, output_splits, input_splits, opts);
  write(output, run(spec_of(Collective::AllToAll, input, size_), ids(tpu_index(input)), input));
  return done({output}, OpType::ALLTOALL_BASE);
}

c10::intrusive_ptr<c10d::Work> DeviceBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::AllToAllOptions& opts) {
  bool even = static_cast<int>(inputs.size()) == size_ && outputs.size() == inputs.size() && on_device(inputs) &&
              on_device(outputs) && tpu_index(inputs[0]) == tpu_index(outputs[0]);
  for (size_t i = 0; even && i < inputs.size(); ++i)
    even = inputs[i].numel() == inputs[0].numel() && outputs[i].numel() == inputs[0].numel() &&
           inputs[i].scalar_type() == inputs[0].scalar_type() && outputs[i].scalar_type() == inputs[0].scalar_type();
  if (!even) return fallback_->alltoall(outputs, inputs, opts);
  std::vector<at::Tensor> flat;
  for (const at::Tensor& t : inputs) flat.push_back(t.reshape({-1}));
  at::Tensor joined = at::cat(flat);
  at::Tensor r = run(spec_of(Collective::AllToAll, joined, size_), ids(tpu_index(joined)), joined);
  int64_t n = inputs[0].numel();
  for (int i = 0; i < size_; ++i) write(outputs[i], r.narrow(0, i * n, n));
  return done(outputs, OpType::ALLTOALL);
}

// A send and its receive run one program on the two ranks' devices
// (collective_permute, replica 0 to replica 1); pairs match in call order.
c10::intrusive_ptr<c10d::Work> DeviceBackend::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  if (!on_device(tensors) || tensors.size() != 1) return fallback_->send(tensors, dst, tag);
  const auto& all = ids(tpu_index(tensors[0]));
  CollectiveSpec s = spec_of(Collective::Permute, tensors[0], 2);
  run(s, {all.at(rank_), all.at(dst)}, tensors[0]);
  return done(tensors, OpType::SEND);
}

c10::intrusive_ptr<c10d::Work> DeviceBackend::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  if (!on_device(tensors) || tensors.size() != 1) return fallback_->recv(tensors, src, tag);
  const auto& all = ids(tpu_index(tensors[0]));
  CollectiveSpec s = spec_of(Collective::Permute, tensors[0], 2);
  write(tensors[0], run(s, {all.at(src), all.at(rank_)}, tensors[0]));
  return done(tensors, OpType::RECV);
}

c10::intrusive_ptr<c10d::Work> DeviceBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return fallback_->recvAnysource(tensors, tag);
}

// An all-reduce of one element on the device, waited for: every rank has
// reached it and the device work queued before it has finished.
c10::intrusive_ptr<c10d::Work> DeviceBackend::barrier(const c10d::BarrierOptions& opts) {
  int device = device_ >= 0 ? device_ : static_cast<int>(c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1)
                                                              ->getDevice()
                                                              .index());
  if (device < 0) device = 0;
  at::Tensor one = at::zeros({1}, at::TensorOptions().dtype(at::kInt).device(c10::DeviceType::PrivateUse1, device));
  CollectiveSpec s = spec_of(Collective::AllReduce, one, size_);
  run(s, ids(device), one).cpu();
  return done({}, OpType::BARRIER);
}

}  // namespace torch_pjrt::distributed

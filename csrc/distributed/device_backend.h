// The c10d backend of the tpu device where the PJRT client spans the job's
// processes (CUDA plugin with its distributed options, TPU slices): each
// collective is an XLA program (collective_programs.h) compiled replicated
// over the group's devices and launched on this rank's device, queued with
// the device's other work like any program. What has no program (gather,
// scatter, uneven all_to_all, receive from any source, CPU tensors) goes to
// the host-copy backend. docs/distributed.md, "On-device collectives".
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>

#include "distributed/collective_programs.h"
#include "runtime/pjrt_runtime.h"

namespace torch_pjrt::distributed {

std::atomic<int64_t>& device_collectives();  // metrics(): distributed_device_collectives

// Runs one collective's program with every participant in this process:
// `inputs[r]` (dense, on distinct tpu devices) is replica r's. Returns each
// replica's output as a flat tensor. The device backend's path, for a client
// whose devices are all local (tests on the CPU plugin's devices).
std::vector<at::Tensor> run_collective_locally(const CollectiveSpec& spec, const std::vector<at::Tensor>& inputs);

class DeviceBackend : public c10d::Backend {
 public:
  // `store`: a store of this group's own (device ids are exchanged there);
  // `fallback`: the host-copy backend of the same group.
  // `timeout`: the group's; a collective not done by then ends the process
  // (watchdog.h).
  DeviceBackend(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                c10::intrusive_ptr<c10d::Backend> fallback, std::chrono::milliseconds timeout);
  const std::string getBackendName() const override { return "tpu"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  // (The coalesced forms, as DTensor's full_tensor and FSDP2's state dicts
  // call them, go to the host-copy backend.)
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override {
    return fallback_->allgather_into_tensor_coalesced(outputs, inputs, opts);
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override {
    return fallback_->reduce_scatter_tensor_coalesced(outputs, inputs, opts);
  }
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  // Global device ids of every rank, exchanged through the store at the
  // first collective (`device`: this rank's); compiled graphs' collectives
  // ask too.
  const std::vector<int64_t>& ids(int device);

 private:
  // Whether the collective's tensors are one tpu device's (else the fallback runs it).
  bool on_device(const std::vector<at::Tensor>& tensors) const;
  // Runs `spec` over `devices` (global ids, replica order) with this rank's
  // `input` as replica `replica`'s; returns the flat output.
  at::Tensor run(const CollectiveSpec& spec, const std::vector<int64_t>& devices, const at::Tensor& input);
  c10::intrusive_ptr<c10d::Work> done(std::vector<at::Tensor> result, c10d::OpType type);

  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::Backend> fallback_;
  std::chrono::milliseconds timeout_;
  // Every rank's device belongs to this process (ranks as threads): their
  // parts share the plugin's thread pool, so each collective completes
  // before the next is launched (a rank running ahead could fill the pool
  // with parts waiting for peers whose parts then never get a thread).
  bool shared_client_ = false;
  int device_ = -1;
  std::vector<int64_t> ids_;
};

}  // namespace torch_pjrt::distributed

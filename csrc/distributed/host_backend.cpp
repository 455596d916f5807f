#include "distributed/host_backend.h"

#include <ATen/ATen.h>

#include <memory>
#include <mutex>
#include <optional>
#include <utility>

namespace torch_pjrt::distributed {

HostCounters& host_counters() {
  static HostCounters c;
  return c;
}

namespace {

using Pairs = std::vector<std::pair<at::Tensor, at::Tensor>>;  // (tpu tensor, its host copy)

// The copies back into the tpu tensors, once: from the host work's future
// callback (DDP waits on futures) or from wait(), whichever comes first.
struct CopyBack {
  Pairs pairs;
  std::once_flag once;
  void run() {
    std::call_once(once, [&] {
      int64_t bytes = 0;
      for (auto& [dev, host] : pairs) {
        dev.copy_(host);
        bytes += host.nbytes();
      }
      host_counters().from_host_bytes += bytes;
    });
  }
  std::vector<at::Tensor> device_tensors() const {
    std::vector<at::Tensor> out;
    for (const auto& p : pairs) out.push_back(p.first);
    return out;
  }
};

class HostWork : public c10d::Work {
 public:
  HostWork(c10::intrusive_ptr<c10d::Work> inner, std::shared_ptr<CopyBack> back, c10d::OpType type)
      : c10d::Work(-1, type), inner_(std::move(inner)), back_(std::move(back)) {}

  bool isCompleted() override { return inner_->isCompleted(); }
  bool isSuccess() const override { return inner_->isSuccess(); }
  std::exception_ptr exception() const override { return inner_->exception(); }
  int sourceRank() const override { return inner_->sourceRank(); }
  std::vector<at::Tensor> result() override { return back_->device_tensors(); }
  void abort() override { inner_->abort(); }

  bool wait(std::chrono::milliseconds timeout) override {
    bool done = inner_->wait(timeout);  // raises the host backend's error or timeout
    back_->run();
    return done;
  }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!future_) {
      auto back = back_;
      future_ = inner_->getFuture()->then(
          [back](c10::ivalue::Future& host) -> c10::IValue {
            host.value();  // rethrows the host backend's error
            back->run();
            return c10::IValue(back->device_tensors());
          },
          c10::ListType::create(c10::TensorType::get()));
    }
    return future_;
  }

 private:
  c10::intrusive_ptr<c10d::Work> inner_;
  std::shared_ptr<CopyBack> back_;
  std::mutex mu_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// Host stand-ins for one collective's tensors. A CPU tensor stands for itself;
// a tpu tensor gets a contiguous host tensor, filled from it when the
// collective reads it, copied back into it when the collective writes it.
class Staging {
 public:
  explicit Staging(const char* op) : op_(op) {}
  // A tensor, a list of them, or a list of lists, as the collective takes them.
  template <class T>
  T in(const T& x) { return map(x, true, false); }
  template <class T>
  T out(const T& x) { return map(x, false, true); }
  template <class T>
  T inout(const T& x) { return map(x, true, true); }

  c10::intrusive_ptr<c10d::Work> finish(c10::intrusive_ptr<c10d::Work> work, c10d::OpType type) {
    if (staged_) ++host_counters().collectives;
    if (back_->pairs.empty()) return work;
    return c10::make_intrusive<HostWork>(std::move(work), back_, type);
  }

 private:
  at::Tensor map(const at::Tensor& t, bool read, bool written) {
    if (!t.defined()) return t;
    // One collective, one device: gloo would take a CPU/tpu mix through the
    // host copies, but the same call fails on CUDA (NCCL), so it fails here.
    if (!device_) device_ = t.device();
    TORCH_CHECK(t.device().type() == device_->type(), "torch_pjrt (c10d backend 'tpu'): ", op_,
                ": tensors on ", device_->str(), " and ", t.device().str(),
                "; a collective's tensors must all be on the same device");
    if (!t.device().is_privateuseone()) return t;
    staged_ = true;
    at::Tensor host;
    if (read) {
      host = t.to(at::kCPU).contiguous();  // waits for the tpu's pending work on t
      host_counters().to_host_bytes += host.nbytes();
    } else {
      host = at::empty(t.sizes(), t.options().device(at::kCPU));
    }
    if (written) back_->pairs.emplace_back(t, host);
    return host;
  }
  template <class T>
  std::vector<T> map(const std::vector<T>& xs, bool read, bool written) {
    std::vector<T> out;
    out.reserve(xs.size());
    for (const auto& x : xs) out.push_back(map(x, read, written));
    return out;
  }

  const char* op_;
  std::optional<c10::Device> device_;
  bool staged_ = false;
  std::shared_ptr<CopyBack> back_ = std::make_shared<CopyBack>();
};

// all_gather_into_tensor and reduce_scatter_tensor take tensors whose element
// counts agree (the gathered one `size` times the other) in any shapes, as
// NCCL and the device path do; accelerate gathers a (1, k) tensor into a
// flat one. gloo compares each chunk's shape with the other tensor's, so
// contiguous pairs go to it flat (views: what gloo writes lands in them).
void flatten_pair(at::Tensor& gathered, at::Tensor& part, int64_t size) {
  if (gathered.defined() && part.defined() && gathered.numel() == part.numel() * size &&
      gathered.is_contiguous() && part.is_contiguous()) {
    gathered = gathered.view({-1});
    part = part.view({-1});
  }
}
void flatten_pairs(std::vector<at::Tensor>& gathered, std::vector<at::Tensor>& parts, int64_t size) {
  for (size_t i = 0; i < gathered.size() && i < parts.size(); ++i) flatten_pair(gathered[i], parts[i], size);
}

}  // namespace

HostCopyBackend::HostCopyBackend(c10::intrusive_ptr<c10d::Backend> host)
    : c10d::Backend(host->getRank(), host->getSize()), host_(std::move(host)) {}

using c10d::OpType;

c10::intrusive_ptr<c10d::Work> HostCopyBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                          const c10d::BroadcastOptions& opts) {
  Staging s("broadcast");
  auto h = s.inout(tensors);
  return s.finish(host_->broadcast(h, opts), OpType::BROADCAST);
}

c10::intrusive_ptr<c10d::Work> HostCopyBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::AllreduceOptions& opts) {
  Staging s("all_reduce");
  auto h = s.inout(tensors);
  return s.finish(host_->allreduce(h, opts), OpType::ALLREDUCE);
}

c10::intrusive_ptr<c10d::Work> HostCopyBackend::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  Staging s("all_reduce_coalesced");
  auto h = s.inout(tensors);
  return s.finish(host_->allreduce_coalesced(h, opts), OpType::ALLREDUCE_COALESCED);
}

c10::intrusive_ptr<c10d::Work> HostCopyBackend::reduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::ReduceOptions& opts) {
  Staging s("reduce");
  auto h = s.inout(tensors);
  return s.finish(host_->reduce(h, opts), OpType::REDUCE);
}

c10::intrusive_ptr<c10d::Work> HostCopyBackend::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  Staging s("all_gather");
  auto hi = s.in(inputs);
  auto ho = s.out(outputs);
  return s.finish(host_->allgather(ho, hi, opts), OpType::ALLGATHER);
}

c10::intrusive_ptr<c10d::Work> HostCopyBackend::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  Staging s("all_gather_into_tensor");
  auto hi = s.in(input);
  auto ho = s.out(output);
  flatten_pair(ho, hi, getSize());
  return s.finish(host_->_allgather_base(ho, hi, opts), OpType::_ALLGATHER_BASE);
}

c10::intrusive_ptr<c10d::Work> HostCopyBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  Staging s("all_gather_into_tensor (coalesced)");
  auto hi = s.in(inputs);
  auto ho = s.out(outputs);
  flatten_pairs(ho, hi, getSize());
  return s.finish(host_->allgather_into_tensor_coalesced(ho, hi, opts), OpType::COALESCED);
}

c10::intrusive_ptr<c10d::Work> HostCopyBackend::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  Staging s("gather");
  auto hi = s.in(inputs);
  auto ho = s.out(outputs);
  return s.finish(host_->gather(ho, hi, opts), OpType::GATHER);
}

c10::intrusive_ptr<c10d::Work> HostCopyBackend::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  Staging s("scatter");
  auto hi = s.in(inputs);
  auto ho = s.out(outputs);
  return s.finish(host_->scatter(ho, hi, opts), OpType::SCATTER);
}

c10::intrusive_ptr<c10d::Work> HostCopyBackend::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  Staging s("reduce_scatter");
  auto hi = s.in(inputs);
  auto ho = s.out(outputs);
  return s.finish(host_->reduce_scatter(ho, hi, opts), OpType::REDUCE_SCATTER);
}

c10::intrusive_ptr<c10d::Work> HostCopyBackend::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  Staging s("reduce_scatter_tensor");
  auto hi = s.in(input);
  auto ho = s.out(output);
  flatten_pair(hi, ho, getSize());
  return s.finish(host_->_reduce_scatter_base(ho, hi, opts), OpType::_REDUCE_SCATTER_BASE);
}

c10::intrusive_ptr<c10d::Work> HostCopyBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  Staging s("reduce_scatter_tensor (coalesced)");
  auto hi = s.in(inputs);
  auto ho = s.out(outputs);
  flatten_pairs(hi, ho, getSize());
  return s.finish(host_->reduce_scatter_tensor_coalesced(ho, hi, opts), OpType::REDUCE_SCATTER_TENSOR_COALESCED);
}

c10::intrusive_ptr<c10d::Work> HostCopyBackend::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
    std::vector<int64_t>& input_splits, const c10d::AllToAllOptions& opts) {
  Staging s("all_to_all_single");
  auto hi = s.in(input);
  auto ho = s.out(output);
  return s.finish(host_->alltoall_base(ho, hi, output_splits, input_splits, opts),
                  OpType::ALLTOALL_BASE);
}

c10::intrusive_ptr<c10d::Work> HostCopyBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::AllToAllOptions& opts) {
  Staging s("all_to_all");
  auto hi = s.in(inputs);
  auto ho = s.out(outputs);
  return s.finish(host_->alltoall(ho, hi, opts), OpType::ALLTOALL);
}

c10::intrusive_ptr<c10d::Work> HostCopyBackend::send(std::vector<at::Tensor>& tensors, int dst,
                                                     int tag) {
  Staging s("send");
  auto h = s.in(tensors);
  return s.finish(host_->send(h, dst, tag), OpType::SEND);
}

c10::intrusive_ptr<c10d::Work> HostCopyBackend::recv(std::vector<at::Tensor>& tensors, int src,
                                                     int tag) {
  Staging s("recv");
  auto h = s.out(tensors);
  return s.finish(host_->recv(h, src, tag), OpType::RECV);
}

c10::intrusive_ptr<c10d::Work> HostCopyBackend::recvAnysource(std::vector<at::Tensor>& tensors,
                                                              int tag) {
  Staging s("recv");
  auto h = s.out(tensors);
  return s.finish(host_->recvAnysource(h, tag), OpType::RECVANYSOURCE);
}

c10::intrusive_ptr<c10d::Work> HostCopyBackend::barrier(const c10d::BarrierOptions& opts) {
  return host_->barrier(opts);
}

}  // namespace torch_pjrt::distributed

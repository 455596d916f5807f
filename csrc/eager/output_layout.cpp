// Output memory formats that CPU's kernels give and the Meta kernels do not.
// The eager plan lays a fresh result out with the strides of its Meta
// result; for these ops the C++ Meta path (convolution's `_convolution`
// falls to an empty contiguous tensor; the padding ops' Meta kernels) is
// contiguous where CPU's kernel keeps channels_last.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

#include "eager/plan.h"

namespace torch_pjrt::eager {
namespace {

c10::MemoryFormat format_of(const c10::IValue& v) {
  if (!v.isTensor()) return c10::MemoryFormat::Contiguous;
  const at::Tensor& t = v.toTensor();
  return t.defined() ? t.suggest_memory_format() : c10::MemoryFormat::Contiguous;
}

bool channels_last(c10::MemoryFormat f) {
  return f == c10::MemoryFormat::ChannelsLast || f == c10::MemoryFormat::ChannelsLast3d;
}

bool any_not_one(const c10::IValue& v) {
  if (!v.isIntList()) return false;
  for (int64_t x : v.toIntVector())
    if (x != 1) return true;
  return false;
}

// Whether CPU runs this 3-d convolution on mkldnn (which keeps
// channels_last_3d) rather than slow_conv3d (always contiguous): PyTorch's
// use_mkldnn heuristic, for float32 (bf16/f16 always, float64 never).
bool cpu_conv3d_on_mkldnn(const at::Tensor& input, const at::Tensor& weight, const c10::IValue& stride,
                          const c10::IValue& dilation, int64_t groups) {
  if (input.scalar_type() == at::kDouble) return false;
  if (input.scalar_type() != at::kFloat) return true;
  int64_t n = input.size(0), kw = weight.size(-1), kh = weight.size(-2);
  bool fast = any_not_one(stride) || any_not_one(dilation) || n >= 16 || kw != 1 || kh != 1 ||
              at::get_num_threads() > 1;
  return fast && (groups > 1 || (kw > 3 && kh > 3) || n > 1 ||
                  n * input.size(1) * input.size(2) * input.size(3) > 20480);
}

// The ops concerned, by kind, with the position of the argument whose layout
// decides (a table looked up once per Meta run: every op passes here).
enum class Rule { Conv, Pad, UnbatchedPool3d };
struct Entry {
  Rule rule;
  size_t input;
};

const Entry* rule_of(const std::string& name) {
  static const std::unordered_map<std::string, Entry> rules = {
      // convolution(input, weight, bias, stride, padding, dilation, transposed,
      // output_padding, groups); convolution_backward(grad_output, input, ...)
      {"aten::convolution", {Rule::Conv, 0}},
      {"aten::_convolution", {Rule::Conv, 0}},
      {"aten::convolution_backward", {Rule::Conv, 1}},
      // the pads' backward forms take (grad_output, self, padding)
      {"aten::reflection_pad2d", {Rule::Pad, 0}},
      {"aten::reflection_pad3d", {Rule::Pad, 0}},
      {"aten::replication_pad2d", {Rule::Pad, 0}},
      {"aten::replication_pad3d", {Rule::Pad, 0}},
      {"aten::reflection_pad2d_backward", {Rule::Pad, 1}},
      {"aten::reflection_pad3d_backward", {Rule::Pad, 1}},
      {"aten::replication_pad2d_backward", {Rule::Pad, 1}},
      {"aten::replication_pad3d_backward", {Rule::Pad, 1}},
      {"aten::max_pool3d_with_indices", {Rule::UnbatchedPool3d, 0}},
      {"aten::max_pool3d_with_indices_backward", {Rule::UnbatchedPool3d, 1}},
  };
  auto it = rules.find(name);
  return it == rules.end() ? nullptr : &it->second;
}

// Which format CPU gives a convolution's fresh results: channels_last when
// the input or the weight is (3-d: only where CPU picks mkldnn).
c10::MemoryFormat conv_format(c10::ArrayRef<c10::IValue> args, size_t input) {
  if (args.size() < input + 9 || !args[input].isTensor() || !args[input + 1].isTensor())
    return c10::MemoryFormat::Contiguous;
  c10::MemoryFormat a = format_of(args[input]), w = format_of(args[input + 1]);
  c10::MemoryFormat f = channels_last(a) ? a : channels_last(w) ? w : c10::MemoryFormat::Contiguous;
  if (f == c10::MemoryFormat::ChannelsLast3d &&
      !cpu_conv3d_on_mkldnn(args[input].toTensor(), args[input + 1].toTensor(), args[input + 3], args[input + 5],
                            args[input + 8].isInt() ? args[input + 8].toInt() : 1))
    return c10::MemoryFormat::Contiguous;
  return f;
}

// CPU's max_pool3d kernels treat an unbatched (C, D, H, W) input as a batch
// of one: channels_last_3d when that batch of one is.
bool unbatched_channels_last_3d(const at::Tensor& t) {
  if (!t.defined() || t.dim() != 4) return false;
  std::vector<int64_t> sizes{1}, strides{std::max<int64_t>(t.numel(), 1)};
  for (int64_t d = 0; d < 4; ++d) {
    sizes.push_back(t.size(d));
    strides.push_back(t.stride(d));
  }
  return c10::is_channels_last_strides_3d(sizes, strides);
}

}  // namespace

void keep_cpu_memory_format(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                            torch::jit::Stack& meta_returns) {
  if (!op.schema().overload_name().empty() && op.schema().overload_name() != "default") return;  // out= forms
  const Entry* e = rule_of(op.schema().name());
  if (!e || e->input >= args.size()) return;
  if (e->rule == Rule::UnbatchedPool3d) {
    if (!args[e->input].isTensor() || !unbatched_channels_last_3d(args[e->input].toTensor())) return;
    for (auto& v : meta_returns) {
      if (!v.isTensor() || !v.toTensor().defined() || v.toTensor().dim() != 4) continue;
      const at::Tensor& m = v.toTensor();
      v = at::empty(m.unsqueeze(0).sizes(), m.options().memory_format(c10::MemoryFormat::ChannelsLast3d)).squeeze(0);
    }
    return;
  }
  c10::MemoryFormat f = e->rule == Rule::Conv ? conv_format(args, e->input) : format_of(args[e->input]);
  if (!channels_last(f)) return;
  int64_t dim = f == c10::MemoryFormat::ChannelsLast ? 4 : 5;
  for (auto& v : meta_returns) {
    if (!v.isTensor() || !v.toTensor().defined() || v.toTensor().dim() != dim) continue;
    const at::Tensor& m = v.toTensor();
    v = at::empty(m.sizes(), m.options().memory_format(f));
  }
}

}  // namespace torch_pjrt::eager

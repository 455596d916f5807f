// Convolution forward and backward, every spatial rank, grouped, dilated and
// transposed, as stablehlo.convolution.
//
// Which ATen op we lower: nn.ConvNd goes conv2d (CompositeImplicitAutograd) ->
// convolution -> _convolution -> convolution_overrideable, the last three
// CompositeExplicitAutograd. convolution_overrideable and
// convolution_backward_overrideable are PyTorch's hooks for out-of-tree
// backends, but they have no Meta kernel (their composite kernels throw), and
// the executor takes shapes and errors from the Meta kernel. So we lower
// convolution and convolution_backward (and _convolution, which TorchScript
// traces call directly); all three have Meta kernels and are routed here from
// their composite kernels.
//
// The three primitives below cover every case:
//   forward(x, w)        normal conv, w [O, C/g, k...]
//   transpose(x, w)      transposed conv, w [C, O/g, k...]; also grad_input of forward
//   weight_grad(x, dy)   grad_weight of forward; also of transpose with x and dy swapped
// Half types are computed in float32 and rounded once, as PyTorch's CPU kernels do.
#include <algorithm>

#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {

struct ConvParams {
  std::vector<int64_t> stride, padding, dilation, output_padding;
  int64_t groups = 1;
  bool transposed = false;
};

// PyTorch lets one value stand for every spatial dim.
std::vector<int64_t> expand(std::vector<int64_t> v, size_t n, int64_t dflt) {
  if (v.empty()) v.push_back(dflt);
  if (v.size() == 1) v.resize(n, v[0]);
  return v;
}

ConvParams conv_params(const LoweringContext& ctx, size_t nd) {
  ConvParams p;
  p.stride = expand(ctx.ints("stride"), nd, 1);
  p.padding = expand(ctx.ints("padding"), nd, 0);
  p.dilation = expand(ctx.ints("dilation"), nd, 1);
  p.output_padding = expand(ctx.ints("output_padding"), nd, 0);
  p.groups = ctx.to_int("groups", 1);
  p.transposed = ctx.to_bool("transposed", false);
  return p;
}

// Positions of the batch/feature dims and the spatial dims of one operand.
struct Layout {
  int64_t batch, feature;  // for the kernel: output feature, input feature
  std::vector<int64_t> spatial;
  std::string str(char b, char f) const {
    std::vector<std::string> names(spatial.size() + 2);
    names[batch] = std::string(1, b);
    names[feature] = std::string(1, f);
    for (size_t i = 0; i < spatial.size(); ++i) names[spatial[i]] = std::to_string(i);
    std::string s = "[";
    for (size_t i = 0; i < names.size(); ++i) s += (i ? ", " : "") + names[i];
    return s + "]";
  }
};

// Layout with dims (a, b, spatial...).
Layout layout(int64_t a, int64_t b, size_t nd) {
  Layout l{a, b, {}};
  for (size_t i = 0; i < nd; ++i) l.spatial.push_back(static_cast<int64_t>(i) + 2);
  return l;
}

struct ConvSpec {
  Layout lhs, rhs, out;
  std::vector<int64_t> strides, lhs_dilation, rhs_dilation, pad_lo, pad_hi;
  int64_t feature_groups = 1, batch_groups = 1;
};

Value convolution(Builder& b, const Value& lhs, const Value& rhs, const ConvSpec& s) {
  size_t nd = s.lhs.spatial.size();
  Shape out(nd + 2);
  out[s.out.batch] = lhs.shape()[s.lhs.batch] / s.batch_groups;
  out[s.out.feature] = rhs.shape()[s.rhs.batch];
  std::string pad = "dense<[";
  for (size_t i = 0; i < nd; ++i) {
    int64_t in = (lhs.shape()[s.lhs.spatial[i]] - 1) * s.lhs_dilation[i] + 1;
    int64_t k = (rhs.shape()[s.rhs.spatial[i]] - 1) * s.rhs_dilation[i] + 1;
    out[s.out.spatial[i]] = std::max<int64_t>((in + s.pad_lo[i] + s.pad_hi[i] - k) / s.strides[i] + 1, 0);
    pad += (i ? ", [" : "[") + std::to_string(s.pad_lo[i]) + ", " + std::to_string(s.pad_hi[i]) + "]";
  }
  pad += "]> : tensor<" + std::to_string(nd) + "x2xi64>";
  std::string attrs =
      "batch_group_count = " + std::to_string(s.batch_groups) +
      " : i64, dimension_numbers = #stablehlo.conv<" + s.lhs.str('b', 'f') + "x" +
      s.rhs.str('o', 'i') + "->" + s.out.str('b', 'f') +
      ">, feature_group_count = " + std::to_string(s.feature_groups) +
      " : i64, lhs_dilation = " + i64_array(s.lhs_dilation) + ", padding = " + pad +
      ", rhs_dilation = " + i64_array(s.rhs_dilation) + ", window_strides = " + i64_array(s.strides) +
      b.precision_attr(lhs, rhs);
  return b.op("stablehlo.convolution", {lhs, rhs}, TensorType{lhs.dtype(), out}, attrs);
}

Shape spatial(const Shape& s) { return Shape(s.begin() + 2, s.end()); }

// The leading `sizes` of each spatial dim of `x` (dims 2...).
Value crop_spatial(Builder& b, const Value& x, const Shape& start, const Shape& sizes) {
  Shape lo(x.rank(), 0), hi = x.shape();
  for (size_t i = 0; i < sizes.size(); ++i) {
    lo[i + 2] = start[i];
    hi[i + 2] = start[i] + sizes[i];
  }
  return b.slice(x, lo, hi);
}

// x [N, C, s...], w [O, C/g, k...].
Value forward(Builder& b, const Value& x, const Value& w, const ConvParams& p) {
  size_t nd = x.rank() - 2;
  ConvSpec s{layout(0, 1, nd), layout(0, 1, nd), layout(0, 1, nd)};
  s.strides = p.stride;
  s.lhs_dilation.assign(nd, 1);
  s.rhs_dilation = p.dilation;
  s.pad_lo = s.pad_hi = p.padding;
  s.feature_groups = p.groups;
  return convolution(b, x, w, s);
}

// Transposed conv: x [N, C, s...], w [C, O/g, k...], result spatial sizes `out`
// (output_padding is implied by them). It is the gradient of forward() with
// respect to its input: the input dilated by the stride, padded by
// d*(k-1)-p, convolved with the spatially flipped kernel.
Value transpose(Builder& b, const Value& x, Value w, const ConvParams& p, const Shape& out) {
  size_t nd = x.rank() - 2;
  int64_t g = p.groups, c = w.shape()[0], og = w.shape()[1];
  Shape ks = spatial(w.shape());
  if (g > 1) {
    // [C, O/g, k] -> [C/g, O, k]: group j's output features take group j's inputs.
    Shape split{g, c / g, og};
    split.insert(split.end(), ks.begin(), ks.end());
    std::vector<int64_t> perm{1, 0, 2};
    for (size_t i = 0; i < nd; ++i) perm.push_back(static_cast<int64_t>(i) + 3);
    Shape merged{c / g, g * og};
    merged.insert(merged.end(), ks.begin(), ks.end());
    w = b.reshape(b.transpose(b.reshape(w, split), perm), merged);
  }
  std::vector<int64_t> sp;
  for (size_t i = 0; i < nd; ++i) sp.push_back(static_cast<int64_t>(i) + 2);
  w = b.reverse(w, sp);
  ConvSpec s{layout(0, 1, nd), layout(1, 0, nd), layout(0, 1, nd)};
  s.strides.assign(nd, 1);
  s.lhs_dilation = p.stride;
  s.rhs_dilation = p.dilation;
  s.feature_groups = g;
  // Negative padding crops; we pad by at least 0 and crop the result instead
  // (the window stride is 1, so cropping input and output agree).
  Shape crop(nd, 0);
  for (size_t i = 0; i < nd; ++i) {
    int64_t dilated_in = (x.shape()[i + 2] - 1) * p.stride[i] + 1;
    int64_t lo = p.dilation[i] * (ks[i] - 1) - p.padding[i];
    int64_t hi = out[i] - dilated_in + p.padding[i];
    s.pad_lo.push_back(std::max<int64_t>(lo, 0));
    s.pad_hi.push_back(std::max<int64_t>(hi, 0));
    crop[i] = s.pad_lo[i] - lo;
  }
  return crop_spatial(b, convolution(b, x, w, s), crop, out);
}

// Gradient of forward(x, w) with respect to w, given dy [N, O, t...]: result
// [O, C/g, k...]. A convolution over the batch: x's batch dim is the
// contracted feature, dy is the kernel, the forward's dilation becomes the
// window stride and its stride the kernel dilation; groups become batch groups.
Value weight_grad(Builder& b, const Value& x, const Value& dy, const ConvParams& p, const Shape& ks) {
  size_t nd = x.rank() - 2;
  ConvSpec s{layout(1, 0, nd), layout(1, 0, nd), layout(1, 0, nd)};
  s.strides = p.dilation;
  s.lhs_dilation.assign(nd, 1);
  s.rhs_dilation = p.stride;
  s.pad_lo = p.padding;
  for (size_t i = 0; i < nd; ++i) {
    // Just enough high padding for k outputs; inputs past the last window are unused.
    int64_t need = p.dilation[i] * (ks[i] - 1) + p.stride[i] * (dy.shape()[i + 2] - 1) + 1;
    s.pad_hi.push_back(std::max<int64_t>(need - x.shape()[i + 2] - p.padding[i], 0));
  }
  s.batch_groups = p.groups;
  return crop_spatial(b, convolution(b, x, dy, s), Shape(nd, 0), ks);
}

// The checks of _convolution (check_shape_forward, check_input_same_type_as_parameters)
// that the Meta kernel of convolution lacks; CPU raises them as RuntimeError.
void check_forward(const LoweringContext& ctx, const ConvParams& p) {
  auto any = [](const std::vector<int64_t>& v, bool (*bad)(int64_t)) {
    return std::any_of(v.begin(), v.end(), bad);
  };
  auto negative = [](int64_t v) { return v < 0; };
  auto non_positive = [](int64_t v) { return v <= 0; };
  if (any(p.padding, negative)) ctx.fail("negative padding is not supported");
  if (any(p.output_padding, negative)) ctx.fail("negative output_padding is not supported");
  if (any(p.stride, non_positive)) ctx.fail("non-positive stride is not supported");
  if (any(p.dilation, non_positive)) ctx.fail("non-positive dilation is not supported");
  for (size_t i = 0; p.transposed && i < p.output_padding.size(); ++i)
    if (p.output_padding[i] >= p.stride[i] && p.output_padding[i] >= p.dilation[i])
      ctx.fail("output padding must be smaller than either stride or dilation");
  const Value& x = ctx.tensor("input");
  const Value& w = ctx.tensor("weight");
  if (x.dtype() != w.dtype())
    ctx.fail(std::string("Input type (") + dtype_name(x.dtype()) + ") and weight type (" +
             dtype_name(w.dtype()) + ") should be the same");
  if (ctx.has("bias")) {
    const Value& bias = ctx.tensor("bias");
    int64_t channels = p.transposed ? w.shape()[1] * p.groups : w.shape()[0];
    if (bias.rank() != 1 || bias.shape()[0] != channels)
      ctx.fail("expected bias to be 1-dimensional with " + std::to_string(channels) + " elements, but got " +
               bias.type.str());
    if (bias.dtype() != x.dtype())
      ctx.fail(std::string("Input type (") + dtype_name(x.dtype()) + ") and bias type (" +
               dtype_name(bias.dtype()) + ") should be the same");
  }
}

std::vector<Value> conv_forward(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  DType md = math_dtype(out.dtype);
  Value x = b.convert(ctx.tensor("input"), md), w = b.convert(ctx.tensor("weight"), md);
  ConvParams p = conv_params(ctx, x.rank() - 2);
  check_forward(ctx, p);
  // An empty result (no input channels give PyTorch's (N, 0, L) shape).
  if (out.numel() == 0) return {b.zeros(out)};
  Value y = p.transposed ? transpose(b, x, w, p, spatial(out.shape)) : forward(b, x, w, p);
  if (ctx.has("bias"))
    y = b.binary("add", y, b.broadcast_in_dim(b.convert(ctx.tensor("bias"), md), y.shape(), {1}));
  return {b.convert(y, out.dtype)};
}

// Computes the results PyTorch asks for in output_mask (grad_input, grad_weight,
// grad_bias); the others are undefined (None) and get no result.
std::vector<Value> conv_backward(LoweringContext& ctx) {
  Builder& b = ctx.b;
  DType md = math_dtype(ctx.tensor("input").dtype());
  Value dy = b.convert(ctx.tensor("grad_output"), md);
  Value x = b.convert(ctx.tensor("input"), md), w = b.convert(ctx.tensor("weight"), md);
  ConvParams p = conv_params(ctx, x.rank() - 2);
  std::vector<int64_t> mask = ctx.ints("output_mask");
  if (mask.size() != 3) ctx.fail("output_mask (bool[3]) did not reach the lowering as 3 ints");
  Shape xs = spatial(x.shape()), ks = spatial(w.shape());
  if (dy.type.numel() == 0) {  // no output element: every gradient is 0
    std::vector<Value> zeros;
    for (const TensorType& t : ctx.outputs) zeros.push_back(b.zeros(t));
    return zeros;
  }

  std::vector<Value> res;
  if (mask[0]) {
    Value dx = p.transposed ? crop_spatial(b, forward(b, dy, w, p), Shape(xs.size(), 0), xs)
                            : transpose(b, dy, w, p, xs);
    res.push_back(dx);
  }
  if (mask[1]) res.push_back(p.transposed ? weight_grad(b, dy, x, p, ks) : weight_grad(b, x, dy, p, ks));
  if (mask[2]) {
    std::vector<int64_t> dims{0};
    for (int64_t i = 2; i < dy.rank(); ++i) dims.push_back(i);
    res.push_back(b.reduce(dy, b.constant(0.0, md), dims, "stablehlo.add"));
  }
  if (ctx.outputs.size() == 3 && res.size() < 3) {
    // The executor kept a slot for each undefined result: it gets a placeholder it drops.
    std::vector<Value> all;
    for (size_t i = 0, k = 0; i < 3; ++i) all.push_back(mask[i] ? res[k++] : b.zeros(ctx.out(i)));
    res = all;
  }
  if (res.size() != ctx.outputs.size())
    ctx.fail("convolution_backward: " + std::to_string(ctx.outputs.size()) +
             " results expected for output_mask with " + std::to_string(res.size()) + " set");
  for (size_t i = 0; i < res.size(); ++i) res[i] = b.convert(res[i], ctx.out(i).dtype);
  return res;
}

}  // namespace

TORCH_PJRT_LOWERING("convolution", conv_forward);
TORCH_PJRT_LOWERING("_convolution", conv_forward);
TORCH_PJRT_LOWERING("convolution_backward", conv_backward);

}  // namespace torch_pjrt::lowering::ops

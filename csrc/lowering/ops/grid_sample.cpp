// grid_sampler_2d (F.grid_sample on 4-d input): bilinear, nearest and bicubic
// sampling with zeros, border and reflection padding, by the formulas of
// PyTorch's CPU kernel (aten/src/ATen/native/GridSampler.h). Every tap is one
// row gather from the image laid out as [N*H*W, C]; a tap outside the image
// reads nothing (zeros padding), and its weight multiplies the value read, as
// on CPU (so an inf under a zero weight still gives NaN there and here).
// Computed in the input's dtype, half types too, as CPU's kernel does; the
// backward op likewise (grad_input scattered back tap by tap).
#include <string>

#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {

struct Sampler {
  Builder& b;
  Value table;           // [N*H*W, C]
  int64_t n, c, h, w;    // image sizes
  Shape out;             // [N, Ho, Wo]
  int padding;           // 0 zeros, 1 border, 2 reflection
  bool align;

  Value k(double v) const { return b.splat(Scalar::from_float(v), TensorType{table.dtype(), out}); }
  Value add(const Value& x, const Value& y) const { return b.binary("add", x, y); }
  Value sub(const Value& x, const Value& y) const { return b.binary("subtract", x, y); }
  Value mul(const Value& x, const Value& y) const { return b.binary("multiply", x, y); }

  // [-1, 1] to pixel coordinates.
  Value unnormalize(const Value& g, int64_t size) const {
    if (align) return mul(add(g, k(1)), k((size - 1) / 2.0));
    return mul(sub(mul(add(g, k(1)), k(double(size))), k(1)), k(0.5));
  }
  Value clip(const Value& x, int64_t size) const {
    return b.binary("minimum", b.binary("maximum", x, k(0)), k(double(size - 1)));
  }
  // d unnormalize / d grid.
  double unnormalize_grad(int64_t size) const { return align ? (size - 1) / 2.0 : size / 2.0; }
  // The padded coordinate and d padded / d unpadded (PyTorch's *_set_grad:
  // 0 where clipped, including at the clip bounds themselves; -1 where
  // reflected an odd number of times).
  std::pair<Value, Value> pad_with_grad(const Value& x, int64_t size) const {
    auto clip_grad = [&](const Value& v) {
      return b.select(b.binary("and", b.compare(Cmp::GT, v, k(0)), b.compare(Cmp::LT, v, k(double(size - 1)))), k(1),
                      k(0));
    };
    if (padding == 1) return {clip(x, size), clip_grad(x)};
    if (padding == 2) {
      int64_t lo2 = align ? 0 : -1, hi2 = align ? 2 * (size - 1) : 2 * size - 1;
      Value sign = k(0), r = k(0);
      if (lo2 != hi2) {
        double lo = lo2 / 2.0, span = (hi2 - lo2) / 2.0;
        Value in = sub(x, k(lo));
        Value neg = b.compare(Cmp::LT, in, k(0));
        Value mult = b.select(neg, k(-1), k(1));
        in = b.unary("abs", in);
        Value extra = b.binary("remainder", in, k(span));
        Value flips = b.unary("floor", b.binary("divide", in, k(span)));
        Value even = b.compare(Cmp::EQ, b.binary("remainder", flips, k(2)), k(0));
        r = b.select(even, add(extra, k(lo)), add(sub(k(span), extra), k(lo)));
        sign = b.select(even, mult, b.unary("negate", mult));
      }
      return {clip(r, size), mul(sign, clip_grad(r))};
    }
    return {x, k(1)};
  }
  // compute_coordinates: the padding mode applied to a source coordinate (the
  // unused derivative is dropped by XLA).
  Value pad(const Value& x, int64_t size) const { return pad_with_grad(x, size).first; }
  // The image's values at integer-valued (x, y), [N, Ho, Wo, C], and whether
  // each lies inside the image.
  std::pair<Value, Value> read(const Value& x, const Value& y) const {
    auto [row, inside] = locate(x, y);
    Shape rows_shape = out;
    rows_shape.push_back(c);
    Value rows = b.op("stablehlo.gather", {table, row}, TensorType{table.dtype(), rows_shape},
                      "dimension_numbers = #stablehlo.gather<offset_dims = [3], collapsed_slice_dims = [0], "
                      "start_index_map = [0], index_vector_dim = 3>, slice_sizes = " + i64_array({1, c}) +
                          ", indices_are_sorted = false");
    return {rows, inside};
  }
  // The row of (x, y) in the table (0 outside) and whether it is inside.
  std::pair<Value, Value> locate(const Value& x, const Value& y) const {
    Value inside = b.binary("and", b.binary("and", b.compare(Cmp::GE, x, k(0)), b.compare(Cmp::LE, x, k(double(w - 1)))),
                            b.binary("and", b.compare(Cmp::GE, y, k(0)), b.compare(Cmp::LE, y, k(double(h - 1)))));
    TensorType it{DType::I64, out};
    auto as_int = [&](const Value& v) { return b.convert(b.select(inside, v, k(0)), DType::I64); };
    Value batch = b.binary("multiply", b.iota(it, 0), b.splat(Scalar::from_int(h * w), it));
    Value row = b.binary("add", batch, b.binary("add", b.binary("multiply", as_int(y), b.splat(Scalar::from_int(w), it)),
                                                as_int(x)));
    return {row, inside};
  }
  // grad_table[row(x, y)] += weight * grad (taps inside the image only).
  Value scatter(const Value& grad_table, const Value& x, const Value& y, const Value& weight, const Value& grad) const {
    auto [row, inside] = locate(x, y);
    Value upd = b.select(spread(inside), b.binary("multiply", grad, spread(weight)), b.zeros(grad.type));
    return b.op_multi("stablehlo.scatter", {grad_table, row, upd}, {grad_table.type},
                      "scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [3], "
                      "inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 3>, "
                      "indices_are_sorted = false, unique_indices = false",
                      b.binary_region(grad_table.dtype(), "stablehlo.add"))[0];
  }
  // [N, Ho, Wo] broadcast over the channels.
  Value spread(const Value& v) const {
    Shape s = out;
    s.push_back(c);
    return b.broadcast_in_dim(v, s, {0, 1, 2});
  }
  // weight * value for taps inside the image, nothing for the others.
  Value tap(const Value& acc, const Value& x, const Value& y, const Value& weight) const {
    auto [rows, inside] = read(x, y);
    Value term = b.binary("multiply", rows, spread(weight));
    Value r = b.select(spread(inside), term, b.zeros(term.type));
    return acc.id.empty() ? r : b.binary("add", acc, r);  // (the first tap starts the sum)
  }
  // The value at (x, y), 0 outside the image (get_value_bounded).
  Value bounded(const Value& x, const Value& y) const {
    auto [rows, inside] = read(x, y);
    return b.select(spread(inside), rows, b.zeros(rows.type));
  }
};

// cubic_convolution1/2 of PyTorch (A = -0.75): the four tap weights at t.
std::vector<Value> cubic_weights(const Sampler& s, const Value& t) {
  const double a = -0.75;
  auto conv1 = [&](const Value& x) {  // ((A + 2) x - (A + 3)) x^2 + 1
    return s.add(s.mul(s.mul(s.sub(s.mul(s.k(a + 2), x), s.k(a + 3)), x), x), s.k(1));
  };
  auto conv2 = [&](const Value& x) {  // ((A x - 5A) x + 8A) x - 4A
    return s.sub(s.mul(s.add(s.mul(s.sub(s.mul(s.k(a), x), s.k(5 * a)), x), s.k(8 * a)), x), s.k(4 * a));
  };
  return {conv2(s.add(t, s.k(1))), conv1(t), conv1(s.sub(s.k(1), t)), conv2(s.sub(s.k(2), t))};
}

std::vector<Value> grid_sampler_2d(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  DType dt = out.dtype;  // (CPU's kernel computes half types' coordinates in the half type)
  Value input = ctx.tensor("input"), grid = ctx.tensor("grid");
  if (input.rank() != 4 || grid.rank() != 4 || grid.shape()[3] != 2 || grid.shape()[0] != input.shape()[0])
    ctx.fail("grid_sampler(): expected 4D input and grid of shape [N, H_out, W_out, 2] with input's batch size");
  int64_t n = input.shape()[0], c = input.shape()[1], h = input.shape()[2], w = input.shape()[3];
  if (h == 0 || w == 0) ctx.fail("grid_sampler(): expected input to have non-empty spatial dimensions");
  if (out.numel() == 0) return {b.zeros(out)};
  int64_t mode = ctx.to_int("interpolation_mode", 0), padding = ctx.to_int("padding_mode", 0);
  Value x = b.convert(input, dt);
  Value table = b.reshape(b.transpose(x, {0, 2, 3, 1}), {n * h * w, c});
  Shape o{n, grid.shape()[1], grid.shape()[2]};
  Sampler s{b, table, n, c, h, w, o, int(padding), ctx.to_bool("align_corners", false)};
  Value g = b.convert(grid, dt);
  auto coord = [&](int64_t i) { return b.reshape(b.slice(g, {0, 0, 0, i}, {n, o[1], o[2], i + 1}), o); };
  Value gx = s.unnormalize(coord(0), w), gy = s.unnormalize(coord(1), h);
  Value acc{};
  if (mode == 2) {
    // bicubic: padding applied to each tap (get_value_bounded); each row
    // interpolated along x, then the rows along y, summed in CPU's order.
    Value x0 = b.unary("floor", gx), y0 = b.unary("floor", gy);
    auto wx = cubic_weights(s, s.sub(gx, x0)), wy = cubic_weights(s, s.sub(gy, y0));
    auto interp = [&](const std::vector<Value>& v, const std::vector<Value>& wt) {
      Value r = b.binary("multiply", v[0], s.spread(wt[0]));
      for (int i = 1; i < 4; ++i) r = b.binary("add", r, b.binary("multiply", v[i], s.spread(wt[i])));
      return r;
    };
    std::vector<Value> rows;
    for (int j = 0; j < 4; ++j) {
      std::vector<Value> v;
      for (int i = 0; i < 4; ++i) v.push_back(s.bounded(s.pad(s.add(x0, s.k(i - 1)), w), s.pad(s.add(y0, s.k(j - 1)), h)));
      rows.push_back(interp(v, wx));
    }
    acc = interp(rows, wy);
  } else {
    gx = s.pad(gx, w);
    gy = s.pad(gy, h);
    if (mode == 1) {  // nearest, halves to even (nearbyint)
      acc = s.tap(acc, b.unary("round_nearest_even", gx), b.unary("round_nearest_even", gy), s.k(1));
    } else {  // bilinear
      Value xw = b.unary("floor", gx), yn = b.unary("floor", gy);
      Value xe = s.add(xw, s.k(1)), ys = s.add(yn, s.k(1));
      Value dxe = s.sub(xe, gx), dxw = s.sub(gx, xw), dys = s.sub(ys, gy), dyn = s.sub(gy, yn);
      acc = s.tap(acc, xw, yn, s.mul(dxe, dys));
      acc = s.tap(acc, xe, yn, s.mul(dxw, dys));
      acc = s.tap(acc, xw, ys, s.mul(dxe, dyn));
      acc = s.tap(acc, xe, ys, s.mul(dxw, dyn));
    }
  }
  return {b.convert(b.transpose(acc, {0, 3, 1, 2}), out.dtype)};  // [N, C, Ho, Wo]
}

// d/dt of the four cubic tap weights (PyTorch's get_cubic_coefficients_grad).
std::vector<Value> cubic_weight_grads(const Sampler& s, const Value& t) {
  const double a = -0.75;
  Value x0 = s.sub(s.k(-1), t), x1 = s.sub(s.k(0), t), x2 = s.sub(s.k(1), t), x3 = s.sub(s.k(2), t);
  return {s.sub(s.mul(s.sub(s.mul(s.k(-3 * a), x0), s.k(10 * a)), x0), s.k(8 * a)),
          s.mul(s.sub(s.mul(s.k(-3 * (a + 2)), x1), s.k(2 * (a + 3))), x1),
          s.mul(s.sub(s.mul(s.k(3 * (a + 2)), x2), s.k(2 * (a + 3))), x2),
          s.add(s.mul(s.sub(s.mul(s.k(3 * a), x3), s.k(10 * a)), x3), s.k(8 * a))};
}

// grid_sampler_2d_backward(grad_output, input, grid, interpolation_mode,
// padding_mode, align_corners, output_mask) -> (grad_input, grad_grid): the
// taps' weights scattered back into the image, and the weights' derivatives
// times the values read, by the formulas of CPU's kernel.
std::vector<Value> grid_sampler_2d_backward(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& gi_type = ctx.out(0);
  const TensorType& gg_type = ctx.out(1);
  Value input = ctx.tensor("input"), grid = ctx.tensor("grid");
  DType dt = input.dtype();
  int64_t n = input.shape()[0], c = input.shape()[1], h = input.shape()[2], w = input.shape()[3];
  Shape o{n, grid.shape()[1], grid.shape()[2]};
  if (numel(o) == 0 || c == 0 || h == 0 || w == 0)
    return {b.zeros({dt, input.shape()}), b.zeros({grid.dtype(), grid.shape()})};
  int64_t mode = ctx.to_int("interpolation_mode", 0), padding = ctx.to_int("padding_mode", 0);
  Value table = b.reshape(b.transpose(input, {0, 2, 3, 1}), {n * h * w, c});
  Sampler s{b, table, n, c, h, w, o, int(padding), ctx.to_bool("align_corners", false)};
  Value go = b.transpose(b.convert(ctx.tensor("grad_output"), dt), {0, 2, 3, 1});  // [N, Ho, Wo, C]
  Value g = b.convert(grid, dt);
  auto coord = [&](int64_t i) { return b.reshape(b.slice(g, {0, 0, 0, i}, {n, o[1], o[2], i + 1}), o); };
  Value ix = s.unnormalize(coord(0), w), iy = s.unnormalize(coord(1), h);
  Value mx = s.k(s.unnormalize_grad(w)), my = s.k(s.unnormalize_grad(h));
  Value gtable = b.zeros(table.type);
  auto channel_sum = [&](const Value& v) { return b.reduce(v, b.constant(0.0, dt), {3}, "stablehlo.add"); };
  Value gix = s.k(0), giy = s.k(0);
  if (mode == 2) {
    Value x0 = b.unary("floor", ix), y0 = b.unary("floor", iy);
    Value tx = s.sub(ix, x0), ty = s.sub(iy, y0);
    auto wx = cubic_weights(s, tx), wy = cubic_weights(s, ty);
    auto dwx = cubic_weight_grads(s, tx), dwy = cubic_weight_grads(s, ty);
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j) {
        Value px = s.pad(s.add(x0, s.k(i - 1)), w), py = s.pad(s.add(y0, s.k(j - 1)), h);
        gtable = s.scatter(gtable, px, py, s.mul(wx[i], wy[j]), go);
        Value vg = channel_sum(b.binary("multiply", s.bounded(px, py), go));
        gix = s.sub(gix, s.mul(vg, s.mul(dwx[i], wy[j])));
        giy = s.sub(giy, s.mul(vg, s.mul(dwy[j], wx[i])));
      }
  } else {
    auto [px, dpx] = s.pad_with_grad(ix, w);
    auto [py, dpy] = s.pad_with_grad(iy, h);
    mx = s.mul(mx, dpx);
    my = s.mul(my, dpy);
    if (mode == 1) {
      gtable = s.scatter(gtable, b.unary("round_nearest_even", px), b.unary("round_nearest_even", py), s.k(1), go);
    } else {
      Value xw = b.unary("floor", px), yn = b.unary("floor", py);
      Value xe = s.add(xw, s.k(1)), ys = s.add(yn, s.k(1));
      Value dxe = s.sub(xe, px), dxw = s.sub(px, xw), dys = s.sub(ys, py), dyn = s.sub(py, yn);
      gtable = s.scatter(gtable, xw, yn, s.mul(dxe, dys), go);
      gtable = s.scatter(gtable, xe, yn, s.mul(dxw, dys), go);
      gtable = s.scatter(gtable, xw, ys, s.mul(dxe, dyn), go);
      gtable = s.scatter(gtable, xe, ys, s.mul(dxw, dyn), go);
      auto vg = [&](const Value& x, const Value& y) { return channel_sum(b.binary("multiply", s.bounded(x, y), go)); };
      Value nw = vg(xw, yn), ne = vg(xe, yn), sw = vg(xw, ys), se = vg(xe, ys);
      gix = s.add(s.sub(s.mul(s.sub(ne, nw), dys), s.mul(sw, dyn)), s.mul(se, dyn));
      giy = s.add(s.sub(s.sub(s.mul(sw, dxe), s.mul(nw, dxe)), s.mul(ne, dxw)), s.mul(se, dxw));
    }
  }
  Value gi = b.transpose(b.reshape(gtable, {n, h, w, c}), {0, 3, 1, 2});
  Shape o1 = o;
  o1.push_back(1);
  Value gg = b.concatenate({b.reshape(s.mul(mx, gix), o1), b.reshape(s.mul(my, giy), o1)}, 3);
  return {b.convert(gi, gi_type.dtype), b.convert(gg, gg_type.dtype)};
}

}  // namespace

TORCH_PJRT_LOWERING("grid_sampler_2d", grid_sampler_2d);
TORCH_PJRT_LOWERING("grid_sampler_2d_backward", grid_sampler_2d_backward);

}  // namespace torch_pjrt::lowering::ops

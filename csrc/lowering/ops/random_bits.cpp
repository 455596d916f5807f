#include "lowering/ops/random_bits.h"

#include <cmath>
#include <utility>

namespace torch_pjrt::lowering::ops {
namespace {

Value rotl(Builder& b, const Value& x, int r) {
  Value l = b.op("stablehlo.shift_left", {x, b.splat(Scalar::from_int(r), x.type)}, x.type);
  Value h = b.op("stablehlo.shift_right_logical", {x, b.splat(Scalar::from_int(32 - r), x.type)}, x.type);
  return b.binary("or", l, h);
}

std::pair<Value, Value> threefry2x32(Builder& b, const Value& k0, const Value& k1, Value x0, Value x1) {
  static const int kRot[8] = {13, 15, 26, 6, 17, 29, 16, 24};
  Value k2 = b.binary("xor", b.binary("xor", k0, k1), b.splat(Scalar::from_int(0x1BD11BDA), k0.type));
  const Value ks[3] = {k0, k1, k2};
  x0 = b.binary("add", x0, k0);
  x1 = b.binary("add", x1, k1);
  for (int i = 0; i < 5; ++i) {
    for (int r = 0; r < 4; ++r) {
      x0 = b.binary("add", x0, x1);
      x1 = b.binary("xor", rotl(b, x1, kRot[(i % 2) * 4 + r]), x0);
    }
    x0 = b.binary("add", x0, ks[(i + 1) % 3]);
    x1 = b.binary("add", b.binary("add", x1, ks[(i + 2) % 3]), b.splat(Scalar::from_int(i + 1), x1.type));
  }
  return {x0, x1};
}

}  // namespace

Value random_words(Builder& b, const Value& key, int64_t n) {
  int64_t m = (n + 1) / 2;
  Value w = b.bitcast_convert(key, TensorType{DType::I32, {2, 2}});
  auto word = [&](int64_t i, int64_t j) {
    return b.broadcast_to(b.reshape(b.slice(w, {i, j}, {i + 1, j + 1}), {}), {m});
  };
  Value c0 = b.binary("add", b.iota(TensorType{DType::I32, {m}}, 0), word(1, 0));
  auto [y0, y1] = threefry2x32(b, word(0, 0), word(0, 1), c0, word(1, 1));
  return b.slice(b.concatenate({y0, y1}, 0), {0}, {n});
}

Value uniform01(Builder& b, const Value& key, int64_t n) {
  Value bits = random_words(b, key, n);
  bits = b.op("stablehlo.shift_right_logical", {bits, b.splat(Scalar::from_int(8), bits.type)}, bits.type);
  Value f = b.convert(bits, DType::F32);
  return b.binary("multiply", f, b.splat(Scalar::from_float(std::ldexp(1.0, -24)), f.type));
}

}  // namespace torch_pjrt::lowering::ops

// _trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim): each
// input with size-1 dims inserted at its expand positions, the three
// multiplied (broadcast) and summed over sumdim, which the result drops.
// F.bilinear is this in compiled graphs; unroll_dim only picks CPU's loop.
#include <algorithm>

#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {

std::vector<Value> trilinear(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  std::vector<int64_t> sumdim = ctx.ints("sumdim");
  auto expanded = [&](const char* name, const char* expand) {
    const Value& x = ctx.tensor(name);
    std::vector<int64_t> at = ctx.ints(expand);
    int64_t total = x.rank() + static_cast<int64_t>(at.size());
    Shape shape;
    for (int64_t d = 0, k = 0; d < total; ++d)
      shape.push_back(std::count(at.begin(), at.end(), d) ? 1 : x.shape()[k++]);
    return b.reshape(b.convert(x, math_dtype(out.dtype)), shape);
  };
  Value a = expanded("i1", "expand1"), c = expanded("i2", "expand2"), e = expanded("i3", "expand3");
  Shape full = broadcast_shapes(broadcast_shapes(a.shape(), c.shape()), e.shape());
  Value p = b.binary("multiply", b.binary("multiply", b.broadcast_to(a, full), b.broadcast_to(c, full)),
                     b.broadcast_to(e, full));
  // (Half types in float32 and rounded once, as CPU's sum of products.)
  Value sum = b.reduce(p, b.zeros(TensorType{p.dtype(), {}}), sumdim, "stablehlo.add");
  return {b.reshape(b.convert(sum, out.dtype), out.shape)};
}

}  // namespace

TORCH_PJRT_LOWERING("_trilinear", trilinear);

}  // namespace torch_pjrt::lowering::ops

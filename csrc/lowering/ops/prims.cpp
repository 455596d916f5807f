// prims ops that AOTAutograd's decompositions leave in compiled graphs.
#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {

// convert_element_type(a, dtype)
std::vector<Value> convert_element_type(LoweringContext& ctx) {
  return {ctx.b.convert(ctx.tensor("a"), ctx.out().dtype)};
}

// fma(a, b, c) = a * b + c, in the result dtype.
std::vector<Value> fma(LoweringContext& ctx) {
  Builder& b = ctx.b;
  DType dt = ctx.out().dtype;
  const Shape& shape = ctx.out().shape;
  auto in = [&](const char* name) { return b.broadcast_to(b.convert(ctx.tensor(name), dt), shape); };
  return {b.binary("add", b.binary("multiply", in("a"), in("b")), in("c"))};
}

}  // namespace

TORCH_PJRT_LOWERING("convert_element_type", convert_element_type);
TORCH_PJRT_LOWERING("fma", fma);

}  // namespace torch_pjrt::lowering::ops

// Assertions on the data: torch._assert_async(cond[, msg]) and its
// functionalized form (torch.export). A device check that the one element is
// nonzero, raised with CPU's message at the next host read, as CUDA raises its
// device-side asserts (at the op itself in TORCH_PJRT_EAGER=debug): no host
// round trip per assertion, in eager or fused mode or in a compiled graph
// (where it was dropped before: PyTorch checks only size assertions while
// tracing). On CPU inputs a compiled graph runs it on the host (split_host).
#include <string>

#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {

std::vector<Value> assert_async(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const Value& self = ctx.tensor("self");
  int64_t n = self.type.numel();
  if (n != 1)  // (CPU's is_nonzero)
    ctx.fail(std::string("Boolean value of Tensor with ") + (n == 0 ? "no values" : "more than one value") +
             " is ambiguous");
  std::string msg = "Expected Tensor with single nonzero value, but got zero";
  if (ctx.has("assert_msg")) msg = ctx.str("assert_msg").empty() ? "Assertion is failed" : ctx.str("assert_msg");
  ctx.check_all(b.compare(Cmp::NE, self, b.zeros(self.type)), msg, LoweringContext::CheckError::Runtime);
  if (ctx.op == "_functional_assert_async") return {b.zeros(ctx.out())};  // its dependency token
  return {};
}

}  // namespace

TORCH_PJRT_LOWERING("_assert_async", assert_async);
TORCH_PJRT_LOWERING("_functional_assert_async", assert_async);

}  // namespace torch_pjrt::lowering::ops

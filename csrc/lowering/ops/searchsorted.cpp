// searchsorted and bucketize: CPU's binary search, run for every value at once
// (one gather per halving step, bit_length(M) steps for M boundaries), so a
// NaN or an unsorted sequence gives CPU's answer, not that of a count of
// smaller elements. Compared in the promoted dtype of both operands.
#include <string>

#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {

Value binary_search(Builder& b, const Value& seq, const Value& v, const Value* sorter, bool right) {
  int64_t m = seq.shape().back();
  bool batched = seq.rank() > 1;
  TensorType it{DType::I64, v.shape()};
  auto k = [&](int64_t x) { return b.splat(Scalar::from_int(x), it); };
  Value lo = b.zeros(it), hi = k(m);
  // Row coordinates of each value (batched): [S..., rank - 1].
  std::vector<Value> rows;
  if (batched)
    for (int64_t d = 0; d + 1 < seq.rank(); ++d) rows.push_back(b.iota(it, d));
  Shape coord = v.shape();
  coord.push_back(1);
  auto at = [&](const Value& table, const Value& pos) {
    std::vector<Value> parts;
    for (const Value& r : rows) parts.push_back(b.reshape(r, coord));
    parts.push_back(b.reshape(pos, coord));
    Value c = parts.size() == 1 ? parts[0] : b.concatenate(parts, v.rank());
    return b.gather_elements(table, c);
  };
  int64_t steps = 0;
  for (int64_t n = m; n > 0; n >>= 1) ++steps;
  for (int64_t s = 0; s < steps; ++s) {
    Value active = b.compare(Cmp::LT, lo, hi);
    Value mid = b.binary("add", lo, b.op("stablehlo.shift_right_logical", {b.binary("subtract", hi, lo), k(1)}, it));
    Value safe = b.select(active, mid, b.zeros(it));
    Value pos = sorter ? at(*sorter, safe) : safe;
    Value mv = at(seq, pos);
    // CPU: start = mid + 1 unless mid_val >= val (left) / mid_val > val (right).
    Value go_right = b.unary("not", b.compare(right ? Cmp::GT : Cmp::GE, mv, v));
    lo = b.select(b.binary("and", active, go_right), b.binary("add", mid, k(1)), lo);
    hi = b.select(b.binary("and", active, b.unary("not", go_right)), mid, hi);
  }
  return lo;
}

namespace {

bool is_right(const LoweringContext& ctx) {
  std::string side = ctx.str("side");
  return side.empty() ? ctx.to_bool("right", false) : side == "right";
}

std::vector<Value> search(LoweringContext& ctx, const char* seq_name, const char* values_name) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  DType dt = compute_dtype(ctx, seq_name, values_name);
  Value seq = b.convert(ctx.tensor(seq_name), dt);
  Value v = ctx.operand(values_name, dt);  // (a Scalar value is a runtime input)
  if (seq.rank() == 0) ctx.fail("torch.searchsorted(): boundaries tensor should be 1 dimension or the first N-1 "
                                "dimensions of boundaries tensor and input value tensor must match");
  bool has_sorter = ctx.has("sorter") && ctx.find("sorter")->kind == Arg::Tensor;
  if (ctx.op == "searchsorted") {  // CPU's notes on its copies (BucketizationUtils.h), once per process
    auto note = [&](const char* name, const char* what) {
      const Arg* a = ctx.find(name);
      if (a && a->kind == Arg::Tensor && !a->contiguous)
        ctx.warn_once(std::string("torch.searchsorted(): ") + what + " tensor is non-contiguous, this will lower the "
                      "performance due to extra data copy when converting non-contiguous tensor to contiguous, "
                      "please use contiguous " + what + " tensor if possible. This message will only appear once "
                      "per program.");
    };
    note(values_name, "input value");
    note(seq_name, "boundary");
    if (has_sorter) note("sorter", "sorter");
  }
  if (seq.shape().back() == 0 || v.type.numel() == 0) return {b.zeros(out)};
  Value sorter;
  if (has_sorter) {
    sorter = b.convert(ctx.tensor("sorter"), DType::I64);
    ctx.check_indices(sorter, 0, seq.shape().back(), "torch.searchsorted(): sorter index out of range",
                      LoweringContext::CheckError::Runtime);
  }
  Value r = binary_search(b, seq, v, has_sorter ? &sorter : nullptr, is_right(ctx));
  return {b.reshape(b.convert(r, out.dtype), out.shape)};
}

}  // namespace

TORCH_PJRT_LOWERING("searchsorted", [](LoweringContext& c) { return search(c, "sorted_sequence", "self"); });
TORCH_PJRT_LOWERING("bucketize", [](LoweringContext& c) { return search(c, "boundaries", "self"); });

}  // namespace torch_pjrt::lowering::ops

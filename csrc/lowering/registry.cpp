#include "lowering/registry.h"

#include <algorithm>
#include <stdexcept>

namespace torch_pjrt::lowering {
namespace {

std::map<std::string, LoweringInfo>& table() {
  static std::map<std::string, LoweringInfo> t;
  return t;
}

}  // namespace

void register_lowering(const std::string& name, LowerFn fn, bool needs_rng,
                       const std::string& source_file) {
  std::string family = source_file.substr(source_file.find_last_of('/') + 1);
  family = family.substr(0, family.find('.'));
  auto [it, inserted] = table().emplace(name, LoweringInfo{std::move(fn), needs_rng, family});
  if (!inserted) throw std::logic_error("torch_pjrt: lowering registered twice: " + name);
}

std::vector<std::tuple<std::string, std::string, bool>> lowering_table() {
  std::vector<std::tuple<std::string, std::string, bool>> rows;
  for (const auto& [k, v] : table()) rows.emplace_back(k, v.family, v.needs_rng);
  return rows;
}

const LoweringInfo* find_lowering(const std::string& name, const std::string& overload) {
  auto& t = table();
  if (!overload.empty()) {
    auto it = t.find(name + "." + overload);
    if (it != t.end()) return &it->second;
  }
  auto it = t.find(name);
  return it == t.end() ? nullptr : &it->second;
}

std::vector<std::string> registered_lowerings() {
  std::vector<std::string> names;
  for (const auto& [k, v] : table()) names.push_back(k);
  return names;
}

const Arg* LoweringContext::find(const std::string& name) const {
  for (const auto& a : args)
    if (a.name == name) return &a;
  return nullptr;
}

const Arg& LoweringContext::arg(const std::string& name) const {
  const Arg* a = find(name);
  if (!a) fail("missing argument '" + name + "'");
  return *a;
}

bool LoweringContext::has(const std::string& name) const {
  const Arg* a = find(name);
  return a && a->kind != Arg::None;
}

const Value& LoweringContext::tensor(const std::string& name) const {
  const Arg& a = arg(name);
  if (a.kind != Arg::Tensor) fail("argument '" + name + "' is not a tensor");
  return a.tensor;
}

Scalar LoweringContext::scalar(const std::string& name, Scalar dflt) const {
  const Arg* a = find(name);
  if (!a || a->kind == Arg::None) return dflt;
  if (a->kind == Arg::Int || a->kind == Arg::Float || a->kind == Arg::Bool) {
    if (a->dynamic) scalar_value_read = true;
    return a->scalar;
  }
  fail("argument '" + name + "' is not a scalar");
}

double LoweringContext::to_double(const std::string& name, double dflt) const {
  return has(name) ? scalar(name).to_double() : dflt;
}

int64_t LoweringContext::to_int(const std::string& name, int64_t dflt) const {
  return has(name) ? scalar(name).i : dflt;
}

bool LoweringContext::to_bool(const std::string& name, bool dflt) const {
  return has(name) ? scalar(name).i != 0 : dflt;
}

std::vector<int64_t> LoweringContext::ints(const std::string& name) const {
  const Arg* a = find(name);
  if (!a || a->kind == Arg::None) return {};
  if (a->kind == Arg::Int) {
    if (a->dynamic) scalar_value_read = true;
    return {a->scalar.i};
  }
  return a->ints;
}

std::string LoweringContext::str(const std::string& name, const std::string& dflt) const {
  const Arg* a = find(name);
  return a && a->kind == Arg::String ? a->str : dflt;
}

Value LoweringContext::operand(const std::string& name, DType dtype) {
  const Arg& a = arg(name);
  if (a.kind == Arg::Tensor) return b.convert(a.tensor, dtype);
  if (a.dynamic) return b.convert(*a.dynamic, dtype);
  return b.constant(scalar(name), dtype);
}

void LoweringContext::check_indices(const Value& idx, int64_t lo, int64_t hi, const std::string& message,
                                    CheckError error) {
  if (!checks_enabled) return;
  Value i = b.convert(idx, DType::I64);
  Value in_range = b.binary("and", b.compare(Cmp::GE, i, b.splat(Scalar::from_int(lo), i.type)),
                            b.compare(Cmp::LT, i, b.splat(Scalar::from_int(hi), i.type)));
  check_all(in_range, message, error);
}

void LoweringContext::check_all(const Value& ok, const std::string& message, CheckError error) {
  if (!checks_enabled) return;
  std::vector<int64_t> all;
  for (int64_t d = 0; d < ok.rank(); ++d) all.push_back(d);
  Value v = ok.rank() == 0 ? ok
                           : b.reduce(ok, b.constant(Scalar::from_bool(true), DType::Bool), all, "stablehlo.and");
  checks.push_back(Check{v, message, error});
}

Value fold_checks(Builder& b, Value word, const std::vector<std::pair<Value, int>>& checks) {
  TensorType t{DType::I32, {}};
  Value zero = b.splat(Scalar::from_int(0), t);
  Value failed = zero;
  // The first failing check wins: fold from the last one back.
  for (auto it = checks.rbegin(); it != checks.rend(); ++it)
    failed = b.select(it->first, failed, b.splat(Scalar::from_int(it->second), t));
  return b.select(b.compare(Cmp::NE, word, zero), word, failed);
}

PromotionOperand LoweringContext::promotion(const std::string& name) const {
  const Arg& a = arg(name);
  if (a.kind == Arg::Tensor) {
    if (a.wrapped_number) return {a.tensor.dtype(), PromotionOperand::WrappedScalar};
    return {a.tensor.dtype(),
            a.tensor.rank() == 0 ? PromotionOperand::ZeroDim : PromotionOperand::Dimensioned};
  }
  return {a.scalar.natural_dtype(), PromotionOperand::WrappedScalar};
}

void LoweringContext::fail(const std::string& why) const {
  throw std::runtime_error("torch_pjrt: lowering of aten::" + op +
                           (overload.empty() ? "" : "." + overload) + ": " + why);
}

void LoweringContext::not_implemented(const std::string& why) const {
  throw NotImplemented("torch_pjrt: lowering of aten::" + op + (overload.empty() ? "" : "." + overload) + ": " +
                       why);
}

void LoweringContext::index_error(const std::string& why) const {
  // std::out_of_range: the frontends raise it as IndexError (as wrap_dim's).
  throw std::out_of_range("torch_pjrt: lowering of aten::" + op + (overload.empty() ? "" : "." + overload) + ": " +
                          why);
}

int64_t wrap_dim(int64_t dim, int64_t rank) {
  int64_t r = std::max<int64_t>(rank, 1);
  if (dim < -r || dim >= r)
    throw std::out_of_range("Dimension out of range (expected to be in range of [" +
                            std::to_string(-r) + ", " + std::to_string(r - 1) + "], but got " +
                            std::to_string(dim) + ")");
  return dim < 0 ? dim + r : dim;
}

std::vector<int64_t> wrap_dims(const std::vector<int64_t>& dims, int64_t rank) {
  std::vector<int64_t> out;
  if (dims.empty()) {
    for (int64_t i = 0; i < rank; ++i) out.push_back(i);
    return out;
  }
  for (auto d : dims) {
    int64_t w = wrap_dim(d, rank);
    if (rank == 0) continue;  // a 0-d tensor reduced over dim 0/-1 keeps its shape
    if (std::find(out.begin(), out.end(), w) == out.end()) out.push_back(w);
  }
  std::sort(out.begin(), out.end());
  return out;
}

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n, 1);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1)
      throw std::runtime_error("shapes cannot be broadcast together");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

}  // namespace torch_pjrt::lowering

#include "lowering/builder.h"

#include <cstdint>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace torch_pjrt::lowering {

std::string i64_array(const std::vector<int64_t>& v) {
  std::string s = "array<i64";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : ": ") + std::to_string(v[i]);
  return s + ">";
}

std::string i64_list(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

namespace {

std::string types_of(const std::vector<Value>& vs) {
  std::string s;
  for (size_t i = 0; i < vs.size(); ++i) s += (i ? ", " : "") + vs[i].type.str();
  return s;
}

std::string ids_of(const std::vector<Value>& vs) {
  std::string s;
  for (size_t i = 0; i < vs.size(); ++i) s += (i ? ", " : "") + vs[i].id;
  return s;
}

std::string hex_bits(uint64_t bits, int width) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%0*llX", width, static_cast<unsigned long long>(bits));
  return buf;
}

const char* cmp_name(Cmp c) {
  switch (c) {
    case Cmp::EQ: return "EQ";
    case Cmp::NE: return "NE";
    case Cmp::LT: return "LT";
    case Cmp::LE: return "LE";
    case Cmp::GT: return "GT";
    case Cmp::GE: return "GE";
  }
  return "EQ";
}

}  // namespace

std::string Builder::fresh() { return "%v" + std::to_string(next_++); }

Value Builder::param(const TensorType& type) {
  Value v{"%arg" + std::to_string(params_.size()), type};
  params_.push_back(type);
  return v;
}

Value Builder::constant(const Scalar& v, DType dtype) {
  if (dtype == DType::F16 || dtype == DType::BF16 || is_float8(dtype))
    return convert(constant(v, DType::F32), dtype);
  if (is_complex(dtype)) return convert(constant(v, real_dtype(dtype)), dtype);  // imaginary part 0
  std::string lit;
  switch (dtype) {
    case DType::Bool:
      lit = (v.kind == Scalar::Float ? v.f != 0.0 : v.i != 0) ? "true" : "false";
      break;
    case DType::F32: {
      // (A uint64 converts directly, as C++ and CPU do: not through double, which rounds twice.)
      float f = v.kind == Scalar::UInt ? static_cast<float>(static_cast<uint64_t>(v.i))
                                       : static_cast<float>(v.to_double());
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      lit = hex_bits(bits, 8);
      break;
    }
    case DType::F64: {
      double d = v.to_double();
      uint64_t bits;
      std::memcpy(&bits, &d, 8);
      lit = hex_bits(bits, 16);
      break;
    }
    default: {
      // Integers wrap like a C cast, as PyTorch does for out-of-range values.
      int64_t i = v.kind == Scalar::Float ? static_cast<int64_t>(v.f) : v.i;
      switch (dtype) {
        case DType::U8: i = static_cast<uint8_t>(i); break;
        case DType::I8: i = static_cast<int8_t>(i); break;
        case DType::I16: i = static_cast<int16_t>(i); break;
        case DType::I32: i = static_cast<int32_t>(i); break;
        case DType::U16: i = static_cast<uint16_t>(i); break;
        case DType::U32: i = static_cast<uint32_t>(i); break;
        default: break;
      }
      lit = dtype == DType::U64 ? std::to_string(static_cast<uint64_t>(i)) : std::to_string(i);
    }
  }
  TensorType t{dtype, {}};
  std::string id = fresh();
  body_ += "    " + id + " = \"stablehlo.constant\"() {value = dense<" + lit + "> : " + t.str() +
           "} : () -> " + t.str() + "\n";
  Value c{id, t};
  if (dtype == DType::F32 || dtype == DType::F64) float_constant_.emplace(id, c);
  return c;
}

Value Builder::splat(const Scalar& v, const TensorType& type) {
  Value c = constant(v, type.dtype);
  if (type.shape.empty()) return c;
  return broadcast_in_dim(c, type.shape, {});
}

Value Builder::op(const std::string& name, const std::vector<Value>& operands,
                  const TensorType& result, const std::string& attrs) {
  return op_multi(name, operands, {result}, attrs)[0];
}

std::vector<Value> Builder::op_multi(const std::string& name, const std::vector<Value>& operands,
                                     const std::vector<TensorType>& results,
                                     const std::string& attrs, const std::string& region) {
  std::string id = fresh();
  std::string rtypes;
  for (size_t i = 0; i < results.size(); ++i) rtypes += (i ? ", " : "") + results[i].str();
  std::string line = "    " + id + (results.size() > 1 ? ":" + std::to_string(results.size()) : "") +
                     " = \"" + name + "\"(" + ids_of(operands) + ")";
  if (!region.empty()) line += " (" + region + ")";
  if (!attrs.empty()) line += " {" + attrs + "}";
  line += " : (" + types_of(operands) + ") -> ";
  line += results.size() == 1 ? rtypes : "(" + rtypes + ")";
  body_ += line + "\n";
  std::vector<Value> out;
  for (size_t i = 0; i < results.size(); ++i)
    out.push_back(Value{results.size() > 1 ? id + "#" + std::to_string(i) : id, results[i]});
  // A widened value moved about (a transposed or flipped weight) is still exact
  // in fewer passes (precision_attr).
  static const char* const kLayout[] = {"stablehlo.transpose", "stablehlo.reshape", "stablehlo.reverse",
                                        "stablehlo.slice", "stablehlo.broadcast_in_dim"};
  if (results.size() == 1 && operands.size() == 1 && !widened_.empty()) {
    auto it = widened_.find(operands[0].id);
    if (it != widened_.end())
      for (const char* l : kLayout)
        if (name == l) {
          widened_[id] = it->second;
          break;
        }
  }
  return out;
}

Value Builder::unary(const std::string& name, const Value& x) {
  Value y = op("stablehlo." + name, {x}, x.type);
  if (name != "log_plus_one" || x.dtype() != DType::F64) return y;
  // XLA's float64 log1p is up to 128 ulps off on -0.5 <= x < -0.29 (CPU 1;
  // softplus, logaddexp, xlog1py, BCE reach it): there log(u) * x / (u - 1)
  // for u = 1 + x (u - 1 exact), within an ulp.
  Value one = splat(Scalar::from_float(1.0), x.type);
  Value u = binary("add", x, one);
  Value goldberg = binary("multiply", op("stablehlo.log", {u}, x.type), binary("divide", x, binary("subtract", u, one)));
  Value band = binary("and", compare(Cmp::GE, x, splat(Scalar::from_float(-0.5), x.type)),
                      compare(Cmp::LT, x, splat(Scalar::from_float(-0.29), x.type)));
  return select(band, goldberg, y);
}

Value Builder::binary(const std::string& name, const Value& a, const Value& b) {
  if (a.type != b.type)
    throw std::runtime_error("builder: " + name + " operand types differ: " + a.type.str() +
                             " vs " + b.type.str());
  auto c = name == "divide" ? float_constant_.find(b.id) : float_constant_.end();
  if (c != float_constant_.end()) {
    // XLA turns x / c for a constant c into x * (1 / c), 1 ulp off CPU's
    // quotient in about a third of the elements (means, variances, round's
    // decimals, pooling and norm divisors): the constant goes through a
    // barrier (before its broadcast, so nothing of x's size is materialized).
    Value k = c->second;
    Value opaque = op("stablehlo.optimization_barrier", {k}, k.type);
    return op("stablehlo." + name, {a, broadcast_in_dim(opaque, b.shape(), {})}, a.type);
  }
  return op("stablehlo." + name, {a, b}, a.type);
}

Value Builder::compare(Cmp dir, const Value& a, const Value& b) {
  std::string type = is_float(a.dtype()) || is_complex(a.dtype()) ? "FLOAT" : is_unsigned(a.dtype()) || a.dtype() == DType::Bool ? "UNSIGNED" : "SIGNED";
  return op("stablehlo.compare", {a, b}, TensorType{DType::Bool, a.shape()},
            std::string("comparison_direction = #stablehlo<comparison_direction ") + cmp_name(dir) +
                ">, compare_type = #stablehlo<comparison_type " + type + ">");
}

Value Builder::select(const Value& pred, const Value& t, const Value& f) {
  return op("stablehlo.select", {pred, t, f}, t.type);
}

// To float8 through float32, as PyTorch's c10 types convert (a double or an
// integer is rounded to float first), with CPU's choices where XLA's convert
// differs: float8_e4m3fn saturates finite and infinite overflow to +-448
// (NaN stays NaN), and float8_e5m2's NaN has the bits 0x7F.
Value Builder::convert_to_float8(const Value& x, DType to) {
  Value xf = convert(x, DType::F32);
  Value nan = compare(Cmp::NE, xf, xf);
  if (to == DType::F8E4M3FN) {
    Value lim = splat(Scalar::from_float(448.0), xf.type);
    Value neg = splat(Scalar::from_float(-448.0), xf.type);
    Value clamped = select(compare(Cmp::GT, xf, lim), lim, select(compare(Cmp::LT, xf, neg), neg, xf));
    xf = select(nan, xf, clamped);
  }
  Value y = op("stablehlo.convert", {xf}, TensorType{to, x.shape()});
  if (to == DType::F8E5M2) {
    TensorType u32{DType::U32, x.shape()}, u8{DType::U8, x.shape()};
    Value sign = op("stablehlo.shift_right_logical", {bitcast_convert(xf, u32), splat(Scalar::from_int(24), u32)}, u32);
    sign = convert(binary("and", sign, splat(Scalar::from_int(0x80), u32)), DType::U8);
    Value bits = binary("or", sign, splat(Scalar::from_int(0x7F), u8));
    // (Chosen as bits: XLA's CPU backend computes float8 values in a wider
    // type, and a select of float8 values would canonicalize the NaN again.)
    y = bitcast_convert(select(nan, bits, bitcast_convert(y, u8)), y.type);
  }
  return y;
}

Value Builder::convert(const Value& x, DType to) {
  Value y = convert_value(x, to);
  DType from = x.dtype();
  if (to == DType::F32 && y.id != x.id &&
      (from == DType::BF16 || from == DType::F16 || is_float8(from) || from == DType::I8 || from == DType::U8 ||
       from == DType::Bool))
    widened_[y.id] = from;
  return y;
}

Value Builder::convert_value(const Value& x, DType to) {
  if (x.dtype() == to) return x;
  if (is_float8(to)) return convert_to_float8(x, to);
  if (is_float8(x.dtype()) && to != DType::F32 && to != DType::Bool) {
    // Through float32 (exact), as PyTorch's conversions go. A NaN of the
    // fnuz types becomes integer 0 on CPU (other NaNs: see float -> int below).
    Value xf = convert(x, DType::F32);
    Value y = convert(xf, to);
    if (is_integral(to, false) && (x.dtype() == DType::F8E4M3FNUZ || x.dtype() == DType::F8E5M2FNUZ))
      y = select(compare(Cmp::NE, xf, xf), splat(Scalar::from_int(0), y.type), y);
    return y;
  }
  if (is_complex(x.dtype()) && !is_complex(to)) {
    // complex -> real keeps the real part, as PyTorch does (XLA has no such convert).
    DType r = real_dtype(x.dtype());
    Value re = op("stablehlo.real", {x}, TensorType{r, x.shape()});
    if (to == DType::Bool) {
      Value im = op("stablehlo.imag", {x}, TensorType{r, x.shape()});
      return binary("or", convert(re, to), convert(im, to));
    }
    return convert(re, to);
  }
  if (is_complex(to) && !is_complex(x.dtype()) && x.dtype() != real_dtype(to)) {
    return convert(convert(x, real_dtype(to)), to);
  }
  if (to == DType::Bool) {
    // Nonzero is true, as in PyTorch (a plain convert would truncate).
    return compare(Cmp::NE, x, splat(Scalar::from_int(0), x.type));
  }
  if (is_float(x.dtype()) && (to == DType::U32 || to == DType::U64)) {
    // CPU's uint32 conversion goes through int64 and its uint64 one is
    // unsigned: [lo, 2^bits) converts exactly, negatives wrap (-1 -> max);
    // past 2^bits (and +inf) is 0, the rest (NaN, -inf, below lo) 2^(bits-1),
    // as CPU's elementwise kernels give. Computed in int64 (the same bits).
    bool u64 = to == DType::U64;
    Value xf = itemsize(x.dtype()) < 4 ? convert(x, DType::F32) : x;  // exact
    auto c = [&](double v) { return splat(Scalar::from_float(v), xf.type); };
    auto i = [&](int64_t v) { return splat(Scalar::from_int(v), TensorType{DType::I64, x.shape()}); };
    auto within = [&](double lo, double hi) {
      return binary("and", compare(Cmp::GE, xf, c(lo)), compare(Cmp::LT, xf, c(hi)));
    };
    auto to_i64 = [&](const Value& v) { return op("stablehlo.convert", {v}, TensorType{DType::I64, x.shape()}); };
    double two63 = 9223372036854775808.0, top = u64 ? 18446744073709551616.0 : 4294967296.0;
    double lo = u64 ? -two63 : -2147483648.0;
    Value y = select(compare(Cmp::GE, xf, c(top)), i(0), i(u64 ? INT64_MIN : int64_t(1) << 31));
    if (u64)  // [2^63, 2^64): x - 2^63 (exact) with the top bit set
      y = select(within(two63, top), binary("add", to_i64(binary("subtract", xf, c(two63))), i(INT64_MIN)), y);
    y = select(within(lo, u64 ? two63 : top), to_i64(xf), y);
    return op("stablehlo.convert", {y}, TensorType{to, x.shape()});
  }
  if (is_float(x.dtype()) && is_integral(to, false)) {
    // PyTorch's CPU kernels convert through int32 (int64 for int64) with the
    // x86 rule: NaN, +-inf and values out of that range give its minimum
    // (narrower types keep the low bits). XLA would saturate instead.
    DType wide = to == DType::I64 ? DType::I64 : DType::I32;
    Value xf = itemsize(x.dtype()) < 4 ? convert(x, DType::F32) : x;  // exact
    double bound = wide == DType::I64 ? 9223372036854775808.0 : 2147483648.0;
    Value ok = binary("and", compare(Cmp::GE, xf, splat(Scalar::from_float(-bound), xf.type)),
                      compare(Cmp::LT, xf, splat(Scalar::from_float(bound), xf.type)));
    Value y = op("stablehlo.convert", {xf}, TensorType{wide, x.shape()});
    int64_t min = wide == DType::I64 ? INT64_MIN : INT32_MIN;
    y = select(ok, y, splat(Scalar::from_int(min), y.type));
    return wide == to ? y : op("stablehlo.convert", {y}, TensorType{to, x.shape()});
  }
  if (x.dtype() == DType::Bool && is_float(to)) {
    // XLA rewrites convert(pred) * y into select(pred, y, 0), which drops y's
    // NaN and inf where pred is false (CPU: 0 * nan is nan). A mask converted
    // by one op and multiplied by the next meet in one program in fused eager
    // and compiled graphs: the barrier keeps the product a product.
    Value c = op("stablehlo.convert", {x}, TensorType{to, x.shape()});
    return op("stablehlo.optimization_barrier", {c}, c.type);
  }
  return op("stablehlo.convert", {x}, TensorType{to, x.shape()});
}

Value Builder::bitcast_convert(const Value& x, const TensorType& to) {
  return op("stablehlo.bitcast_convert", {x}, to);
}

std::string Builder::precision_attr(const Value& a, const Value& b) {
  auto needed = [&](const Value& v) {
    if (v.dtype() != DType::F32 && v.dtype() != DType::C64) return Precision::Default;
    auto it = widened_.find(v.id);
    if (it != widened_.end()) return it->second == DType::F16 ? Precision::High : Precision::Default;
    used_f32_precision_ = true;
    return f32_precision_;
  };
  Precision p = std::max(needed(a), needed(b));
  if (p == Precision::Default) return "";
  std::string one = p == Precision::Highest ? "#stablehlo<precision HIGHEST>" : "#stablehlo<precision HIGH>";
  return ", precision_config = [" + one + ", " + one + "]";
}

Value Builder::reshape(const Value& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  return op("stablehlo.reshape", {x}, TensorType{x.dtype(), shape});
}

Value Builder::transpose(const Value& x, const std::vector<int64_t>& perm) {
  bool identity = true;
  for (size_t i = 0; i < perm.size(); ++i) identity &= perm[i] == int64_t(i);
  if (identity) return x;
  Shape s;
  for (auto p : perm) s.push_back(x.shape()[p]);
  return op("stablehlo.transpose", {x}, TensorType{x.dtype(), s},
            "permutation = " + i64_array(perm));
}

Value Builder::broadcast_in_dim(const Value& x, const Shape& shape, const std::vector<int64_t>& dims) {
  if (x.shape() == shape) return x;
  Value y = op("stablehlo.broadcast_in_dim", {x}, TensorType{x.dtype(), shape},
               "broadcast_dimensions = " + i64_array(dims));
  auto c = float_constant_.find(x.id);
  if (c != float_constant_.end()) float_constant_.emplace(y.id, c->second);
  return y;
}

Value Builder::broadcast_to(const Value& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  int64_t r = x.rank(), R = static_cast<int64_t>(shape.size());
  if (r > R) throw std::runtime_error("builder: cannot broadcast " + x.type.str() + " to fewer dims");
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < r; ++i) {
    int64_t target = shape[R - r + i];
    if (x.shape()[i] != target && x.shape()[i] != 1)
      throw std::runtime_error("builder: cannot broadcast " + x.type.str());
    dims.push_back(R - r + i);
  }
  return broadcast_in_dim(x, shape, dims);
}

Value Builder::slice(const Value& x, const Shape& start, const Shape& limit, const Shape& strides_in) {
  Shape strides = strides_in.empty() ? Shape(start.size(), 1) : strides_in;
  Shape out;
  bool identity = true;
  for (size_t i = 0; i < start.size(); ++i) {
    int64_t n = limit[i] > start[i] ? (limit[i] - start[i] + strides[i] - 1) / strides[i] : 0;
    out.push_back(n);
    identity &= start[i] == 0 && limit[i] == x.shape()[i] && strides[i] == 1;
  }
  if (identity) return x;
  return op("stablehlo.slice", {x}, TensorType{x.dtype(), out},
            "start_indices = " + i64_array(start) + ", limit_indices = " + i64_array(limit) +
                ", strides = " + i64_array(strides));
}

Value Builder::pad(const Value& x, const Value& pad_value, const Shape& low, const Shape& high,
                   const Shape& interior_in) {
  Shape interior = interior_in.empty() ? Shape(low.size(), 0) : interior_in;
  Shape out;
  for (size_t i = 0; i < low.size(); ++i) {
    int64_t n = x.shape()[i];
    out.push_back(low[i] + high[i] + n + (n > 0 ? (n - 1) * interior[i] : 0));
  }
  return op("stablehlo.pad", {x, pad_value}, TensorType{x.dtype(), out},
            "edge_padding_low = " + i64_array(low) + ", edge_padding_high = " + i64_array(high) +
                ", interior_padding = " + i64_array(interior));
}

Value Builder::concatenate(const std::vector<Value>& xs, int64_t dim) {
  if (xs.size() == 1) return xs[0];
  Shape s = xs[0].shape();
  s[dim] = 0;
  for (const auto& x : xs) s[dim] += x.shape()[dim];
  return op("stablehlo.concatenate", xs, TensorType{xs[0].dtype(), s},
            "dimension = " + std::to_string(dim) + " : i64");
}

Value Builder::reverse(const Value& x, const std::vector<int64_t>& dims) {
  if (dims.empty()) return x;
  return op("stablehlo.reverse", {x}, x.type, "dimensions = " + i64_array(dims));
}

Value Builder::iota(const TensorType& type, int64_t dim) {
  return op("stablehlo.iota", {}, type, "iota_dimension = " + std::to_string(dim) + " : i64");
}

Value Builder::dynamic_update_slice(const Value& x, const Value& update, const Shape& start) {
  if (update.shape() == x.shape()) return update;
  std::vector<Value> at;
  for (auto s : start) at.push_back(constant_int(s, DType::I64));
  return dynamic_update_slice_at(x, update, at);
}

Value Builder::dynamic_update_slice_at(const Value& x, const Value& update, const std::vector<Value>& start) {
  std::vector<Value> operands{x, update};
  operands.insert(operands.end(), start.begin(), start.end());
  return op("stablehlo.dynamic_update_slice", operands, x.type);
}

Value Builder::dynamic_slice(const Value& x, const std::vector<Value>& start, const Shape& sizes) {
  std::vector<Value> operands{x};
  operands.insert(operands.end(), start.begin(), start.end());
  return op("stablehlo.dynamic_slice", operands, TensorType{x.dtype(), sizes},
            "slice_sizes = " + i64_array(sizes));
}

std::string Builder::binary_region(DType dtype, const std::string& body_op) {
  TensorType s{dtype, {}};
  std::string a = fresh(), b = fresh(), r = fresh();
  return "{\n    ^bb0(" + a + ": " + s.str() + ", " + b + ": " + s.str() + "):\n      " + r +
         " = \"" + body_op + "\"(" + a + ", " + b + ") : (" + s.str() + ", " + s.str() + ") -> " +
         s.str() + "\n      \"stablehlo.return\"(" + r + ") : (" + s.str() + ") -> ()\n    }";
}

std::string Builder::region(const std::vector<TensorType>& types, const LoopFn& fn) {
  std::vector<Value> args = open_region(types);
  return close_region(fn(*this, args));
}

std::vector<Value> Builder::open_region(const std::vector<TensorType>& types) {
  // The body is emitted into body_, then cut out of it by close_region.
  OpenRegion r;
  std::swap(r.outer_body, body_);
  std::vector<Value> args;
  for (size_t i = 0; i < types.size(); ++i) {
    args.push_back(Value{fresh(), types[i]});
    r.signature += (i ? ", " : "") + args.back().id + ": " + types[i].str();
  }
  open_.push_back(std::move(r));
  return args;
}

std::string Builder::close_region(const std::vector<Value>& results) {
  if (open_.empty()) throw std::logic_error("torch_pjrt: close_region without an open region");
  OpenRegion r = std::move(open_.back());
  open_.pop_back();
  std::string inner;
  std::swap(inner, body_);
  body_ = std::move(r.outer_body);
  return "{\n    ^bb0(" + r.signature + "):\n" + inner + "    \"stablehlo.return\"(" + ids_of(results) + ") : (" +
         types_of(results) + ") -> ()\n    }";
}

std::vector<Value> Builder::while_loop(const std::vector<Value>& init, const LoopFn& cond,
                                       const LoopFn& body) {
  std::vector<TensorType> types;
  for (const Value& v : init) types.push_back(v.type);
  return op_multi("stablehlo.while", init, types, "", region(types, cond) + ", " + region(types, body));
}

Value Builder::reduce(const Value& x, const Value& init, const std::vector<int64_t>& dims,
                      const std::string& body_op) {
  if (dims.empty()) return x;
  Shape out;
  for (int64_t i = 0; i < x.rank(); ++i) {
    bool reduced = false;
    for (auto d : dims) reduced |= d == i;
    if (!reduced) out.push_back(x.shape()[i]);
  }
  std::vector<int64_t> sorted = dims;
  std::sort(sorted.begin(), sorted.end());
  return op_multi("stablehlo.reduce", {x, init}, {TensorType{x.dtype(), out}},
                  "dimensions = " + i64_array(sorted), binary_region(x.dtype(), body_op))[0];
}

Value Builder::dot_general(const Value& a, const Value& b, const std::vector<int64_t>& batch_a,
                           const std::vector<int64_t>& batch_b, const std::vector<int64_t>& contract_a,
                           const std::vector<int64_t>& contract_b, DType result_dtype) {
  if (a.dtype() == DType::Bool || b.dtype() == DType::Bool) {
    // XLA's CPU dot emitter aborts the process on some boolean dots (a bool
    // addmv: "Check failed: addend_array_ == nullptr"): counted in int32, a
    // bool result is "any product true".
    Value n = dot_general(convert(a, DType::I32), convert(b, DType::I32), batch_a, batch_b, contract_a, contract_b,
                          DType::I32);
    return result_dtype == DType::Bool ? compare(Cmp::NE, n, zeros(n.type)) : convert(n, result_dtype);
  }
  Shape out;
  for (auto d : batch_a) out.push_back(a.shape()[d]);
  auto free_dims = [&](const Value& v, const std::vector<int64_t>& batch,
                       const std::vector<int64_t>& contract) {
    for (int64_t i = 0; i < v.rank(); ++i) {
      bool used = false;
      for (auto d : batch) used |= d == i;
      for (auto d : contract) used |= d == i;
      if (!used) out.push_back(v.shape()[i]);
    }
  };
  free_dims(a, batch_a, contract_a);
  free_dims(b, batch_b, contract_b);
  return op("stablehlo.dot_general", {a, b}, TensorType{result_dtype, out},
            "dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = " + i64_list(batch_a) +
                ", rhs_batching_dimensions = " + i64_list(batch_b) +
                ", lhs_contracting_dimensions = " + i64_list(contract_a) +
                ", rhs_contracting_dimensions = " + i64_list(contract_b) + ">" + precision_attr(a, b));
}

Value Builder::gather_elements(const Value& x, const Value& indices) {
  std::vector<int64_t> all;
  for (int64_t i = 0; i < x.rank(); ++i) all.push_back(i);
  Shape out(indices.shape().begin(), indices.shape().end() - 1);
  return op("stablehlo.gather", {x, indices}, TensorType{x.dtype(), out},
            "dimension_numbers = #stablehlo.gather<collapsed_slice_dims = " + i64_list(all) +
                ", start_index_map = " + i64_list(all) +
                ", index_vector_dim = " + std::to_string(indices.rank() - 1) +
                ">, slice_sizes = " + i64_array(Shape(x.rank(), 1)) +
                ", indices_are_sorted = false");
}

std::string Builder::scatter_region(DType dtype, const std::string& combine_op) {
  if (!combine_op.empty()) return binary_region(dtype, combine_op);
  // Replace: return the update value.
  TensorType s{dtype, {}};
  std::string a = fresh(), b = fresh();
  return "{\n    ^bb0(" + a + ": " + s.str() + ", " + b + ": " + s.str() +
         "):\n      \"stablehlo.return\"(" + b + ") : (" + s.str() + ") -> ()\n    }";
}

Value Builder::scatter_elements(const Value& x, const Value& indices, const Value& updates,
                                const std::string& combine_op) {
  std::vector<int64_t> all;
  for (int64_t i = 0; i < x.rank(); ++i) all.push_back(i);
  std::string region = scatter_region(x.dtype(), combine_op);
  return op_multi("stablehlo.scatter", {x, indices, updates}, {x.type},
                  "scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = " +
                      i64_list(all) + ", scatter_dims_to_operand_dims = " + i64_list(all) +
                      ", index_vector_dim = " + std::to_string(indices.rank() - 1) +
                      ">, indices_are_sorted = false, unique_indices = false",
                  region)[0];
}

std::string Builder::finish(const std::vector<Value>& results) const {
  std::string s = "module @torch_pjrt " +
                  (replicas_ > 0 ? "attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = " +
                                       std::to_string(replicas_) + " : i32} "
                                 : std::string()) +
                  "{\n" + functions_ + "  func.func public @main(";
  for (size_t i = 0; i < params_.size(); ++i) {
    s += (i ? ", " : "") + std::string("%arg") + std::to_string(i) + ": " + params_[i].str();
    for (const auto& [param, result] : aliases_)
      if (param == i) s += " {tf.aliasing_output = " + std::to_string(result) + " : i32}";
  }
  s += ") -> (" + types_of(results) + ") {\n" + body_;
  s += "    \"func.return\"(" + ids_of(results) + ") : (" + types_of(results) + ") -> ()\n  }\n}\n";
  return s;
}

}  // namespace torch_pjrt::lowering

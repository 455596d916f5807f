#include "distributed/collective_programs.h"

#include <c10/util/Exception.h>

#include <map>
#include <sstream>

#include "lowering/builder.h"

namespace torch_pjrt::distributed {
namespace {

using lowering::Builder;
using lowering::DType;
using lowering::TensorType;
using lowering::Value;

const char* reduction_name(Reduction r) {
  switch (r) {
    case Reduction::Sum: return "sum";
    case Reduction::Avg: return "avg";
    case Reduction::Product: return "product";
    case Reduction::Min: return "min";
    case Reduction::Max: return "max";
  }
  return "?";
}

// The reduction's combining op on scalars of `t`. Bool: sum and max are
// "or", product and min are "and" (what gloo computes on bool).
const char* combiner(const CollectiveSpec& s, DType t) {
  if (lowering::is_complex(t) && (s.reduction == Reduction::Min || s.reduction == Reduction::Max))
    TORCH_CHECK_TYPE(false, "torch_pjrt: ", collective_name(s.kind), " with ReduceOp.", reduction_name(s.reduction),
                     " is not defined for complex tensors (", lowering::dtype_name(t), ")");
  switch (s.reduction) {
    case Reduction::Sum:
    case Reduction::Avg: return t == DType::Bool ? "stablehlo.or" : "stablehlo.add";
    case Reduction::Product: return t == DType::Bool ? "stablehlo.and" : "stablehlo.multiply";
    case Reduction::Min: return t == DType::Bool ? "stablehlo.and" : "stablehlo.minimum";
    case Reduction::Max: return t == DType::Bool ? "stablehlo.or" : "stablehlo.maximum";
  }
  return "stablehlo.add";
}

std::string groups(int ranks) {
  std::string g = "dense<[[";
  for (int r = 0; r < ranks; ++r) g += (r ? ", " : "") + std::to_string(r);
  return g + "]]> : tensor<1x" + std::to_string(ranks) + "xi64>";
}

}  // namespace

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::AllReduce: return "all_reduce";
    case Collective::AllGather: return "all_gather";
    case Collective::ReduceScatter: return "reduce_scatter";
    case Collective::AllToAll: return "all_to_all";
    case Collective::Broadcast: return "broadcast";
    case Collective::Permute: return "send/recv";
  }
  return "?";
}

Collective collective_from_name(const std::string& name) {
  static const std::map<std::string, Collective> kinds = {
      {"all_reduce", Collective::AllReduce}, {"all_gather", Collective::AllGather},
      {"reduce_scatter", Collective::ReduceScatter}, {"all_to_all", Collective::AllToAll},
      {"broadcast", Collective::Broadcast}, {"permute", Collective::Permute}};
  auto it = kinds.find(name);
  TORCH_CHECK_VALUE(it != kinds.end(), "torch_pjrt: unknown collective '", name, "'");
  return it->second;
}

Reduction reduction_from_name(const std::string& name) {
  static const std::map<std::string, Reduction> reductions = {{"sum", Reduction::Sum},
                                                              {"avg", Reduction::Avg},
                                                              {"product", Reduction::Product},
                                                              {"min", Reduction::Min},
                                                              {"max", Reduction::Max}};
  auto it = reductions.find(name);
  TORCH_CHECK_VALUE(it != reductions.end(), "torch_pjrt: unknown reduction '", name, "'");
  return it->second;
}

std::string CollectiveSpec::key() const {
  std::ostringstream k;
  k << static_cast<int>(kind) << '|' << static_cast<int>(reduction) << '|' << static_cast<int>(dtype) << '|'
    << numel << '|' << ranks << '|' << root;
  return k.str();
}

int64_t output_numel(const CollectiveSpec& s) {
  switch (s.kind) {
    case Collective::AllGather: return s.numel * s.ranks;
    case Collective::ReduceScatter: return s.numel / s.ranks;
    default: return s.numel;
  }
}

Value emit_collective(Builder& b, const CollectiveSpec& s, const Value& x) {
  TORCH_CHECK_VALUE(s.ranks >= 1, "torch_pjrt: a collective needs at least one rank");
  TORCH_CHECK_VALUE(s.kind != Collective::Permute || s.ranks == 2, "torch_pjrt: send/recv runs on 2 devices");
  TORCH_CHECK_VALUE(x.rank() >= 1, "torch_pjrt: ", collective_name(s.kind), " takes a tensor of rank >= 1");
  DType t = x.dtype();
  int64_t n0 = x.shape()[0];
  if (s.kind == Collective::ReduceScatter || s.kind == Collective::AllToAll)
    TORCH_CHECK_VALUE(n0 % s.ranks == 0, "torch_pjrt: ", collective_name(s.kind), " of ", n0,
                      x.rank() == 1 ? " elements" : " rows", " does not split evenly over ", s.ranks, " ranks");
  std::string replica_groups = "replica_groups = " + groups(s.ranks);
  auto with_dim0 = [&](int64_t rows) {
    TensorType out = x.type;
    out.shape[0] = rows;
    return out;
  };
  Value r;
  switch (s.kind) {
    case Collective::AllReduce:
      r = b.op_multi("stablehlo.all_reduce", {x}, {x.type}, replica_groups,
                     b.binary_region(t, combiner(s, t)))[0];
      break;
    case Collective::ReduceScatter:
      r = b.op_multi("stablehlo.reduce_scatter", {x}, {with_dim0(n0 / s.ranks)},
                     replica_groups + ", scatter_dimension = 0 : i64", b.binary_region(t, combiner(s, t)))[0];
      break;
    case Collective::AllGather:
      r = b.op("stablehlo.all_gather", {x}, with_dim0(n0 * s.ranks), "all_gather_dim = 0 : i64, " + replica_groups);
      break;
    case Collective::AllToAll:
      r = b.op("stablehlo.all_to_all", {x}, x.type,
               "concat_dimension = 0 : i64, " + replica_groups + ", split_count = " + std::to_string(s.ranks) +
                   " : i64, split_dimension = 0 : i64");
      break;
    case Collective::Broadcast: {
      // Everyone gathers every rank's value and keeps the root's: exact bits,
      // where a masked all-reduce would lose -0.0 and NaN payloads.
      Value all = b.op("stablehlo.all_gather", {x}, with_dim0(n0 * s.ranks),
                       "all_gather_dim = 0 : i64, " + replica_groups);
      lowering::Shape start(x.rank(), 0), limit = all.shape();
      start[0] = s.root * n0;
      limit[0] = (s.root + 1) * n0;
      r = b.slice(all, start, limit);
      break;
    }
    case Collective::Permute:
      r = b.op("stablehlo.collective_permute", {x}, x.type, "source_target_pairs = dense<[[0, 1]]> : tensor<1x2xi64>");
      break;
  }
  bool reduces = s.kind == Collective::AllReduce || s.kind == Collective::ReduceScatter;
  if (reduces && s.reduction == Reduction::Avg) {
    TORCH_CHECK_TYPE(t != DType::Bool, "torch_pjrt: ", collective_name(s.kind),
                     " with ReduceOp.AVG is not defined for bool");
    TORCH_CHECK_TYPE(!lowering::is_complex(t), "torch_pjrt: ", collective_name(s.kind),
                     " with ReduceOp.AVG: complex tensors take ReduceOp.SUM and a division");
    r = b.binary("divide", r, b.broadcast_to(b.constant_int(s.ranks, t), r.shape()));
  }
  return r;
}

std::string collective_program(const CollectiveSpec& s) {
  Builder b;
  b.set_replicas(s.ranks);
  Value x = b.param(TensorType{s.dtype, {s.numel}});
  return b.finish({emit_collective(b, s, x)});
}

}  // namespace torch_pjrt::distributed

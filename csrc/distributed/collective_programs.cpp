#include "distributed/collective_programs.h"

#include <c10/util/Exception.h>

#include <sstream>

namespace torch_pjrt::distributed {
namespace {

using lowering::DType;

std::string tensor(int64_t n, DType t) {
  return "tensor<" + std::to_string(n) + "x" + lowering::mlir_name(t) + ">";
}

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
std::string combiner(const CollectiveSpec& s) {
  DType t = s.dtype;
  if (lowering::is_complex(t) && (s.reduction == Reduction::Min || s.reduction == Reduction::Max))
    TORCH_CHECK_TYPE(false, "torch_pjrt: ", collective_name(s.kind), " with ReduceOp.", reduction_name(s.reduction),
                     " is not defined for complex tensors (", lowering::dtype_name(t), ")");
  const char* op = "stablehlo.add";
  switch (s.reduction) {
    case Reduction::Sum:
    case Reduction::Avg: op = t == DType::Bool ? "stablehlo.or" : "stablehlo.add"; break;
    case Reduction::Product: op = t == DType::Bool ? "stablehlo.and" : "stablehlo.multiply"; break;
    case Reduction::Min: op = t == DType::Bool ? "stablehlo.and" : "stablehlo.minimum"; break;
    case Reduction::Max: op = t == DType::Bool ? "stablehlo.or" : "stablehlo.maximum"; break;
  }
  std::string scalar = std::string("tensor<") + lowering::mlir_name(t) + ">";
  std::ostringstream r;
  r << "({\n  ^bb0(%a: " << scalar << ", %b: " << scalar << "):\n"
    << "    %r = \"" << op << "\"(%a, %b) : (" << scalar << ", " << scalar << ") -> " << scalar << "\n"
    << "    \"stablehlo.return\"(%r) : (" << scalar << ") -> ()\n  })";
  return r.str();
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

std::string collective_program(const CollectiveSpec& s) {
  TORCH_CHECK_VALUE(s.ranks >= 1, "torch_pjrt: a collective needs at least one rank");
  TORCH_CHECK_VALUE(s.kind != Collective::Permute || s.ranks == 2, "torch_pjrt: send/recv runs on 2 devices");
  if (s.kind == Collective::ReduceScatter || s.kind == Collective::AllToAll)
    TORCH_CHECK_VALUE(s.numel % s.ranks == 0, "torch_pjrt: ", collective_name(s.kind), " of ", s.numel,
                      " elements does not split evenly over ", s.ranks, " ranks");
  int64_t out_n = output_numel(s);
  std::string in_t = tensor(s.numel, s.dtype), out_t = tensor(out_n, s.dtype);
  std::ostringstream m;
  m << "module @collective attributes {mhlo.num_replicas = " << s.ranks << " : i32, mhlo.num_partitions = 1 : i32} {\n"
    << "  func.func public @main(%arg0: " << in_t << ") -> " << out_t << " {\n";
  std::string result = "%0";
  switch (s.kind) {
    case Collective::AllReduce:
      m << "    %0 = \"stablehlo.all_reduce\"(%arg0) " << combiner(s) << " {replica_groups = " << groups(s.ranks)
        << "} : (" << in_t << ") -> " << out_t << "\n";
      break;
    case Collective::ReduceScatter:
      m << "    %0 = \"stablehlo.reduce_scatter\"(%arg0) " << combiner(s) << " {replica_groups = "
        << groups(s.ranks) << ", scatter_dimension = 0 : i64} : (" << in_t << ") -> " << out_t << "\n";
      break;
    case Collective::AllGather:
      m << "    %0 = \"stablehlo.all_gather\"(%arg0) {all_gather_dim = 0 : i64, replica_groups = " << groups(s.ranks)
        << "} : (" << in_t << ") -> " << out_t << "\n";
      break;
    case Collective::AllToAll:
      m << "    %0 = \"stablehlo.all_to_all\"(%arg0) {concat_dimension = 0 : i64, replica_groups = "
        << groups(s.ranks) << ", split_count = " << s.ranks << " : i64, split_dimension = 0 : i64} : (" << in_t
        << ") -> " << out_t << "\n";
      break;
    case Collective::Broadcast: {
      // Everyone gathers every rank's value and keeps the root's: exact bits,
      // where a masked all-reduce would lose -0.0 and NaN payloads.
      std::string all_t = tensor(s.numel * s.ranks, s.dtype);
      m << "    %g = \"stablehlo.all_gather\"(%arg0) {all_gather_dim = 0 : i64, replica_groups = " << groups(s.ranks)
        << "} : (" << in_t << ") -> " << all_t << "\n"
        << "    %0 = \"stablehlo.slice\"(%g) {start_indices = array<i64: " << s.root * s.numel
        << ">, limit_indices = array<i64: " << (s.root + 1) * s.numel << ">, strides = array<i64: 1>} : (" << all_t
        << ") -> " << out_t << "\n";
      break;
    }
    case Collective::Permute:
      m << "    %0 = \"stablehlo.collective_permute\"(%arg0) {source_target_pairs = dense<[[0, 1]]> : "
           "tensor<1x2xi64>} : (" << in_t << ") -> " << out_t << "\n";
      break;
  }
  bool reduces = s.kind == Collective::AllReduce || s.kind == Collective::ReduceScatter;
  if (reduces && s.reduction == Reduction::Avg) {
    TORCH_CHECK_TYPE(s.dtype != DType::Bool, "torch_pjrt: ", collective_name(s.kind),
                     " with ReduceOp.AVG is not defined for bool");
    std::string scalar = std::string("tensor<") + lowering::mlir_name(s.dtype) + ">";
    std::string count = lowering::is_float(s.dtype) || lowering::is_complex(s.dtype)
                            ? std::to_string(s.ranks) + ".0"
                            : std::to_string(s.ranks);
    if (lowering::is_complex(s.dtype)) count = "(" + count + ", 0.0)";
    m << "    %n = stablehlo.constant dense<" << count << "> : " << scalar << "\n"
      << "    %nb = \"stablehlo.broadcast_in_dim\"(%n) {broadcast_dimensions = array<i64>} : (" << scalar << ") -> "
      << out_t << "\n"
      << "    %1 = \"stablehlo.divide\"(%0, %nb) : (" << out_t << ", " << out_t << ") -> " << out_t << "\n";
    result = "%1";
  }
  m << "    \"func.return\"(" << result << ") : (" << out_t << ") -> ()\n  }\n}\n";
  return m.str();
}

}  // namespace torch_pjrt::distributed

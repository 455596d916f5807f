// Collectives as XLA programs: the StableHLO module each rank runs for one
// collective (stablehlo.all_reduce, all_gather, reduce_scatter, all_to_all,
// collective_permute), compiled replicated over the group's devices (replica
// r = rank r). Data is flat: every tensor goes in as its dense elements.
#pragma once

#include <cstdint>
#include <string>

#include "lowering/builder.h"
#include "lowering/types.h"

namespace torch_pjrt::distributed {

enum class Collective { AllReduce, AllGather, ReduceScatter, AllToAll, Broadcast, Permute };
// c10d's reductions (ReduceOp): sum, avg, product, min, max.
enum class Reduction { Sum, Avg, Product, Min, Max };

struct CollectiveSpec {
  Collective kind = Collective::AllReduce;
  Reduction reduction = Reduction::Sum;
  lowering::DType dtype = lowering::DType::F32;
  int64_t numel = 0;  // elements each rank contributes (AllReduce, AllGather, Broadcast, Permute)
                      // or holds in its input (ReduceScatter, AllToAll: a multiple of ranks)
  int ranks = 1;      // replicas
  int root = 0;       // Broadcast: the rank whose value everyone gets
  // Permute: 2 replicas, replica 0 (the sender) to replica 1 (the receiver).
  std::string key() const;
};

// Emits the collective of `s` on `x` into `b` (gather and scatter along
// dimension 0; `s.numel` is not read): the standalone programs here and the
// collectives inside compiled graphs (graph_program.cpp) share it.
lowering::Value emit_collective(lowering::Builder& b, const CollectiveSpec& s, const lowering::Value& x);
// The module; throws c10::Error (TypeError / ValueError as c10d raises)
// naming the collective when the dtype or reduction cannot run.
std::string collective_program(const CollectiveSpec& spec);
// Elements of each rank's output.
int64_t output_numel(const CollectiveSpec& spec);
const char* collective_name(Collective c);
// From the names Python uses ("all_reduce", "all_gather", "reduce_scatter",
// "all_to_all", "broadcast", "permute"; "sum", "avg", "product", "min",
// "max"); throws ValueError naming an unknown one.
Collective collective_from_name(const std::string& name);
Reduction reduction_from_name(const std::string& name);

}  // namespace torch_pjrt::distributed

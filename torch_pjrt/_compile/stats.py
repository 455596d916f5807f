"""Counters of the torch.compile frontend, merged into torch_pjrt.metrics()."""
import collections
import os
import sys

COUNTERS = {
    "dynamo_graphs": 0,            # graphs Dynamo handed to the "tpu" backend
    "dynamo_recompiles": 0,        # ... for a frame it had compiled before (a guard failed)
    "compiled_graphs": 0,          # XLA programs built for graphs (one per graph and input signature)
    "graph_recompiles": 0,         # ... for a graph that already had one for other inputs
    "graph_compile_seconds": 0.0,  # lowering + XLA compile (or persistent-cache load) of those
    "compiled_graph_runs": 0,
    "eager_graph_fallbacks": 0,    # graph runs op by op because an op could not be lowered (no piece could)
    "partitioned_graphs": 0,       # graphs cut into compiled pieces around ops that cannot be lowered
}


def log_enabled(topic):
    """TORCH_PJRT_LOG is a comma-separated list of topics (recompiles, graphs)."""
    return topic in [t.strip() for t in os.environ.get("TORCH_PJRT_LOG", "").split(",")]


# The latest events per topic, kept whatever TORCH_PJRT_LOG says (the
# migration assessment reports recompiles and their causes from here).
HISTORY = collections.defaultdict(lambda: collections.deque(maxlen=500))


def log(topic, message):
    HISTORY[topic].append(message)
    if log_enabled(topic):
        print(f"torch_pjrt [{topic}]: {message}", file=sys.stderr, flush=True)

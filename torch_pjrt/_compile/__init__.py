"""torch.compile(backend="tpu"): whole graphs as one XLA program each."""
from .backend import register, tpu_backend  # noqa: F401
from .stats import COUNTERS  # noqa: F401

"""torch.compile(backend="tpu"): whole graphs as one XLA program each."""
from .backend import register, tpu_backend  # noqa: F401
from .stats import COUNTERS  # noqa: F401
from . import default_backend, flex_attention  # noqa: E402

default_backend.install()
flex_attention.install()

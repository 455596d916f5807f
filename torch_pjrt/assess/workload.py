"""What is assessed: a Workload (the model, deterministic inputs per batch
size, the mode, tolerances, the batch sizes, the precision, an optional task
metric), and how one is found from the command line: `path/to/file.py:function`
or `module:function` naming a function that returns a Workload."""
import dataclasses
import importlib
import importlib.util
import os
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

MODES = ("inference", "training", "generation")
INPUT_SEED = 1234  # torch's CPU generator's seed while make_inputs runs (Workload.inputs)
PRECISIONS = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
              "float64": torch.float64}

# (rtol, atol) per output dtype; the same as the test suite's (tests/conftest.py).
DEFAULT_TOLERANCES = {
    "float64": (1e-7, 1e-7),
    "float32": (1e-5, 1e-5),
    "float16": (1e-3, 1e-3),
    "bfloat16": (1.6e-2, 1e-2),
}


@dataclasses.dataclass
class Workload:
    """A model and how to drive it.

    model: an nn.Module built on the CPU, or a function returning one (called
        once per side, so both sides start from identical weights: give a
        function that seeds, or a module whose state is copied).
    make_inputs(batch_size): the inputs for one call, deterministic for a
        batch size (CPU tensors; a tensor, a tuple of positional arguments or
        a dict of keyword arguments).
    mode: "inference" (forward under no_grad), "training" (forward, loss,
        backward, optimizer step) or "generation" (greedy `generate` of a
        Hugging Face causal LM, `max_new_tokens` tokens).
    loss_fn(outputs, targets) -> scalar tensor: training only; targets are
        make_targets(batch_size) on the device (None without make_targets).
    optimizer(parameters) -> torch.optim.Optimizer: training (default SGD, lr 1e-2).
    train_steps: steps of the training loss curve compared on both sides.
    batch_sizes: the sweep (latency, throughput, memory).
    precision: "float32", "bfloat16", ... (model and float inputs cast to it
        on both sides).
    tolerances: {dtype name: (rtol, atol)} per output dtype, over DEFAULT_TOLERANCES.
    task_metric(outputs, inputs) -> float: a score per side (e.g. accuracy
        against labels in the inputs); passes when the two sides' scores differ
        by at most task_metric_tolerance. Without one, inference workloads whose
        first output is logits get "top-1 agreement" and generation "token
        agreement" between the sides.
    items_per_call(batch_size): items one call completes (throughput, cost);
        default the batch size (generation: batch x new tokens).
    """
    name: str
    model: Any
    make_inputs: Callable[[int], Any]
    mode: str = "inference"
    loss_fn: Optional[Callable[[Any, Any], torch.Tensor]] = None
    make_targets: Optional[Callable[[int], Any]] = None
    optimizer: Optional[Callable[[Any], torch.optim.Optimizer]] = None
    train_steps: int = 10
    batch_sizes: Sequence[int] = (1, 2, 4, 8)
    precision: str = "float32"
    tolerances: Dict[str, Tuple[float, float]] = dataclasses.field(default_factory=dict)
    task_metric: Optional[Callable[[Any, Any], float]] = None
    task_metric_name: str = "task metric"
    task_metric_tolerance: float = 1e-3
    max_new_tokens: int = 8
    items_per_call: Optional[Callable[[int], int]] = None
    source: str = ""  # set by load(): where it came from (for the report)
    source_paths: List[str] = dataclasses.field(default_factory=list)  # the workload's own source tree

    def validate(self):
        if self.mode not in MODES:
            raise ValueError(f"Workload {self.name!r}: mode must be one of {MODES}, got {self.mode!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"Workload {self.name!r}: precision must be one of {sorted(PRECISIONS)}, "
                             f"got {self.precision!r}")
        if self.mode == "training" and self.loss_fn is None:
            raise ValueError(f"Workload {self.name!r}: training needs loss_fn(outputs, inputs)")
        sizes = list(self.batch_sizes)
        if not sizes or any(not isinstance(b, int) or b < 1 for b in sizes):
            raise ValueError(f"Workload {self.name!r}: batch_sizes must be positive integers, got {sizes}")
        if not callable(self.make_inputs):
            raise TypeError(f"Workload {self.name!r}: make_inputs must be a function of the batch size")
        return self

    @property
    def dtype(self):
        return PRECISIONS[self.precision]

    def tolerance(self, dtype):
        name = str(dtype).replace("torch.", "")
        return tuple(self.tolerances.get(name, DEFAULT_TOLERANCES.get(name, (0.0, 0.0))))

    def items(self, batch_size):
        if self.items_per_call is not None:
            return int(self.items_per_call(batch_size))
        return batch_size * (self.max_new_tokens if self.mode == "generation" else 1)

    def build_model(self):
        """A fresh CPU copy of the model in the workload's precision."""
        import copy
        model = self.model() if callable(self.model) and not isinstance(self.model, torch.nn.Module) \
            else copy.deepcopy(self.model)
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"Workload {self.name!r}: model must be an nn.Module or a function returning one, "
                            f"got {type(model).__name__}")
        model = model.to(self.dtype)
        return model.train() if self.mode == "training" else model.eval()

    def inputs(self, batch_size, device, targets=False):
        """make_inputs(batch_size) (or make_targets), float tensors in the
        precision, on `device`. torch's CPU generator is seeded for the call
        (and restored after): an unseeded `torch.randn(b, 8)` gives the
        baseline and every tpu frontend, in any process and call order, the
        same inputs (it gave each its own, and a false numerics failure)."""
        make = self.make_targets if targets else self.make_inputs
        if make is None:
            return None

        def move(x):
            if isinstance(x, torch.Tensor):
                x = x.to(self.dtype) if x.is_floating_point() else x
                return x.to(device)
            if isinstance(x, (list, tuple)):
                return type(x)(move(e) for e in x)
            if isinstance(x, dict):
                return {k: move(v) for k, v in x.items()}
            return x
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(INPUT_SEED + (1 if targets else 0))
            return move(make(batch_size))


def call(model, inputs):
    """model(*inputs) / model(**inputs) / model(inputs)."""
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, tuple):
        return model(*inputs)
    return model(inputs)


def load(spec):
    """The Workload named by `path/to/file.py:function` or `module:function`."""
    if ":" not in spec:
        raise ValueError(f"workload {spec!r}: expected path/to/file.py:function or module:function")
    where, func_name = spec.rsplit(":", 1)
    if where.endswith(".py") or os.sep in where:
        path = os.path.abspath(where)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"workload {spec!r}: no such file {path}")
        # Its folder first on sys.path, so it can import its neighbours.
        sys.path.insert(0, os.path.dirname(path))
        name = "_torch_pjrt_workload_" + os.path.splitext(os.path.basename(path))[0]
        mod_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[name] = module
        mod_spec.loader.exec_module(module)
        source_paths = [os.path.dirname(path)]
    else:
        module = importlib.import_module(where)
        file = getattr(module, "__file__", None)
        source_paths = [os.path.dirname(os.path.abspath(file))] if file else []
    fn = getattr(module, func_name, None)
    if fn is None or not callable(fn):
        raise AttributeError(f"workload {spec!r}: {where} has no function {func_name!r}")
    workload = fn()
    if not isinstance(workload, Workload):
        raise TypeError(f"workload {spec!r}: {func_name}() returned {type(workload).__name__}, "
                        "expected torch_pjrt.assess.Workload")
    workload.source = workload.source or spec
    workload.source_paths = workload.source_paths or source_paths
    return workload.validate()


def load_spec(spec):
    """A workload spec of the command line: "hf:DIR" (a Hugging Face model
    directory, assess/hf.py) or path/to/file.py:function or module:function."""
    if spec.startswith("hf:"):
        from . import hf
        return hf.workload(spec[3:]).validate()
    return load(spec)

"""Making new tensors on tpu (factory functions and an in-place init on a new
tensor, as nn.Module parameters are made on a device) against PyTorch's CPU,
one process: time per call and the peak device memory of one call over the
tensor's size (1.0: only the tensor itself is ever held).

The first tpu call (compile) apart, then the median of --repeats warm calls
each way, alternating, each synced (torch.tpu.synchronize).

    python benchmarks/creation.py [--repeats 20] [--markdown]
"""
import torch

import torch_pjrt  # noqa: F401
from bench import compare, parse_args, print_table

CASES = [
    ("torch.ones", lambda shape, d: torch.ones(shape, device=d)),
    ("torch.zeros", lambda shape, d: torch.zeros(shape, device=d)),
    ("torch.full", lambda shape, d: torch.full(shape, 0.5, device=d)),
    ("torch.randn", lambda shape, d: torch.randn(shape, device=d)),
    ("uniform_ on torch.empty", lambda shape, d: torch.nn.init.uniform_(torch.empty(shape, device=d))),
    ("kaiming_uniform_ on torch.empty", lambda shape, d: torch.nn.init.kaiming_uniform_(torch.empty(shape, device=d))),
]
SHAPES = [(16, 16), (1024, 1024), (4096, 4096)]


def peak_ratio(make, shape):
    torch.tpu.synchronize()
    base = torch.tpu.memory_allocated()
    torch.tpu.reset_peak_memory_stats()
    t = make(shape, "tpu")
    torch.tpu.synchronize()
    return (torch.tpu.max_memory_allocated() - base) / (t.numel() * t.element_size())


def main():
    args = parse_args(__doc__, repeats=20)
    rows = []
    for name, make in CASES:
        for shape in SHAPES:
            def on_tpu():
                make(shape, "tpu")
                torch.tpu.synchronize()
            first, dev, cpu = compare(on_tpu, lambda: make(shape, "cpu"), args.repeats)
            rows.append((name, "x".join(map(str, shape)), first, dev, cpu, cpu / dev, peak_ratio(make, shape)))
    print_table(["op", "shape", "first tpu ms", "tpu ms", "cpu ms", "tpu speed vs cpu", "peak / size"], rows,
                ["", "", ".2f", ".3f", ".3f", ".2f", ".1f"], args.markdown)


if __name__ == "__main__":
    main()

"""Max pooling on tpu against PyTorch's CPU, one process.

Each case: the first tpu call (compile, or a persistent-cache load) apart,
then the median of --repeats warm calls each way, alternating, each synced
(a host read of a reduction of the result). max_pool is one variadic
reduce_window over (value, index) pairs (csrc/lowering/ops/pooling.cpp), so
its compile time does not grow with the window.

    python benchmarks/pooling.py [--repeats 10] [--markdown]
"""
import torch
import torch.nn.functional as F

import torch_pjrt  # noqa: F401
from bench import compare, parse_args, print_table

CASES = [
    ("max_pool2d 3x3 s2 p1 (ResNet stem), 8x64x112x112", lambda x: F.max_pool2d(x, 3, 2, 1), (8, 64, 112, 112)),
    ("max_pool3d 7x7x7 s1 p3, 2x4x16^3", lambda x: F.max_pool3d(x, 7, 1, 3), (2, 4, 16, 16, 16)),
    ("max_pool2d 2x2, 16x32x32x32", lambda x: F.max_pool2d(x, 2), (16, 32, 32, 32)),
]


def main():
    args = parse_args(__doc__)
    rows = []
    for name, fn, shape in CASES:
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
        xt = x.to("tpu")
        first, d, c = compare(lambda: fn(xt).sum().item(), lambda: fn(x).sum().item(), args.repeats)
        rows.append((name, first, d, c, torch.equal(fn(xt).cpu(), fn(x))))
    head = ("case", "tpu first call (ms)", "tpu warm (ms)", "cpu (ms)", "same values")
    print_table(head, rows, ("", ".0f", ".2f", ".2f", ""), args.markdown)
    print(f"median of {args.repeats} synced calls each")


if __name__ == "__main__":
    main()

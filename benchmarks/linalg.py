"""LU-based linear algebra on tpu against PyTorch's CPU (LAPACK), one process.

torch.linalg.solve, inv and det on a batch of n x n float32 matrices: the
first tpu call (compile, or a persistent-cache load) apart, then the median
of --repeats warm calls of each, each synced (a host read of a reduction of
the result), side by side with CPU's median in the same run. The tpu LU is
blocked with static shapes (csrc/lowering/ops/lu.cpp: each panel of 8 columns
passes over the whole matrix), so the ratio falls with n.

    python benchmarks/linalg.py [--sizes 8,32,128,256] [--batch 16] [--repeats 20] [--markdown]
"""
import torch

import torch_pjrt  # noqa: F401
from bench import compare, parse_args, print_table

OPS = {
    "solve": lambda a, b: torch.linalg.solve(a, b),
    "inv": lambda a, b: torch.linalg.inv(a),
    "det": lambda a, b: torch.linalg.det(a),
}


def main():
    args = parse_args(__doc__, repeats=20, extra=[("--sizes", dict(default="8,32,128,256")),
                                                  ("--batch", dict(type=int, default=16))])
    rows = []
    for n in [int(s) for s in args.sizes.split(",")]:
        g = torch.Generator().manual_seed(n)
        a = torch.randn(args.batch, n, n, generator=g) / n ** 0.5 + torch.eye(n)  # det stays finite
        b = torch.randn(args.batch, n, 4, generator=g)
        at, bt = a.to("tpu"), b.to("tpu")
        for name, fn in OPS.items():
            first, d, c = compare(lambda: fn(at, bt).sum().item(), lambda: fn(a, b).sum().item(), args.repeats)
            ref = fn(a, b)
            err = ((fn(at, bt).cpu() - ref).norm() / ref.norm()).item()  # relative, norm-wise
            rows.append((name, n, first, d, c, c / d, err))
    head = ("op", "n", "tpu first call (ms)", "tpu warm (ms)", "cpu (ms)", "cpu / tpu", "rel. diff (norm)")
    rows = [(r[0], r[1], r[2], r[3], r[4], f"{r[5]:.2f}x", r[6]) for r in rows]
    print_table(head, rows, ("", "d", ".1f", ".3f", ".3f", "", ".1e"), args.markdown)
    print(f"batch {args.batch}, float32, median of {args.repeats} synced calls each")


if __name__ == "__main__":
    main()

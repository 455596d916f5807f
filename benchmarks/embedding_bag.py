"""nn.EmbeddingBag on tpu against PyTorch's CPU, one process: forward, and
forward + backward (a dense weight gradient), for recommendation-model sizes.

The first tpu call (compile, or a persistent-cache load) apart, then the
median of --repeats warm calls each way, alternating, each synced (a host
read of a reduction of the result). The device lowering
(csrc/lowering/ops/embedding_bag.cpp) keeps indices, offsets and the table
on the device; before it, every call went through the CPU fallback.

    python benchmarks/embedding_bag.py [--repeats 10] [--markdown]
"""
import torch
import torch.nn.functional as F

import torch_pjrt  # noqa: F401
from bench import compare, parse_args, print_table

# (rows, dim, bags, indices per bag, mode)
CASES = [(100_000, 64, 2048, 20, "sum"), (100_000, 64, 2048, 20, "mean"), (100_000, 64, 2048, 20, "max"),
         (10_000, 128, 512, 50, "sum")]


def call(weight, idx, off, mode, backward):
    out = F.embedding_bag(idx, weight, off, mode=mode)
    if backward:
        out.sum().backward()
        return weight.grad.sum().item()
    return out.sum().item()


def main():
    args = parse_args(__doc__)
    rows = []
    for words, dim, bags, per_bag, mode in CASES:
        g = torch.Generator().manual_seed(words + dim)
        weight = torch.randn(words, dim, generator=g)
        idx = torch.randint(0, words, (bags * per_bag,), generator=g)
        off = torch.arange(0, bags * per_bag, per_bag)
        for backward in (False, True):
            w_cpu = weight.clone().requires_grad_(backward)
            w_tpu = weight.to("tpu").requires_grad_(backward)
            on_tpu = (w_tpu, idx.to("tpu"), off.to("tpu"), mode, backward)
            on_cpu = (w_cpu, idx, off, mode, backward)
            first, d, c = compare(lambda: call(*on_tpu), lambda: call(*on_cpu), args.repeats)
            what = f"{mode} {bags}x{per_bag} of {words}x{dim}" + (" fwd+bwd" if backward else " fwd")
            rows.append((what, first, d, c, f"{c / d:.2f}x"))
    print_table(("case", "tpu first call (ms)", "tpu warm (ms)", "cpu (ms)", "cpu / tpu"), rows,
                ("", ".0f", ".2f", ".2f", ""), args.markdown)
    print(f"float32, median of {args.repeats} synced calls each")


if __name__ == "__main__":
    main()

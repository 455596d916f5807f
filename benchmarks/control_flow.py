"""Control flow under torch.compile: torch.cond, while_loop and scan as one
program (stablehlo.if / stablehlo.while) against the same functions run op
by op on tpu, and against PyTorch on the CPU.

Per case, in one process, medians of --repeats warm calls (each synced):
  cpu eager          PyTorch on the CPU, eager (cond and scan as PyTorch runs them);
  cpu inductor       torch.compile on the CPU (Inductor), where it compiles;
  tpu eager          strict eager on tpu (the loop body op by op, one host
                     read per cond / while test);
  tpu aot_eager      torch.compile(backend="aot_eager") on tpu: the graph
                     around the control flow, the control flow op by op: what
                     backend="tpu" did before it lowered these ops;
  tpu compiled       torch.compile(backend="tpu"): one program;
and for "tpu compiled" the first call (trace, lowering, XLA compile) and the
programs it compiled.

    python benchmarks/control_flow.py [--repeats 20] [--markdown]
"""
import argparse
import statistics
import time

import torch
from torch._higher_order_ops.scan import scan
from torch._higher_order_ops.while_loop import while_loop

import torch_pjrt


def rnn(h0, xs, w, u):
    def cell(h, x):
        h = torch.tanh(x @ u + h @ w)
        return h, h.clone()  # (an output may not alias the carry)
    return scan(cell, h0, xs)


def newton_sqrt(a):
    # Newton iterations until converged: a data-dependent trip count.
    def cond(x, i):
        return ((x * x - a).abs().max() > 1e-4) & (i < 100)

    def body(x, i):
        return (x + a / x) * 0.5, i + 1
    return while_loop(cond, body, (a.clone() + 1, torch.zeros((), dtype=torch.int64, device=a.device)))


def gated(x, w):
    return torch.cond(x.mean() > 0, lambda a, b: torch.relu(a @ b), lambda a, b: torch.sigmoid(a @ b.t()), (x, w))


def cases():
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return [
        ("scan: RNN cell, 64 steps, hidden 64", rnn, (torch.zeros(8, 64), r(64, 8, 64), r(64, 64) * 0.1, r(64, 64) * 0.1)),
        ("while_loop: Newton sqrt to 1e-4", newton_sqrt, (r(256).abs() * 10 + 1,)),
        ("cond: two 128x128 branches", gated, (r(128, 128), r(128, 128))),
    ]


def _sync(out):
    flat = torch.utils._pytree.tree_flatten(out)[0]
    for t in flat:
        if isinstance(t, torch.Tensor) and t.device.type == "tpu":
            torch.tpu.synchronize()
            break


def timed(fn, args, repeats):
    """(first call s, median warm ms)."""
    t0 = time.perf_counter()
    _sync(fn(*args))
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        _sync(fn(*args))
        times.append((time.perf_counter() - t0) * 1e3)
    return first, statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--markdown", action="store_true")
    opts = ap.parse_args()
    rows = []
    for name, fn, args in cases():
        dev = [a.to("tpu") for a in args]
        row = {"case": name}
        row["cpu eager"] = timed(fn, args, opts.repeats)[1]
        torch._dynamo.reset()
        try:
            row["cpu inductor"] = timed(torch.compile(fn, fullgraph=True), args, opts.repeats)[1]
        except Exception as e:  # noqa: BLE001 - reported, not fatal
            row["cpu inductor"] = f"fails ({type(e).__name__})"
        row["tpu eager"] = timed(fn, dev, opts.repeats)[1]
        torch._dynamo.reset()
        row["tpu aot_eager"] = timed(torch.compile(fn, backend="aot_eager", fullgraph=True), dev, opts.repeats)[1]
        torch._dynamo.reset()
        before = torch_pjrt.metrics()
        first, warm = timed(torch.compile(fn, backend="tpu", fullgraph=True), dev, opts.repeats)
        after = torch_pjrt.metrics()
        row["tpu compiled"] = warm
        row["first call (s)"] = first
        row["programs"] = after["compiled_graphs"] - before["compiled_graphs"]
        row["pieces"] = after.get("partitioned_graphs", 0) - before.get("partitioned_graphs", 0)
        ref = fn(*args)
        out = torch.compile(fn, backend="tpu", fullgraph=True)(*dev)
        row["max abs diff vs cpu"] = max((a.float() - b.cpu().float()).abs().max().item() for a, b in zip(
            torch.utils._pytree.tree_flatten(ref)[0], torch.utils._pytree.tree_flatten(out)[0]))
        rows.append(row)
    cols = ["case", "cpu eager", "cpu inductor", "tpu eager", "tpu aot_eager", "tpu compiled", "first call (s)",
            "programs", "pieces", "max abs diff vs cpu"]
    fmt = lambda v: f"{v:.3g}" if isinstance(v, float) else str(v)  # noqa: E731
    print(f"torch {torch.__version__}, warm medians of {opts.repeats} synced calls, ms unless said")
    if opts.markdown:
        print("| " + " | ".join(cols) + " |")
        print("|" + "---|" * len(cols))
        for r in rows:
            print("| " + " | ".join(fmt(r[c]) for c in cols) + " |")
    else:
        for r in rows:
            print("  ".join(f"{c}={fmt(r[c])}" for c in cols))


if __name__ == "__main__":
    main()

"""The captured GPT training step against the same step in JAX, head to head in
one process.

compile_bench.py runs each configuration in its own processes one after the
other, so on a shared machine its ratios move with the load of the moment.
Here the torch_pjrt captured step (examples/models.py's GPT recipe: zero_grad,
forward + loss, backward, clip_grad_norm_(1.0), AdamW with capturable=True,
wrapped in torch_pjrt.capture_step) and JAX's jitted step
(benchmarks/jax_gpt.py: same weights, batches and update) alternate in blocks
of --block synced steps, --blocks times; the figure is the median over all
steps of each, and the ratio is JAX's median over ours (>= 1: the captured
step is at least as fast). Both start from the same weights and batches;
their losses are compared over the first 20 steps (float32 trajectories of
two implementations drift apart over hundreds of steps; the last losses are
printed too).

    python benchmarks/capture_vs_jax.py [--models gpt,gpt-wide] [--blocks 10] [--block 20] [--markdown]
"""
import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # (JAX would try an installed libtpu first)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import torch_pjrt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))
sys.path.insert(0, HERE)
import models  # noqa: E402


def run(kind, blocks, block):
    import jax
    import jax_gpt

    model, make_opt, batch_fn, loss_fn = models.build(kind)
    state = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    n = blocks * block + 4
    batches = [batch_fn(i) for i in range(n)]

    # torch_pjrt: the captured step
    model.to("tpu").train()
    params = list(model.parameters())
    step = models.captured_step(model, make_opt(params), loss_fn, params)

    tpu_batches = [tuple(t.to("tpu") for t in b) for b in batches]

    # JAX: the jitted step, same weights and batches
    cfg = jax_gpt.WIDE if kind == "gpt-wide" else jax_gpt.Config()
    box = {"params": jax.device_put(jax_gpt.params_from_state_dict(state, cfg))}
    box["opt"] = jax_gpt.init_opt_state(box["params"])
    _, train_step = jax_gpt.jitted(cfg)
    jax_batches = [tuple(jax.device_put(t.numpy().astype(np.int32)) for t in b) for b in batches]

    def torch_call(i):
        out = step(*tpu_batches[i])
        torch.tpu.synchronize()
        return out

    def jax_call(i):
        box["params"], box["opt"], loss = train_step(box["params"], box["opt"], *jax_batches[i])
        jax.block_until_ready((loss, box["params"]))
        return loss

    losses = {"torch": [], "jax": []}
    for i in range(4):  # warm-up, recordings (torch); compile (jax)
        losses["torch"].append(float(torch_call(i).cpu()))
        losses["jax"].append(float(jax_call(i)))
    times = {"torch": [], "jax": []}
    i = 4
    for _ in range(blocks):
        for name, call in (("torch", torch_call), ("jax", jax_call)):
            for k in range(block):
                start = time.perf_counter()
                out = call(i + k)
                times[name].append(time.perf_counter() - start)
                losses[name].append(out)
        i += block
    losses = {name: [float(v.cpu()) if isinstance(v, torch.Tensor) else float(v) for v in vals]
              for name, vals in losses.items()}
    replays = torch_pjrt.metrics()["capture_replays"]
    return {"torch": statistics.median(times["torch"]), "jax": statistics.median(times["jax"]),
            "torch_min": min(times["torch"]), "jax_min": min(times["jax"]), "replays": replays,
            "loss_diff": max(abs(a - b) / abs(b) for a, b in zip(losses["torch"][:20], losses["jax"][:20])),
            "last_losses": (losses["torch"][-1], losses["jax"][-1])}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="gpt,gpt-wide")
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--block", type=int, default=20)
    parser.add_argument("--markdown", action="store_true")
    a = parser.parse_args()
    try:
        import jax
    except ImportError as e:
        sys.exit(f"capture_vs_jax: JAX is needed ({e}); pip install jax==0.10.2 jaxlib==0.10.2")
    rows = []
    for kind in [k for k in a.models.split(",") if k]:
        r = run(kind, a.blocks, a.block)
        rows.append([kind, f"{r['torch'] * 1e3:.2f}", f"{r['jax'] * 1e3:.2f}", f"{r['jax'] / r['torch']:.2f}x",
                     f"{r['torch_min'] * 1e3:.2f} / {r['jax_min'] * 1e3:.2f}", f"{r['loss_diff']:.1e}",
                     f"{r['last_losses'][0]:.4f} / {r['last_losses'][1]:.4f}"])
    head = ["model", "captured step (ms)", "jax jit step (ms)", "captured vs jax", "min captured / jax (ms)",
            "loss difference, first 20 steps (max, relative)", f"last loss captured / jax (step {a.blocks * a.block + 4})"]
    print(f"torch {torch.__version__}, jax {jax.__version__}, plugin {torch_pjrt.plugin_info()['name']}, "
          f"{os.cpu_count()} CPU cores; {a.blocks} alternating blocks of {a.block} synced steps each, medians")
    if a.markdown:
        print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        for r in rows:
            print("| " + " | ".join(r) + " |")
    else:
        for r in [head] + rows:
            print("  ".join(c.rjust(14) for c in r))


if __name__ == "__main__":
    main()

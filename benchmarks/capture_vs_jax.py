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

Which part of the ratio is the runtime's: a third participant runs JAX's own
step program (lowered from the same jit, parameters and optimizer state
donated) through torch_pjrt's runtime and PJRT plugin, the way JAX's client
runs it (each call waits for the device, its outputs are the next call's
inputs). "plugin vs jax's client" compares that with JAX's step, and
"captured vs jax's program on the plugin" compares the captured step with it:
the same plugin and XLA build, only the programs differ. --no-split skips it.

    python benchmarks/capture_vs_jax.py [--models gpt,gpt-wide] [--blocks 10] [--block 20] [--markdown] [--no-split]
"""
import argparse
import os
import re
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


def aliases_of(text):
    """(input, output) pairs of the main function's tf.aliasing_output attributes."""
    sig = re.search(r"func\.func public @main\((.*?)\) ->", text, re.S).group(1)
    return [(int(a), int(o)) for a, o in
            re.findall(r"%arg(\d+): tensor<[^>]*> \{[^}]*tf\.aliasing_output = (\d+) : i32", sig)]


def run(kind, blocks, block, split=True):
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

    if split:
        # JAX's step program on torch_pjrt's runtime, run as JAX's client runs it
        p0 = jax_gpt.params_from_state_dict(state, cfg)
        o0 = jax_gpt.init_opt_state(p0)
        b0 = tuple(t.numpy().astype(np.int32) for t in batches[0])
        text = train_step.lower(p0, o0, *b0).as_text()
        aliases = aliases_of(text)
        chain_args = [torch.from_numpy(np.asarray(v).copy()).to("tpu") for v in jax.tree_util.tree_leaves((p0, o0, b0))]
        if not aliases:
            raise SystemExit("capture_vs_jax: JAX's lowered step donates nothing (no tf.aliasing_output)")
        C = torch_pjrt._state.C
        C.time_program_chain(text, chain_args, aliases, 3)  # compile (or load) and warm up

    def torch_call(i):
        out = step(*tpu_batches[i])
        torch.tpu.synchronize()
        return out

    def jax_call(i):
        box["params"], box["opt"], loss = train_step(box["params"], box["opt"], *jax_batches[i])
        jax.block_until_ready((loss, box["params"]))
        return loss

    calls = {"torch": torch_call, "jax": jax_call}
    losses = {"torch": [], "jax": []}
    for i in range(4):  # warm-up, recordings (torch); compile (jax)
        losses["torch"].append(float(torch_call(i).detach().cpu()))
        losses["jax"].append(float(jax_call(i)))
    times = {"torch": [], "jax": [], "jax_plugin": []}
    i = 4
    for _ in range(blocks):
        for name, call in calls.items():
            for k in range(block):
                start = time.perf_counter()
                out = call(i + k)
                times[name].append(time.perf_counter() - start)
                losses[name].append(out)
        if split:
            times["jax_plugin"] += C.time_program_chain(text, chain_args, aliases, block)
        i += block
    losses = {name: [float(v.detach().cpu()) if isinstance(v, torch.Tensor) else float(v) for v in vals]
              for name, vals in losses.items()}
    replays = torch_pjrt.metrics()["capture_replays"]
    return {"torch": statistics.median(times["torch"]), "jax": statistics.median(times["jax"]),
            "torch_min": min(times["torch"]), "jax_min": min(times["jax"]), "replays": replays,
            "jax_plugin": statistics.median(times["jax_plugin"]) if split else None,
            "loss_diff": max(abs(a - b) / abs(b) for a, b in zip(losses["torch"][:20], losses["jax"][:20])),
            "last_losses": (losses["torch"][-1], losses["jax"][-1])}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="gpt,gpt-wide")
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--block", type=int, default=20)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--no-split", action="store_true",
                        help="skip JAX's program on torch_pjrt's plugin (the runtime's share of the ratio)")
    a = parser.parse_args()
    try:
        import jax
    except ImportError as e:
        sys.exit(f"capture_vs_jax: JAX is needed ({e}); pip install jax==0.10.2 jaxlib==0.10.2")
    rows = []
    for kind in [k for k in a.models.split(",") if k]:
        r = run(kind, a.blocks, a.block, split=not a.no_split)
        row = [kind, f"{r['torch'] * 1e3:.2f}", f"{r['jax'] * 1e3:.2f}", f"{r['jax'] / r['torch']:.2f}x",
               f"{r['torch_min'] * 1e3:.2f} / {r['jax_min'] * 1e3:.2f}", f"{r['loss_diff']:.1e}",
               f"{r['last_losses'][0]:.4f} / {r['last_losses'][1]:.4f}"]
        if r["jax_plugin"] is not None:
            row += [f"{r['jax_plugin'] * 1e3:.2f}", f"{r['jax'] / r['jax_plugin']:.2f}x",
                    f"{r['jax_plugin'] / r['torch']:.2f}x"]
        rows.append(row)
    head = ["model", "captured step (ms)", "jax jit step (ms)", "captured vs jax", "min captured / jax (ms)",
            "loss difference, first 20 steps (max, relative)", f"last loss captured / jax (step {a.blocks * a.block + 4})"]
    if not a.no_split:
        head += ["jax's program on the plugin (ms)", "plugin vs jax's client", "captured vs jax's program on the plugin"]
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

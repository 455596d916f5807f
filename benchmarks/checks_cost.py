"""What the in-program value checks cost (on, the default, against off) on
the GPT training step of examples/models.py, eager and torch.compile'd.

One process per mode trains the GPT with checks switched on and off in
alternating blocks of steps (torch_pjrt.set_checks; each setting has its own
programs, all compiled in a first warm-up block of each), so drift of a shared
machine hits both alike. Per block, the median step time; the table gives the
median over blocks and the difference of on against off.

    python benchmarks/checks_cost.py [--blocks 20] [--block-steps 40] [--markdown]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import json, os, statistics, sys, time
sys.path.insert(0, os.path.join(sys.argv[1], "examples"))
import torch, torch_pjrt, models
mode, blocks, block_steps = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
model, make_opt, batch_fn, loss_fn = models.build("gpt", 0)
model = model.to("tpu")
opt = make_opt(model.parameters())
forward, opt_step = model, opt.step
if mode == "compiled":
    forward = torch.compile(model, backend="tpu")
    opt_step = torch.compile(opt.step, backend="tpu")
batches = [batch_fn(s) for s in range(64)]
step_no = [0]
def step():
    x, y = batches[step_no[0] % len(batches)]
    step_no[0] += 1
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(forward, x.to("tpu"), y.to("tpu"))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt_step()
    loss.item()  # waits for the step (and reports any failed check)
def block(on):
    torch_pjrt.set_checks(on)
    times = []
    for _ in range(block_steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
block(True); block(False)  # warm-up: both settings' programs compiled
results = {"on": [], "off": []}
for b in range(blocks):
    for setting in (("on", "off") if b % 2 == 0 else ("off", "on")):
        results[setting].append(block(setting == "on"))
print("RESULT " + json.dumps(results))
"""


def measure(mode, blocks, block_steps):
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    p = subprocess.run([sys.executable, "-c", CHILD, ROOT, mode, str(blocks), str(block_steps)], env=env,
                       capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise SystemExit(p.stderr[-2000:])
    return json.loads([ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")][-1][len("RESULT "):])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=20)
    parser.add_argument("--block-steps", type=int, default=40)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    print(f"GPT training step (clip + AdamW), {args.blocks} blocks of {args.block_steps} steps per setting, "
          f"alternating; median step per block, median over blocks; {os.cpu_count()} CPU cores")
    rows = []
    for mode in ("eager", "compiled"):
        r = measure(mode, args.blocks, args.block_steps)
        on, off = statistics.median(r["on"]), statistics.median(r["off"])
        rows.append((mode, off * 1e3, on * 1e3, (on / off - 1) * 100,
                     " ".join(f"{a / b - 1:+.1%}" for a, b in zip(r["on"], r["off"]))))
    head = ["step", "checks off (ms)", "checks on (ms)", "cost", "per block pair"]
    if args.markdown:
        print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        for mode, off, on, pct, pairs in rows:
            print(f"| {mode} | {off:.2f} | {on:.2f} | {pct:+.1f}% | {pairs} |")
    else:
        for mode, off, on, pct, pairs in rows:
            print(f"{mode:>10}  off {off:.2f} ms  on {on:.2f} ms  cost {pct:+.1f}%  ({pairs})")


if __name__ == "__main__":
    main()

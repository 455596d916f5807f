"""GPT training step on 1 and 2 ranks with the "tpu" c10d backend, and the
share of a step spent in communication.

    python benchmarks/distributed_step.py [--steps N] [--warmup N] [--batch B] [--markdown]

Each configuration runs in fresh processes (torch.multiprocessing.spawn, one
tpu device per rank, same weights and global batch):
  1 rank        the whole batch, no process group
  2 ranks DDP   each rank half the batch, gradients all-reduced
  2 ranks local the same, under DDP's no_sync(): no all-reduce (what the
                step would cost if communication were free)
communication share = (DDP - local) / DDP. The step time is the median over
--steps timed steps after --warmup untimed ones (compiles happen there);
each step ends with loss.item(), which waits for the device.
"""
import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))


def _rank(rank, world, mode, args, out, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import contextlib
    import torch
    import torch.distributed as dist
    import torch_pjrt
    import models
    dev = torch.device("tpu", rank)
    torch.tpu.set_device(dev)
    if world > 1:
        dist.init_process_group("tpu", rank=rank, world_size=world)
    model, make_opt, _, loss_fn = models.build("gpt", seed=0)
    model = model.to(dev)
    net = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    opt = make_opt(net.parameters())
    text = models.gpt_text()
    times = []
    for step in range(args.warmup + args.steps):
        x, y = models.gpt_batch(step, batch=args.batch, text=text)
        part = args.batch // world
        x, y = x[rank * part:(rank + 1) * part].to(dev), y[rank * part:(rank + 1) * part].to(dev)
        start = time.perf_counter()
        ctx = net.no_sync() if mode == "local" else contextlib.nullcontext()
        opt.zero_grad()
        with ctx:
            loss = loss_fn(net, x, y)
            loss.backward()
        opt.step()
        loss.item()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    m = torch_pjrt.metrics()
    with open(os.path.join(out, f"{rank}.json"), "w") as f:
        json.dump({"median": statistics.median(times),
                   "collectives": m["distributed_host_collectives"],
                   "host_bytes": m["distributed_to_host_bytes"] + m["distributed_from_host_bytes"]}, f)
    if world > 1:
        dist.destroy_process_group()


def run(world, mode, args):
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_rank, args=(world, mode, args, out, port), nprocs=world, join=True)
        res = [json.load(open(os.path.join(out, f"{r}.json"))) for r in range(world)]
    return max(r["median"] for r in res), res[0]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--batch", type=int, default=8, help="global batch (split over the ranks)")
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("TORCH_PJRT_CPU_DEVICES", "2")
    rows = []
    one, r1 = run(1, "ddp", args)
    ddp, r2 = run(2, "ddp", args)
    local, _ = run(2, "local", args)
    steps = args.warmup + args.steps
    rows.append(["1 rank", f"{one * 1e3:.2f}", "-", "-", "-"])
    rows.append(["2 ranks DDP", f"{ddp * 1e3:.2f}", f"{r2['collectives'] / steps:.1f}",
                 f"{r2['host_bytes'] / steps / 1024:.0f}", f"{max(ddp - local, 0) / ddp:.0%}"])
    rows.append(["2 ranks, no all-reduce (no_sync)", f"{local * 1e3:.2f}", "-", "-", "-"])
    head = ["configuration", "step median (ms)", "collectives per step (rank 0)",
            "host copies per step (KiB)", "communication share"]
    if args.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for r in rows:
            print("| " + " | ".join(r) + " |")
    else:
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
        print("  ".join(h.ljust(w) for h, w in zip(head, widths)))
        for r in rows:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    print(f"\nGPT {args.batch} sequences a step (global), {args.steps} timed steps after {args.warmup}; "
          "CPU PJRT plugin, collectives on gloo through host copies.")


if __name__ == "__main__":
    main()

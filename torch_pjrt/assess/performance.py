"""Performance of one side in a fresh process (worker.py): cold start split
into process start, import, model load, first call (compile) and steady
call; then per batch size the latency of every timed call (p50/p95/p99 from
them) and the throughput in items/s. Each phase is timed apart; every call
ends with a host wait, so a time is the device's."""
import statistics
import time

import torch

from . import failures
from .steps import Runner


def percentile(samples, q):
    xs = sorted(samples)
    if not xs:
        return None
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def measure(workload, device, frontend, batch_sizes, warmup, iterations, phases):
    """`phases`: process_start and import, timed by the worker before it got
    here. Returns (cold start row, latency rows, throughput rows, failures).

    Each batch size is tried on its own: one that fails (a model that takes
    only some batch sizes) is a failure of that batch, not of the side (the
    first batch ran outside the per-batch guard and took every figure with
    it). The cold start is timed on the first batch that runs."""
    fails = []
    side = frontend if device == "tpu" else "baseline"
    t0 = time.perf_counter()
    runner = Runner(workload, device, frontend)
    phases["model_load"] += time.perf_counter() - t0
    cold = False
    latency, throughput = [], []
    for bs in batch_sizes:
        try:
            t0 = time.perf_counter()
            inputs = runner.inputs(bs)
            if not cold:
                phases["model_load"] += time.perf_counter() - t0
                t0 = time.perf_counter()
                runner(inputs)
                phases["first_call"] = time.perf_counter() - t0
                steady = []
                for _ in range(max(3, warmup)):
                    t0 = time.perf_counter()
                    runner(inputs)
                    steady.append(time.perf_counter() - t0)
                phases["steady_call"] = statistics.median(steady)
                phases["warmup"] = sum(steady)  # the calls after the first until steady (cost counts them)
                phases["total"] = sum(phases[k] for k in ("process_start", "import", "model_load", "first_call"))
                phases["batch_size"] = bs
                cold = True
            for _ in range(warmup):
                runner(inputs)
            samples = []
            for _ in range(iterations):
                t0 = time.perf_counter()
                runner(inputs)
                samples.append(time.perf_counter() - t0)
        except Exception as e:  # noqa: BLE001
            fails.append(failures.from_exception(e, "performance", side, bs))
            if isinstance(e, torch.OutOfMemoryError):
                break  # larger batches will not fit either
            continue
        finally:
            inputs = None
        latency.append({"frontend": side, "batch_size": bs, "p50": percentile(samples, 0.5),
                        "p95": percentile(samples, 0.95), "p99": percentile(samples, 0.99), "n": len(samples),
                        "samples": samples})
        throughput.append({"frontend": side, "batch_size": bs,
                           "items_per_s": workload.items(bs) * len(samples) / sum(samples)})
    if not cold:  # no batch ran: no call was timed
        phases.update(first_call=None, steady_call=None, warmup=None, total=None)
    return phases, latency, throughput, fails

"""Memory: the peak device memory of one call per batch size, growing the
batch until it no longer fits, in a process whose device behaves as the
target's (TORCH_PJRT_MEMORY_LIMIT): the largest batch that runs and the
first that runs out. An out-of-memory error ends the sweep, not the report."""
import torch

import torch_pjrt

from . import failures
from .steps import Runner


def sweep_sizes(batch_sizes, factor):
    """The workload's batch sizes, then doubling up to factor x the largest."""
    sizes = sorted(set(batch_sizes))
    top, limit = sizes[-1], sizes[-1] * factor
    while 0 < top and top * 2 <= limit:  # (top 0 doubled forever; config checks it too)
        top *= 2
        sizes.append(top)
    return sizes


def sweep(workload, sizes):
    rows, fails = [], []
    runner = Runner(workload, "tpu", "eager")
    for bs in sizes:
        try:
            inputs = runner.inputs(bs)
            torch.tpu.synchronize()
            torch.tpu.reset_peak_memory_stats()
            runner(inputs)
            if workload.mode == "training":
                runner(inputs)  # the optimizer's state exists from the first step on
            rows.append({"batch_size": bs, "peak_bytes": torch.tpu.max_memory_allocated(), "status": "ok"})
        except Exception as e:  # noqa: BLE001
            f = failures.from_exception(e, "memory", "eager", bs)
            fails.append(f)
            if f["kind"] == "out_of_memory":
                rows.append({"batch_size": bs, "peak_bytes": torch.tpu.max_memory_allocated(),
                             "status": "out_of_memory"})
                break
            # Another error is not "does not fit": the row says which (a model
            # that takes only some batch sizes fails here; larger ones may run).
            rows.append({"batch_size": bs, "peak_bytes": None, "status": "failed",
                         "error": f["error"].splitlines()[0][:200]})
        finally:
            inputs = None
    ok = [r["batch_size"] for r in rows if r["status"] == "ok"]
    oom = [r["batch_size"] for r in rows if r["status"] == "out_of_memory"]
    return {"per_batch": rows, "limit_bytes": torch_pjrt.memory_limit(0) or None,
            "total_bytes": torch.tpu.get_device_properties(0).total_memory,
            "largest_batch": max(ok) if ok else None, "first_oom_batch": min(oom) if oom else None}, fails

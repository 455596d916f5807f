"""One stage of an assessment in a fresh process (run as a script by the
runner: `python .../assess/worker.py REQUEST.json`), so that a crash, a hang
or an out-of-memory state stays inside it and cold start can be timed from
the process's own start. It writes its results to the request's "out" file.

Stages: "analyze" (op coverage, graph breaks, recompiles, numerics),
"performance" (one side: cold start, latency, throughput), "memory" (the
batch sweep under a memory limit), "capture" (the baseline's outputs, for
comparing elsewhere)."""
import time

T_START = time.time()

import json  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402


def _phases(request, t_torch_done):
    return {"process_start": max(0.0, T_START - request["spawn_time"]),
            "import": t_torch_done - T_START, "model_load": 0.0}


def analyze(request, workload, settings):
    from torch_pjrt.assess import coverage, failures, numerics
    result = {"failures": []}
    sizes = request["batch_sizes"]
    nb = request["numerics_batch_size"]
    steps = request["train_steps"]

    def guarded(key, fn):
        try:
            result[key] = fn()
        except Exception as e:  # noqa: BLE001  (a failing part never loses the others)
            result[key] = None
            result[key + "_error"] = f"{type(e).__name__}: {e}"
            # (an error of the baseline's own run is labelled so: the workload fails there too)
            result["failures"].append(failures.from_exception(e, key.split("_")[0], getattr(e, "assess_side", None),
                                                              getattr(e, "assess_batch", None)))

    def cov():
        c, failure = coverage.op_coverage(workload, sizes[0])
        if failure:
            result["failures"].append(failure)
        return c
    guarded("coverage", cov)
    if "compiled" in request["frontends"]:
        guarded("coverage_graphs", lambda: coverage.graph_breaks(workload, sizes[0]))

        def rec():
            events, errors = coverage.recompiles(workload, sizes)
            result["failures"].extend(errors)
            return events
        guarded("coverage_recompiles", rec)
    baseline = None
    if request.get("baseline_file"):
        import torch
        baseline = torch.load(request["baseline_file"], weights_only=False)

    def num():
        n = numerics.compare_sides(workload, request["baseline_device"], request["frontends"], nb, steps,
                                   settings["numerics"]["loss_rtol"], baseline)
        import torch
        n["baseline_file"] = request["out"] + ".baseline.pt"
        torch.save({"outputs": n.pop("baseline_outputs"), "losses": n.pop("baseline_losses")}, n["baseline_file"])
        return n
    guarded("numerics", num)
    if result["failures"] and not any(f["frontend"] == "baseline" for f in result["failures"]):
        # Something failed and no baseline failure is known (numerics ran the
        # baseline at its own batch size, or not here at all with --against):
        # one baseline call at the coverage batch says whether the workload
        # fails there too (runner: failures.mark_workload_errors).
        from torch_pjrt.assess.steps import Runner
        try:
            runner = Runner(workload, request["baseline_device"])
            runner(runner.inputs(sizes[0]))
        except Exception as e:  # noqa: BLE001
            result["failures"].append(failures.from_exception(e, "coverage", "baseline", sizes[0]))
    return result


def performance(request, workload, phases):
    from torch_pjrt.assess import performance as perf
    device = request["device"]
    row, latency, throughput, fails = perf.measure(
        workload, device, request["frontend"], request["batch_sizes"], request["warmup"], request["iterations"],
        phases)
    row.update(frontend=request["frontend"] if device == "tpu" else "baseline", cache=request["cache"],
               device=device)
    return {"cold_start": row, "latency": latency, "throughput": throughput, "failures": fails}


def capture(request, workload):
    """The baseline side's outputs (and training losses), saved for --against."""
    import torch
    from torch_pjrt.assess import numerics
    from torch_pjrt.assess.steps import Runner
    out, losses = numerics.run_side(Runner(workload, request["device"]), request["numerics_batch_size"],
                                    request["train_steps"])
    path = request["out"] + ".baseline.pt"
    torch.save({"outputs": out, "losses": losses}, path)
    return {"outputs_file": path, "failures": []}


def memory(request, workload):
    from torch_pjrt.assess import memory as mem
    result, fails = mem.sweep(workload, request["batch_sizes"])
    return {"memory": result, "failures": fails}


def readiness(request, workload):
    from torch_pjrt.readiness import cli, plugin
    from torch_pjrt.readiness.core import MARGIN_NOTE
    r = request["settings"]["readiness"]
    rows = cli.workload_rows(workload, r["topologies"], request["batch_sizes"], r["chips"], r["largest_batch"],
                             tolerance=r["tolerance"], max_batch=int(r["max_batch"]))
    for row in rows:  # the per-program figures stay in the JSON; the report shows the step
        for prog in row.get("programs", []):
            prog.pop("serialized_path", None)
    return {"readiness": {"available": True, "libtpu": plugin.LIBTPU_PIN, "note": MARGIN_NOTE,
                          "estimate": "step times are roofline estimates from published peaks, not measurements",
                          "rows": rows}, "failures": []}


def main(path):
    with open(path) as f:
        request = json.load(f)
    import torch  # noqa: F401  (timed: the import phase)
    if request.get("device", "tpu") == "tpu":
        import torch_pjrt  # noqa: F401
    t_import = time.time()
    from torch_pjrt.assess import workload as wl
    from torch_pjrt.assess import failures
    phases = _phases(request, t_import)
    t0 = time.perf_counter()
    try:
        workload = wl.load_spec(request["workload"])
        phases["model_load"] = time.perf_counter() - t0  # the workload's own import and set-up
        stage = request["stage"]
        if stage == "analyze":
            result = analyze(request, workload, request["settings"])
        elif stage == "performance":
            result = performance(request, workload, phases)
        elif stage == "memory":
            result = memory(request, workload)
        elif stage == "readiness":
            result = readiness(request, workload)
        elif stage == "capture":
            result = capture(request, workload)
        else:
            raise ValueError(f"unknown stage {stage!r}")
    except Exception as e:  # noqa: BLE001  (the whole stage failed: say how)
        # The baseline's own worker is the baseline, whatever frontend the request names ("eager").
        side = "baseline" if request.get("device", "tpu") != "tpu" else request.get("frontend")
        result = {"failures": [failures.from_exception(e, request["stage"], side)],
                  "error": traceback.format_exc(limit=8)}
    with open(request["out"], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1])

"""The decision: each criterion (coverage, numerics, latency, throughput,
memory fit, cost, inventory) passes or fails against the config's
thresholds (None where it was not measured or no threshold is set), then an
overall verdict, blocking items first:

  not ready                 something fails that code changes on the user's
                            side cannot fix now (numerics, failing ops, out of
                            memory at the required batch, stages that failed)
  ready after listed changes  it runs and matches, but CUDA-specific code,
                            CPU fallbacks or missed targets need work first
  ready                     nothing of the above
"""


def _g(x, spec=".3g"):
    """A figure that may be None (integer outputs have no max rel or cosine)."""
    return "n/a" if x is None else format(x, spec)


def mismatch_text(o):
    """One output row that failed, in words (max rel and cosine are None for
    integer and bool outputs)."""
    text = (f"{o['name']}: max abs {_g(o.get('max_abs'))}, max rel {_g(o.get('max_rel'))}, "
            f"cosine {_g(o.get('cosine'), '.6f')}, {_g(o.get('out_of_tolerance'), '.2%')} of elements out of "
            f"tolerance (rtol {o.get('rtol')}, atol {o.get('atol')})")
    return text + (f"; {o['note']}" if o.get("note") else "")


def _size(nbytes):
    """A memory limit in words: MiB below 1 GiB (40 MiB read "0.04 GiB")."""
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.0f} MiB"


def _best_target(rows, batch):
    return [r for r in rows if r["frontend"] != "baseline" and (batch is None or r["batch_size"] == batch)]


def decide(report, settings):
    t = settings["thresholds"]
    criteria, blocking, changes = [], [], []
    inv = report.get("inventory")
    if inv:
        items = inv.get("items") or []
        rewrite = [i for i in items if i["effort"] == "rewrite"]
        other = [i for i in items if i["effort"] != "rewrite"]
        criteria.append({"name": "inventory", "pass": not items, "value": f"{len(items)} CUDA-specific items",
                         "threshold": "none", "detail": ", ".join(f"{k} {v}" for k, v in inv["summary"].items())})
        for i in rewrite + other:
            changes.append(f"{i['effort']}: {i['detail']} ({i['file']}:{i['line']}): {i['suggestion']}")
    cov = report.get("coverage")
    if cov:
        s = cov["summary"]
        share = cov.get("fallback_time_share") or 0.0
        ok = s.get("failing", 0) == 0 and share <= t["max_fallback_time_share"]
        criteria.append({"name": "coverage", "pass": ok,
                         "value": f"{s.get('lowered', 0)} lowered, {s.get('decomposed', 0)} decomposed, "
                                  f"{s.get('cpu_fallback', 0)} CPU fallback, {s.get('failing', 0)} failing; "
                                  f"fallback time {share:.1%}",
                         "threshold": f"no failing op, fallback time <= {t['max_fallback_time_share']:.0%}",
                         "detail": ""})
        workload_error = any(f["kind"] == "workload_error" and f["stage"] == "coverage"
                             for f in report.get("failures") or [])
        for o in cov["ops"]:
            if o["class"] == "failing":
                blocking.append(f"coverage: {o['op']} fails on tpu" + (
                    " (the workload fails on the baseline too: see the workload error)" if workload_error else ""))
            elif o["class"] == "cpu_fallback":
                changes.append(f"lower {o['op']} (runs on the CPU: {o['count']} calls)")
    num = report.get("numerics")
    if num:
        bad = [o for o in num["outputs"] if o["pass"] is False]
        metric = num.get("task_metric")
        ref = "reference" if metric and metric.get("baseline_is_reference") else "baseline"
        value = (f"{len(num['outputs']) - len(bad)}/{len(num['outputs'])} outputs within tolerance"
                 + (f"; {metric['name']} {metric['target']:.4g} ({ref} {metric['baseline']:.4g})" if metric else ""))
        status = num.get("status", "measured")
        if status != "measured":
            value = num.get("note") or status  # "not measured ..." / "not comparable ..."
        criteria.append({"name": "numerics", "pass": num["pass"] if num["pass"] is None else bool(num["pass"]),
                         "value": value, "threshold": "every output within its dtype's (rtol, atol)", "detail": ""})
        if status == "nothing_compared":
            blocking.append("numerics: nothing comparable was returned (no tensors or Python numbers in the "
                            "outputs): return the model's outputs, not a summary of them, to compare")
        elif status == "not_comparable":
            changes.append(f"numerics: {num.get('note')}: make the forward deterministic (eval mode, no random "
                           "ops) or give a task_metric, to compare tpu with the baseline")
        for o in bad[:5]:
            blocking.append(f"numerics: {o['frontend']} " + (f"{o['name']}: {o['error']}" if o.get("error")
                                                             else mismatch_text(o)))
        for o in num["outputs"]:
            if o["pass"] and o.get("note"):  # NaN/inf where both sides agree: passes, but said
                changes.append(f"numerics: {o['frontend']} {o['name']}: {o['note']}")
        if metric and metric["pass"] is False:
            blocking.append(f"numerics: {metric['name']} {metric['target']:.4g} vs {ref} {metric['baseline']:.4g}")
    perf = report.get("performance")
    cost = report.get("cost")
    batch = cost["assumptions"]["batch_size"] if cost else None
    if perf:
        lat = _best_target(perf.get("latency") or [], batch)
        if t["latency_p95_ms"] is not None and lat:
            best = min(lat, key=lambda r: r["p95"])
            ok = best["p95"] * 1e3 <= t["latency_p95_ms"]
            criteria.append({"name": "latency", "pass": ok, "value": f"p95 {best['p95'] * 1e3:.2f} ms "
                             f"({best['frontend']}, batch {best['batch_size']})",
                             "threshold": f"<= {t['latency_p95_ms']} ms", "detail": ""})
            if not ok:
                changes.append(f"latency: p95 {best['p95'] * 1e3:.2f} ms > {t['latency_p95_ms']} ms")
        else:
            criteria.append({"name": "latency", "pass": None, "value": "measured" if lat else "not measured",
                             "threshold": "none set (thresholds.latency_p95_ms)", "detail": ""})
        thr = perf.get("throughput") or []
        base = [r for r in thr if r["frontend"] == "baseline" and r["batch_size"] == batch]
        tgt = _best_target(thr, batch)
        if t["min_throughput_ratio"] is not None and base and tgt:
            best = max(tgt, key=lambda r: r["items_per_s"])
            ratio = best["items_per_s"] / base[0]["items_per_s"]
            ok = ratio >= t["min_throughput_ratio"]
            criteria.append({"name": "throughput", "pass": ok, "value": f"{ratio:.2f}x the baseline ({best['frontend']})",
                             "threshold": f">= {t['min_throughput_ratio']}x", "detail": ""})
            if not ok:
                changes.append(f"throughput: {ratio:.2f}x the baseline < {t['min_throughput_ratio']}x")
        else:
            criteria.append({"name": "throughput", "pass": None, "value": "measured" if tgt else "not measured",
                             "threshold": "none set (thresholds.min_throughput_ratio)", "detail": ""})
    mem = report.get("memory")
    if mem:
        need = settings["memory"]["required_batch"] or max(report["workload"]["batch_sizes"])
        largest = mem.get("largest_batch")
        oom = mem.get("first_oom_batch")
        threshold = f">= batch {need}" + (f" within {_size(mem['limit_bytes'])}" if mem.get("limit_bytes") else "")
        if largest is not None and largest >= need:
            criteria.append({"name": "memory", "pass": True, "value": f"largest batch {largest}",
                             "threshold": threshold, "detail": ""})
        elif oom is not None and oom <= need:
            # Only a real out-of-memory error says a batch does not fit.
            criteria.append({"name": "memory", "pass": False, "value": f"largest batch {largest}",
                             "threshold": threshold, "detail": ""})
            blocking.append(f"memory: batch {need} does not fit (largest that runs: {largest})")
        else:
            # The step failed at the required batch (or at every batch) for another
            # reason, listed with the failures (e.g. a model that takes only some
            # batch sizes): nothing is known about memory there, which is not the blocker.
            errors = {r["batch_size"]: r.get("error") for r in mem.get("per_batch") or [] if r.get("status") == "failed"}
            why = f": {errors[need]}" if errors.get(need) else " (see the failures)"
            criteria.append({"name": "memory", "pass": None,
                             "value": "not measured (the step failed)" if largest is None
                             else f"largest batch {largest}; batch {need} failed with another error than out of "
                                  f"memory{why}",
                             "threshold": threshold, "detail": ""})
    if cost and cost["rows"] and t["max_cost_ratio"] is not None:
        by_side = {r["side"]: r for r in cost["rows"]}
        key = "cost_per_1000" if all(r["cost_per_1000"] is not None for r in cost["rows"]) \
            else "device_seconds_per_1000"
        if "baseline" in by_side and "target" in by_side:
            targets = [r for r in cost["rows"] if r["side"] == "target"]
            best = min(targets, key=lambda r: r[key])
            ratio = best[key] / by_side["baseline"][key]
            ok = ratio <= t["max_cost_ratio"]
            criteria.append({"name": "cost", "pass": ok, "value": f"{ratio:.2f}x the baseline's {key}",
                             "threshold": f"<= {t['max_cost_ratio']}x", "detail": ""})
            if not ok:
                changes.append(f"cost: {ratio:.2f}x the baseline > {t['max_cost_ratio']}x")
    elif cost is not None:
        criteria.append({"name": "cost", "pass": None, "value": "estimated" if cost["rows"] else "not estimated",
                         "threshold": "none set (thresholds.max_cost_ratio)", "detail": cost.get("note") or ""})
    for f in report.get("failures") or []:
        if f["kind"] == "out_of_memory":
            continue  # the memory criterion says whether it matters (at the required batch)
        if f["kind"] != "numerics_mismatch":
            blocking.append(f"{f['kind']} in {f['stage']}" + (f" (batch {f['batch_size']})" if f["batch_size"] else "")
                            + f": {f['error'].splitlines()[0][:160]}")
    # A criterion whose stage did not run (run.stages, or it failed) is named,
    # so a partial run's "ready" says what it did not look at.
    have = {c["name"] for c in criteria}
    status = {s["name"]: s for s in report.get("stages") or []}
    not_measured = []
    for name, stage in (("coverage", "coverage"), ("numerics", "numerics"), ("latency", "performance"),
                        ("throughput", "performance"), ("memory", "memory")):
        if name in have:
            continue
        st = status.get(stage) or {}
        why = ("not in run.stages" if st.get("status") == "skipped" else
               "the stage failed" if st.get("status") == "failed" else "no data")
        criteria.append({"name": name, "pass": None, "value": f"not measured ({stage}: {why})", "threshold": "",
                         "detail": ""})
        not_measured.append(name)
    for c in criteria:
        if c["name"] == "numerics" and c["pass"] is None and c["name"] not in not_measured:
            not_measured.append("numerics")  # nothing compared, or a baseline that disagrees with itself
        if c["name"] == "memory" and c["pass"] is None and c["name"] not in not_measured:
            not_measured.append("memory")
    failed_stages = [s["name"] for s in report.get("stages") or [] if s["status"] == "failed"]
    for name in failed_stages:
        blocking.append(f"stage {name} did not complete")
    if blocking:
        overall = "not ready"
    elif changes or any(c["pass"] is False for c in criteria):
        overall = "ready after listed changes"
    else:
        overall = "ready"
    return {"overall": overall, "criteria": criteria, "blocking": _dedupe(blocking),
            "changes": list(dict.fromkeys(changes)), "not_measured": not_measured}


def _dedupe(items):
    """Blockers in order, once each; the same root cause repeated (one error at
    every batch size and frontend, differing only in its "(batch N)" and
    stage) kept once with the count of repeats."""
    import re
    seen, order = {}, []
    for b in items:
        key = re.sub(r"^(\w+) in \w+( \(batch \d+\))?: ", r"\1: ", b)
        if key not in seen:
            seen[key] = [b, 0]
            order.append(key)
        seen[key][1] += 1
    return [seen[k][0] + (f" (and {seen[k][1] - 1} more like it)" if seen[k][1] > 1 else "") for k in order]

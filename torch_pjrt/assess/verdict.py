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
        for o in cov["ops"]:
            if o["class"] == "failing":
                blocking.append(f"coverage: {o['op']} fails on tpu")
            elif o["class"] == "cpu_fallback":
                changes.append(f"lower {o['op']} (runs on the CPU: {o['count']} calls)")
    num = report.get("numerics")
    if num:
        bad = [o for o in num["outputs"] if not o["pass"]]
        metric = num.get("task_metric")
        criteria.append({"name": "numerics", "pass": bool(num["pass"]),
                         "value": f"{len(num['outputs']) - len(bad)}/{len(num['outputs'])} outputs within tolerance"
                                  + (f"; {metric['name']} {metric['target']:.4g} (baseline {metric['baseline']:.4g})"
                                     if metric else ""),
                         "threshold": "every output within its dtype's (rtol, atol)", "detail": ""})
        for o in bad[:5]:
            blocking.append(f"numerics: {o['frontend']} {o['name']}: "
                            + (o.get("error") or f"max abs {o['max_abs']:.3g}, max rel {o['max_rel']:.3g}, "
                               f"{o['out_of_tolerance']:.1%} out of tolerance (rtol {o['rtol']}, atol {o['atol']})"))
        if metric and not metric["pass"]:
            blocking.append(f"numerics: {metric['name']} {metric['target']:.4g} vs baseline {metric['baseline']:.4g}")
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
        threshold = f">= batch {need}" + (f" within {mem['limit_bytes'] / 2**30:.2f} GiB"
                                          if mem.get("limit_bytes") else "")
        if largest is None and mem.get("first_oom_batch") is None:
            # The step failed at every batch for another reason (listed with the
            # failures): nothing is known about memory, which is not the blocker.
            criteria.append({"name": "memory", "pass": None, "value": "not measured (the step failed)",
                             "threshold": threshold, "detail": ""})
        else:
            ok = largest is not None and largest >= need
            criteria.append({"name": "memory", "pass": ok, "value": f"largest batch {largest}",
                             "threshold": threshold, "detail": ""})
            if not ok:
                blocking.append(f"memory: batch {need} does not fit (largest that runs: {largest})")
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
    failed_stages = [s["name"] for s in report.get("stages") or [] if s["status"] == "failed"]
    for name in failed_stages:
        blocking.append(f"stage {name} did not complete")
    if blocking:
        overall = "not ready"
    elif changes or any(c["pass"] is False for c in criteria):
        overall = "ready after listed changes"
    else:
        overall = "ready"
    return {"overall": overall, "criteria": criteria, "blocking": list(dict.fromkeys(blocking)),
            "changes": list(dict.fromkeys(changes))}

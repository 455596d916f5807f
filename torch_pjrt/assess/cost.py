"""Cost per 1,000 successfully completed items, per side, from the measured
throughput and start-up (process start, import, model load, compile,
warm-up; from a cold cache) and the prices in the config (none are built in):
device time = (start-up spread over the job + 1,000 items at the measured
rate, with retried calls) / (1 - idle share), times the device count; cost =
device time x price per device-hour. Without prices the figure is
device-seconds per 1,000 items."""


def _best(rows, side, batch_size):
    rows = [r for r in rows if r["frontend"] == side and r["batch_size"] == batch_size]
    return rows[0]["items_per_s"] if rows else None


def estimate(performance, settings):
    prices, c = settings["prices"], settings["cost"]
    throughput = (performance or {}).get("throughput") or []
    cold = (performance or {}).get("cold_start") or []
    sides = sorted({r["frontend"] for r in throughput})
    common = None
    for side in sides:
        sizes = {r["batch_size"] for r in throughput if r["frontend"] == side}
        common = sizes if common is None else common & sizes
    batch = c["batch_size"] or (max(common) if common else None)
    assumptions = {
        "baseline_price_per_device_hour": prices["baseline_per_device_hour"],
        "target_price_per_device_hour": prices["target_per_device_hour"],
        "currency": prices["currency"], "baseline_devices": prices["baseline_devices"],
        "target_devices": prices["target_devices"], "idle_share": c["idle_share"], "retry_rate": c["retry_rate"],
        "batch_size": batch, "job_items": c["job_items"],
    }
    rows = []
    for side in sides:
        rate = _best(throughput, side, batch) if batch else None
        if not rate:
            continue
        # Start-up: process start, import, model load, first call (compile) and warm-up.
        starts = [r["total"] + r.get("warmup", 0.0) for r in cold
                  if r["frontend"] == side and r.get("cache") in ("cold", None) and r.get("total") is not None]
        startup = min(starts) if starts else 0.0
        baseline = side == "baseline"
        devices = prices["baseline_devices"] if baseline else prices["target_devices"]
        price = prices["baseline_per_device_hour"] if baseline else prices["target_per_device_hour"]
        seconds = (startup * 1000 / c["job_items"] + 1000 / rate * (1 + c["retry_rate"])) / (1 - c["idle_share"])
        device_seconds = seconds * devices
        rows.append({"side": "baseline" if baseline else "target", "frontend": side, "items_per_s": rate,
                     "startup_seconds": startup, "seconds_per_1000": seconds,
                     "device_seconds_per_1000": device_seconds,
                     "cost_per_1000": device_seconds / 3600 * price if price is not None else None})
    note = None
    if prices["baseline_per_device_hour"] is None or prices["target_per_device_hour"] is None:
        note = ("no prices configured ([prices] baseline_per_device_hour, target_per_device_hour): "
                "costs shown as device-seconds per 1,000 items only")
    return {"assumptions": assumptions, "rows": rows, "note": note}

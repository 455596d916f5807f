"""Settings of an assessment: defaults, a TOML file over them (`--config`),
`--quick` over both (fewer iterations, a shorter sweep; it keeps the
config's run.frontends). Every value used and its default go into the
report. Values are checked up front, types and ranges and the baseline
device: a bad one is one line and exit status 2 (the CLI).

The TOML file has one table per topic, e.g.

    [run]
    warmup = 3
    iterations = 30
    [memory]
    limit = "16GiB"          # stands in for the target device's memory
    [prices]
    baseline_per_device_hour = 2.50   # your numbers; nothing is built in
    target_per_device_hour = 1.20
    [thresholds]
    latency_p95_ms = 50
"""
import copy
import tomllib

import torch

DEFAULTS = {
    "run": {
        "stages": ["inventory", "coverage", "numerics", "performance", "memory", "readiness", "cost", "verdict"],
        "frontends": ["eager", "compiled"],  # how the tpu side runs
        "baseline_device": "auto",   # "auto": cuda where present, else cpu
        "warmup": 3,                 # calls before timing, per batch size
        "iterations": 20,            # timed calls per batch size
        "stage_timeout_s": 900,      # a stage running longer is a timeout failure
        "batch_sizes": None,         # None: the workload's own
    },
    "numerics": {
        "batch_size": None,          # None: the smallest of the sweep
        "train_steps": None,         # None: the workload's own
        "loss_rtol": 0.02,           # last loss of the curve, tpu against baseline
    },
    "memory": {
        "limit": None,               # bytes or "16GiB" or a fraction: TORCH_PJRT_MEMORY_LIMIT of the sweep
        "sweep_factor": 4,           # the memory sweep goes on doubling up to this x the largest batch size
        "required_batch": None,      # None: the largest batch size of the sweep
    },
    "readiness": {                   # TPU readiness: compiled for TPU topologies by libtpu, no TPU needed
        "topologies": ["v5e:2x2", "v6e:2x2"],
        "chips": [1],                # data parallel over this many chips of the topology (the batch split)
        "batch_sizes": None,         # None: the sweep's
        "largest_batch": True,       # search the largest batch that fits (compiles more; big programs compile slowly)
        "max_batch": 4096,           # ... up to this batch (">= max_batch" when that fits)
        "tolerance": 0.05,           # the search stops when the smallest batch too big is within this fraction
    },
    "prices": {
        "baseline_per_device_hour": None,
        "target_per_device_hour": None,
        "currency": "USD",
        "baseline_devices": 1,
        "target_devices": 1,
    },
    "cost": {
        "job_items": 1_000_000,      # items one job completes (start-up is spread over them)
        "idle_share": 0.0,           # share of paid device time spent idle
        "retry_rate": 0.0,           # share of calls repeated after a failure
        "batch_size": None,          # None: the largest batch that ran on both sides
    },
    "thresholds": {
        "max_fallback_time_share": 0.05,  # CPU-fallback share of the tpu run's time
        "latency_p95_ms": None,           # at the cost batch size; None: not a criterion
        "min_throughput_ratio": None,     # tpu items/s over the baseline's; None: not a criterion
        "max_cost_ratio": None,           # tpu cost over the baseline's; None: not a criterion
    },
}

QUICK = {
    # (no run.frontends here: --quick overrode the config's choice silently)
    "run": {"warmup": 1, "iterations": 5},
    "memory": {"sweep_factor": 2},
    "readiness": {"topologies": ["v5e:2x2"], "largest_batch": False},
}


def _merge(base, over, where):
    out = copy.deepcopy(base)
    for key, value in over.items():
        if key not in base:
            known = ", ".join(sorted(base))
            raise ValueError(f"config: unknown setting {where}{key!r} (known: {known})")
        if isinstance(base[key], dict):
            if not isinstance(value, dict):
                raise ValueError(f"config: {where}{key} must be a table")
            out[key] = _merge(base[key], value, f"{where}{key}.")
        else:
            out[key] = value
    return out


def load(path=None, quick=False, overrides=None):
    """(settings, defaults) for a TOML file (optional), quick mode and overrides."""
    settings = copy.deepcopy(DEFAULTS)
    if path:
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"config {path}: not valid TOML: {e}") from None
        settings = _merge(settings, data, "")
    if quick:
        settings = _merge(settings, QUICK, "")
    if overrides:
        settings = _merge(settings, overrides, "")
    _check(settings)
    return settings, copy.deepcopy(DEFAULTS)


def _number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _positive_int(v):
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _memory_limit_ok(v):
    """What TORCH_PJRT_MEMORY_LIMIT takes (csrc/runtime/pjrt_runtime.cpp):
    bytes (a whole number or "8GiB"), or a fraction of the device's memory
    ("0.5", 0.5 or "50%")."""
    if v is None:
        return True
    if _number(v):
        return (isinstance(v, int) and v >= 0) or 0 < v <= 1
    if not isinstance(v, str):
        return False
    text = v.strip()
    try:
        if text.endswith("%"):
            return 0 < float(text[:-1]) <= 100
        if "." in text and text.replace(".", "", 1).isdigit():
            return 0 < float(text) <= 1
        from torch_pjrt.cache import parse_size
        parse_size(text)
        return True
    except ValueError:
        return False


def _check_types(s):
    """Types and ranges of the settings, so a bad value is one clear line up
    front (batch_sizes = [0] hung the memory sweep; a threshold "fast" raised
    at the verdict; job_items = 0 divided by zero; --device cdua ran it all)."""
    run, num, mem, cost, th = s["run"], s["numerics"], s["memory"], s["cost"], s["thresholds"]
    checks = [
        ("run.stages", run["stages"], isinstance(run["stages"], list), "a list of stage names"),
        ("run.frontends", run["frontends"], isinstance(run["frontends"], list) and run["frontends"],
         'a non-empty list of "eager" and/or "compiled"'),
        ("run.batch_sizes", run["batch_sizes"], run["batch_sizes"] is None or (
            isinstance(run["batch_sizes"], list) and run["batch_sizes"]
            and all(_positive_int(b) for b in run["batch_sizes"])), "a non-empty list of positive integers"),
        ("numerics.batch_size", num["batch_size"], num["batch_size"] is None or _positive_int(num["batch_size"]),
         "a positive integer"),
        ("numerics.train_steps", num["train_steps"], num["train_steps"] is None or _positive_int(num["train_steps"]),
         "a positive integer"),
        ("numerics.loss_rtol", num["loss_rtol"], _number(num["loss_rtol"]) and num["loss_rtol"] >= 0,
         "a number >= 0"),
        ("memory.limit", mem["limit"], _memory_limit_ok(mem["limit"]),
         'bytes (e.g. 17179869184 or "16GiB") or a fraction of the device\'s memory (0.5 or "50%")'),
        ("memory.sweep_factor", mem["sweep_factor"], _number(mem["sweep_factor"]) and mem["sweep_factor"] >= 1,
         "a number >= 1"),
        ("memory.required_batch", mem["required_batch"],
         mem["required_batch"] is None or _positive_int(mem["required_batch"]), "a positive integer"),
        ("cost.job_items", cost["job_items"], _number(cost["job_items"]) and cost["job_items"] > 0,
         "a number > 0"),
        ("cost.batch_size", cost["batch_size"], cost["batch_size"] is None or _positive_int(cost["batch_size"]),
         "a positive integer"),
        ("prices.baseline_devices", s["prices"]["baseline_devices"], _positive_int(s["prices"]["baseline_devices"]),
         "a positive integer"),
        ("prices.target_devices", s["prices"]["target_devices"], _positive_int(s["prices"]["target_devices"]),
         "a positive integer"),
    ]
    checks += [(f"thresholds.{k}", v, v is None or (_number(v) and v >= 0), "a number >= 0")
               for k, v in th.items()]
    for name, value, ok, what in checks:
        if not ok:
            raise ValueError(f"config: {name} must be {what}, got {value!r}")
    dev = run["baseline_device"]
    if not isinstance(dev, str):
        raise ValueError(f"config: run.baseline_device must be a device string, got {dev!r}")
    if dev != "auto":
        try:
            torch.device(dev)
        except (RuntimeError, ValueError) as e:
            raise ValueError(f"baseline device {dev!r} (--device / run.baseline_device): not a device: "
                             f"{str(e).splitlines()[0]}") from None


def _check(s):
    _check_types(s)
    run = s["run"]
    known = DEFAULTS["run"]["stages"]
    bad = [x for x in run["stages"] if x not in known]
    if bad:
        raise ValueError(f"config: run.stages has unknown stages {bad} (known: {known})")
    bad = [x for x in run["frontends"] if x not in ("eager", "compiled")]
    if bad:
        raise ValueError(f"config: run.frontends must be eager and/or compiled, got {bad}")
    for key in ("warmup", "iterations", "stage_timeout_s"):
        if not isinstance(run[key], (int, float)) or run[key] < (1 if key != "warmup" else 0):
            raise ValueError(f"config: run.{key} must be a positive number, got {run[key]!r}")
    for key in ("idle_share", "retry_rate"):
        v = s["cost"][key]
        if not isinstance(v, (int, float)) or not 0 <= v < 1:
            raise ValueError(f"config: cost.{key} must lie in [0, 1), got {v!r}")
    for key in ("baseline_per_device_hour", "target_per_device_hour"):
        v = s["prices"][key]
        if v is not None and (not isinstance(v, (int, float)) or v < 0):
            raise ValueError(f"config: prices.{key} must be a non-negative number, got {v!r}")

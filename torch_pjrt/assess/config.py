"""Settings of an assessment: defaults, a TOML file over them (`--config`),
`--quick` over both. Every value used and its default go into the report.

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
    "run": {"warmup": 1, "iterations": 5, "frontends": ["eager", "compiled"]},
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


def _check(s):
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

"""Compile-time and step-time benchmark: torch.compile(backend="tpu") against tpu
eager, PyTorch eager and inductor on CPU, and the same GPT in plain JAX (jit).

For each model of examples/models.py (MLP, CNN, GPT, and the wider GPT:
width 128, 4 heads, 2 layers, batch 4 x 64 tokens), each mode and each
configuration, three timings:

  cold     first call in a fresh process with EMPTY cache dirs (a fresh
           TORCH_PJRT_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR and JAX compilation
           cache dir per cell): compiles included;
  warm     first call in a NEW process reusing the cache dirs the cold process
           filled;
  steady   median step time over --steps calls after --warmup calls, in the
           warm process.

First-call times start just before the call (interpreter start, imports, model
construction and the host->device copy of weights and data are excluded) and
stop after the device is synchronized (torch.tpu.synchronize(); JAX:
block_until_ready). Import times are reported separately in a note.

Modes:
  inference   model.eval(), forward of one batch under torch.no_grad();
  train       one training step of models.train's recipe: zero_grad, forward +
              loss, backward, clip_grad_norm_(1.0), optimizer step (SGD+momentum
              for the MLP, Adam for the CNN, AdamW for the GPT).

Configurations:
  tpu-compiled   model on "tpu"; inference: torch.compile(model, backend="tpu");
                 train: torch.compile of forward + loss (one graph, backward via
                 AOTAutograd) and of the clip + optimizer step (--eager-opt
                 leaves those two eager);
  tpu-compiled-fused
                 as tpu-compiled, each call inside torch_pjrt.fused(): the
                 step's graphs (and the eager glue between them) are recorded
                 and run as one XLA program, parameters and optimizer state
                 donated;
  tpu-captured   model on "tpu", eager code, the whole step wrapped in
                 torch_pjrt.capture_step (optimizers with capturable=True):
                 warm-up call, two recorded calls, then each call replays one
                 XLA program without running the step's Python; its extra
                 table gives the time to the first replayed step;
  tpu-eager      model on "tpu", op by op;
  cpu-eager      PyTorch eager on CPU;
  cpu-inductor   as tpu-compiled, on CPU with torch.compile's default backend;
  jax            GPT only, benchmarks/jax_gpt.py, jax.jit of forward / of the
                 whole train step (value_and_grad, clip, AdamW), same initial
                 weights and batches as the torch GPT. Skipped when `import jax`
                 fails.

Every measurement runs in its own processes (this script re-invoked with
--worker, one JSON line back), sequentially. A failing configuration shows
"failed: <reason>" in its cells; the run goes on.

    python benchmarks/compile_bench.py [--steps N] [--warmup N]
        [--models mlp,cnn,gpt] [--modes inference,train]
        [--configs tpu-compiled,tpu-eager,cpu-eager,cpu-inductor,jax]
        [--eager-opt] [--markdown FILE] [--json FILE] [--keep-cache]
"""
import argparse
import atexit
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MARK = "@@compile_bench "

CONFIGS = {  # cli name -> table label
    "tpu-compiled": "tpu compiled",
    "tpu-compiled-fused": "tpu compiled, fused step",
    "tpu-captured": "tpu captured step",
    "tpu-eager": "tpu eager",
    "cpu-eager": "cpu eager",
    "cpu-inductor": "cpu inductor",
    "jax": "jax jit",
    # GPU check only (not in the default set): PyTorch on CUDA, same dtype and batch.
    "cuda-eager": "cuda eager",
    "cuda-inductor": "cuda inductor",
}
DEFAULT_CONFIGS = ("tpu-compiled", "tpu-compiled-fused", "tpu-captured", "tpu-eager", "cpu-eager", "cpu-inductor",
                   "jax")
MODELS = ("mlp", "cnn", "gpt", "gpt-wide")
JAX_MODELS = ("gpt", "gpt-wide")
CAPTURE_CALLS = 4  # tpu-captured: warm-up, two recordings, then the first replay
MODES = ("inference", "train")
CLIP = 1.0  # models.train's default


def _short(exc_text, limit=160):
    line = next((l.strip() for l in str(exc_text).splitlines() if l.strip()), "error")
    return line if len(line) <= limit else line[:limit - 3] + "..."


def _cell_reason(error, limit=60):
    """A table cell's short form of a worker's error: the exception text up to its first sentence."""
    text = error or "?"
    for cut in (", see ", ". "):
        if cut in text:
            text = text[:text.index(cut)]
    return text if len(text) <= limit else text[:limit - 3] + "..."


# =============================================================================================
# worker side: one (config, model, mode) measurement in this process
# =============================================================================================

def _emit(obj):
    sys.stdout.flush()
    print(MARK + json.dumps(obj), flush=True)


def _timed_first_call(res, call, sync, counters):
    """The first call, timed up to the device sync, with its counter deltas."""
    c0 = counters()
    res["stage"] = "first call"
    start = time.perf_counter()
    out = call(0)
    sync(out)
    res["first_s"] = time.perf_counter() - start
    res["first_metrics"] = _numeric_delta(counters(), c0)
    return out


def _numeric_delta(after, before):
    out = {}
    for k, v in after.items():
        if isinstance(v, bool):
            continue
        if isinstance(v, (int, float)):
            d = v - before.get(k, 0)
            if d:
                out[k] = d
        elif isinstance(v, dict):  # e.g. cpu_fallbacks: op -> calls
            b = before.get(k) or {}
            d = {op: n - b.get(op, 0) for op, n in v.items() if isinstance(n, (int, float)) and n - b.get(op, 0)}
            if d:
                out[k] = d
    return out


def _timed_steps(call, sync, first_index, n):
    times = []
    out = None
    for i in range(first_index, first_index + n):
        start = time.perf_counter()
        out = call(i)
        sync(out)
        times.append(time.perf_counter() - start)
    return times, out


def _worker_torch(a, res):
    t0 = time.perf_counter()
    import torch
    res["import_s"] = {"torch": time.perf_counter() - t0}
    if a.threads:
        torch.set_num_threads(a.threads)
    res["torch_threads"] = torch.get_num_threads()
    tpu = a.config.startswith("tpu")
    metrics = lambda: {}  # noqa: E731
    if tpu:
        t1 = time.perf_counter()
        import torch_pjrt
        res["import_s"]["torch_pjrt"] = time.perf_counter() - t1
        metrics = torch_pjrt.metrics
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import models
    from torch._dynamo.utils import counters

    cuda = a.config.startswith("cuda")
    device = "tpu" if tpu else "cuda" if cuda else "cpu"
    compiled = a.config in ("tpu-compiled", "tpu-compiled-fused", "cpu-inductor", "cuda-inductor")
    backend = "tpu" if a.config.startswith("tpu-compiled") else "inductor"
    captured = a.config == "tpu-captured"
    n_calls = (CAPTURE_CALLS if captured else 1) if a.phase == "cold" else 1 + max(a.warmup, CAPTURE_CALLS) + a.steps

    model, make_opt, batch_fn, loss_fn = models.build(a.model)
    model.to(device)
    params = list(model.parameters())
    if a.mode == "inference":
        model.eval()
        x = batch_fn(0)[0].to(device)
        fn = torch.compile(model, backend=backend) if compiled else model
        if captured:
            fn = torch_pjrt.capture_step(model)

        def call(i):
            with torch.no_grad():
                return fn(x)
    else:
        model.train()
        opt = make_opt(params)
        batches = [tuple(t.to(device) for t in batch_fn(i)) for i in range(n_calls)]

        step = models.step_fn(model, opt, loss_fn, batches, params, CLIP, backend if compiled else None,
                              a.compile_opt)
        call = step
        if captured:
            captured_step = models.captured_step(model, opt, loss_fn, params, CLIP)

            def call(i):
                return captured_step(*batches[i])
        if a.config == "tpu-compiled-fused":
            def call(i):
                with torch_pjrt.fused():
                    return step(i)

    if tpu:
        sync = lambda out: torch.tpu.synchronize()  # noqa: E731
    elif cuda:
        sync = lambda out: torch.cuda.synchronize()  # noqa: E731
    else:
        sync = lambda out: None  # noqa: E731
    sync(None)  # weights and data are on the device before the clock starts

    def dynamo_counts():
        return {"unique_graphs": counters["stats"]["unique_graphs"],
                "graph_breaks": sum(counters["graph_break"].values()),
                "fxgraph_cache_hit": counters["inductor"]["fxgraph_cache_hit"],
                "fxgraph_cache_miss": counters["inductor"]["fxgraph_cache_miss"],
                "autograd_cache_hit": counters["aot_autograd"]["autograd_cache_hit"],
                "autograd_cache_miss": counters["aot_autograd"]["autograd_cache_miss"]}

    d0 = dynamo_counts()
    out = _timed_first_call(res, call, sync, metrics)
    res["first_dynamo"] = _numeric_delta(dynamo_counts(), d0)

    # What the first call computed, read after the clock (host copies only).
    with torch.no_grad():
        if a.mode == "inference":
            o = out.detach().cpu().double()
            res["result"] = {"sum": float(o.sum()), "abs_sum": float(o.abs().sum())}
        else:
            ps = [p.detach().cpu().double() for p in params]
            res["result"] = {"loss": float(out.detach().cpu()), "param_sum": float(sum(p.sum() for p in ps)),
                             "param_abs_sum": float(sum(p.abs().sum() for p in ps))}
    first = 1
    if captured:
        # Time to the first replayed step: the first call (above) and the calls up to the first replay.
        res["stage"] = "to first replay"
        m0 = metrics()
        times, _ = _timed_steps(call, sync, 1, CAPTURE_CALLS - 1)
        res["to_replay_s"] = res["first_s"] + sum(times)
        res["first_replay_s"] = times[-1]
        res["replayed"] = metrics().get("capture_replays", 0) - m0.get("capture_replays", 0)
        first = CAPTURE_CALLS
    if a.phase == "cold":
        return

    res["stage"] = "warm-up"
    m1, d1 = metrics(), dynamo_counts()
    _timed_steps(call, sync, first, 1 + a.warmup - first)
    m2, d2 = metrics(), dynamo_counts()
    res["stage"] = "steady"
    times, out = _timed_steps(call, sync, 1 + a.warmup, a.steps)
    res["warmup_metrics"] = _numeric_delta(m2, m1)
    res["warmup_dynamo"] = _numeric_delta(d2, d1)
    res["steady_metrics"] = _numeric_delta(metrics(), m2)
    res["steady_dynamo"] = _numeric_delta(dynamo_counts(), d2)
    res["steady_s"] = times
    if a.mode == "train":
        res["last_loss"] = float(out.detach().cpu())


def _worker_jax(a, res):
    if a.model not in JAX_MODELS:
        raise ValueError("the JAX configuration exists for the GPTs only")
    t0 = time.perf_counter()
    import numpy as np
    import jax
    res["import_s"] = {"jax": time.perf_counter() - t0}
    events = {}
    jax.monitoring.register_event_listener(lambda name, **kw: events.__setitem__(name, events.get(name, 0) + 1))
    jax.config.update("jax_compilation_cache_dir", os.environ["COMPILE_BENCH_JAX_CACHE_DIR"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    sys.path.insert(0, HERE)
    import jax_gpt

    data = np.load(a.jax_data)
    state = {k[len("w:"):]: data[k] for k in data.files if k.startswith("w:")}
    cfg = jax_gpt.WIDE if a.model == "gpt-wide" else jax_gpt.Config()
    params = jax.device_put(jax_gpt.params_from_state_dict(state, cfg))
    fwd, train_step = jax_gpt.jitted(cfg)
    n_calls = 1 if a.phase == "cold" else 1 + a.warmup + a.steps
    xs = [jax.device_put(data[f"x:{i}"].astype(np.int32)) for i in range(n_calls)]
    ys = [jax.device_put(data[f"y:{i}"].astype(np.int32)) for i in range(n_calls)]
    box = {"params": params}
    if a.mode == "inference":
        def call(i):
            return fwd(box["params"], xs[0])
    else:
        box["opt"] = jax_gpt.init_opt_state(params)

        def call(i):
            box["params"], box["opt"], loss = train_step(box["params"], box["opt"], xs[i], ys[i])
            return loss

    def sync(out):
        jax.block_until_ready(out)
        if a.mode == "train":
            jax.block_until_ready(box["params"])

    jax.block_until_ready((box, xs, ys))

    def counts():
        requests = events.get("/jax/compilation_cache/compile_requests_use_cache", 0)
        hits = events.get("/jax/compilation_cache/cache_hits", 0)
        return {"xla_compiles": requests - hits, "persistent_cache_hits": hits}

    out = _timed_first_call(res, call, sync, counts)
    if a.mode == "inference":
        o = np.asarray(out, dtype=np.float64)
        res["result"] = {"sum": float(o.sum()), "abs_sum": float(np.abs(o).sum())}
    else:
        leaves = [np.asarray(p, dtype=np.float64) for p in jax.tree_util.tree_leaves(box["params"])]
        res["result"] = {"loss": float(out), "param_sum": float(sum(p.sum() for p in leaves)),
                         "param_abs_sum": float(sum(np.abs(p).sum() for p in leaves))}
    if a.phase == "cold":
        return
    res["stage"] = "warm-up"
    c1 = counts()
    _timed_steps(call, sync, 1, a.warmup)
    c2 = counts()
    res["stage"] = "steady"
    times, out = _timed_steps(call, sync, 1 + a.warmup, a.steps)
    res["warmup_metrics"] = _numeric_delta(c2, c1)
    res["steady_metrics"] = _numeric_delta(counts(), c2)
    res["steady_s"] = times
    if a.mode == "train":
        res["last_loss"] = float(out)


def _worker_env(res):
    t0 = time.perf_counter()
    import torch
    res["torch"] = torch.__version__
    res["torch_threads"] = torch.get_num_threads()
    res["import_s"] = {"torch": time.perf_counter() - t0}
    try:
        t1 = time.perf_counter()
        import torch_pjrt
        res["import_s"]["torch_pjrt"] = time.perf_counter() - t1
        info = torch_pjrt.plugin_info()
        api = info.get("api_version")
        attrs = info.get("attributes") or {}
        res["plugin"] = {"name": info.get("name"), "platform": info.get("platform"),
                         "api": ".".join(map(str, api)) if isinstance(api, (tuple, list)) else str(api),
                         "attributes": {k: str(v) for k, v in attrs.items()}}
        res["tpu_devices"] = torch.tpu.device_count()
        try:
            import torch._dynamo
            res["tpu_backend_registered"] = "tpu" in torch._dynamo.list_backends(exclude_tags=())
        except Exception as e:  # noqa: BLE001
            res["tpu_backend_registered"] = f"unknown ({_short(e)})"
    except Exception as e:  # noqa: BLE001
        res["torch_pjrt_error"] = f"{type(e).__name__}: {_short(e)}"
    try:
        t2 = time.perf_counter()
        import jax
        res["import_s"]["jax"] = time.perf_counter() - t2
        res["jax"] = jax.__version__
        res["jax_devices"] = [str(d) for d in jax.devices()]
    except Exception as e:  # noqa: BLE001
        res["jax_error"] = f"{type(e).__name__}: {_short(e)}"


def worker_main(a):
    res = {"config": a.config, "model": a.model, "mode": a.mode, "phase": a.phase, "ok": False}
    try:
        if a.worker == "env":
            _worker_env(res)
        elif a.config == "jax":
            _worker_jax(a, res)
        else:
            _worker_torch(a, res)
        res["ok"] = True
        res.pop("stage", None)
    except BaseException as e:  # noqa: BLE001 - report every failure as a table cell
        import traceback
        res["error"] = f"{type(e).__name__}: {_short(e)}"
        res["traceback"] = traceback.format_exc()[-4000:]
    # A normal exit follows (atexit handlers run, e.g. anything a cache flushes at exit); the driver reads
    # this line even if the teardown ends badly.
    _emit(res)


# =============================================================================================
# driver side
# =============================================================================================

def _run_worker(args, extra_env, timeout):
    cmd = [sys.executable, os.path.abspath(__file__), *args]
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.setdefault("JAX_PLATFORMS", "cpu")  # (JAX would try an installed libtpu first; set it to use a GPU)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra_env)
    start = time.perf_counter()
    try:
        p = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        return {"ok": False, "error": f"timeout after {timeout:.0f} s", "process_s": time.perf_counter() - start,
                "stderr_tail": (e.stderr or b"")[-2000:].decode(errors="replace") if isinstance(e.stderr, bytes)
                else (e.stderr or "")[-2000:]}
    wall = time.perf_counter() - start
    res = None
    for line in p.stdout.splitlines():
        if line.startswith(MARK):
            res = json.loads(line[len(MARK):])
    if res is None:
        tail = [l for l in (p.stderr or "").splitlines() if l.strip()]
        res = {"ok": False, "error": f"worker exited with code {p.returncode}" + (f": {_short(tail[-1], 70)}" if tail else ""),
               "stderr_tail": (p.stderr or "")[-3000:]}
    res["process_s"] = wall
    return res


def _dir_size(path):
    total = 0
    for base, _, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(base, f))
            except OSError:
                pass
    return total


def _write_jax_data(path, n_calls, kind):
    """The torch GPT's initial weights (state_dict) and batches 0..n_calls-1, for the JAX worker."""
    import numpy as np
    import torch  # noqa: F401
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import models
    model, _, batch_fn, _ = models.build(kind)
    arrays = {f"w:{k}": v.detach().numpy().copy() for k, v in model.state_dict().items()}
    for i in range(n_calls):
        x, y = batch_fn(i)
        arrays[f"x:{i}"], arrays[f"y:{i}"] = x.numpy(), y.numpy()
    np.savez(path, **arrays)


def _ms(seconds):
    if seconds >= 10:
        return f"{seconds * 1e3:,.0f}"
    if seconds >= 0.1:
        return f"{seconds * 1e3:.0f}"
    return f"{seconds * 1e3:.2f}" if seconds < 0.01 else f"{seconds * 1e3:.1f}"


def _cell_fail(res):
    return "failed: " + _cell_reason(res.get("error")).replace("|", "\\|")


def _counts(res, key, metric_keys):
    """compile / cache-hit counts of one phase for the table, '-' when not applicable."""
    if not res or not res.get("ok") or key not in res:
        return "-"
    d = res.get(key) or {}
    return str(sum(d.get(k, 0) for k in metric_keys))


def _compare(res, ref):
    """Relative difference of a first-call result against cpu eager's."""
    if not res.get("ok") or not ref or not ref.get("ok"):
        return ""
    a, b = res["result"], ref["result"]
    if "loss" in a:
        d = max(abs(a["loss"] - b["loss"]) / max(abs(b["loss"]), 1e-12),
                abs(a["param_sum"] - b["param_sum"]) / max(b["param_abs_sum"], 1e-12))
    else:
        d = abs(a["sum"] - b["sum"]) / max(b["abs_sum"], 1e-12)
    return f"{d:.1e}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="timed steady-state calls (median quoted)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed calls after the first, before the timed ones")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--configs", default=",".join(DEFAULT_CONFIGS),
                        help=f"of {','.join(CONFIGS)}")
    parser.add_argument("--compile-opt", action="store_true", default=True,
                        help="compiled configs: also torch.compile the clip + optimizer step (default)")
    parser.add_argument("--eager-opt", dest="compile_opt", action="store_false",
                        help="compiled configs: clip + optimizer step stay eager")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch.set_num_threads(N) in the torch workers (default: PyTorch's choice)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per worker process")
    parser.add_argument("--markdown", metavar="FILE", help="also write the report (Markdown) to FILE")
    parser.add_argument("--json", metavar="FILE", help="write every worker's raw result to FILE")
    parser.add_argument("--keep-cache", action="store_true", help="keep the cache dirs (path printed)")
    # worker-only
    parser.add_argument("--worker", choices=("run", "env"), help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--phase", choices=("cold", "warm"), help=argparse.SUPPRESS)
    parser.add_argument("--jax-data", help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.worker:
        worker_main(a)
        return

    def pick(text, allowed, what):
        names = [n.strip().replace(" ", "-") for n in text.split(",") if n.strip()]
        names = ["jax" if n in ("jax-jit", "jax") else n for n in names]
        bad = [n for n in names if n not in allowed]
        if bad:
            parser.error(f"unknown {what}: {', '.join(bad)} (choose from {', '.join(allowed)})")
        return [n for n in allowed if n in names]  # canonical order

    if a.steps < 1 or a.warmup < 0:
        parser.error("--steps must be >= 1 and --warmup >= 0")
    configs = pick(a.configs, tuple(CONFIGS), "config")
    kinds = pick(a.models, MODELS, "model")
    modes = pick(a.modes, MODES, "mode")
    run_start = time.perf_counter()
    lines = []

    def out(text=""):
        print(text, flush=True)
        lines.append(text)

    env = _run_worker(["--worker", "env"], {"TORCH_PJRT_CACHE_DIR": ""}, a.timeout)
    load0 = os.getloadavg()
    out("# torch.compile benchmark (`benchmarks/compile_bench.py`)")
    out()
    plugin = env.get("plugin") or {}
    out(f"- torch {env.get('torch', '?')}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPU cores ({platform.machine()}), load average at start "
        f"{load0[0]:.2f} / {load0[1]:.2f} / {load0[2]:.2f} (1/5/15 min)")
    if plugin:
        attrs = ", ".join(f"{k} {v}" for k, v in plugin.get("attributes", {}).items())
        out(f"- torch_pjrt plugin '{plugin.get('name')}' (platform {plugin.get('platform')}, C API "
            f"{plugin.get('api')}{', ' + attrs if attrs else ''}), {env.get('tpu_devices', '?')} device(s)")
        out(f"- torch.compile backend \"tpu\" registered: {env.get('tpu_backend_registered')}")
    else:
        out(f"- torch_pjrt: {env.get('torch_pjrt_error') or env.get('error', '?')}")
    have_jax = "jax" in env
    out(f"- jax {env['jax']} ({', '.join(env.get('jax_devices', []))})" if have_jax
        else f"- jax: not available ({env.get('jax_error', '?')}): the jax row is skipped")
    out(f"- {a.steps} timed steps after {a.warmup} warm-up calls; PyTorch CPU threads: "
        f"{a.threads or str(env.get('torch_threads', '?')) + ' (default)'}; train step compiled region: "
        + ("forward + loss, and clip + optimizer step" if a.compile_opt
           else "forward + loss (clip + optimizer step eager: --eager-opt)"))
    out()

    cache_root = tempfile.mkdtemp(prefix="compile_bench_")
    if not a.keep_cache:
        atexit.register(shutil.rmtree, cache_root, True)  # also on Ctrl-C
    jax_data = {}
    if "jax" in configs and have_jax:
        for kind in kinds:
            if kind in JAX_MODELS:
                jax_data[kind] = os.path.join(cache_root, f"jax_{kind}_data.npz")
                _write_jax_data(jax_data[kind], 1 + max(a.warmup, CAPTURE_CALLS) + a.steps, kind)

    cells = []  # (kind, mode, config, cold, warm, cache_bytes)
    for kind in kinds:
        for mode in modes:
            for config in configs:
                if config == "jax" and (kind not in JAX_MODELS or not have_jax):
                    continue
                tag = f"{config}_{kind}_{mode}"
                cdir = os.path.join(cache_root, tag)
                extra = {"TORCH_PJRT_CACHE_DIR": os.path.join(cdir, "pjrt"),
                         "TORCHINDUCTOR_CACHE_DIR": os.path.join(cdir, "inductor"),
                         "COMPILE_BENCH_JAX_CACHE_DIR": os.path.join(cdir, "jax")}
                for d in extra.values():
                    os.makedirs(d, exist_ok=True)
                common = ["--worker", "run", "--config", config, "--model", kind, "--mode", mode,
                          "--steps", str(a.steps), "--warmup", str(a.warmup)]
                if not a.compile_opt:
                    common.append("--eager-opt")
                if a.threads:
                    common += ["--threads", str(a.threads)]
                if kind in jax_data:
                    common += ["--jax-data", jax_data[kind]]
                print(f"  [{time.perf_counter() - run_start:6.0f} s] {kind} {mode} {CONFIGS[config]}: cold ...",
                      end="", flush=True, file=sys.stderr)
                cold = _run_worker(common + ["--phase", "cold"], extra, a.timeout)
                size = _dir_size(cdir)
                print(" warm ...", end="", flush=True, file=sys.stderr)
                warm = _run_worker(common + ["--phase", "warm"], extra, a.timeout)
                print(" done" if cold.get("ok") and warm.get("ok") else
                      f" {cold.get('error') or warm.get('error')}", file=sys.stderr, flush=True)
                cells.append((kind, mode, config, cold, warm, size))

    # ---- the table --------------------------------------------------------------------------
    out("| model | mode | config | cold first call (ms) | warm-cache first call (ms) | steady median (ms) "
        "| steps/s | compiles: cold / warm / steady | cache hits: cold / warm | vs cpu eager |")
    out("|---|---|---|---:|---:|---:|---:|---|---|---|")
    refs = {(k, m): c for k, m, cfg, c, _, _ in cells if cfg == "cpu-eager"}
    compile_keys = {"tpu-compiled": ("xla_compiles",), "tpu-compiled-fused": ("xla_compiles",),
                    "tpu-captured": ("xla_compiles",), "tpu-eager": ("xla_compiles",),
                    "cpu-inductor": ("fxgraph_cache_miss",), "jax": ("xla_compiles",)}
    hit_keys = {"tpu-compiled": ("persistent_cache_hits",), "tpu-compiled-fused": ("persistent_cache_hits",),
                "tpu-captured": ("persistent_cache_hits",), "tpu-eager": ("persistent_cache_hits",),
                "cpu-inductor": ("fxgraph_cache_hit",), "jax": ("persistent_cache_hits",)}
    for kind, mode, config, cold, warm, size in cells:
        c_cold = _ms(cold["first_s"]) if cold.get("ok") else _cell_fail(cold)
        c_warm = _ms(warm["first_s"]) if warm.get("ok") else _cell_fail(warm)
        if warm.get("ok"):
            med = statistics.median(warm["steady_s"])
            c_steady, c_rate = _ms(med), f"{1 / med:,.0f}" if med > 0 else "-"
        elif warm.get("stage") in ("warm-up", "steady"):  # the first call worked, later calls failed
            c_steady, c_rate = _cell_fail(warm), "-"
        else:
            c_steady = c_rate = "-"
        if config in compile_keys and (cold.get("ok") or warm.get("ok")):
            src = "first_dynamo" if config == "cpu-inductor" else "first_metrics"
            ssrc = "steady_dynamo" if config == "cpu-inductor" else "steady_metrics"
            ck = compile_keys[config]
            c_comp = f"{_counts(cold, src, ck)} / {_counts(warm, src, ck)} / {_counts(warm, ssrc, ck)}"
            c_hits = f"{_counts(cold, src, hit_keys[config])} / {_counts(warm, src, hit_keys[config])}"
        else:
            c_comp = c_hits = "-"
        c_cmp = "ref" if config == "cpu-eager" and cold.get("ok") else _compare(cold, refs.get((kind, mode)))
        out(f"| {kind} | {mode} | {CONFIGS[config]} | {c_cold} | {c_warm} | {c_steady} | {c_rate} "
            f"| {c_comp} | {c_hits} | {c_cmp} |")
    out()

    # ---- step capture: time to the first replayed step, steady ratios ------------------------
    capture_rows = [(k, m, cold, warm) for k, m, cfg, cold, warm, _ in cells if cfg == "tpu-captured"]
    if capture_rows:
        out("Step capture (`torch_pjrt.capture_step`): time to the first replayed step (the first call, two "
            "recorded calls and the first replay, each synced), cold cache and warm cache, and the steady step "
            "against the other configs of the same run (ratios > 1: the captured step is faster).")
        out()
        out("| model | mode | to 1st replay cold (ms) | to 1st replay warm (ms) | warm / cold | replayed | "
            "steady (ms) | vs tpu compiled | vs cpu eager | vs cpu inductor | vs jax jit | last loss vs cpu eager |")
        out("|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---|")
        steady = {(k, m, cfg): statistics.median(w["steady_s"]) for k, m, cfg, _, w, _ in cells
                  if w.get("ok") and w.get("steady_s")}
        last = {(k, m, cfg): w.get("last_loss") for k, m, cfg, _, w, _ in cells if w.get("ok")}
        for k, m, cold, warm in capture_rows:
            tc = cold.get("to_replay_s") if cold.get("ok") else None
            tw = warm.get("to_replay_s") if warm.get("ok") else None
            mine = steady.get((k, m, "tpu-captured"))

            def ratio(cfg):
                other = steady.get((k, m, cfg))
                return f"{other / mine:.2f}x" if other and mine else "-"
            ref_loss, my_loss = last.get((k, m, "cpu-eager")), last.get((k, m, "tpu-captured"))
            loss_cmp = (f"{abs(my_loss - ref_loss) / max(abs(ref_loss), 1e-12):.1e}"
                        if ref_loss is not None and my_loss is not None else "-")
            out(f"| {k} | {m} | {_ms(tc) if tc else _cell_fail(cold)} | {_ms(tw) if tw else _cell_fail(warm)} "
                f"| {f'{tw / tc:.2f}' if tc and tw else '-'} | {'yes' if warm.get('replayed') else 'no'} "
                f"| {_ms(mine) if mine else '-'} | {ratio('tpu-compiled')} | {ratio('cpu-eager')} "
                f"| {ratio('cpu-inductor')} | {ratio('jax')} | {loss_cmp} |")
        out()

    # ---- notes ------------------------------------------------------------------------------
    def med_import(name):
        vals = [r["import_s"][name] for _, _, _, c, w, _ in cells for r in (c, w)
                if r.get("import_s", {}).get(name) is not None]
        vals += [env["import_s"][name]] if env.get("import_s", {}).get(name) is not None else []
        return (statistics.median(vals), len(vals)) if vals else (None, 0)

    notes = []
    for name, label in (("torch", "import torch"), ("torch_pjrt", "import torch_pjrt (after torch; loads the "
                                                                 "extension and the PJRT plugin, creates the client)"),
                        ("jax", "import jax")):
        t, n = med_import(name)
        if t is not None:
            notes.append(f"{label}: {t * 1e3:.0f} ms (median of {n} processes), not included in first-call times")
    out("Notes:")
    out("- cold: fresh process, empty cache dirs; warm: new process, the same cache dirs; steady: median of "
        f"{a.steps} calls after {a.warmup} warm-up calls in the warm process, each call followed by a device sync.")
    out("- compiles: tpu configs count torch_pjrt `xla_compiles`, jax counts XLA compilations (compile requests "
        "less persistent-cache hits), cpu inductor counts inductor FX-graph cache misses; for the cold first call, "
        "the warm-cache first call and the timed steady calls. cache hits: torch_pjrt `persistent_cache_hits`, "
        "JAX persistent compilation cache hits, inductor FX-graph cache hits.")
    out("- vs cpu eager: relative difference of the first call's result from cpu eager's (inference: sum of "
        "outputs / sum of |outputs|; train: first loss, and sum of parameters after the step / sum of |parameters|).")
    for n in notes:
        out(f"- {n}")
    load1 = os.getloadavg()
    out(f"- load average at end {load1[0]:.2f} / {load1[1]:.2f} / {load1[2]:.2f}; whole run "
        f"{time.perf_counter() - run_start:.0f} s")

    details = []

    def pick_metrics(d, keys):
        parts = []
        for k in keys:
            v = (d or {}).get(k)
            if v:
                parts.append(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}")
        return ", ".join(parts)

    first_keys = ("xla_compiles", "compile_seconds", "persistent_cache_hits", "persistent_cache_load_seconds",
                  "persistent_cache_writes", "persistent_cache_errors", "dynamo_graphs", "compiled_graphs",
                  "graph_compile_seconds", "eager_graph_fallbacks", "graph_recompiles", "dynamo_recompiles",
                  "host_waits", "executions")
    for kind, mode, config, cold, warm, size in cells:
        bits = []
        if cold.get("process_s") is not None and warm.get("process_s") is not None:
            bits.append(f"process wall cold {cold['process_s']:.1f} s / warm {warm['process_s']:.1f} s")
        if size:
            bits.append(f"cache dirs after cold {size / 1024:.0f} KiB")
        for phase, r in (("cold", cold), ("warm", warm)):
            if not r.get("ok"):
                continue
            part = []
            dyn = r.get("first_dynamo") or {}
            if config in ("tpu-compiled", "tpu-compiled-fused", "cpu-inductor"):
                part.append(f"{dyn.get('unique_graphs', 0)} dynamo graph(s), {dyn.get('graph_breaks', 0)} break(s)")
            if config != "cpu-inductor":
                m = pick_metrics(r.get("first_metrics"), first_keys)
                if m:
                    part.append(m)
            fb = (r.get("first_metrics") or {}).get("cpu_fallbacks")
            if fb:
                part.append(f"CPU fallbacks {json.dumps(fb)}")
            if part:
                bits.append(f"{phase} first call: " + ", ".join(part))
        if warm.get("ok"):
            wm = pick_metrics(warm.get("warmup_metrics"), ("xla_compiles", "dynamo_graphs", "dynamo_recompiles",
                                                           "graph_recompiles"))
            if wm:
                bits.append(f"during warm-up: {wm}")
            sm = warm.get("steady_metrics") or {}
            n = max(len(warm.get("steady_s", [])), 1)
            per = [f"{sm[k] / n:.1f} {k}" for k in ("executions", "host_waits", "compiled_graph_runs",
                                                    "eager_graph_fallbacks") if sm.get(k)]
            if per:
                bits.append("per steady step: " + ", ".join(per))
            if (warm.get("steady_dynamo") or {}).get("unique_graphs") or sm.get("xla_compiles"):
                bits.append("COMPILED during the timed steps")
            if warm.get("steady_s"):
                ts = sorted(warm["steady_s"])
                bits.append(f"steady min {_ms(ts[0])} / max {_ms(ts[-1])} ms")
            if "last_loss" in warm:
                bits.append(f"loss {warm['result']['loss']:.4f} -> {warm['last_loss']:.4f}")
        for phase, r in (("cold", cold), ("warm", warm)):
            if not r.get("ok"):
                bits.append(f"{phase} failed{' in ' + r['stage'] if r.get('stage') else ''}: {r.get('error')}")
        details.append(f"- {kind} {mode} {CONFIGS[config]}: " + "; ".join(bits))
    out()
    out("Details:")
    for d in details:
        out(d)

    if a.json:
        with open(a.json, "w") as f:
            json.dump({"env": env, "args": vars(a), "cells": [
                {"model": k, "mode": m, "config": c, "cold": cold, "warm": warm, "cache_bytes": s}
                for k, m, c, cold, warm, s in cells]}, f, indent=1)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write("\n".join(lines) + "\n")
    if a.keep_cache:
        print(f"cache dirs kept under {cache_root}", file=sys.stderr)


if __name__ == "__main__":
    main()

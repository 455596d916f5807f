"""The assessment, stage by stage: inventory (static, here), analyze (op
coverage, graph breaks, recompiles, numerics), performance (each side and
cache state in a fresh process), memory (the sweep under a memory limit),
cost and verdict (here). Every device stage runs in its own process with a
timeout, so a crash, hang or out-of-memory state loses only that stage: the
report says what did not run and why."""
import datetime
import hashlib
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import torch

from . import config as config_mod
from . import cost as cost_mod
from . import failures
from . import verdict as verdict_mod
from .steps import baseline_device
from .workload import load_spec

SCHEMA_VERSION = 1
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")


class Progress:
    """rich progress on a terminal, plain lines otherwise (CI logs)."""

    def __init__(self, total, enabled=True):
        self.enabled = enabled
        self._rich = None
        if enabled and sys.stderr.isatty():
            from rich.progress import BarColumn, Progress as RichProgress, TextColumn, TimeElapsedColumn
            self._rich = RichProgress(TextColumn("[bold]assess[/]"), BarColumn(), TextColumn("{task.description}"),
                                      TimeElapsedColumn(), transient=False)
            self._rich.start()
            self._task = self._rich.add_task("", total=total)

    def step(self, text):
        if self._rich:
            self._rich.update(self._task, description=text)
        elif self.enabled:
            print(f"[assess] {text}", file=sys.stderr, flush=True)

    def advance(self):
        if self._rich:
            self._rich.advance(self._task)

    def close(self):
        if self._rich:
            self._rich.stop()


def _run_worker(request, work_dir, timeout, env_extra=None):
    """Runs one worker process; returns (result dict or None, failure dict or None)."""
    # Who ran: a baseline worker's crash is the baseline's, not frontend "eager"'s.
    side = "baseline" if request.get("device", "tpu") != "tpu" else request.get("frontend")
    fd, path = tempfile.mkstemp(prefix=f"{request['stage']}-", suffix=".json", dir=work_dir)
    os.close(fd)
    request = dict(request, out=path[:-5] + ".out.json", spawn_time=time.time())
    with open(path, "w") as f:
        json.dump(request, f)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"),
               TORCH_PJRT_ASSESS_STAGE=request["stage"])  # a workload may ask which stage runs it
    env.update(env_extra or {})
    log = open(path[:-5] + ".log", "w")
    try:
        p = subprocess.run([sys.executable, WORKER, path], env=env, stdout=log, stderr=subprocess.STDOUT,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, failures.record("timeout", request["stage"], f"no result after {timeout:.0f} s",
                                     side)
    finally:
        log.close()
    if not os.path.exists(request["out"]):
        with open(path[:-5] + ".log") as f:
            tail = f.read()[-1500:]
        how = f"killed by signal {-p.returncode}" if p.returncode < 0 else f"exit status {p.returncode}"
        return None, failures.record("runtime_error", request["stage"],
                                     f"the stage's process crashed ({how}) before writing results:\n{tail}",
                                     side,
                                     next_step="rerun the stage alone (run.stages) to see the crash; a crash of "
                                               "a tpu op is a bug to report")
    with open(request["out"]) as f:
        return json.load(f), None


def strict(obj):
    """`obj` with NaN and +-inf floats as None: report.json is strict JSON
    (json.dump wrote bare NaN, which strict parsers reject). What was not
    finite is said beside it (numerics rows' "nonfinite" counts)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict(v) for v in obj]
    return obj


def _fingerprint(workload):
    """SHA-256 of the model's initial weights (a baseline captured elsewhere must match)."""
    h = hashlib.sha256()
    for k, v in sorted(workload.build_model().state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _tool_info():
    import torch_pjrt
    info = torch_pjrt.plugin_info()
    return {"torch_pjrt": "0.1.0", "torch": torch.__version__, "python": platform.python_version(),
            "plugin": {"name": info["name"], "platform": info["platform"], "version": info["platform_version"],
                       "devices": torch.tpu.device_count(), "device_kind": torch.tpu.get_device_kind(0)},
            "host": {"cpus": os.cpu_count(), "memory_bytes": torch.tpu.get_device_properties(0).total_memory
                     if info["platform"] == "cpu" else None, "machine": platform.machine()}}


class Assessment:
    def __init__(self, spec, out_dir, config_path=None, quick=False, overrides=None, against=None,
                 progress=True):
        self.spec, self.out_dir = spec, os.path.abspath(out_dir)
        self.settings, self.defaults = config_mod.load(config_path, quick, overrides)
        self.settings["quick"] = quick
        self.against = against
        self.progress_enabled = progress
        os.makedirs(self.out_dir, exist_ok=True)
        self.work = os.path.join(self.out_dir, "work")
        shutil.rmtree(self.work, ignore_errors=True)
        os.makedirs(self.work)
        self.report = {"schema_version": SCHEMA_VERSION,
                       "created": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                       "stages": [], "failures": [], "inventory": None, "coverage": None, "numerics": None,
                       "performance": None, "memory": None, "readiness": None, "cost": None,
                       "verdict": None}

    # ---- helpers ----
    def _stage(self, name, fn):
        if name not in self.settings["run"]["stages"]:
            self.report["stages"].append({"name": name, "status": "skipped", "seconds": 0.0,
                                          "reason": "not in run.stages"})
            return
        self.progress.step(name)
        t0 = time.perf_counter()
        try:
            reason = fn()
            status = "failed" if reason else "ok"
        except Exception as e:  # noqa: BLE001  (a failing stage never loses the others)
            status, reason = "failed", f"{type(e).__name__}: {e}"
            self.report["failures"].append(failures.from_exception(e, name))
        self.report["stages"].append({"name": name, "status": status, "seconds": time.perf_counter() - t0,
                                      "reason": reason or None})
        self.progress.advance()

    def _timeout(self):
        return float(self.settings["run"]["stage_timeout_s"])

    def _request(self, stage, **extra):
        return {"stage": stage, "workload": self.spec, "settings": self.settings,
                "batch_sizes": self.batch_sizes, **extra}

    # ---- stages ----
    def inventory(self):
        from . import inventory
        if self.spec.startswith("hf:"):
            # A model directory holds no source of the user's (transformers' own code is the model).
            self.report["inventory"] = inventory.scan([], packages=["transformers"])
            return None
        t = inventory.workload_targets(self.spec)
        if t.get("error"):
            return t["error"]
        self.report["inventory"] = inventory.scan(t["paths"], t["packages"], root=t["root"])
        return self.report["inventory"].get("error")

    def analyze(self):
        run = self.settings["run"]
        nb = self.settings["numerics"]["batch_size"] or self.batch_sizes[0]
        steps = self.settings["numerics"]["train_steps"] or self.workload.train_steps
        wants = [s for s in ("coverage", "numerics") if s in run["stages"]]
        result, fail = _run_worker(self._request(
            "analyze", frontends=run["frontends"], numerics_batch_size=nb, train_steps=steps,
            baseline_device=self.baseline_device, baseline_file=self.against_outputs), self.work, self._timeout())
        if fail:
            self.report["failures"].append(fail)
            return f"{fail['kind']}: {fail['error'].splitlines()[0]}"
        self.report["failures"].extend(result["failures"])
        if "coverage" in wants and result.get("coverage"):
            cov = result["coverage"]
            graphs = result.get("coverage_graphs")
            cov["graphs"], cov["graph_breaks"] = (graphs[0], graphs[1]) if graphs else (None, [])
            cov["recompiles"] = result.get("coverage_recompiles") or []
            self.report["coverage"] = cov
        if "numerics" in wants and result.get("numerics"):
            num = result["numerics"]
            num["baseline_device"] = self.baseline_device if not self.against else self.against_meta["device"]
            num["frontends"] = run["frontends"]
            self.report["numerics"] = num
            for o in num["outputs"]:
                if o["pass"] is False:  # (None: not judged, e.g. a baseline that disagrees with itself)
                    self.report["failures"].append(failures.record(
                        "numerics_mismatch", "numerics",
                        o.get("error") or verdict_mod.mismatch_text(o), o["frontend"], nb))
            m = num.get("task_metric")
            if m and m["pass"] is False:
                self.report["failures"].append(failures.record(
                    "numerics_mismatch", "numerics", f"{m['name']}: {m['target']:.4g} on tpu, "
                    f"{m['baseline']:.4g} on the baseline (tolerance {m['threshold']})", None, nb))
            shutil.copy(num.pop("baseline_file"), os.path.join(self.out_dir, "baseline_outputs.pt"))
        missing = [s for s in wants if not result.get(s)]
        return "; ".join(f"{s}: {result.get(s + '_error', 'no result')}" for s in missing) or None

    def performance(self):
        run = self.settings["run"]
        perf = {"cold_start": [], "latency": [], "throughput": []}
        jobs = []
        if self.against:
            for key in ("cold_start", "latency", "throughput"):
                perf[key].extend(self.against_meta["performance"][key])
        else:
            jobs.append(({"device": self.baseline_device, "frontend": "eager", "cache": "cold"}, {}))
        for frontend in run["frontends"]:
            cache = os.path.join(self.work, f"cache-{frontend}")
            for state in ("cold", "warm"):
                jobs.append(({"device": "tpu", "frontend": frontend, "cache": state},
                             {"TORCH_PJRT_CACHE_DIR": cache}))
        errors = []
        for req, env in jobs:
            label = "baseline" if req["device"] != "tpu" else f"{req['frontend']} ({req['cache']} cache)"
            self.progress.step(f"performance: {label}")
            result, fail = _run_worker(self._request("performance", warmup=run["warmup"],
                                                     iterations=run["iterations"], **req),
                                       self.work, self._timeout(), env)
            if fail:
                self.report["failures"].append(fail)
                errors.append(f"{label}: {fail['kind']}")
                continue
            self.report["failures"].extend(result["failures"])
            if "cold_start" in result:
                perf["cold_start"].append(result["cold_start"])
                if req["cache"] == "cold":  # the warm-cache run repeats the same calls
                    perf["latency"].extend(result["latency"])
                    perf["throughput"].extend(result["throughput"])
            else:
                errors.append(f"{label}: {result.get('error', 'failed').strip().splitlines()[-1]}")
        self.report["performance"] = perf
        return "; ".join(errors) or None

    def memory(self):
        from .memory import sweep_sizes
        m = self.settings["memory"]
        env = {"TORCH_PJRT_MEMORY_LIMIT": str(m["limit"])} if m["limit"] else {}
        sizes = sweep_sizes(self.batch_sizes, m["sweep_factor"])
        result, fail = _run_worker(dict(self._request("memory"), batch_sizes=sizes), self.work,
                                   self._timeout(), env)
        if fail:
            self.report["failures"].append(fail)
            return f"{fail['kind']}: {fail['error'].splitlines()[0]}"
        self.report["failures"].extend(result["failures"])
        self.report["memory"] = result.get("memory")
        return None if result.get("memory") else result.get("error", "failed").strip().splitlines()[-1]

    def readiness(self):
        """TPU readiness: each batch's step compiled for TPU topologies by
        libtpu (torch_pjrt/readiness); when libtpu is absent, how to get it."""
        from torch_pjrt.readiness import plugin
        r = self.settings["readiness"]
        if not plugin.available():
            self.report["readiness"] = {"available": False, "install": plugin.install_hint()}
            return None
        result, fail = _run_worker(dict(self._request("readiness"), batch_sizes=r["batch_sizes"] or self.batch_sizes),
                                   self.work, self._timeout())
        if fail:
            self.report["failures"].append(fail)
            return f"{fail['kind']}: {fail['error'].splitlines()[0]}"
        self.report["failures"].extend(result["failures"])
        self.report["readiness"] = result.get("readiness")
        if not self.report["readiness"]:
            return result.get("error", "failed").strip().splitlines()[-1]
        # A configuration libtpu could not be given (e.g. a graph piece the
        # capture cannot lower) is shown as an error row of the section; it
        # says nothing about running on this device, so it blocks no verdict.
        return None

    def cost(self):
        self.report["cost"] = cost_mod.estimate(self.report["performance"], self.settings)

    def decide(self):
        self.report["verdict"] = verdict_mod.decide(self.report, self.settings)

    # ---- the whole run ----
    def _load_against(self):
        self.against_outputs = None
        self.against_meta = None
        if not self.against:
            return
        try:
            with open(self.against) as f:
                meta = json.load(f)
        except (OSError, ValueError) as e:
            raise ValueError(f"--against {self.against}: not a readable baseline.json ({e})") from e
        need = ("precision", "batch_sizes", "weights_sha256", "outputs_file", "device")
        missing = [k for k in need if not isinstance(meta, dict) or k not in meta]
        if missing:
            raise ValueError(f"--against {self.against}: not a baseline.json from --baseline-only "
                             f"(missing {', '.join(missing)})")
        w = self.workload
        problems = []
        steps = self.settings["numerics"]["train_steps"] or w.train_steps
        if meta.get("mode", w.mode) != w.mode:  # (baselines from before the field: not known)
            problems.append(f"mode {meta['mode']} there, {w.mode} here")
        elif w.mode == "training" and meta.get("train_steps", steps) != steps:
            problems.append(f"{meta['train_steps']} training steps there, {steps} here")
        if meta["precision"] != w.precision:
            problems.append(f"precision {meta['precision']} there, {w.precision} here")
        if meta["batch_sizes"] != self.batch_sizes:
            problems.append(f"batch sizes {meta['batch_sizes']} there, {self.batch_sizes} here")
        if meta["weights_sha256"] != _fingerprint(w):
            problems.append("the model's initial weights differ (seed the model factory)")
        if problems:
            raise ValueError(f"--against {self.against}: refusing to compare unequal runs: " + "; ".join(problems))
        self.against_meta = meta
        self.against_outputs = os.path.join(os.path.dirname(os.path.abspath(self.against)), meta["outputs_file"])

    def run(self):
        self.progress = Progress(8, self.progress_enabled)
        try:
            self.workload = load_spec(self.spec)
            self.batch_sizes = list(self.settings["run"]["batch_sizes"] or self.workload.batch_sizes)
            self.baseline_device = baseline_device(self.settings["run"]["baseline_device"])
            self._load_against()
            w = self.workload
            self.report["workload"] = {
                "name": w.name, "source": w.source, "mode": w.mode, "precision": w.precision,
                "batch_sizes": self.batch_sizes,
                "baseline_device": self.against_meta["device"] if self.against_meta else self.baseline_device,
                "parameters": sum(p.numel() for p in w.build_model().parameters()),
                "task_metric": w.task_metric_name if w.task_metric else None}
            self.report["tool"] = _tool_info()
            self.report["config"] = self.settings
            self.report["config_defaults"] = self.defaults
            self._stage("inventory", self.inventory)
            for name in ("coverage", "numerics"):
                if name not in self.settings["run"]["stages"]:
                    self.report["stages"].append({"name": name, "status": "skipped", "seconds": 0.0,
                                                  "reason": "not in run.stages"})
            if "coverage" in self.settings["run"]["stages"] or "numerics" in self.settings["run"]["stages"]:
                t0 = time.perf_counter()
                self.progress.step("coverage and numerics")
                reason = self.analyze()
                seconds = time.perf_counter() - t0
                for name in ("coverage", "numerics"):
                    if name in self.settings["run"]["stages"]:
                        failed = self.report[name] is None
                        self.report["stages"].append({"name": name, "status": "failed" if failed else "ok",
                                                      "seconds": seconds, "reason": reason if failed else None})
            self._stage("performance", self.performance)
            self._stage("memory", self.memory)
            self._stage("readiness", self.readiness)
            # Failures the baseline shows too are the workload's, not migration blockers.
            failures.mark_workload_errors(self.report["failures"])
            self._stage("cost", self.cost)
            self._stage("verdict", self.decide)
        finally:
            self.progress.close()
        return self.write()

    def write(self):
        path = os.path.join(self.out_dir, "report.json")
        with open(path, "w") as f:
            json.dump(strict(self.report), f, indent=1, default=str, allow_nan=False)
        try:
            from . import report as report_mod
            report_mod.render(self.report, self.out_dir)
        except Exception as e:  # noqa: BLE001  (the JSON is the record; say why the rest is missing)
            print(f"torch_pjrt assess: could not render report.md/report.html: {type(e).__name__}: {e}",
                  file=sys.stderr)
        return self.report


def capture_baseline(spec, out_dir, device, config_path=None, quick=False, overrides=None, progress=True):
    """--baseline-only: the baseline side's outputs (and losses) and
    performance where the model runs today, for `--against` elsewhere."""
    a = Assessment(spec, out_dir, config_path, quick, overrides, progress=progress)
    device = baseline_device(device)  # "auto" (no --device): cuda where present, else cpu
    a.workload = load_spec(spec)
    a.batch_sizes = list(a.settings["run"]["batch_sizes"] or a.workload.batch_sizes)
    a.baseline_device = device
    run = a.settings["run"]
    nb = a.settings["numerics"]["batch_size"] or a.batch_sizes[0]
    steps = a.settings["numerics"]["train_steps"] or a.workload.train_steps
    result, fail = _run_worker(a._request("capture", device=device, numerics_batch_size=nb, train_steps=steps),
                               a.work, a._timeout())
    if not fail and "outputs_file" not in result:  # (the worker caught the error: a bad device)
        fail = (result.get("failures") or [{"error": result.get("error", "no outputs")}])[0]
    if fail:
        raise RuntimeError(f"baseline capture on {device!r} failed: {fail['error']}")
    perf, fail = _run_worker(a._request("performance", device=device, frontend="eager", cache="cold",
                                        warmup=run["warmup"], iterations=run["iterations"]), a.work, a._timeout())
    if not fail and "latency" not in perf:
        fail = (perf.get("failures") or [{"error": perf.get("error", "no figures")}])[0]
    if fail:
        raise RuntimeError(f"baseline performance on {device!r} failed: {fail['error']}")
    shutil.copy(result["outputs_file"], os.path.join(a.out_dir, "baseline_outputs.pt"))
    meta = {"schema_version": SCHEMA_VERSION, "device": device, "precision": a.workload.precision,
            "mode": a.workload.mode, "batch_sizes": a.batch_sizes, "numerics_batch_size": nb, "train_steps": steps,
            "weights_sha256": _fingerprint(a.workload), "outputs_file": "baseline_outputs.pt",
            "performance": {"cold_start": [perf["cold_start"]], "latency": perf["latency"],
                            "throughput": perf["throughput"]},
            "failures": perf["failures"], "torch": torch.__version__}
    path = os.path.join(a.out_dir, "baseline.json")
    with open(path, "w") as f:
        json.dump(strict(meta), f, indent=1, allow_nan=False)
    return path

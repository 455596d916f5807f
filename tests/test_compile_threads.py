"""Eager programs compile on background threads (csrc/runtime/compile_pool.cpp):
the same results and the same programs as compiling on the calling thread,
debug mode compiling on the caller, and a bad TORCH_PJRT_COMPILE_THREADS
refused at import."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TRAIN = r"""
import json, sys
sys.path.insert(0, sys.argv[1] + "/examples")
import torch, torch_pjrt, models
m0 = torch_pjrt.metrics()
losses = models.train("gpt", "tpu", 3)
# new shapes, no host read between them: their compiles overlap
xs = [torch.randn(5, n).to("tpu") for n in range(3, 12)]
ys = [(x.exp() * 2 - x.tanh()).sum(1) for x in xs]
vals = [y.cpu().tolist() for y in ys]
m1 = torch_pjrt.metrics()
print(json.dumps({"losses": losses, "vals": vals,
                  **{k: m1[k] - m0[k] for k in ("xla_compiles", "thread_compiles", "thread_compiles_joined")}}))
"""


def _run(tmp_path, name, code=TRAIN, **env_extra):
    env = {k: v for k, v in os.environ.items() if k != "TORCH_PJRT_EAGER"}  # async eager unless asked
    env.update(TORCH_PJRT_CACHE_DIR=str(tmp_path / name),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **env_extra)
    p = subprocess.run([sys.executable, "-c", code, ROOT], env=env, capture_output=True, text=True, timeout=600)
    return p


def _result(p):
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_same_results_and_programs_as_compiling_on_the_caller(tmp_path):
    caller = _result(_run(tmp_path, "a", TORCH_PJRT_COMPILE_THREADS="0"))
    threads = _result(_run(tmp_path, "b", TORCH_PJRT_COMPILE_THREADS="3"))
    assert caller["thread_compiles"] == 0 and threads["thread_compiles"] > 50
    assert threads["losses"] == caller["losses"]
    assert threads["vals"] == caller["vals"]
    # a program compiling on one thread is not compiled again on another
    assert threads["xla_compiles"] == caller["xla_compiles"]


def test_debug_mode_compiles_on_the_caller(tmp_path):
    debug = _result(_run(tmp_path, "c", TORCH_PJRT_EAGER="debug", TORCH_PJRT_COMPILE_THREADS="3"))
    assert debug["thread_compiles"] == 0 and debug["xla_compiles"] > 0


def test_bad_thread_count_is_refused_at_import(tmp_path):
    p = _run(tmp_path, "d", "import torch, torch_pjrt; torch.ones(1, device='tpu')", TORCH_PJRT_COMPILE_THREADS="many")
    assert p.returncode != 0
    assert "TORCH_PJRT_COMPILE_THREADS" in p.stderr and "'many'" in p.stderr


FORK = r"""
import os, sys, time
import torch, torch_pjrt
xs = [torch.randn(4, n).to("tpu") for n in range(20, 40)]
ys = [x.exp().sum() for x in xs]  # compiles in flight on the threads
pid = os.fork()
if pid == 0:
    sys.exit(0)  # a normal exit (atexit handlers run) in the child
for _ in range(600):
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        break
    time.sleep(0.1)
else:
    os.kill(pid, 9)
    raise SystemExit("the forked child hung at exit")
torch.testing.assert_close(torch.stack([y.cpu() for y in ys]), torch.stack([x.cpu().exp().sum() for x in xs]))
print("ok", os.WEXITSTATUS(status))
"""


def test_forked_child_exits_while_compiles_are_in_flight(tmp_path):
    p = _run(tmp_path, "e", FORK, TORCH_PJRT_COMPILE_THREADS="2")
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split()[-2:] == ["ok", "0"]

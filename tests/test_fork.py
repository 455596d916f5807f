"""fork(): the parent's PJRT client does not exist in a child, so a forked
child's first tpu use raises a clear RuntimeError at once (as CUDA does)
instead of hanging, and fork workers that only touch CPU tensors keep
working. Every child is bounded by a timeout, so a hang fails the test."""
import multiprocessing
import os
import select
import time

import pytest
import torch

CHILD_TIMEOUT = 30


def fork_and_report(child_fn):
    """Runs child_fn() in a forked child; returns what it wrote (a str) or
    fails the test if the child hangs or dies without a word."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(r)
        try:
            msg = child_fn()
        except BaseException as e:  # noqa: BLE001
            msg = f"UNCAUGHT {type(e).__name__}: {e}"
        os.write(w, msg.encode())
        os.close(w)
        os._exit(0)
    os.close(w)
    ready, _, _ = select.select([r], [], [], CHILD_TIMEOUT)
    if not ready:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung")
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return data.decode()


@pytest.fixture(autouse=True)
def parent_uses_tpu():
    # The parent has run tpu work (and holds tpu tensors) before forking.
    x = torch.ones(8).to("tpu") * 2
    assert x.sum().item() == 16
    yield x


def _first_tpu_use_in_child(make):
    def child():
        t0 = time.monotonic()
        try:
            make()
        except RuntimeError as e:
            return f"RuntimeError {time.monotonic() - t0:.3f} {e}"
        return "no error"
    return child


@pytest.mark.parametrize("what", ["factory", "copy", "op_on_inherited", "read_inherited"])
def test_child_first_tpu_use_raises_quickly(parent_uses_tpu, what):
    x = parent_uses_tpu
    make = {
        "factory": lambda: torch.zeros(3, device="tpu"),
        "copy": lambda: torch.ones(3).to("tpu"),
        "op_on_inherited": lambda: x + 1,
        "read_inherited": lambda: x.cpu(),
    }[what]
    out = fork_and_report(_first_tpu_use_in_child(make))
    assert out.startswith("RuntimeError"), out
    _, seconds, message = out.split(" ", 2)
    assert float(seconds) < 1.0
    assert "forked subprocess" in message and "spawn" in message


def test_child_cpu_work_seeding_and_exit_keep_working(parent_uses_tpu):
    def child():
        import gc
        torch.manual_seed(1)  # seeds the tpu generators too, if it can
        y = (torch.arange(6.0) * 2).sum().item()
        assert torch.tpu._is_in_bad_fork()
        assert torch.tpu.device_count() >= 1
        del parent_uses_tpu_local[:]  # inherited tpu tensors die in the child: no hang
        gc.collect()
        return f"ok {y}"
    parent_uses_tpu_local = [parent_uses_tpu]
    assert fork_and_report(child) == "ok 30.0"
    assert not torch.tpu._is_in_bad_fork()
    assert (parent_uses_tpu + 1).sum().item() == 24  # the parent is unaffected


class CpuData(torch.utils.data.Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        return torch.full((3,), float(i)), i


class TpuData(CpuData):
    def __getitem__(self, i):
        return torch.full((3,), float(i), device="tpu"), i


def test_dataloader_fork_workers_with_cpu_data(parent_uses_tpu):
    loader = torch.utils.data.DataLoader(CpuData(), batch_size=4, num_workers=2,
                                         multiprocessing_context="fork", timeout=CHILD_TIMEOUT)
    model = torch.nn.Linear(3, 1).to("tpu")
    total = 0
    for x, i in loader:
        total += int(i.sum())
        model(x.to("tpu")).sum().item()
    assert total == sum(range(16))


def test_dataloader_fork_worker_touching_tpu_raises(parent_uses_tpu):
    loader = torch.utils.data.DataLoader(TpuData(), batch_size=4, num_workers=1,
                                         multiprocessing_context="fork", timeout=CHILD_TIMEOUT)
    t0 = time.monotonic()
    it = iter(loader)
    try:
        with pytest.raises(RuntimeError, match="forked subprocess"):
            next(it)
    finally:
        it._shutdown_workers()  # the traceback keeps the iterator alive: stop its worker now
    assert time.monotonic() - t0 < CHILD_TIMEOUT


def _spawn_worker(q):
    import torch_pjrt  # noqa: F401
    q.put(float((torch.ones(4).to("tpu") * 3).sum().item()))


def test_spawn_start_method_works():
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_spawn_worker, args=(q,))
    p.start()
    try:
        assert q.get(timeout=120) == 12.0
    finally:
        p.join(timeout=60)
        if p.is_alive():
            p.kill()


def test_init_in_a_forked_child_raises_and_reports_not_initialized():
    # As torch.cuda: init() in a bad fork raises the clear error at once
    # (it did nothing), and is_initialized() is False there.
    def child():
        state = (torch.tpu.is_initialized(), torch.tpu._is_in_bad_fork())
        try:
            torch.tpu.init()
        except RuntimeError as e:
            return f"{state} RAISED {e}"
        return f"{state} no error"
    out = fork_and_report(child)
    assert out.startswith("(False, True) RAISED") and "forked subprocess" in out and "spawn" in out, out
    assert torch.tpu.is_initialized()
    torch.tpu.init()  # the parent: nothing to do

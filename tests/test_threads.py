"""Python threads sharing tpu tensors: never a crash, never a program on the
wrong buffer, and a result equal to some serial order of the same ops
(csrc/device/device_lock.h). Each pattern runs many rounds; the counters use
integer adds, so a lost or torn update shows exactly."""
import threading

import pytest
import torch

from conftest import FUSED

ROUNDS = 6


def run_threads(*targets):
    errors = []

    def wrap(fn):
        def body():
            try:
                fn()
            except BaseException as e:  # noqa: BLE001  (reported by the test)
                errors.append(e)
        return body

    threads = [threading.Thread(target=wrap(t)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive(), "a thread hung"
    if errors:
        raise errors[0]


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_inplace_write_vs_reader(round_):
    # The crash: w.add_(g, alpha) in one thread, w.cpu() in another.
    n = 150
    g_cpu = torch.linspace(-1, 1, 511)
    w = torch.zeros(511).to("tpu")
    g = g_cpu.to("tpu")
    # Every state the writer passes through, computed serially on the same device.
    ref = torch.zeros(511).to("tpu")
    states = [ref.cpu()]
    for _ in range(n):
        ref.add_(g, alpha=-1e-3)
        states.append(ref.cpu())
    snapshots = []

    def writer():
        for _ in range(n):
            w.add_(g, alpha=-1e-3)

    def reader():
        for _ in range(n):
            snapshots.append(w.cpu())

    run_threads(writer, reader, reader)
    assert torch.equal(w.cpu(), states[-1])
    for s in snapshots:  # each read saw a whole state, never a torn one
        assert any(torch.equal(s, st) for st in states)


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_write_vs_write_no_lost_update(round_):
    n = 200
    c = torch.zeros(1023, dtype=torch.int64).to("tpu")
    view = c[::3]  # writes through a view of the same storage too

    def add1():
        for _ in range(n):
            c.add_(1)

    def add2():
        for _ in range(n):
            c.add_(2)

    def add_view():
        for _ in range(n):
            view.add_(5)

    run_threads(add1, add2, add_view)
    expected = torch.full((1023,), 3 * n, dtype=torch.int64)
    expected[::3] += 5 * n
    assert torch.equal(c.cpu(), expected)


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_add_vs_mul_is_some_serial_order(round_):
    # add_(1) and mul_(2) do not commute: the result must still be what some
    # interleaving of whole ops gives (the same for every element).
    n = 6
    x = torch.zeros(257, dtype=torch.int64).to("tpu")

    def adder():
        for _ in range(n):
            x.add_(1)

    def doubler():
        for _ in range(n):
            x.mul_(2)

    run_threads(adder, doubler)
    out = x.cpu()
    assert torch.all(out == out[0])
    # Reachable values: interleavings of n "+1" and n "*2" starting from 0.
    frontier = {(0, 0): {0}}
    for _ in range(2 * n):
        nxt = {}
        for (a, m), vals in frontier.items():
            if a < n:
                nxt.setdefault((a + 1, m), set()).update(v + 1 for v in vals)
            if m < n:
                nxt.setdefault((a, m + 1), set()).update(v * 2 for v in vals)
        frontier = nxt
    assert int(out[0]) in frontier[(n, n)]


@pytest.mark.parametrize("round_", range(3))
def test_two_devices_share_a_tensor(round_):
    n = 80
    w = torch.zeros(300, dtype=torch.int64).to("tpu:0")
    copies = []

    def writer():
        for _ in range(n):
            w.add_(1)

    def mover():
        for _ in range(n):
            on1 = w.to("tpu:1")
            copies.append(int((on1 * 1).max().cpu()))

    def other_device_work():
        y = torch.ones(64, dtype=torch.int64).to("tpu:1")
        for _ in range(n):
            y.add_(1)
        assert int(y.sum().cpu()) == 64 * (n + 1)

    run_threads(writer, mover, other_device_work)
    assert torch.equal(w.cpu(), torch.full((300,), n, dtype=torch.int64))
    assert copies == sorted(copies) and all(0 <= c <= n for c in copies)


@pytest.mark.parametrize("round_", range(3))
def test_foreach_ops_from_two_threads(round_):
    n = 60
    params = [torch.zeros(s, dtype=torch.int64).to("tpu") for s in (3, 17, 64)]

    def one():
        for _ in range(n):
            torch._foreach_add_(params, 1)

    def two():
        for _ in range(n):
            torch._foreach_add_(params, [2, 2, 2])

    run_threads(one, two)
    for p in params:
        assert torch.equal(p.cpu(), torch.full(p.shape, 3 * n, dtype=torch.int64))


def _train(model, opt, batches, on_step=None):
    for x, y in batches:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        if on_step:
            on_step()


@pytest.mark.parametrize("round_", range(3))
def test_optimizer_step_vs_weight_reader(round_):
    # A trainer thread and a logging/EMA thread reading model.weight.
    torch.manual_seed(0)
    base = torch.nn.Linear(16, 8)
    batches_cpu = [(torch.randn(4, 16), torch.randn(4, 8)) for _ in range(12)]
    batches = [(x.to("tpu"), y.to("tpu")) for x, y in batches_cpu]

    def fresh():
        m = torch.nn.Linear(16, 8)
        m.load_state_dict(base.state_dict())
        m = m.to("tpu")
        return m, torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)

    ref_model, ref_opt = fresh()
    states = [ref_model.weight.detach().cpu()]
    _train(ref_model, ref_opt, batches, lambda: states.append(ref_model.weight.detach().cpu()))

    model, opt = fresh()
    seen = []
    done, reading = threading.Event(), threading.Event()

    def trainer():
        # Start once the reader has read: on a loaded machine the reader's
        # thread may otherwise first run after training ended (CI saw it).
        reading.wait(timeout=60)
        try:
            _train(model, opt, batches)
        finally:
            done.set()

    def reader():
        while True:
            seen.append(model.weight.detach().cpu())
            reading.set()
            if done.is_set():
                break

    run_threads(trainer, reader)
    # Fused eager: the reader's host reads cut the trainer's traces at other
    # points than the reference's, and a fused program may round in the last
    # bit where op-by-op programs do not (XLA fuses across ops).
    same = (lambda a, b: torch.allclose(a, b, rtol=1e-5, atol=1e-6)) if FUSED else torch.equal
    assert same(model.weight.detach().cpu(), states[-1])
    assert seen, "the reader never ran"
    for s in seen:
        # The weight changes in one op per step (SGD's _foreach_add_), so every
        # read equals the weight after some whole number of steps.
        assert any(same(s, st) for st in states)


def test_compiled_function_vs_eager_reader():
    w = torch.zeros(128).to("tpu")
    step = torch.compile(lambda t: t.add_(1.0), backend="tpu")
    step(w)
    n = 40
    seen = []

    def runner():
        for _ in range(n):
            step(w)

    def reader():
        for _ in range(n):
            seen.append(w.cpu())

    run_threads(runner, reader)
    assert torch.equal(w.cpu(), torch.full((128,), float(n + 1)))
    for s in seen:
        assert torch.all(s == s[0]) and 1 <= float(s[0]) <= n + 1

"""Python ints a compiled graph takes (positions, steps, indices) are runtime
inputs of its program wherever no size depends on them: one program serves
every value (issue 14 item 3 for compiled graphs). Values are compared with
the same function run eagerly on the CPU; programs are counted with
torch_pjrt.metrics()['compiled_graphs'] (Dynamo compiles the first call with
the int as a constant, and the second, seeing it change, with it symbolic:
at most two programs per graph)."""
import pytest
import torch

import torch_pjrt
from conftest import run_json

TABLE = torch.randn(128, 8)


def _graphs():
    return torch_pjrt.metrics()["compiled_graphs"]


def _setitem(x, n, table):
    # (c[:, n] = x into a tensor made here: Dynamo itself specializes n.)
    c = torch.zeros(2, 128, 8, device=x.device)
    c[:, n:n + 1] = x
    c[:, n + 1:n + 2] += x * 2
    return c


def _select_write(x, n, table):
    y = table.clone()
    y[n] = x
    y[n - 1] += 3
    return y


PATTERNS = {
    "select": lambda x, n, table: table[n] * x,
    "slice": lambda x, n, table: table[n:n + 4] * x,
    "negative_select": lambda x, n, table: table[-n - 1] * x,
    "narrow": lambda x, n, table: table.narrow(0, n, 3) + x,
    "setitem": _setitem,
    "select_write": _select_write,
    "mul_add": lambda x, n, table: x * n + n // 3 - n % 5,
    "arange": lambda x, n, table: torch.arange(n, n + 8, device=x.device) * x,
    "arange_step_float": lambda x, n, table: torch.arange(n, n + 16, 2, dtype=torch.float32, device=x.device) + x,
    "full": lambda x, n, table: torch.full((8,), n, device=x.device) + x,
    "where": lambda x, n, table: torch.where(x > 0, x, n),
    "int_index_tensor": lambda x, n, table: table.index_select(0, torch.tensor([n, n + 1], device=x.device)),
    "causal_mask": lambda x, n, table: torch.full((8, 8), float("-inf"), device=x.device).triu(n % 9) + x,
    "tril": lambda x, n, table: table[:8].tril(-(n % 5)),
    "clamped_index": lambda x, n, table: table[max(n - 2, 0)] * min(n, 3) + table[min(n, 50)],
}


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_an_int_compiles_one_program_for_100_values(name):
    torch._dynamo.reset()
    f = PATTERNS[name]
    g = torch.compile(f, backend="tpu")
    x = torch.randn(8)
    table = TABLE.to("tpu")
    before = _graphs()
    for n in range(1, 101):
        expected = f(x, n, TABLE)
        got = g(x.to("tpu"), n, table)
        assert got.dtype == expected.dtype and got.shape == expected.shape
        torch.testing.assert_close(got.cpu(), expected, rtol=1e-6, atol=1e-6, msg=f"{name}, n={n}")
    assert _graphs() - before <= 2, f"{name}: {_graphs() - before} programs for 100 values"


def test_an_int_that_sets_a_size_still_keys_the_program():
    # reshape(n, -1): the result's size is n, so each n is its own program.
    torch._dynamo.reset()
    f = lambda x, n: x.reshape(n, -1).sum(1) * n  # noqa: E731
    g = torch.compile(f, backend="tpu")
    x = torch.randn(8)
    before = _graphs()
    for n in (1, 2, 4, 8, 2):
        torch.testing.assert_close(g(x.to("tpu"), n).cpu(), f(x, n))
    assert _graphs() - before == 4


def test_int_values_wrap_and_promote_as_on_cpu():
    # The int is the op's wrapped number: it takes the tensor's dtype (int8
    # wraps, float16 overflows to inf) and a 0-d tensor keeps its own dtype.
    cases = [
        lambda x, n: (x * 10).to(torch.int8) + n,
        lambda x, n: x.half() * n,
        lambda x, n: x.sum().to(torch.int32) + n,
        lambda x, n: (x > 0) + n,
        lambda x, n: (x * 10).long() * n,
    ]
    x = torch.randn(8)
    for f in cases:
        torch._dynamo.reset()
        g = torch.compile(f, backend="tpu")
        for n in (3, 200, 70000, 2**40 + 1):
            expected, got = f(x, n), g(x.to("tpu"), n).cpu()
            assert got.dtype == expected.dtype
            assert torch.equal(got, expected), (n, got, expected)


def test_a_returned_view_at_an_int_offset_is_a_view_of_the_input():
    torch._dynamo.reset()
    # (Views of the view too: their chain starts at the moved one.)
    g = torch.compile(lambda t, n: (t[n], t[n:n + 2], t[n:n + 2][:, 1], t[n:n + 1].reshape(2, 4)[:, :2]),
                      backend="tpu")
    t = TABLE.to("tpu")
    before = _graphs()
    for n in (3, 9, 40, 3):
        row, rows, column, part = g(t, n)
        assert row.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
        assert row.storage_offset() == n * 8 and rows.storage_offset() == n * 8
        assert column.storage_offset() == n * 8 + 1 and part.storage_offset() == n * 8
        torch.testing.assert_close(rows.cpu(), TABLE[n:n + 2])
        torch.testing.assert_close(column.cpu(), TABLE[n:n + 2][:, 1])
        torch.testing.assert_close(part.cpu(), TABLE[n].reshape(2, 4)[:, :2])
    assert _graphs() - before <= 2
    row, *_ = g(t, 5)
    t[5].fill_(7.0)  # writes through the input show in the returned view
    assert torch.equal(row.cpu(), torch.full((8,), 7.0))


class _Attention(torch.nn.Module):
    """A decoder step at `start`, Llama's reference style: rotary table and
    KV cache indexed by a Python int, the cache written in place."""

    def __init__(self):
        super().__init__()
        self.register_buffer("ck", torch.zeros(1, 32, 2, 8))
        self.register_buffer("freqs", torch.randn(32, 8))
        self.wq = torch.nn.Linear(16, 16)

    def forward(self, x, start):
        b, length, _ = x.shape
        q = self.wq(x).view(b, length, 2, 8) * self.freqs[start:start + length]
        self.ck[:b, start:start + length] = q.detach()
        mask = torch.arange(32, device=x.device) <= start
        a = torch.einsum("blhd,bshd->bhls", q, self.ck[:b]).masked_fill(~mask, float("-inf")).softmax(-1)
        return torch.einsum("bhls,bshd->blhd", a, self.ck[:b]).reshape(b, length, 16)


def test_training_steps_at_int_positions_match_cpu_with_two_programs_per_graph():
    torch._dynamo.reset()
    torch.manual_seed(0)
    cpu = _Attention()
    tpu = _Attention()
    tpu.load_state_dict(cpu.state_dict())
    tpu = tpu.to("tpu")
    g = torch.compile(tpu, backend="tpu")
    before = _graphs()
    for start in range(12):
        x = torch.randn(1, 1, 16)
        expected = cpu(x, start)
        expected.sum().backward()
        got = g(x.to("tpu"), start)
        got.sum().backward()
        torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(tpu.wq.weight.grad.cpu(), cpu.wq.weight.grad, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(tpu.ck.cpu(), cpu.ck)
    assert _graphs() - before <= 4  # forward and backward, each static then symbolic


def test_batches_sliced_by_an_int_compile_one_program_per_batch_size():
    # pytorch/examples' word_language_model get_batch, inside the compiled
    # step: the int sets sizes only through min(bptt, len - 1 - i), so the
    # signature holds those sizes and the program takes i at run time.
    torch._dynamo.reset()
    torch.manual_seed(0)
    source = torch.randn(1001, 4)
    cpu = torch.nn.Linear(4, 4)
    tpu = torch.nn.Linear(4, 4)
    tpu.load_state_dict(cpu.state_dict())
    tpu = tpu.to("tpu")

    def step(model, source, i, bptt=35):
        seq_len = min(bptt, len(source) - 1 - i)
        data = source[i:i + seq_len]
        target = source[i + 1:i + 1 + seq_len].reshape(-1)
        loss = ((model(data).reshape(-1) - target) ** 2).mean()
        loss.backward()
        return loss

    g = torch.compile(step, backend="tpu")
    src = source.to("tpu")
    before = _graphs()
    for i in range(0, 1000, 35):  # 28 batches of 35 rows, then one of 20
        cpu.zero_grad()
        tpu.zero_grad()
        expected = step(cpu, source, i)
        got = g(tpu, src, i)
        torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(tpu.weight.grad.cpu(), cpu.weight.grad, rtol=1e-5, atol=1e-6)
    # forward and backward: the first (static) call, then one per batch size
    assert _graphs() - before <= 6, _graphs() - before


def test_runtime_ints_under_the_default_device_tpu():
    """Under torch.set_default_device("tpu") (or `with torch.device("tpu")`),
    a compiled graph's runtime ints still go in as a host pack: a bare
    torch.tensor() of them was a tpu tensor, whose handle the upload read as
    host memory (a segfault at a batch-size change, or with dynamic=True).
    In a child process, so a crash fails this test only."""
    code = """
import json, torch, torch_pjrt
out = {}
torch.manual_seed(0)
m = torch.nn.Linear(8, 2)
x4, x3 = torch.randn(4, 8), torch.randn(3, 8)
want = [m(x4).tolist(), m(x3).tolist()]
cm = torch.compile(m.to("tpu"), backend="tpu")
with torch.device("tpu"):
    out["module"] = [cm(x4.to("tpu")).cpu().tolist(), cm(x3.to("tpu")).cpu().tolist()]
torch.set_default_device("tpu")
f = torch.compile(lambda x, n: x[:n] * n, backend="tpu", dynamic=True)
out["dynamic"] = [f(torch.arange(5.0), 3).cpu().tolist(), f(torch.arange(6.0), 4).cpu().tolist()]
torch.set_default_device("cpu")
out["after"] = f(torch.arange(5.0, device="tpu"), 2).cpu().tolist()
print("RESULT " + json.dumps({"out": out, "want": want}))
"""
    r = run_json(code)
    got, want = r["out"], r["want"]
    for a, b in zip(got["module"], want):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b))
    assert got["dynamic"] == [[0.0, 3.0, 6.0], [0.0, 4.0, 8.0, 12.0]]
    assert got["after"] == [0.0, 2.0]

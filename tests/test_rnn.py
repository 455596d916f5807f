"""Recurrent layers on tpu vs CPU: nn.LSTM / nn.GRU / nn.RNN (tanh, relu) and
their cells, forward outputs, final states and every parameter and input
gradient, eager and under torch.compile(backend="tpu").

On tpu PyTorch's RNN code (ATen/native/RNN.cpp) runs the fused cell ops
_thnn_fused_lstm_cell / _thnn_fused_gru_cell and their backward ops, as for
CUDA; csrc/lowering/ops/rnn_cells.cpp lowers them. Tolerances: float32
rtol/atol 1e-4 (gate products summed over time steps and layers); bfloat16
runs compare with CPU's float32 result at 3e-2 (bfloat16 rounding at every
step of the recurrence; CPU's own bfloat16 RNNs differ from float32 by up to
2e-2 on these inputs).
"""
import copy

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from conftest import assert_same, make

# CPU's LSTM warns that oneDNN lacks projections (proj_size); not ours.
pytestmark = pytest.mark.filterwarnings("ignore:LSTM with projections:UserWarning")

F32_TOL = dict(rtol=1e-4, atol=1e-4)
BF16_TOL = dict(rtol=3e-2, atol=3e-2)

H, IN, T, B = 6, 5, 4, 3


def _layer(kind, **kw):
    torch.manual_seed(0)
    if kind == "lstm":
        return nn.LSTM(IN, H, **kw)
    if kind == "gru":
        return nn.GRU(IN, H, **kw)
    return nn.RNN(IN, H, nonlinearity=kind.split("_")[1], **kw)


def _flat(out):
    """Tensors of a module's result: (output, h_n) or (output, (h_n, c_n))."""
    if isinstance(out, torch.Tensor):
        return [out]
    res = []
    for o in out:
        res += _flat(o)
    return res


def _run(module, inputs, device, dtype=torch.float32, call=None):
    """module(*inputs) on `device` in `dtype`; backward of a fixed random
    weighting of every result. (results, input grads, parameter grads)."""
    m = copy.deepcopy(module).to(device=device, dtype=dtype)
    args = [x.detach().to(device=device, dtype=dtype).requires_grad_() if x is not None else None
            for x in inputs]
    out = (call or (lambda mod, *a: mod(*a)))(m, *args)
    flat = _flat(out)
    loss = sum((o.float() * make(o.shape, torch.float32, low=-1, high=1, seed=7 + i).to(device)).sum()
               for i, o in enumerate(flat))
    loss.backward()
    in_grads = [a.grad for a in args if a is not None]
    p_grads = [p.grad for p in m.parameters()]
    return [o.detach() for o in flat], in_grads, p_grads


def _compare(module, inputs, tol=F32_TOL, call=None, dtype=torch.float32, ref_dtype=None):
    expected = _run(module, inputs, "cpu", ref_dtype or dtype, call)
    actual = _run(module, inputs, "tpu", dtype, call)
    for a_list, e_list in zip(actual, expected):
        assert len(a_list) == len(e_list)
        for a, e in zip(a_list, e_list):
            assert_same(a.to(e.dtype) if ref_dtype else a, e, **tol)


LAYER_CASES = [
    # (kind, module kwargs, with initial state)
    ("lstm", {}, False),
    ("lstm", {}, True),
    ("lstm", {"batch_first": True}, True),
    ("lstm", {"num_layers": 2, "bidirectional": True}, True),
    ("lstm", {"num_layers": 2, "bias": False}, False),
    ("lstm", {"proj_size": 3}, True),
    ("lstm", {"proj_size": 3, "num_layers": 2, "bidirectional": True, "batch_first": True}, False),
    ("gru", {}, False),
    ("gru", {}, True),
    ("gru", {"batch_first": True, "num_layers": 2}, True),
    ("gru", {"bidirectional": True}, True),
    ("gru", {"bias": False, "bidirectional": True, "num_layers": 2}, False),
    ("rnn_tanh", {}, True),
    ("rnn_tanh", {"num_layers": 2, "bidirectional": True, "batch_first": True}, False),
    ("rnn_relu", {}, False),
    ("rnn_relu", {"num_layers": 2, "bidirectional": True}, True),
]


def _case_id(c):
    kind, kw, h0 = c
    return "-".join([kind] + [f"{k}={v}" for k, v in kw.items()] + (["h0"] if h0 else []))


def _inputs(kind, kw, with_state, batch=B, seq=T):
    layers = kw.get("num_layers", 1) * (2 if kw.get("bidirectional") else 1)
    shape = (batch, seq, IN) if kw.get("batch_first") else (seq, batch, IN)
    x = make(shape, low=-1, high=1, seed=1)
    if not with_state:
        return [x]
    h_size = kw.get("proj_size", 0) or H
    h0 = make((layers, batch, h_size), low=-1, high=1, seed=2)
    if kind == "lstm":
        c0 = make((layers, batch, H), low=-1, high=1, seed=3)
        return [x, h0, c0]
    return [x, h0]


def _call(kind, with_state):
    if kind == "lstm" and with_state:
        return lambda m, x, h0, c0: m(x, (h0, c0))
    return None


@pytest.mark.parametrize("case", LAYER_CASES, ids=_case_id)
def test_layer(case, no_cpu_fallback):
    kind, kw, with_state = case
    _compare(_layer(kind, **kw), _inputs(kind, kw, with_state), call=_call(kind, with_state))


@pytest.mark.parametrize("kind", ["lstm", "gru", "rnn_tanh"])
def test_layer_unbatched(kind, no_cpu_fallback):
    x = make((T, IN), low=-1, high=1, seed=1)
    _compare(_layer(kind), [x])


@pytest.mark.parametrize("kind", ["lstm", "gru", "rnn_tanh", "rnn_relu"])
@pytest.mark.parametrize("batch_first", [False, True])
def test_packed_sequence(kind, batch_first, no_cpu_fallback):
    lengths = torch.tensor([4, 2, 3])
    kw = {"batch_first": batch_first, "num_layers": 2, "bidirectional": True}

    def call(m, x):
        packed = pack_padded_sequence(x, lengths, batch_first=batch_first, enforce_sorted=False)
        out, state = m(packed)
        padded, out_lengths = pad_packed_sequence(out, batch_first=batch_first)
        assert out_lengths.tolist() == lengths.tolist()
        return padded, state

    _compare(_layer(kind, **kw), _inputs(kind, kw, False), call=call)


CELLS = {
    "lstm_cell": lambda **kw: nn.LSTMCell(IN, H, **kw),
    "gru_cell": lambda **kw: nn.GRUCell(IN, H, **kw),
    "rnn_tanh_cell": lambda **kw: nn.RNNCell(IN, H, **kw),
    "rnn_relu_cell": lambda **kw: nn.RNNCell(IN, H, nonlinearity="relu", **kw),
}


def _cell_inputs(name, with_state, batched=True):
    lead = (B,) if batched else ()
    x = make(lead + (IN,), low=-1, high=1, seed=1)
    if not with_state:
        return [x], None
    h = make(lead + (H,), low=-1, high=1, seed=2)
    if name == "lstm_cell":
        c = make(lead + (H,), low=-1, high=1, seed=3)
        return [x, h, c], lambda m, x, h, c: m(x, (h, c))
    return [x, h], None


def _unroll(name):
    """Three steps of the cell, feeding its state back."""
    def call(m, x, *state):
        st = (state if len(state) > 1 else state[0]) if state else None
        outs = []
        for _ in range(3):
            st = m(x, st) if st is not None else m(x)
            outs.append(st[0] if name == "lstm_cell" else st)
        return torch.stack(outs), st
    return call


@pytest.mark.parametrize("name", list(CELLS))
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_cell(name, with_state, bias, no_cpu_fallback):
    torch.manual_seed(0)
    inputs, call = _cell_inputs(name, with_state)
    _compare(CELLS[name](bias=bias), inputs, call=call)


@pytest.mark.parametrize("name", list(CELLS))
def test_cell_unrolled_unbatched(name, no_cpu_fallback):
    torch.manual_seed(0)
    inputs, _ = _cell_inputs(name, True, batched=False)
    _compare(CELLS[name](), inputs, call=_unroll(name))


@pytest.mark.parametrize("kind", ["lstm", "gru", "rnn_tanh"])
def test_layer_bfloat16(kind, no_cpu_fallback):
    kw = {"num_layers": 2, "bidirectional": True}
    _compare(_layer(kind, **kw), _inputs(kind, kw, True), call=_call(kind, True),
             dtype=torch.bfloat16, ref_dtype=torch.float32, tol=BF16_TOL)


@pytest.mark.parametrize("name", ["lstm_cell", "gru_cell"])
def test_cell_bfloat16(name, no_cpu_fallback):
    torch.manual_seed(0)
    inputs, _ = _cell_inputs(name, True)
    _compare(CELLS[name](), inputs, call=_unroll(name), dtype=torch.bfloat16,
             ref_dtype=torch.float32, tol=BF16_TOL)


def _compiled(call):
    call = call or (lambda m, *a: m(*a))

    def fn(m, *args):
        out = call(m, *args)
        return [o * 2 for o in _flat(out)]
    return torch.compile(fn, backend="tpu")


@pytest.mark.parametrize("case", [
    ("lstm", {"num_layers": 2, "bidirectional": True, "batch_first": True}, True),
    ("gru", {"num_layers": 2}, True),
    ("rnn_tanh", {"bidirectional": True}, False),
], ids=_case_id)
def test_layer_compiled(case, no_cpu_fallback):
    torch._dynamo.reset()
    kind, kw, with_state = case
    _compare(_layer(kind, **kw), _inputs(kind, kw, with_state), call=_compiled(_call(kind, with_state)))


@pytest.mark.parametrize("name", list(CELLS))
def test_cell_compiled(name, no_cpu_fallback):
    torch._dynamo.reset()
    torch.manual_seed(0)
    inputs, _ = _cell_inputs(name, True)
    _compare(CELLS[name](), inputs, call=_compiled(_unroll(name)))


def test_lstm_partial_grads(no_cpu_fallback):
    """Backward with only one of (grad_hy, grad_cy) defined at a step: the
    layer's output alone (no c_n gradient) and a cell's c alone (no h gradient)."""
    kw = {"num_layers": 2}
    _compare(_layer("lstm", **kw), _inputs("lstm", kw, False), call=lambda m, x: m(x)[0])
    torch.manual_seed(0)
    inputs, _ = _cell_inputs("lstm_cell", True)
    _compare(CELLS["lstm_cell"](), inputs, call=lambda m, x, h, c: m(x, (h, c))[1])


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_layer_no_grad(kind, no_cpu_fallback):
    m = _layer(kind, num_layers=2, bidirectional=True)
    x = make((T, B, IN), low=-1, high=1, seed=1)
    with torch.no_grad():
        expected = _flat(m(x))
        actual = _flat(copy.deepcopy(m).to("tpu")(x.to("tpu")))
    for a, e in zip(actual, expected):
        assert_same(a, e, **F32_TOL)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_packed_sequence_compiled(kind, no_cpu_fallback):
    torch._dynamo.reset()
    lengths = torch.tensor([4, 2, 3])

    def call(m, x):
        packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
        out, state = m(packed)
        return pad_packed_sequence(out)[0], state

    kw = {"bidirectional": True}
    _compare(_layer(kind, **kw), _inputs(kind, kw, False), call=_compiled(call))


@pytest.mark.parametrize("name", ["lstm_cell", "gru_cell"])
def test_cell_double_backward(name, no_cpu_fallback):
    """create_graph=True: autograd takes the differentiable backward
    (_thnn_differentiable_*_cell_backward, composite) instead of the fused one."""
    torch.manual_seed(0)
    cell = CELLS[name]()
    x0 = make((B, IN), low=-1, high=1, seed=1)
    results = []
    for device in ("cpu", "tpu"):
        m = copy.deepcopy(cell).to(device)
        x = x0.to(device).requires_grad_()
        out = m(x)
        h = out[0] if isinstance(out, tuple) else out
        gx, = torch.autograd.grad(h.sum(), x, create_graph=True)
        gw, = torch.autograd.grad((gx ** 2).sum(), m.weight_ih)
        results.append((gx.detach(), gw))
    assert_same(list(results[1]), list(results[0]), **F32_TOL)

"""Module.to("tpu") / .tpu() / .cpu() keep tied parameters tied without a
process-wide setting: importing torch_pjrt leaves
torch.__future__.get_swap_module_params_on_conversion() False, and
load_state_dict works on CPU modules (RNNs included) as without torch_pjrt."""
import copy
import subprocess
import sys
import threading
import weakref

import pytest
import torch
import torch.nn as nn

import conftest  # noqa: F401  (registers tpu)
from conftest import assert_same
from examples.models import GPT, GPTConfig


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.body = nn.Linear(8, 8)
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.emb.weight
        self.register_buffer("scale", torch.ones(8))

    def forward(self, idx):
        return self.head(torch.tanh(self.body(self.emb(idx))) * self.scale)


def _assert_tied(m, weight):
    assert m.head.weight is m.emb.weight is weight
    assert m.head.weight.data_ptr() == m.emb.weight.data_ptr()
    assert m.head.weight.untyped_storage().data_ptr() == m.emb.weight.untyped_storage().data_ptr()


def test_import_sets_nothing_process_wide():
    code = ("import torch, torch_pjrt\n"
            "assert torch.__future__.get_swap_module_params_on_conversion() is False\n"
            "assert torch.__future__.get_overwrite_module_params_on_conversion() is False\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert torch.__future__.get_swap_module_params_on_conversion() is False


@pytest.mark.parametrize("move", [
    lambda m: m.to("tpu"),
    lambda m: m.tpu(),
    lambda m: m.to(device="tpu", dtype=torch.float64),
    lambda m: m.to(torch.device("tpu", 1)),
    lambda m: m.to("tpu", non_blocking=True),
], ids=["to", "tpu()", "to(device,dtype)", "to(tpu:1)", "non_blocking"])
def test_tied_parameters_stay_tied(move):
    m = Tied()
    w = m.emb.weight
    move(m)
    assert w.device.type == "tpu"
    _assert_tied(m, w)
    assert m.scale.device.type == "tpu"
    assert len(list(m.parameters())) == 3
    m.cpu()
    assert w.device.type == "cpu"
    _assert_tied(m, w)
    assert torch.__future__.get_swap_module_params_on_conversion() is False


def test_gpt_tied_head_and_optimizer_built_before_to():
    torch.manual_seed(0)
    cpu = GPT(GPTConfig())
    model = copy.deepcopy(cpu)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    opt_cpu = torch.optim.AdamW(cpu.parameters(), lr=1e-3)
    tok = model.tok.weight
    model.to("tpu")
    assert model.head.weight is model.tok.weight is tok and tok.device.type == "tpu"
    idx = torch.randint(0, GPTConfig().vocab, (2, 8))
    for m, o, x in ((model, opt, idx.to("tpu")), (cpu, opt_cpu, idx)):
        for _ in range(2):
            o.zero_grad()
            m(x).float().pow(2).mean().backward()
            o.step()
    assert model.head.weight is model.tok.weight
    assert opt.param_groups[0]["params"][0].device.type == "tpu"
    for (n, p), (_, q) in zip(model.named_parameters(), cpu.named_parameters()):
        assert_same(p, q, rtol=1e-4, atol=1e-5)


def test_grads_move_with_their_parameters():
    m = Tied()
    m(torch.tensor([1, 2])).sum().backward()
    g = m.emb.weight.grad
    m.to("tpu")
    assert m.emb.weight.grad is g and g.device.type == "tpu"
    m.cpu()
    assert m.emb.weight.grad is g and g.device.type == "cpu"


def test_to_empty_on_tpu_keeps_ties():
    with torch.device("meta"):
        m = Tied()
    w = m.emb.weight
    m.to_empty(device="tpu")
    _assert_tied(m, w)
    assert w.device.type == "tpu"


def test_weak_reference_falls_back_but_keeps_ties():
    m = Tied()
    w = m.emb.weight
    ref = weakref.ref(w)  # e.g. torch.compile's guards: no swap possible
    m.to("tpu")
    assert m.head.weight is m.emb.weight and m.emb.weight.device.type == "tpu"
    # PyTorch's default path: `param.data = converted`, as between CPU and
    # CUDA, keeps the Parameter object (shallow_copy.cpp).
    assert ref() is w and m.emb.weight is w
    m.cpu()
    assert m.head.weight is m.emb.weight and m.emb.weight.device.type == "cpu"
    assert ref() is w


def test_param_data_assignment_between_cpu_and_tpu():
    """`p.data = p.to("tpu")` (FSDP2's fully_shard, much user code): the same
    Parameter object, now on tpu, as with CUDA; and back."""
    p = nn.Parameter(torch.randn(3, 4))
    values = p.detach().clone()
    p.data = p.to("tpu")
    assert isinstance(p, nn.Parameter) and p.device.type == "tpu" and p.requires_grad
    assert torch.equal(p.detach().cpu(), values)
    (p * 2).sum().backward()
    assert p.grad.device.type == "tpu" and torch.equal(p.grad.cpu(), torch.full((3, 4), 2.0))
    p.data = torch.zeros(2, dtype=torch.float64)
    assert p.device.type == "cpu" and p.dtype == torch.float64 and p.shape == (2,)
    t = torch.ones(2, device="tpu")
    with pytest.raises(RuntimeError, match="incompatible tensor type"):
        t.data = torch.ones(2, device="meta")      # as CPU and CUDA refuse meta


def test_cpu_only_conversions_are_pytorch_default():
    m = Tied()
    ref = weakref.ref(m.body.weight)  # a swap would refuse this
    w = m.body.weight
    m.double()
    assert m.body.weight is w and w.dtype == torch.float64  # param.data = (PyTorch's own path)
    assert ref() is w


def test_rnn_modules_move_and_run():
    lstm = nn.LSTM(4, 6, num_layers=2)
    gru = nn.GRU(4, 6)
    for m in (lstm, gru):
        weights = list(m.parameters())
        m.to("tpu")
        assert all(a is b for a, b in zip(weights, m.parameters()))
        assert all(w.device.type == "tpu" for w in m._flat_weights)
        m.cpu()
        assert all(w.device.type == "cpu" for w in m._flat_weights)
        m(torch.randn(3, 2, 4))


def _modules():
    return {
        "lstm": lambda: nn.LSTM(4, 6, num_layers=2, bidirectional=True),
        "gru": lambda: nn.GRU(4, 6),
        "rnn": lambda: nn.RNN(4, 6),
        "linear": lambda: nn.Linear(4, 6),
        "conv": lambda: nn.Conv2d(3, 4, 3),
        "batchnorm": lambda: nn.BatchNorm1d(6),
        "embedding": lambda: nn.Embedding(10, 4),
        "transformer": lambda: nn.TransformerEncoderLayer(8, 2, dim_feedforward=16),
    }


@pytest.mark.parametrize("name", list(_modules()))
def test_load_state_dict_on_cpu(name):
    make = _modules()[name]
    torch.manual_seed(1)
    src, dst = make(), make()
    params = list(dst.parameters())
    dst.load_state_dict(src.state_dict())
    assert all(a is b for a, b in zip(params, dst.parameters()))
    for (k, v), (_, w) in zip(src.state_dict().items(), dst.state_dict().items()):
        assert torch.equal(v, w), k


@pytest.mark.parametrize("name", ["lstm", "linear", "batchnorm", "transformer"])
def test_load_state_dict_into_tpu_module(name):
    make = _modules()[name]
    torch.manual_seed(2)
    src, dst = make(), make().to("tpu")
    params = list(dst.parameters())
    dst.load_state_dict(src.state_dict())
    assert all(a is b for a, b in zip(params, dst.parameters()))
    for (k, v), (_, w) in zip(src.state_dict().items(), dst.state_dict().items()):
        assert w.device.type == "tpu" and torch.equal(v, w.cpu()), k
    back = make()
    back.load_state_dict(dst.state_dict())  # tpu state into a CPU module
    for (k, v), (_, w) in zip(src.state_dict().items(), back.state_dict().items()):
        assert torch.equal(v, w), k


def test_swap_setting_is_per_thread_during_a_conversion():
    """While one thread converts a meta module to tpu (the conversions that
    swap), another thread sees PyTorch's own setting (False): its CPU
    load_state_dict is unaffected."""
    seen = []
    started, release = threading.Event(), threading.Event()

    class Slow(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def _apply(self, fn, recurse=True):
            def slow_fn(t):  # runs inside Module._apply's conversion
                seen.append(("inside", torch.__future__.get_swap_module_params_on_conversion()))
                started.set()
                release.wait(30)
                return fn(t)
            return super()._apply(slow_fn, recurse)

    def convert():
        with torch.device("meta"):
            m = Slow()
        m.to_empty(device="tpu")

    t = threading.Thread(target=convert)
    t.start()
    assert started.wait(30)
    seen.append(("other", torch.__future__.get_swap_module_params_on_conversion()))
    lstm = nn.LSTM(2, 2)
    lstm.load_state_dict(nn.LSTM(2, 2).state_dict())
    release.set()
    t.join(30)
    assert ("inside", True) in seen and ("other", False) in seen
    assert torch.__future__.get_swap_module_params_on_conversion() is False


def test_move_while_an_autograd_graph_holds_the_weights():
    # A CPU forward with grad whose outputs are still alive: autograd holds the
    # weights, so they cannot be swapped; the move still works, ties kept.
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 4))
    m[2].weight = m[0].weight
    x = torch.randn(2, 4)
    ref = m(x)
    pending = m(x)  # noqa: F841  (keeps the graph alive across the move)
    m.to("tpu")
    assert all(p.device.type == "tpu" for p in m.parameters())
    assert m[2].weight is m[0].weight
    out = m(x.to("tpu"))
    torch.testing.assert_close(out.detach().cpu(), ref.detach(), rtol=1e-5, atol=1e-5)
    out.sum().backward()
    assert m[0].weight.grad.device.type == "tpu"


def test_lazy_modules_moved_before_their_first_forward():
    # The swap on conversion turned an UninitializedParameter into an empty
    # plain Parameter, which LazyConv then took for its weight.
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.LazyConv2d(4, 3), torch.nn.LazyBatchNorm2d(), torch.nn.Flatten(),
                              torch.nn.LazyLinear(5))
    dev = torch.nn.Sequential(torch.nn.LazyConv2d(4, 3), torch.nn.LazyBatchNorm2d(), torch.nn.Flatten(),
                              torch.nn.LazyLinear(5)).to("tpu")
    assert isinstance(dev[0].weight, torch.nn.parameter.UninitializedParameter)
    assert dev[0].weight.device.type == "tpu"
    x = torch.randn(2, 3, 8, 8)
    cpu(x)
    dev(x.to("tpu"))
    dev.load_state_dict(cpu.state_dict())
    cpu.eval()
    dev.eval()
    torch.testing.assert_close(dev(x.to("tpu")).cpu(), cpu(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("convert", [lambda m: m.to("tpu"), lambda m: m.tpu().float(), lambda m: m.tpu().cpu(),
                                     lambda m: m.to("tpu").to(torch.float64)],
                         ids=["to", "tpu().float()", "tpu().cpu()", "to(float64)"])
def test_hooks_on_parameters_survive_conversions(convert):
    # The swap on conversion left the autograd hooks with the old tensor: a
    # gradient mask registered before .to("tpu") (or .float() of a tpu
    # model) was silently dropped, and so was every hook registered after.
    m = nn.Linear(3, 2)
    m.weight.register_hook(lambda g: g * 0)
    seen = []
    m.bias.register_post_accumulate_grad_hook(lambda p: seen.append(p.grad.clone()))
    convert(m)
    m.bias.register_hook(lambda g: g * 3)
    x = torch.ones(1, 3, dtype=m.weight.dtype, device=m.weight.device)
    m(x).sum().backward()
    assert m.weight.grad.abs().sum().item() == 0
    assert m.bias.grad.cpu().tolist() == [3.0, 3.0]
    assert len(seen) == 1 and seen[0].cpu().tolist() == [3.0, 3.0]

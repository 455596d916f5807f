"""Nested tensors (torch.nested, strided layout) on tpu against CPU.

No lowering takes ragged shapes: ops on nested tensors run PyTorch's nested
CPU kernels through the nested fallback (csrc/device/nested.cpp); views and
metadata stay on the device. nn.TransformerEncoder's inference fast path
(eval, no_grad, a padding mask) builds one by default.
"""
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from conftest import assert_same


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the nested-tensor prototype and CPU-fallback warnings
        yield


def both(fn):
    torch.manual_seed(0)
    a, b = torch.randn(2, 3), torch.randn(4, 3)
    return [fn(torch.nested.nested_tensor([a, b], device=d), d) for d in ("cpu", "tpu")]


@pytest.mark.parametrize("name,fn", [
    ("to_padded_tensor", lambda nt, d: nt.to_padded_tensor(-1.0)),
    ("add", lambda nt, d: (nt + nt * 2).to_padded_tensor(0.0)),
    ("softmax", lambda nt, d: torch.softmax(nt, -1).to_padded_tensor(0.0)),
    ("matmul", lambda nt, d: torch.matmul(nt, nt.transpose(1, 2)).to_padded_tensor(0.0)),
    ("linear", lambda nt, d: F.linear(nt, torch.arange(15.0, device=d).view(5, 3)).to_padded_tensor(0.0)),
    ("transpose_contiguous", lambda nt, d: nt.transpose(1, 2).contiguous().to_padded_tensor(0.0)),
    ("unbind", lambda nt, d: torch.cat([t.reshape(-1) for t in nt.unbind()])),
])
def test_nested_ops_match_cpu(name, fn):
    want, got = both(fn)
    assert got.device.type == "tpu"
    assert_same(got, want)


def test_nested_metadata_views_and_writes():
    want, got = both(lambda nt, d: nt)
    assert got.is_nested and got.device.type == "tpu"
    # Sizes are host tensors, as for CUDA's nested tensors.
    assert got._nested_tensor_size().device.type == "cpu"
    assert torch.equal(got._nested_tensor_size(), want._nested_tensor_size())
    for nt in (want, got):
        nt.mul_(3)
        nt.unbind()[1].add_(100)  # a view of the nested storage: the write lands in it
    assert_same(got.to_padded_tensor(0.0), want.to_padded_tensor(0.0))
    assert "nested_tensor" in repr(got) and "device='tpu:0'" in repr(got)
    back = got.cpu()
    assert back.is_nested and torch.equal(back.to_padded_tensor(0.0), want.to_padded_tensor(0.0))


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_encoder_fast_path_with_padding_mask(norm_first):
    # eval + no_grad + src_key_padding_mask: torch.nn.TransformerEncoder turns
    # the batch into a nested tensor on any supported device, tpu included.
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True, norm_first=norm_first)
    enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=not norm_first).eval()
    x = torch.randn(3, 5, 8)
    pad = torch.tensor([[0, 0, 0, 1, 1], [0, 0, 0, 0, 0], [0, 1, 1, 1, 1]], dtype=torch.bool)
    with torch.no_grad():
        want = enc(x, src_key_padding_mask=pad)
        got = enc.to("tpu")(x.to("tpu"), src_key_padding_mask=pad.to("tpu"))
    assert got.device.type == "tpu"
    assert_same(got[pad.logical_not().to("tpu")], want[~pad], rtol=1e-5, atol=1e-5)


def test_to_padded_tensor_backward():
    # Its backward, _nested_from_padded, takes the nested sizes as a host
    # tensor (as on CUDA); the CPU fallback took that for a device mismatch.
    def grads(dev):
        torch.manual_seed(0)
        a = torch.randn(2, 3, device=dev, requires_grad=True)
        b = torch.randn(4, 3, device=dev, requires_grad=True)
        p = torch.nested.to_padded_tensor(torch.nested.as_nested_tensor([a, b]), 0.0)
        (p * torch.arange(24.0, device=dev).reshape(2, 4, 3)).sum().backward()
        return a.grad, b.grad

    for got, expected in zip(grads("tpu"), grads("cpu")):
        assert got.device.type == "tpu"
        assert torch.equal(got.cpu(), expected)

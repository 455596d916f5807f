"""Meta kernels PyTorch lacks for the fused GRU cell ops.

PyTorch's RNN code calls ``aten::_thnn_fused_gru_cell`` (and autograd its
``_thnn_fused_gru_cell_backward``) for tpu inputs, as for CUDA. The eager
executor and FakeTensor (torch.compile) infer result shapes from Meta kernels;
PyTorch registers them for the LSTM cell ops only. Shapes follow
aten/src/ATen/native/cuda/RNN.cu: workspace [B, 5H]; the bias gradients exist
only when ``has_bias``.

PyTorch's own ``_thnn_fused_lstm_cell`` Meta kernel fails for a cell without
biases (its size check reads ``.device`` of the absent biases, PyTorch 2.13);
``install`` replaces that check with one that skips absent tensors.
"""
import torch

_lib = None


# Dynamo must not trace these: a Meta kernel runs inside eager code that a
# compiled function calls after a graph break (nn.GRU under torch.compile).
@torch._disable_dynamo
def _check_sizes(input_gates, hidden_gates, input_bias, hidden_bias, factor, prev_hidden):
    """ATen's checkSizes for the fused cells (RNN.cu), absent biases allowed."""
    torch._check(input_gates.ndim == 2, lambda: f"{input_gates.ndim} != 2")
    torch._check(input_gates.shape == hidden_gates.shape,
                 lambda: f"{input_gates.shape} != {hidden_gates.shape}")
    gates_size = input_gates.size(1)
    if input_bias is not None:
        torch._check(hidden_bias is not None, lambda: "hidden_bias must be defined with input_bias")
        torch._check(input_bias.ndim == 1, lambda: f"{input_bias.ndim} != 1")
        torch._check(input_bias.numel() == gates_size, lambda: f"{input_bias.numel()} != {gates_size}")
        torch._check(input_bias.shape == hidden_bias.shape,
                     lambda: f"{input_bias.shape} != {hidden_bias.shape}")
    torch._check(prev_hidden.ndim == 2, lambda: f"{prev_hidden.ndim} != 2")
    expected = input_gates.size(0) * gates_size // factor
    torch._check(prev_hidden.numel() == expected, lambda: f"{prev_hidden.numel()} != {expected}")
    torch._check(all(x.device == input_gates.device
                     for x in [hidden_gates, input_bias, hidden_bias, prev_hidden] if x is not None),
                 lambda: "expected all inputs to be same device")


@torch._disable_dynamo
def _gru_cell_meta(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    _check_sizes(input_gates, hidden_gates, input_bias, hidden_bias, 3, hx)
    hy = torch.empty_like(hx, memory_format=torch.contiguous_format)
    ws_shape = list(hx.shape)
    ws_shape[-1] *= 5
    workspace = input_gates.new_empty(ws_shape)
    return hy, workspace


@torch._disable_dynamo
def _gru_cell_backward_meta(grad_hy, workspace, has_bias):
    torch._check(workspace.shape[-1] == 5 * grad_hy.shape[-1],
                 lambda: "_thnn_fused_gru_cell_backward: workspace must have 5 * hidden_size columns")
    gates_shape = list(grad_hy.shape)
    gates_shape[-1] *= 3
    gi = grad_hy.new_empty(gates_shape)
    gh = grad_hy.new_empty(gates_shape)
    ghx = torch.empty_like(grad_hy, memory_format=torch.contiguous_format)
    if has_bias:
        return gi, gh, ghx, gi.sum(0), gh.sum(0)
    return gi, gh, ghx, None, None


def install():
    global _lib
    if _lib is not None:
        return
    import torch._meta_registrations as meta_registrations
    if hasattr(meta_registrations, "rnn_cell_checkSizes"):
        meta_registrations.rnn_cell_checkSizes = _check_sizes
    lib = torch.library.Library("aten", "IMPL")
    for name, fn in (("_thnn_fused_gru_cell", _gru_cell_meta),
                     ("_thnn_fused_gru_cell_backward", _gru_cell_backward_meta)):
        if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "Meta"):
            lib.impl(name, fn, "Meta")
    _lib = lib

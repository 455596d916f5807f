"""Inference (eval, no_grad) of nn.MultiheadAttention, nn.TransformerEncoderLayer
and nn.TransformerEncoder with a padding mask on tpu against PyTorch's CPU,
one process. These take PyTorch's fast paths (_native_multi_head_attention,
_transformer_encoder_layer_fwd, nested tensors for padded batches).

The first tpu call (compile, or a persistent-cache load) apart, then the
median of --repeats warm calls each way, alternating, each synced (a host
read of a reduction of the result). `--fused` runs tpu in fused eager.

    python benchmarks/transformer_fast_path.py [--repeats 20] [--markdown]
"""
import copy
import warnings

import torch
import torch.nn as nn

import torch_pjrt  # noqa: F401
from bench import compare, parse_args, print_table

WIDTH, HEADS, FFN, BATCH, TOKENS = 256, 8, 1024, 8, 128


def cases():
    mha = nn.MultiheadAttention(WIDTH, HEADS, batch_first=True)
    layer = nn.TransformerEncoderLayer(WIDTH, HEADS, FFN, batch_first=True, activation="gelu")
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(WIDTH, HEADS, FFN, batch_first=True), 4)
    pad = torch.zeros(BATCH, TOKENS, dtype=torch.bool)
    pad[:, TOKENS * 3 // 4:] = True  # a quarter of every sequence is padding
    yield "MultiheadAttention (need_weights=False)", mha, lambda m, x, p: m(x, x, x, need_weights=False)[0], False
    yield "MultiheadAttention (averaged weights)", mha, lambda m, x, p: m(x, x, x)[0], False
    yield "TransformerEncoderLayer (gelu)", layer, lambda m, x, p: m(x), False
    yield "TransformerEncoder x4, padding mask (nested)", encoder, lambda m, x, p: m(x, src_key_padding_mask=p), pad


def main():
    args = parse_args(__doc__, repeats=20)
    warnings.simplefilter("ignore")  # the nested-tensor prototype warning
    torch.manual_seed(0)
    x = torch.randn(BATCH, TOKENS, WIDTH)
    rows = []
    for name, module, fn, pad in cases():
        module = module.eval()
        tpu_module = copy.deepcopy(module).to("tpu")
        xt = x.to("tpu")
        pt = pad.to("tpu") if pad is not False else None
        pc = pad if pad is not False else None

        def on_tpu():
            with torch.no_grad():
                return fn(tpu_module, xt, pt).sum().item()

        def on_cpu():
            with torch.no_grad():
                return fn(module, x, pc).sum().item()

        try:
            first, d, c = compare(on_tpu, on_cpu, args.repeats)
        except (RuntimeError, NotImplementedError) as e:  # (a build without the nested fallback)
            rows.append((name + f" [tpu raised {type(e).__name__}]", float("nan"), float("nan"), float("nan"), "-"))
            continue
        rows.append((name, first, d, c, f"{c / d:.2f}x"))
    print_table(("case", "tpu first call (ms)", "tpu warm (ms)", "cpu (ms)", "cpu / tpu"), rows,
                ("", ".0f", ".2f", ".2f", ""), args.markdown)
    print(f"float32, batch {BATCH} x {TOKENS} tokens, width {WIDTH}, {HEADS} heads; "
          f"median of {args.repeats} synced calls each")


if __name__ == "__main__":
    main()

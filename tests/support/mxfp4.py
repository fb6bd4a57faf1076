"""Turn a tiny gpt-oss folder into an MXFP4 checkpoint laid out as gpt-oss-20b's release is.

gpt-oss ships its expert weights in MXFP4: for each expert projection `P` (`gate_up_proj`,
`down_proj`, stored (experts, in, out) in the model), `P_blocks` holds the transposed weight
(experts, out, in) cut into blocks of 32 values along `in`, two FP4 (e2m1) codes per byte (low
nibble first), and `P_scales` one shared power-of-two exponent per block (e8m0, biased by 127).
This writes that layout from a dense folder with a plain round-to-nearest quantizer and returns
what each weight dequantizes to, so a test can check the loader's dequantization exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

FP4_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
EXPERT_WEIGHTS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


def quantize_mxfp4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(blocks uint8 (E, out, in/32, 16), scales uint8 (E, out, in/32), dequantized (E, in, out))."""
    transposed = weight.detach().float().transpose(1, 2).contiguous()  # (E, out, in)
    experts, rows, cols = transposed.shape
    groups = transposed.reshape(experts, rows, cols // 32, 32)
    amax = groups.abs().amax(-1, keepdim=True).clamp(min=2.0 ** -100)
    exponent = torch.floor(torch.log2(amax)) - 2  # amax / 2**exponent in [4, 8): the grid's top is 6
    scaled = groups / torch.exp2(exponent)
    codes = (scaled.unsqueeze(-1) - FP4_GRID).abs().argmin(-1)  # nearest grid value (clamps to +-6)
    blocks = (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)
    scales = (exponent.squeeze(-1) + 127).to(torch.uint8)
    dequantized = (FP4_GRID[codes] * torch.exp2(exponent)).reshape(experts, rows, cols).transpose(1, 2)
    return blocks, scales, dequantized.contiguous()


def write_mxfp4_checkpoint(dense_dir: str | Path, out_dir: str | Path) -> dict[str, torch.Tensor]:
    """Copy `dense_dir` to `out_dir` with its expert weights in MXFP4 and an mxfp4
    `quantization_config`; returns {parameter name: the dense tensor it dequantizes to}."""
    import shutil

    from safetensors.torch import load_file, save_file

    dense_dir, out_dir = Path(dense_dir), Path(out_dir)
    shutil.copytree(dense_dir, out_dir, ignore=shutil.ignore_patterns("*.safetensors", "*.safetensors.index.json"))
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(dense_dir.glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    expected: dict[str, torch.Tensor] = {}
    for name in [n for n in tensors if n.endswith(EXPERT_WEIGHTS)]:
        blocks, scales, dequantized = quantize_mxfp4(tensors.pop(name))
        tensors[f"{name}_blocks"], tensors[f"{name}_scales"] = blocks, scales
        expected[name] = dequantized
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((out_dir / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    return expected

"""``nvfp4lab demo``: quantize one built-in tensor with every recipe and print an error table."""
from __future__ import annotations

import math

import torch

from . import ops

RECIPES = {
    "nvfp4 1x16": dict(),
    "nvfp4 16x16": dict(block="16x16"),
    "nvfp4 per-token": dict(per_token=True),
    "nvfp4 RHT (columnwise)": dict(rht=True, rowwise=False, columnwise=True),
    "nvfp4 SR": dict(stochastic_rounding=True, seed=0),
    "nvfp4 4over6 MAE E=256": dict(four_over_six="mae"),
    "nvfp4 4over6 MSE E=256": dict(four_over_six="mse"),
    "nvfp4 4over6 MAE E=448": dict(four_over_six="mae", e4m3_max=448),
}


def builtin_tensor(device="cpu") -> torch.Tensor:
    """(256, 512) bf16: Gaussian rows with per-row magnitudes over 2 decades and 0.5% x20 outliers."""
    g = torch.Generator().manual_seed(2026)
    x = torch.randn(256, 512, generator=g) * torch.exp2(torch.rand(256, 1, generator=g) * 6 - 3)
    outliers = torch.rand(256, 512, generator=g) < 0.005
    return torch.where(outliers, x * 20, x).to(torch.bfloat16).to(device)


def sqnr_db(x: torch.Tensor, x_deq: torch.Tensor) -> float:
    x64, e64 = x.double(), (x.double() - x_deq.double())
    noise = float(e64.pow(2).sum())
    return math.inf if noise == 0 else 10 * math.log10(float(x64.pow(2).sum()) / noise)


def run_demo(device: str = "cpu") -> list[tuple[str, float, float]]:
    x = builtin_tensor(device)
    rows = []
    for name, kwargs in RECIPES.items():
        q = ops.quantize_nvfp4(x, **kwargs)
        which = "columnwise" if kwargs.get("columnwise") and not kwargs.get("rowwise", True) else "rowwise"
        deq = q.dequantize(torch.float32, which=which)
        rel = float((deq - x.float()).norm() / x.float().norm())
        rows.append((name, sqnr_db(x, deq), rel))
    mx = ops.quantize_mxfp8(x)
    deq = mx.dequantize(torch.float32)
    rows.append(("mxfp8 e4m3", sqnr_db(x, deq), float((deq - x.float()).norm() / x.float().norm())))
    print(f"built-in tensor {tuple(x.shape)} bf16 on {device}: quantize -> dequantize error by recipe")
    print(f"{'recipe':<26}{'SQNR dB':>9}{'rel. error':>12}")
    for name, snr, rel in sorted(rows, key=lambda r: -r[1]):
        print(f"{name:<26}{snr:>9.2f}{rel:>12.4f}")
    return rows

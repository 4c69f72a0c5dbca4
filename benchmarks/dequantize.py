"""NVFP4 dequantize kernel bandwidth vs a device-to-device copy of the same bytes (CUDA only).

    PYTHONPATH=src python benchmarks/dequantize.py [--quick] [--tune] [--out FILE]

Sweep: rowwise (swizzled scales) and columnwise (transposed store) to bf16 at 8192 x 8192 and
M in {1024..32768} x K in {2048, 4096, 8192}; at 8192 x 8192 also compact scales, per-token amax and
fp16 / fp32 outputs. Bytes moved = packed data + scales + amax read, output written. Before timing,
each case's output at 8192 x 8192 is checked bit for bit against the reference.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import _bench  # noqa: E402
from nvfp4lab import ref  # noqa: E402
from nvfp4lab.config import NVFP4QuantConfig  # noqa: E402
from nvfp4lab.kernels import dequantize as dq  # noqa: E402
from nvfp4lab.tensors import NVFP4Tensor  # noqa: E402

_DT = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def make_operand(rows: int, cols: int, layout: str, per_token: bool):
    """Random packed codes and E4M3 scales (0..0x7E, no NaN) for a quantized (rows, cols) matrix."""
    data = torch.randint(0, 256, (rows, cols // 2), dtype=torch.uint8, device=_bench.DEVICE)
    compact = torch.randint(0, 0x7F, (rows, cols // 16), dtype=torch.uint8, device=_bench.DEVICE)
    scale = ref.swizzle.apply_scale_layout(compact, layout)
    amax = torch.rand(rows if per_token else 1, device=_bench.DEVICE) * 10 + 0.1
    return data, scale, amax


def check(data, scale, amax, layout, per_token, transpose, dtype):
    rows, cols = data.shape[0], data.shape[1] * 2
    cfg = NVFP4QuantConfig(rowwise=not transpose, columnwise=transpose, per_token=per_token, scale_layout=layout)
    shape = torch.Size((cols, rows) if transpose else (rows, cols))
    which = "columnwise" if transpose else "rowwise"
    t = NVFP4Tensor(shape=shape, dtype=dtype, config=cfg, **{f"{which}_data": data, f"{which}_scale": scale, f"{which}_amax": amax})
    got, want = dq.dequantize_nvfp4(t, dtype, which), ref.nvfp4.dequantize(t, dtype, which)
    view = torch.int32 if dtype == torch.float32 else torch.int16
    if not torch.equal(got.view(view), want.view(view)):
        raise SystemExit(f"MISMATCH vs reference: {which} {layout} per_token={per_token} {dtype}")


def run_case(results, m, k, *, layout="swizzled", per_token=False, transpose=False, dtype=torch.bfloat16, verify=False, tile=None):
    rows, cols = (k, m) if transpose else (m, k)  # the quantized matrix Q; x is (m, k)
    data, scale, amax = make_operand(rows, cols, layout, per_token)
    if verify:
        check(data, scale, amax, layout, per_token, transpose, dtype)
    out = torch.empty((m, k), dtype=dtype, device=_bench.DEVICE)
    block_rows, block_cols, warps = tile or (None, None, None)

    def fn():
        dq.launch_nvfp4_dequantize(data, scale, amax, out, scale_layout=layout, e4m3_max=448.0, transpose=transpose,
                                   block_rows=block_rows, block_cols=block_cols, num_warps=warps)

    ms = _bench.bench_ms(fn)
    moved = data.numel() + scale.numel() + amax.numel() * 4 + out.numel() * out.element_size()
    name = f"nvfp4 {'col' if transpose else 'row'} {layout[:4]}{' tok' if per_token else ''} ->{_DT[dtype]}"
    if tile:
        name += f" {block_rows}x{block_cols}w{warps}"
    extra = dict(layout=layout, per_token=per_token, transpose=transpose, out_dtype=_DT[dtype])
    if tile:
        extra["tile"] = list(tile)
    _bench.record(results, name, m, k, ms, moved, **extra)


def main():
    args = _bench.parse_args(__doc__.splitlines()[0])
    results: list = []
    print(f"cases at {_bench.BASE[0]} x {_bench.BASE[1]} (each checked against the reference first)")
    for layout in ("swizzled", "compact"):
        for transpose in (False, True):
            run_case(results, *_bench.BASE, layout=layout, transpose=transpose, verify=True)
    run_case(results, *_bench.BASE, per_token=True, verify=True)
    run_case(results, *_bench.BASE, per_token=True, transpose=True, verify=True)
    for dtype in (torch.float16, torch.float32):
        run_case(results, *_bench.BASE, dtype=dtype, verify=True)
        run_case(results, *_bench.BASE, dtype=dtype, transpose=True, verify=True)
    if args.tune:
        print(f"tile shapes at {_bench.BASE[0]} x {_bench.BASE[1]} (BLOCK_ROWS x BLOCK_COLS, num_warps)")
        for tile in [(16, 256, 4), (32, 256, 4), (32, 512, 4), (64, 256, 8), (32, 512, 8), (64, 512, 8), (16, 512, 4)]:
            run_case(results, *_bench.BASE, tile=tile)
        # transposed tiles: (groups of 8 Q rows, of 4 for fp32 output; words of 8 codes per Q row (even); warps)
        for tile in [(16, 16, 4), (4, 64, 4), (8, 64, 8), (16, 32, 8), (8, 16, 2)]:
            run_case(results, *_bench.BASE, transpose=True, per_token=True, tile=tile, verify=tile == (16, 16, 4))
            run_case(results, *_bench.BASE, transpose=True, tile=tile)
        for tile in [(8, 32, 4), (32, 8, 4), (32, 16, 8), (16, 32, 8), (8, 16, 2)]:
            run_case(results, *_bench.BASE, transpose=True, dtype=torch.float32, tile=tile, verify=tile == (8, 32, 4))
    print("sweep (bf16 output, swizzled scales)")
    for m, k in _bench.shapes(args.quick):
        run_case(results, m, k)
        run_case(results, m, k, transpose=True)
    _bench.finish(results, args.out, "NVFP4 dequantize")


if __name__ == "__main__":
    main()

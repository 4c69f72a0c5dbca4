"""Static SASS statistics of a quantize cast kernel built for sm_90 on this machine (no GPU needed).

Prints registers, spills, instruction count per thread and per element, and an opcode histogram, for
the cast kernel of each named recipe at its default tile (or NVFP4LAB_QUANT_TILE). Instruction count
per element is the one number that bounds these kernels on Hopper (see kernels/nvfp4_quantize.py).

    TRITON_INTERPRET=0 python tools/sass_stats.py rowcol row 2d [--cast16] [--grouped STEPS] [--dump DIR]\n    (MAXNREG=128: try a register cap; NVFP4LAB_PT_PRECOMPUTE=1: per-token global scales loaded)
"""
import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

os.environ["TRITON_INTERPRET"] = "0"
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

from nvfp4lab import NVFP4QuantConfig  # noqa: E402
from nvfp4lab.kernels import nvfp4_quantize as kq  # noqa: E402

RECIPES = {
    "row": dict(rowwise=True, columnwise=False),
    "rowcol": dict(rowwise=True, columnwise=True),
    "col": dict(rowwise=False, columnwise=True),
    "2d": dict(rowwise=True, columnwise=True, block="16x16"),
    "pertoken": dict(rowwise=True, columnwise=True, per_token=True),
    "rht": dict(rowwise=True, columnwise=True, rht=True),
    "sr": dict(rowwise=True, columnwise=True, stochastic_rounding=True),
    "rht-sr": dict(rowwise=True, columnwise=True, rht=True, stochastic_rounding=True),
    "4over6": dict(rowwise=True, columnwise=True, four_over_six="mae", e4m3_max=256.0),
}
MAXNREG = int(os.environ.get("MAXNREG", "0"))  # a ptxas register cap (launch option maxnreg) to try; 0: the launcher's
BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def compile_cast(kwargs, tile=None, cast16=False, split_steps=0):
    cfg = NVFP4QuantConfig(**kwargs)
    meta = kq.config_meta(cfg)
    if split_steps:
        meta.update(GROUPED=True, SPLIT_STEPS=split_steps)
    if cast16:  # RHT recipes build the kernel's RHT path (the default; NVFP4LAB_CAST16_RHT=0: generic)
        bk, warps = (tile[1], tile[2]) if tile else kq.cast16_tile(8192)
        meta = dict(kq.cast16_meta(cfg.rowwise, cfg.columnwise, cfg.block == "16x16", cfg.per_token, cfg.e4m3_max,
                                   cfg.stochastic_rounding, cfg.stochastic_rounding, cfg.scale_layout, bk,
                                   cfg.rht_sign_mask if cfg.rht else -1),
                    **{k: v for k, v in meta.items() if k in ("GROUPED", "SPLIT_STEPS")})
        fn = kq._cast16_kernel
        bm = 16
    else:
        kind = kq.cast_kind(cfg.rowwise, cfg.columnwise, cfg.block == "16x16", cfg.per_token, cfg.rht,
                            cfg.stochastic_rounding, cfg.four_over_six is not None)
        bm, bk, warps = tile or kq._tile(8192, 8192, rht=cfg.rht, four_over_six=cfg.four_over_six is not None, kind=kind)
        meta.update(BLOCK_M=bm, BLOCK_K=bk, DOT_BF16=True)
        fn = kq._quantize_kernel
    pointers = dict(x_ptr="*bf16", row_data_ptr="*i32", row_scale_ptr="*u8", col_data_ptr="*i32", col_scale_ptr="*u8",
                    row_amax_ptr="*fp32", col_amax_ptr="*fp32", seed_ptr="*i64", offsets_ptr="*i64",
                    group_split_ptr="*i32")
    scalars = dict(seed_value="i64", M="i32", K="i32", num_splits="i32")
    sig = {n: pointers.get(n) or scalars.get(n) or "constexpr" for n in fn.arg_names}
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in pointers}
    attrs.update({(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in ("M", "K")})
    src = triton.compiler.ASTSource(fn=fn, signature=sig, attrs=attrs,
                                    constexprs={(fn.arg_names.index(k),): v for k, v in meta.items()})
    options = dict(num_warps=warps, enable_fp_fusion=False)
    if cast16 and not MAXNREG:
        options.update(kq.cast16_launch_options(cfg.rowwise, cfg.columnwise))  # the cap the launcher uses
    elif MAXNREG:
        options["maxnreg"] = MAXNREG
    c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    return c, (bm, bk, warps)


def sass_of(cubin: bytes) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([os.path.join(BIN, "nvdisasm"), "-c", f.name], capture_output=True, text=True, check=True).stdout


def resources(cubin: bytes) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([os.path.join(BIN, "cuobjdump"), "-res-usage", f.name], capture_output=True, text=True).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", out)
    return f"regs {m.group(1)} stack {m.group(2)} shared {m.group(3)} local {m.group(4)}" if m else out.strip()[-200:]


def stats(sass: str):
    ops = collections.Counter()
    for line in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", line)
        if m:
            ops[m.group(2).split(".")[0]] += 1
    return ops


def main():
    p = argparse.ArgumentParser()
    p.add_argument("recipes", nargs="*", default=["row", "rowcol"])
    p.add_argument("--tile", default=None, help="BMxBKxWARPS")
    p.add_argument("--dump", default=None)
    p.add_argument("--cast16", action="store_true", help="the 16-row-group kernel (_cast16_kernel)")
    p.add_argument("--grouped", type=int, default=0, metavar="STEPS",
                   help="the grouped (MoE) cast with 2^STEPS splits (kernels/grouped_quantize.py)")
    p.add_argument("--normal-only", action="store_true",
                   help="compile only the normal-range path (what runs on ordinary data): drops the EXACT branch")
    a = p.parse_args()
    if a.normal_only:
        @triton.jit
        def _always(outer):
            return True

        kq._normal_range = _always
        kq._normal_range_pt = _always  # per token with NVFP4LAB_PT_PRECOMPUTE=1
    tile = tuple(int(v) for v in a.tile.split("x")) if a.tile else None
    for name in a.recipes:
        c, (bm, bk, warps) = compile_cast(RECIPES[name], tile, a.cast16, a.grouped)
        sass = sass_of(c.asm["cubin"])
        ops = stats(sass)
        total = sum(v for k, v in ops.items() if k not in ("NOP",))
        per_elem = total / (bm * bk / (32 * warps))
        print(f"{name:9s} tile {bm}x{bk}x{warps}: {resources(c.asm['cubin'])} | SASS {total} instr/thread = {per_elem:.1f} per element")
        print("   ", ", ".join(f"{k}:{v}" for k, v in ops.most_common(22)))
        if a.dump:
            os.makedirs(a.dump, exist_ok=True)
            open(os.path.join(a.dump, f"{name}.sass"), "w").write(sass)
            open(os.path.join(a.dump, f"{name}.ttgir"), "w").write(c.asm["ttgir"])
            open(os.path.join(a.dump, f"{name}.ptx"), "w").write(c.asm["ptx"])


if __name__ == "__main__":
    sys.exit(main())

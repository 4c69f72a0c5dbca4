"""Static SASS statistics of a quantize cast kernel built for sm_90 on this machine (no GPU needed).

Prints registers, spills, instruction count per thread and per element, and an opcode histogram, for
the cast kernel of each named recipe (``cast16_kernel``, ``cast_row_kernel`` for rowwise-only bf16 casts
(SR too; ``--side row`` for the rowwise launch of a split cast), ``cast_col_kernel`` for columnwise-only RHT casts
(``--side col``), ``four_over_six_1x16_kernel`` for 1x16 4over6 (one output per launch: ``--side row`` or
``--side col``), or ``four_over_six_kernel`` for the other 4over6 casts; ``--cast16`` for cast16_kernel instead of
cast_row) as the
launcher builds it (one launch for rowwise and columnwise, ``--side`` for one output) at its default
tile (or ``--tile``). Instruction count per element is the one number that bounds these kernels on
Hopper (see kernels/nvfp4_quantize.py).

    TRITON_INTERPRET=0 python tools/sass_stats.py rowcol row 2d [--side row|col] [--grouped STEPS] [--dump DIR] [--cast16]
        [--layouts] [--amax] [--operand]
    (MAXNREG=128: try a register cap)

``--operand`` builds ``cast_row_kernel`` / ``cast_col_kernel`` with their BF16 GEMM operand output (OPERAND).
``--amax`` compiles the recipe's amax pass instead (``amax_rht_col_kernel`` for the post-RHT per-tensor amaxes of bf16
x, else ``amax_kernel``). Per-element figures count each instruction once: a tile of several 16-row groups per program (``cast16_kernel``'s
default for row+col casts: 64 rows) runs its group loop's body once per group, so compare kernels at one group
(``--tile 16x128x1``), where the count is what each element costs.

``--layouts`` lists each global load / store with its tensor shape and distributed layout (how lanes and warps
cover the tensor), and the layout conversions and shared-memory buffers of the kernel. Triton versions choose these
differently (Triton 3.6 orders dimensions of equal contiguity with dim 0 fastest, so a pointer tensor whose rows are
not contiguous can get its lanes along the rows); to see the GPU machine's choice, put that version first on the path
without installing it: ``pip download triton==3.6.0 --no-deps -d W``, unzip the wheel into a folder D, ``chmod +x
D/triton/backends/nvidia/bin/*``, then ``PYTHONPATH=D:src``.
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
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

from nvfp4lab import NVFP4QuantConfig  # noqa: E402
from nvfp4lab.kernels.nvfp4_quantize import FOUR_OVER_SIX_CODES  # noqa: E402
from nvfp4lab.kernels.nvfp4_quantize import amax_modes  # noqa: E402
from nvfp4lab.kernels.nvfp4_quantize_details import (  # noqa: E402
    amax, cast16, cast_col, cast_row, cast_rowcol, four_over_six, opt_flags, pt_scales)

RECIPES = {
    "row": dict(rowwise=True, columnwise=False),
    "pertoken-row": dict(rowwise=True, columnwise=False, per_token=True),
    "rowcol": dict(rowwise=True, columnwise=True),
    "col": dict(rowwise=False, columnwise=True),
    "2d": dict(rowwise=True, columnwise=True, block="16x16"),
    "pertoken": dict(rowwise=True, columnwise=True, per_token=True),
    "rht": dict(rowwise=True, columnwise=True, rht=True),
    "sr": dict(rowwise=True, columnwise=True, stochastic_rounding=True),
    "rht-sr": dict(rowwise=True, columnwise=True, rht=True, stochastic_rounding=True),
    "4over6": dict(rowwise=True, columnwise=True, four_over_six="mae", e4m3_max=256.0),
    "4over6-2d": dict(rowwise=True, columnwise=True, block="16x16", four_over_six="mae", e4m3_max=256.0),
}
MAXNREG = int(os.environ.get("MAXNREG", "0"))  # a ptxas register cap (launch option maxnreg) to try; 0: the launcher's
BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def compile_cast(kwargs, tile=None, side=None, split_steps=0, allow_row=True, row_operand=False, operand=False):
    """Compile the recipe's cast kernel for sm_90; ``tile`` (BM, BK, WARPS) as ``quantize``'s explicit tile,
    ``side`` "row" or "col" for a one-output launch; ``allow_row``: the launcher's choice of
    ``cast_row_kernel`` where it applies (else ``cast16_kernel``); ``row_operand``: ``cast16_kernel`` writing the
    rowwise side as the BF16 GEMM operand; ``operand``: ``cast_row_kernel`` / ``cast_col_kernel`` writing theirs
    (OPERAND)."""
    allow_row = allow_row and not row_operand
    cfg = NVFP4QuantConfig(**kwargs)
    rowwise = cfg.rowwise if side is None else side == "row"
    columnwise = cfg.columnwise if side is None else side == "col"
    block_2d = cfg.block == "16x16"
    steps = split_steps or None
    explicit = dict(block_k=tile[1], num_warps=tile[2]) if tile else {}
    if opt_flags.use_cast_col(8192, 8192, rowwise, columnwise, block_2d, cfg.per_token, cfg.four_over_six, cfg.rht,
                              steps is not None, False, True, True):
        meta = opt_flags.cast_col_meta(8192, 8192, cfg.scale_layout, cfg.rht_sign_mask if cfg.rht else -1,
                                       cfg.e4m3_max, cfg.stochastic_rounding, cfg.stochastic_rounding, block_m=tile[0] if tile else 0,
                                       **explicit, operand=operand)
        meta["HW"] = True
        fn, bm, bk = cast_col.cast_col_kernel, 16 * meta["GROUPS"], meta["BLOCK_C"] * 2
    elif allow_row and opt_flags.use_cast_rowcol(8192, 8192, rowwise, columnwise, block_2d, cfg.per_token,
                                               cfg.four_over_six, cfg.rht, cfg.stochastic_rounding, steps is not None,
                                               False, True, True, (False, False)):
        meta = opt_flags.cast_rowcol_meta(8192, 8192, cfg.scale_layout, block_m=tile[0] if tile else 0, **explicit)
        meta["HW"] = True
        fn, bm, bk = cast_rowcol.cast_rowcol_kernel, 16 * meta["GROUPS"], meta["QB"] * 16
    elif allow_row and opt_flags.use_cast_row(8192, 8192, rowwise, columnwise, block_2d, cfg.per_token, cfg.four_over_six,
                                            cfg.stochastic_rounding, steps is not None, False, True, True,
                                            split=side is not None, tables_shared=cfg.rht and cfg.stochastic_rounding):
        meta = opt_flags.cast_row_meta(8192, 8192, cfg.scale_layout, cfg.per_token, cfg.e4m3_max,
                                       cfg.stochastic_rounding, cfg.stochastic_rounding,
                                       block_m=tile[0] if tile else 0, **explicit, operand=operand)
        meta["HW"] = True
        fn, bm, bk = cast_row.cast_row_kernel, meta["BLOCK_M"], meta["KB"] * 16
    elif opt_flags.use_cast16(cfg.four_over_six):
        meta = opt_flags.cast16_meta(8192, 8192, rowwise, columnwise, block_2d, cfg.per_token,
                                     cfg.rht_sign_mask if cfg.rht else -1, cfg.e4m3_max, cfg.stochastic_rounding,
                                     cfg.stochastic_rounding, cfg.scale_layout, split_steps=steps,
                                     block_m=tile[0] if tile else 0, **explicit, row_operand=row_operand)
        fn, bm, bk = cast16.cast16_kernel, 16 * meta["GROUPS"], meta["BLOCK_K"]
    elif opt_flags.use_four_over_six_1x16(8192, 8192, rowwise, columnwise, block_2d, steps is not None, True, True):
        if rowwise and columnwise:
            raise SystemExit("four_over_six_1x16_kernel casts one output per launch: pass --side row or --side col")
        meta = opt_flags.four_over_six_1x16_meta(8192, 8192, columnwise, cfg.per_token,
                                                 FOUR_OVER_SIX_CODES[cfg.four_over_six], cfg.e4m3_max, cfg.scale_layout,
                                                 block_m=tile[0] if tile else 0, **explicit)
        fn = four_over_six.four_over_six_1x16_kernel
        bm, bk = meta["BLOCK_M"], meta["BLOCK_W"] * (2 if columnwise else 16)
    else:
        meta = opt_flags.four_over_six_meta(8192, 8192, rowwise, columnwise, block_2d, cfg.per_token,
                                            FOUR_OVER_SIX_CODES[cfg.four_over_six], cfg.e4m3_max, cfg.scale_layout,
                                            split_steps=steps, block_m=tile[0] if tile else 0, **explicit)
        fn, bm, bk = four_over_six.four_over_six_kernel, 16, meta["BLOCK_K"]
    warps = meta["num_warps"]
    words = (cast_row.cast_row_kernel, cast_col.cast_col_kernel, cast_rowcol.cast_rowcol_kernel,
             four_over_six.four_over_six_1x16_kernel)
    pointers = dict(x_ptr="*i32" if fn in words else "*bf16", data_ptr="*i32", scale_ptr="*u8",
                    table_ptr="*fp32", amax_ptr="*fp32",
                    row_data_ptr="*i16" if fn is cast_rowcol.cast_rowcol_kernel else "*i32", row_scale_ptr="*u8", col_data_ptr="*i32", col_scale_ptr="*u8", stage_ptr="*i32",
                    row_amax_ptr="*fp32", col_amax_ptr="*fp32", seed_ptr="*i64", offsets_ptr="*i64",
                    group_split_ptr="*i32")
    scalars = dict(seed_value="i64", M="i32", K="i32", M_WORDS="i32", num_splits="i32")
    sig = {n: pointers.get(n) or scalars.get(n) or "constexpr" for n in fn.arg_names}
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in pointers if n in fn.arg_names}
    attrs.update({(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in ("M", "K", "M_WORDS") if n in fn.arg_names})
    src = triton.compiler.ASTSource(fn=fn, signature=sig, attrs=attrs,
                                    constexprs={(fn.arg_names.index(k),): v for k, v in opt_flags.constexprs(meta).items()})
    options = dict(num_warps=warps, enable_fp_fusion=False)
    if "maxnreg" in meta:  # the cap the launcher uses
        options["maxnreg"] = meta["maxnreg"]
    if MAXNREG:
        options["maxnreg"] = MAXNREG
    c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    return c, (bm, bk, warps)


def compile_amax(kwargs, tile=None):
    """Compile the recipe's amax pass for sm_90 (``amax_rht_col_kernel`` where the launcher takes it, else
    ``amax_kernel``); returns the compiled kernel and (rows, columns, warps) of the elements one pass of its loop body
    covers (``amax_rht_col_kernel``'s group loop is not unrolled: one 16-row group)."""
    cfg = NVFP4QuantConfig(**kwargs)
    row_mode, col_mode = amax_modes(cfg, None, None)
    mask = cfg.rht_sign_mask if cfg.rht else 0
    explicit = dict(block_m=tile[0], block_k=tile[1], num_warps=tile[2]) if tile else {}
    if opt_flags.use_amax_rht_col(8192, 8192, row_mode, col_mode, True, True):
        meta = opt_flags.amax_rht_col_meta(8192, 8192, row_mode, mask, **explicit)
        meta["HW"] = True
        fn, rows, cols, x_type = amax.amax_rht_col_kernel, 16, 2 * meta["BLOCK_C"], "*i32"
    else:
        meta = opt_flags.amax_meta(8192, 8192, row_mode, col_mode, mask, **explicit)
        meta["SOFT_BF16"] = False
        fn, rows, cols, x_type = amax.amax_kernel, meta["BLOCK_M"] * meta["STEPS_M"], meta["BLOCK_K"], "*bf16"
    meta.setdefault("FINAL_BLOCK", 1024)
    pointers = dict(x_ptr=x_type, scratch_ptr="*i32", row_out_ptr="*fp32", col_out_ptr="*fp32", sums_ptr="*fp32")
    sig = {n: pointers.get(n) or ("i32" if n in ("M", "K", "N_ROW", "N_COL") else "constexpr") for n in fn.arg_names}
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in (*pointers, "M", "K")}
    src = triton.compiler.ASTSource(fn=fn, signature=sig, attrs=attrs,
                                    constexprs={(fn.arg_names.index(k),): v for k, v in opt_flags.constexprs(meta).items()})
    c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=meta["num_warps"], enable_fp_fusion=False))
    return c, (rows, cols, meta["num_warps"])


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


def layouts(ttgir: str) -> list[str]:
    """One line per global load / store (tensor shape, layout) and the kernel's conversion / shared-memory counts."""
    defs = dict(re.findall(r"^(#\w+) = (#ttg\.\w+<.*>)$", ttgir, re.M))
    lines = []
    for op, shape, name in re.findall(r"(tt\.load|tt\.store) .*?: tensor<([0-9x]+)x!tt\.ptr<\w+>, (#\w+)>", ttgir):
        layout = defs.get(name, name)
        fields = re.findall(r"(sizePerThread|threadsPerWarp|warpsPerCTA|order) = (\[[0-9, ]+\])", layout)
        lines.append(f"{op[3:]:5s} {shape:>12s}  " + (" ".join(f"{k}={v}" for k, v in fields) or layout[:120]))
    lines.append(f"convert_layout: {ttgir.count('ttg.convert_layout')}, local_alloc: {ttgir.count('ttg.local_alloc')}")
    return lines


_cast_groups = cast_col._cast_groups


@triton.jit
def _normal_groups(x_ptr, data_ptr, scale_ptr, s_enc_sixth, s_dec, table_ptr, seed, wc, c_ok, g0, kw, m_blocks, m_words,
                   LAYOUT: tl.constexpr, GROUPS: tl.constexpr, HW: tl.constexpr, RHT_MASK: tl.constexpr,
                   SATURATE: tl.constexpr, TABLE: tl.constexpr, SR: tl.constexpr, OPERAND: tl.constexpr):
    """``cast_col._cast_groups`` for ``--normal-only``: the normal-range pass only. ``cast_col_kernel`` casts a program
    again (SATURATE) when the first pass found a non-finite result, a flag known at run time only, so that pass stays
    in the build unless it is dropped here."""
    worst = False
    if not SATURATE:
        worst = _cast_groups(x_ptr, data_ptr, scale_ptr, s_enc_sixth, s_dec, table_ptr, seed, wc, c_ok, g0, kw,
                             m_blocks, m_words, LAYOUT, GROUPS, HW, RHT_MASK, SATURATE, TABLE, SR, OPERAND)
    return worst


def main():
    p = argparse.ArgumentParser()
    p.add_argument("recipes", nargs="*", default=["row", "rowcol"])
    p.add_argument("--tile", default=None, help="BMxBKxWARPS")
    p.add_argument("--dump", default=None)
    p.add_argument("--side", choices=("row", "col"), default=None,
                   help="one output only (the two launches of a split row+col cast)")
    p.add_argument("--grouped", type=int, default=0, metavar="STEPS",
                   help="the grouped (MoE) cast with 2^STEPS splits (kernels/grouped_quantize.py)")
    p.add_argument("--cast16", action="store_true",
                   help="cast16_kernel also for the casts the launcher gives cast_row_kernel or cast_rowcol_kernel")
    p.add_argument("--normal-only", action="store_true",
                   help="compile only the normal-range path (what runs on ordinary data): drops the EXACT branch")
    p.add_argument("--amax", action="store_true", help="the recipe's amax pass instead of its cast")
    p.add_argument("--row-operand", action="store_true",
                   help="cast16_kernel writing the rowwise side as the BF16 GEMM operand (ROW_OPERAND)")
    p.add_argument("--operand", action="store_true",
                   help="cast_row_kernel / cast_col_kernel writing the BF16 GEMM operand (OPERAND; with --side)")
    p.add_argument("--layouts", action="store_true",
                   help="each global load / store's shape and lane layout, and the conversions (see the docstring)")
    a = p.parse_args()
    if a.normal_only:
        @triton.jit
        def _always(outer):
            return True

        cast16.normal_range = _always
        cast_col.normal_range = _always
        cast_col._cast_groups = _normal_groups  # not the pass that casts a program again (non-finite results)
        four_over_six.normal_range = _always

        @triton.jit
        def _fast_path(outer, E6: tl.constexpr):
            return 2

        four_over_six.tile_path = _fast_path  # four_over_six_1x16_kernel: normal range, signs from x
        pt_scales.normal_range_pt = _always  # per token: the tables' range flag
    tile = tuple(int(v) for v in a.tile.split("x")) if a.tile else None
    for name in a.recipes:
        if a.amax:
            c, (bm, bk, warps) = compile_amax(RECIPES[name], tile)
        else:
            c, (bm, bk, warps) = compile_cast(RECIPES[name], tile, a.side, a.grouped, allow_row=not a.cast16,
                                              row_operand=a.row_operand, operand=a.operand)
        sass = sass_of(c.asm["cubin"])
        ops = stats(sass)
        total = sum(v for k, v in ops.items() if k not in ("NOP",))
        per_elem = total / (bm * bk / (32 * warps))
        print(f"{name:9s} tile {bm}x{bk}x{warps}: {resources(c.asm['cubin'])} | SASS {total} instr/thread = {per_elem:.1f} per element")
        print("   ", ", ".join(f"{k}:{v}" for k, v in ops.most_common(22)))
        if a.layouts:
            print("\n".join("    " + line for line in dict.fromkeys(layouts(c.asm["ttgir"]))))
        if a.dump:
            os.makedirs(a.dump, exist_ok=True)
            open(os.path.join(a.dump, f"{name}.sass"), "w").write(sass)
            open(os.path.join(a.dump, f"{name}.ttgir"), "w").write(c.asm["ttgir"])
            open(os.path.join(a.dump, f"{name}.ptx"), "w").write(c.asm["ptx"])


if __name__ == "__main__":
    sys.exit(main())

"""Static SASS statistics of the MXFP8 quantize and NVFP4 dequantize kernels, built for sm_90 on any machine.

The launcher of each case is called with meta tensors; the kernel launch it makes is captured and
compiled with the same constexprs, num_warps and the runtime's divisibility-by-16 specialisation, so
what is counted is what the launcher would run at that shape. Prints registers, spills and SASS
instructions per thread and per element, with the ALU-pipe share (on sm_90 the integer ALU pipe issues
half as fast as the fp32 pipe).

    python tools/sass_kernels.py [case ...] [--shape 8192x8192] [--tile RxCxW] [--dump DIR]
    cases: mx-row mx-col mx-both mx-col-hw mx-both-hw dq-row dq-col dq-col-tok dq-col-f32 dq-row-tok
           dq-row-f32 (default: all)
"""
import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

os.environ["TRITON_INTERPRET"] = "0"
import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

from nvfp4lab.kernels import dequantize as dq  # noqa: E402
from nvfp4lab.kernels import mxfp8 as mk  # noqa: E402

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
_PTR = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32", torch.uint8: "*u8", torch.int32: "*i32"}
# opcodes issued to the integer ALU pipe on sm_90 (half the fp32 pipe's width)
_ALU = {"LOP3", "SHF", "IADD3", "ISETP", "FSETP", "FMNMX", "IMNMX", "VIMNMX", "SEL", "FSEL", "PRMT", "LEA", "MOV",
        "IABS", "FLO", "POPC", "BMSK", "SGXT", "PLOP3", "I2FP", "F2FP", "LOP", "R2P", "P2R"}


class _Capture:
    def __init__(self, fn):
        self.fn, self.calls = fn, []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.calls.append((grid, args, kwargs))
        return launch


def _capture(module, run):
    """Run ``run`` with every Triton kernel of ``module`` replaced by a recorder; returns the last
    launch as (kernel, (grid, args, kwargs))."""
    saved = {n: v for n, v in vars(module).items() if isinstance(v, triton.runtime.JITFunction)}
    caps = {n: _Capture(v) for n, v in saved.items()}
    for n, cap in caps.items():
        setattr(module, n, cap)
    try:
        run()
    finally:
        for n, v in saved.items():
            setattr(module, n, v)
    (cap,) = [c for c in caps.values() if c.calls]
    return cap.fn, cap.calls[-1]


def _compile(fn, args, kwargs):
    kwargs = dict(kwargs)
    num_warps = kwargs.pop("num_warps", 4)
    names = fn.arg_names
    sig, attrs, consts = {}, {}, {}
    for i, name in enumerate(names):
        if name in kwargs:
            sig[name] = "constexpr"
            consts[(i,)] = kwargs[name]
            continue
        v = args[i]
        if isinstance(v, torch.Tensor):
            sig[name] = _PTR[v.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(v, bool):
            sig[name] = "i1"
        elif isinstance(v, int):
            sig[name] = "i64" if abs(v) >= 2**31 else "i32"
            if v % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[name] = "fp32"
    src = triton.compiler.ASTSource(fn=fn, signature=sig, attrs=attrs, constexprs=consts)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps)), num_warps


def _mx_case(rows, cols, rowwise, colwise, cast, tile=None):
    x = torch.empty(rows, cols, dtype=torch.bfloat16, device="meta")
    shapes = mk.scale_shapes(rows, cols, "compact")
    u8 = dict(dtype=torch.uint8, device="meta")
    outs = (torch.empty(rows, cols, **u8) if rowwise else None, torch.empty(shapes[0], **u8) if rowwise else None,
            torch.empty(rows, cols, **u8) if colwise else None, torch.empty(shapes[1], **u8) if colwise else None)

    def run():
        block_rows, block_cols, num_warps = tile or (None, None, None)
        mk.launch_mxfp8_quantize(x, *outs, fp8_format="e4m3", scale_layout="compact", fp8_cast="soft",
                                 block_rows=block_rows, block_cols=block_cols, num_warps=num_warps)

    fn, (grid, args, kwargs) = _capture(mk, run)
    if cast == "hw":
        kwargs = dict(kwargs, HW_CAST=True)
    return fn, grid, args, kwargs, rows * cols


def _dq_case(rows, cols, transpose, tile=None, per_token=False, dtype=torch.bfloat16):
    # Q is (rows, cols) = x^T for the columnwise copy
    data = torch.empty(rows, cols // 2, dtype=torch.uint8, device="meta")
    scale = torch.empty(rows, cols // 16, dtype=torch.uint8, device="meta")
    amax = torch.empty(rows if per_token else 1, dtype=torch.float32, device="meta")
    out = torch.empty((cols, rows) if transpose else (rows, cols), dtype=dtype, device="meta")

    def run():
        block_rows, block_cols, num_warps = tile or (None, None, None)
        dq.launch_nvfp4_dequantize(data, scale, amax, out, scale_layout="swizzled", e4m3_max=448.0, transpose=transpose,
                                   block_rows=block_rows, block_cols=block_cols, num_warps=num_warps)

    fn, (grid, args, kwargs) = _capture(dq, run)
    kwargs = dict(kwargs, SOFT_BF16=False)  # the GPU's bf16 cast
    return fn, grid, args, kwargs, rows * cols


CASES = {
    "mx-row": lambda m, k, t: _mx_case(m, k, True, False, "soft", t),
    "mx-col": lambda m, k, t: _mx_case(m, k, False, True, "soft", t),
    "mx-both": lambda m, k, t: _mx_case(m, k, True, True, "soft", t),
    "mx-col-hw": lambda m, k, t: _mx_case(m, k, False, True, "hw", t),
    "mx-both-hw": lambda m, k, t: _mx_case(m, k, True, True, "hw", t),
    "dq-row": lambda m, k, t: _dq_case(m, k, False, t),
    "dq-col": lambda m, k, t: _dq_case(k, m, True, t),
    "dq-col-tok": lambda m, k, t: _dq_case(k, m, True, t, per_token=True),
    "dq-col-f32": lambda m, k, t: _dq_case(k, m, True, t, dtype=torch.float32),
    "dq-row-tok": lambda m, k, t: _dq_case(m, k, False, t, per_token=True),
    "dq-row-f32": lambda m, k, t: _dq_case(m, k, False, t, dtype=torch.float32),
}


def _tool(name, cubin, *flags):
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([os.path.join(BIN, name), *flags, f.name], capture_output=True, text=True, check=True).stdout


def main():
    p = argparse.ArgumentParser()
    p.add_argument("cases", nargs="*", default=list(CASES))
    p.add_argument("--shape", default="8192x8192", help="x's shape MxK")
    p.add_argument("--tile", default=None, help="the launcher's block_rows x block_cols x num_warps overrides, e.g. 1x128x4")
    p.add_argument("--finite-only", action="store_true",
                   help="MXFP8: compile only the path for tiles whose maxima are all finite (what ordinary data runs)")
    p.add_argument("--dump", default=None, help="write .sass / .ttgir / .ptx per case here")
    a = p.parse_args()
    m, k = (int(v) for v in a.shape.split("x"))
    if a.finite_only:
        @triton.jit
        def _always(abs_bits):
            return True

        mk.all_finite = _always
    for name in a.cases:
        tile = tuple(int(v) for v in a.tile.split("x")) if a.tile else None
        fn, grid, args, kwargs, elements = CASES[name](m, k, tile)
        c, warps = _compile(fn, args, kwargs)
        cubin = c.asm["cubin"]
        sass = _tool("nvdisasm", cubin, "-c")
        res = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", _tool("cuobjdump", cubin, "-res-usage"))
        ops = collections.Counter()
        for line in sass.splitlines():
            mt = re.match(r"\s*/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", line)
            if mt:
                ops[mt.group(2).split(".")[0]] += 1
        ops.pop("NOP", None)
        total = sum(ops.values())
        alu = sum(v for op, v in ops.items() if op in _ALU)
        programs = grid[0] if isinstance(grid, tuple) else grid
        per_thread = elements / (programs * 32 * warps)
        print(f"{name:10s} grid {programs} x {warps} warps, {per_thread:.0f} elem/thread: regs {res.group(1)} "
              f"stack {res.group(2)} smem {c.metadata.shared} local {res.group(4)} | SASS {total} = "
              f"{total / per_thread:.2f}/elem (ALU pipe {alu / per_thread:.2f}/elem)")
        print("   ", ", ".join(f"{op}:{v}" for op, v in ops.most_common(24)))
        if a.dump:
            os.makedirs(a.dump, exist_ok=True)
            for ext, text in (("sass", sass), ("ttgir", c.asm["ttgir"]), ("ptx", c.asm["ptx"])):
                with open(os.path.join(a.dump, f"{name}.{ext}"), "w") as f:
                    f.write(text)


if __name__ == "__main__":
    sys.exit(main())

"""NVFP4 x NVFP4 GEMM for Hopper (and the Triton interpreter): ``out = A @ B^T``, dense and grouped (MoE).

Operands (both K-major, cuBLAS "TN"; the rowwise copies of two :class:`~nvfp4lab.NVFP4Tensor`)::

    A data  uint8 (M, K/2)        two E2M1 codes per byte, element 2j in the low nibble
    A scale uint8 E4M3            compact (M, K/16) | padded / swizzled (roundup(M,128), roundup(K/16,4))
    A amax  fp32 (1,) | (M,)      per tensor | per token (row of A)
    B       the same with N rows (grouped: E*N rows, expert e owns rows e*N..e*N+N-1); B amax
            (1,) | (E,) per expert | (E*N,) per row (output channel)

Dense GEMMs also take either operand as an :class:`~nvfp4lab.NVFP4Operand` (BF16 q * s (rows, K) in K order,
written by the cast itself; layout name :data:`.nvfp4_gemm_details.common.EXPANDED`): such a product runs
the dequant_mm path, which then expands only the packed operand, in K order. Grouped GEMMs with host split sizes
take them too (A's values (M, K), B's stacked (E, N, K)).

Numerics (spec section 12, :mod:`nvfp4lab.ref.gemm`)::

    acc[i, j]   = sum_k (q_a * s_a)[i, k] * (q_b * s_b)[j, k]            fp32 (tensor-core order)
    alpha[i, j] = fl(fl(amax_a[i] * amax_b[j]) * fl(1/(36 E_a E_b)))     in the epilogue, per element
    out         = out_dtype(fl(fl(acc * alpha) + bias[j]) + out_old)     bias / out_old optional

Operands with PR 3045's numerics (``pr3045``) take its epilogue order instead,
fl(fl(fl(amax_a[i] * acc) * amax_b[j]) * fl(1/7225344)) (``EPI_PR3045``, :mod:`nvfp4lab.ref.gemm`).

Every product of an E2M1 value (2 significant bits) and an E4M3 scale (4 bits, 2^-9..448) is an FP16
normal number in [2^-10, 2688] or zero, so expanding the operands to FP16 q * s is exact and the tensor
core forms exactly the block products of Blackwell's FP4 MMA; only the fp32 summation order differs,
which the golden tolerance allows. FP16 rather than BF16: same tensor-core rate, and the Triton
interpreter computes FP16 dots in fp32 while it mis-handles BF16 operands. E4M3 scales decode exactly
(0x7F / 0xFF give NaN, as in the reference), a zero scale gives zeros.

Three paths (private modules in :mod:`.nvfp4_gemm_details`, chosen by :func:`.opt_flags.resolve_config`
from M, the GPU and, for grouped GEMMs, whether the split sizes are known on the host):

* :mod:`~.nvfp4_gemm_details.fused`: decodes both operands per tile in registers (dense and grouped;
  for large M, B expanded to FP16 once and only A decoded per tile);
* :mod:`~.nvfp4_gemm_details.stream`: dense, M <= 64, a weight stream with K split over programs;
* :mod:`~.nvfp4_gemm_details.dequant_mm`: large M, both operands expanded (exact), cuBLAS: with its own
  epilogue and a device alpha (:mod:`~.nvfp4_gemm_details.cublaslt`) where alpha is one number per product,
  else fp32 output and an epilogue kernel (grouped with host split sizes: per expert).

Decoders (``decode``): 1, PTX inline asm (the GPU's; its text is run by a PTX emulator in the tests);
0, portable bit placement (the interpreter's, or where a tile does not fit the PTX decoder's packing).

Constraints: K % 16 == 0 (whole scale blocks); BLOCK_K a multiple of 64; out may be strided.
Public launchers: the ``torch.library`` custom ops ``nvfp4lab::nvfp4_gemm``, ``nvfp4_gemm_out``,
``nvfp4_grouped_gemm``, ``nvfp4_grouped_gemm_out``, ``nvfp4_grouped_wgrad`` (MoE weight gradients:
per expert a product over its own tokens, from bulk columnwise copies) and ``nvfp4_expand_rowwise`` (a rowwise
copy's BF16 operand, :func:`expand_rowwise`); fake impls for torch.compile,
wrapped by :func:`nvfp4_gemm`, :func:`nvfp4_grouped_gemm` and :func:`nvfp4_grouped_wgrad`; :func:`run`
and :func:`grouped_wgrad` launch directly (tests, tuning) and take the path's config and the decoder as
arguments.
"""
from __future__ import annotations

from typing import List, Optional

import torch

from ..tensors import NVFP4Operand
from .formats import soft_bf16_loads
from .launch import custom_op, tracing
from .nvfp4_gemm_details import dequant_mm, fused, opt_flags, stream
from .nvfp4_gemm_details.common import EXPANDED, gemm_inv, operand
from .nvfp4_gemm_details.opt_flags import GemmConfig

__all__ = ["GemmConfig", "expand_rowwise", "expand_rule", "grouped_wgrad", "nvfp4_gemm", "nvfp4_grouped_gemm",
           "nvfp4_grouped_wgrad", "run", "takes_expanded_by_rule"]


def _launch(
    a_data, a_scale, a_layout, a_amax, b_data, b_scale, b_layout, b_amax, offs, bias, out,
    *, m, n, k, num_experts, e_max_a, e_max_b, accumulate, grouped, config=None, decode=None, splits=None,
    pr3045=False, a_per_expert=False,
):
    """Dispatch one GEMM to its path (see the module docstring) and return ``out``."""
    device = a_data.device
    a = operand(a_data, a_scale, a_layout, a_amax, k)
    b = operand(b_data, b_scale, b_layout, b_amax, k)
    if b.amax.numel() == 1:
        b_mode = 0
    elif b.amax.numel() == num_experts * n and n != 1:
        b_mode = 2
    else:
        b_mode = 1
    if bias is None:
        bias_mode = 0
    else:
        bias_mode = 2 if bias.dim() == 2 else 1
        bias = bias.contiguous()
    if decode is None:
        decode = opt_flags.default_decode(device)
    inv_e = gemm_inv(e_max_a, e_max_b)
    config = opt_flags.resolve_config(config, m, n, k, num_experts, grouped, splits is not None, device)
    if a.expanded or b.expanded:
        if grouped and splits is None:
            raise ValueError("a grouped GEMM takes operands given expanded (NVFP4Operand) with host split sizes")
        if not config.dequant_mm:
            config = opt_flags.dequant_config(device)
    if grouped and config.dequant_mm:  # host split sizes: per-expert cuBLAS GEMMs on expanded operands
        return dequant_mm.grouped_gemm(a, b, bias, out, offs, b_mode, bias_mode, bool(accumulate), splits, n, k, inv_e,
                                       config, decode, pr3045=bool(pr3045), a_per_expert=bool(a_per_expert))
    flags = dict(A_AMAX_ROWS=a.amax.numel() != 1 and not a_per_expert, B_AMAX_MODE=b_mode, BIAS_MODE=bias_mode,
                 ACCUMULATE=bool(accumulate), OUT_BF16=out.dtype == torch.bfloat16, SOFT_BF16=soft_bf16_loads(device),
                 EPI_PR3045=bool(pr3045))
    if a_per_expert:
        flags["A_AMAX_EXPERT"] = True
    bias_arg = bias if bias is not None else a.amax  # a stand-in pointer that BIAS_MODE=0 never reads
    if config.stream:
        return stream.gemm(a, b, bias_arg, out, flags, m, n, k, inv_e, config, decode)
    if config.dequant_mm:
        return dequant_mm.gemm(a, b, bias_arg, out, flags, m, n, k, inv_e, config, decode)
    return fused.gemm(a, b, bias_arg, out, offs if offs is not None else a.amax, flags, m, n, k, num_experts, inv_e,
                      grouped, config, decode)


# ------------------------------------------------------------------- torch.library custom ops
# Tensors and plain values only (an NVFP4Tensor is unpacked by the Python wrappers below), so that
# torch.compile (fullgraph) and CUDA graphs see opaque ops with shape-only fake implementations.
@custom_op("nvfp4lab::nvfp4_gemm", mutates_args=())
def _gemm_op(
    a_data: torch.Tensor, a_scale: torch.Tensor, a_amax: torch.Tensor, a_layout: str, e_max_a: float,
    b_data: torch.Tensor, b_scale: torch.Tensor, b_amax: torch.Tensor, b_layout: str, e_max_b: float,
    bias: Optional[torch.Tensor], k: int, out_dtype: torch.dtype, pr3045: bool = False,
) -> torch.Tensor:
    """``a @ b^T`` into a new (M, N) tensor through the eager calls' plan (:func:`_dense_gemm`)."""
    return _dense_gemm(a_data, a_scale, a_amax, a_layout, e_max_a, b_data, b_scale, b_amax, b_layout, e_max_b, bias,
                       k, out_dtype, pr3045)


@_gemm_op.register_fake
def _(a_data, a_scale, a_amax, a_layout, e_max_a, b_data, b_scale, b_amax, b_layout, e_max_b, bias, k, out_dtype,
      pr3045=False):
    return a_data.new_empty((a_data.shape[0], b_data.shape[0]), dtype=out_dtype)


@custom_op("nvfp4lab::nvfp4_gemm_out", mutates_args=("out",))
def _gemm_out_op(
    a_data: torch.Tensor, a_scale: torch.Tensor, a_amax: torch.Tensor, a_layout: str, e_max_a: float,
    b_data: torch.Tensor, b_scale: torch.Tensor, b_amax: torch.Tensor, b_layout: str, e_max_b: float,
    bias: Optional[torch.Tensor], k: int, out: torch.Tensor, accumulate: bool, pr3045: bool = False,
) -> None:
    _launch(a_data, a_scale, a_layout, a_amax, b_data, b_scale, b_layout, b_amax, None, bias, out,
            m=a_data.shape[0], n=b_data.shape[0], k=k, num_experts=1, e_max_a=e_max_a, e_max_b=e_max_b,
            accumulate=accumulate, grouped=False, pr3045=pr3045)


@_gemm_out_op.register_fake
def _(a_data, a_scale, a_amax, a_layout, e_max_a, b_data, b_scale, b_amax, b_layout, e_max_b, bias, k, out, accumulate,
      pr3045=False):
    return None


def _expert_rows(b_data: torch.Tensor, num_experts: int) -> int:
    """N of a grouped GEMM's B: E*N rows of packed codes, or expanded values stacked (E, N, K)."""
    return b_data.shape[1] if b_data.dim() == 3 else b_data.shape[0] // num_experts


@custom_op("nvfp4lab::nvfp4_grouped_gemm", mutates_args=())
def _grouped_op(
    a_data: torch.Tensor, a_scale: torch.Tensor, a_amax: torch.Tensor, a_layout: str, e_max_a: float,
    b_data: torch.Tensor, b_scale: torch.Tensor, b_amax: torch.Tensor, b_layout: str, e_max_b: float,
    offs: torch.Tensor, num_experts: int, bias: Optional[torch.Tensor], k: int, out_dtype: torch.dtype,
    splits: Optional[List[int]] = None, pr3045: bool = False, a_per_expert: bool = False,
) -> torch.Tensor:
    m, n = a_data.shape[0], _expert_rows(b_data, num_experts)
    out = torch.empty((m, n), dtype=out_dtype, device=a_data.device)
    return _launch(a_data, a_scale, a_layout, a_amax, b_data, b_scale, b_layout, b_amax, offs, bias, out,
                   m=m, n=n, k=k, num_experts=num_experts, e_max_a=e_max_a, e_max_b=e_max_b,
                   accumulate=False, grouped=True, splits=splits, pr3045=pr3045, a_per_expert=a_per_expert)


@_grouped_op.register_fake
def _(a_data, a_scale, a_amax, a_layout, e_max_a, b_data, b_scale, b_amax, b_layout, e_max_b, offs, num_experts,
      bias, k, out_dtype, splits=None, pr3045=False, a_per_expert=False):
    return a_data.new_empty((a_data.shape[0], _expert_rows(b_data, num_experts)), dtype=out_dtype)


@custom_op("nvfp4lab::nvfp4_grouped_gemm_out", mutates_args=("out",))
def _grouped_out_op(
    a_data: torch.Tensor, a_scale: torch.Tensor, a_amax: torch.Tensor, a_layout: str, e_max_a: float,
    b_data: torch.Tensor, b_scale: torch.Tensor, b_amax: torch.Tensor, b_layout: str, e_max_b: float,
    offs: torch.Tensor, num_experts: int, bias: Optional[torch.Tensor], k: int, out: torch.Tensor,
    accumulate: bool, splits: Optional[List[int]] = None, pr3045: bool = False, a_per_expert: bool = False,
) -> None:
    _launch(a_data, a_scale, a_layout, a_amax, b_data, b_scale, b_layout, b_amax, offs, bias, out,
            m=a_data.shape[0], n=_expert_rows(b_data, num_experts), k=k, num_experts=num_experts,
            e_max_a=e_max_a, e_max_b=e_max_b, accumulate=accumulate, grouped=True, splits=splits, pr3045=pr3045,
            a_per_expert=a_per_expert)


@_grouped_out_op.register_fake
def _(a_data, a_scale, a_amax, a_layout, e_max_a, b_data, b_scale, b_amax, b_layout, e_max_b, offs, num_experts,
      bias, k, out, accumulate, splits=None, pr3045=False, a_per_expert=False):
    return None


def _wgrad_parts(data, scale, rows: int, splits):
    """Per split (rows, m_e) views of a bulk columnwise copy (flat data / scales, split e at rows * off_e / 2 and
    rows * off_e / 16), None for empty splits."""
    parts, off = [], 0
    for m_e in splits:
        if m_e == 0:
            parts.append(None)
        else:
            parts.append((data[rows * off // 2:rows * (off + m_e) // 2].view(rows, m_e // 2),
                          scale[rows * off // 16:rows * (off + m_e) // 16].view(rows, m_e // 16)))
        off += m_e
    return parts


def _amax_mode(amax: torch.Tensor, num: int, rows: int) -> int:
    """1: one amax per expert, 2: one per (expert, row)."""
    return 1 if amax.numel() == num else 2


def grouped_wgrad(a_data, a_scale, a_amax, e_max_a, b_data, b_scale, b_amax, e_max_b, offs, splits, n_a, n_b, out,
                  pr3045=False, config=None, decode=None):
    """out[e] (n_a, n_b) = A_e @ B_e^T for bulk columnwise copies split alike (see :func:`_grouped_wgrad_op`);
    ``config`` / ``decode`` as in :func:`run` (a dequant_mm config: one split-K expansion, per-expert cuBLAS,
    one epilogue; another: one dense launch per expert)."""
    device = out.device
    num = len(splits)
    a_amax = a_amax.reshape(-1).to(torch.float32)
    b_amax = b_amax.reshape(-1).to(torch.float32)
    a_mode, b_mode = _amax_mode(a_amax, num, n_a), _amax_mode(b_amax, num, n_b)
    if decode is None:
        decode = opt_flags.default_decode(device)
    config = opt_flags.resolve_config(config, n_a, n_b, max(splits), 1, False, False, device)
    if config.dequant_mm:
        return dequant_mm.grouped_wgrad(a_data, a_scale, a_amax, b_data, b_scale, b_amax, offs, splits, a_mode, b_mode,
                                        out, n_a, n_b, gemm_inv(e_max_a, e_max_b), config, decode, pr3045=bool(pr3045))
    a_parts = _wgrad_parts(a_data, a_scale, n_a, splits)
    b_parts = _wgrad_parts(b_data, b_scale, n_b, splits)
    for e, (pa, pb) in enumerate(zip(a_parts, b_parts)):
        if pa is None:
            out[e].zero_()
            continue
        amax_a = a_amax[e:e + 1] if a_mode == 1 else a_amax[e * n_a:(e + 1) * n_a]
        amax_b = b_amax[e:e + 1] if b_mode == 1 else b_amax[e * n_b:(e + 1) * n_b]
        _launch(pa[0], pa[1], "compact", amax_a, pb[0], pb[1], "compact", amax_b, None, None, out[e],
                m=n_a, n=n_b, k=2 * pa[0].shape[1], num_experts=1, e_max_a=e_max_a, e_max_b=e_max_b,
                accumulate=False, grouped=False, config=config, decode=decode, pr3045=pr3045)
    return out


@custom_op("nvfp4lab::nvfp4_grouped_wgrad", mutates_args=())
def _grouped_wgrad_op(
    a_data: torch.Tensor, a_scale: torch.Tensor, a_amax: torch.Tensor, e_max_a: float,
    b_data: torch.Tensor, b_scale: torch.Tensor, b_amax: torch.Tensor, e_max_b: float,
    offs: torch.Tensor, splits: List[int], n_a: int, n_b: int, out_dtype: torch.dtype, pr3045: bool = False,
) -> torch.Tensor:
    """(E, n_a, n_b) with out[e] = A_e @ B_e^T: A, B the bulk columnwise copies of two grouped tensors
    split alike (``offs`` their int64 (E + 1,) device split offsets, ``splits`` the host sizes, multiples
    of 16): flat data (rows * M / 2,) and compact scales (rows * M / 16,), split e a (rows, m_e) matrix;
    amax (E,) per split or (E, rows) per row."""
    out = torch.empty((len(splits), n_a, n_b), dtype=out_dtype, device=a_data.device)
    return grouped_wgrad(a_data, a_scale, a_amax, e_max_a, b_data, b_scale, b_amax, e_max_b, offs, splits, n_a, n_b,
                         out, pr3045)


@_grouped_wgrad_op.register_fake
def _(a_data, a_scale, a_amax, e_max_a, b_data, b_scale, b_amax, e_max_b, offs, splits, n_a, n_b, out_dtype,
      pr3045=False):
    return a_data.new_empty((len(splits), n_a, n_b), dtype=out_dtype)


def nvfp4_grouped_wgrad(a, b, splits, *, out_dtype=torch.bfloat16):
    """Per split ``a_e^T b_e`` of two grouped tensors' columnwise copies (checked by
    :func:`nvfp4lab.ops.nvfp4_grouped_wgrad`): (E, N, K)."""
    n_a, n_b = int(a.shape[-1]), int(b.shape[-1])
    return _grouped_wgrad_op(a.columnwise_data, a.columnwise_scale, a.columnwise_amax, float(a.config.e4m3_max),
                             b.columnwise_data, b.columnwise_scale, b.columnwise_amax, float(b.config.e4m3_max),
                             a.split_offsets, [int(s) for s in splits], n_a, n_b, out_dtype, _pr3045(a, b))


def run(a, b, out, *, bias=None, accumulate=False, offs=None, num_experts=1, config=None, decode=None, splits=None):
    """Direct launch without the custom op, for tests and tuning: writes ``out`` (M, N) and returns it.
    ``config`` (a :class:`GemmConfig`: tiles and path) and ``decode`` (0 portable, 1 PTX) override the
    defaults of :mod:`.nvfp4_gemm_details.opt_flags`; ``splits``: the grouped GEMM's host split sizes (a
    ``dequant_mm`` config then takes the per-expert cuBLAS path)."""
    grouped = offs is not None
    return _launch(a.rowwise_data, a.rowwise_scale, a.scale_layout, a.rowwise_amax,
                   b.rowwise_data, b.rowwise_scale, b.scale_layout, b.rowwise_amax, offs, bias, out,
                   m=a.m, n=b.m // num_experts, k=a.k, num_experts=num_experts, e_max_a=a.e4m3_max,
                   e_max_b=b.e4m3_max, accumulate=accumulate, grouped=grouped, config=config, decode=decode,
                   splits=None if splits is None else list(splits), pr3045=_pr3045(a, b))


@custom_op("nvfp4lab::nvfp4_expand_rowwise", mutates_args=())
def _expand_op(data: torch.Tensor, scale: torch.Tensor, amax: torch.Tensor, layout: str, k: int) -> torch.Tensor:
    """The exact BF16 values q * s of a rowwise copy (data, scale, amax, its scale layout) in K order, (rows,
    roundup(k, K tile of the dequant_mm path)), zeros past k: :func:`expand_rowwise` as one op (traced calls)."""
    device = data.device
    return dequant_mm.expand_padded(operand(data, scale, layout, amax, k), k, opt_flags.dequant_config(device),
                                    opt_flags.default_decode(device))


@_expand_op.register_fake
def _(data, scale, amax, layout, k):
    block_k = opt_flags.dequant_config(data.device).block_k
    return data.new_empty((data.shape[0], -(-k // block_k) * block_k), dtype=torch.bfloat16)


def expand_rowwise(t) -> torch.Tensor:
    """The exact BF16 values q * s (rows, K) of an NVFP4Tensor's rowwise copy in K order (one launch of the
    dequant_mm path's expansion kernel); a view of rows padded to its K tile. The values of
    :func:`nvfp4lab.ops.nvfp4_operand`. Eager calls launch directly, traced ones through the custom op
    ``nvfp4lab::nvfp4_expand_rowwise``."""
    k = t.shape[-1]
    return _expand_op(t.rowwise_data, t.rowwise_scale, t.rowwise_amax, t.scale_layout, k)[:, :k]


def expand_rule(device: torch.device) -> Optional[tuple]:
    """The sizes from which GEMMs on ``device`` run the dequant_mm path by default, which expands both operands to
    BF16 (so :class:`~nvfp4lab.NVFP4Operand` inputs save that work); None where it never does. Applied by
    :func:`takes_expanded_by_rule` (plain comparisons: symbolic sizes too)."""
    return opt_flags.expand_rule(device)


takes_expanded_by_rule = opt_flags.takes_expanded_by_rule


def _pr3045(a, b) -> bool:
    """PR 3045's epilogue order: both operands have its numerics (ops checks that they agree)."""
    return a.config.numerics == "te_pr3045" and b.config.numerics == "te_pr3045"


def operand_args(t):
    """The custom ops' arguments for one NVFP4Tensor operand (its rowwise copy) or NVFP4Operand (its values;
    the amax stands in for the scales, never read)."""
    if type(t) is NVFP4Operand:
        return (t.values, t.amax, t.amax, EXPANDED, float(t.config.e4m3_max))
    return (t.rowwise_data, t.rowwise_scale, t.rowwise_amax, t.scale_layout, float(t.e4m3_max))


# ------------------------------------------------------------------------------ eager plans
def _takes_strides(data: torch.Tensor, layout: str) -> bool:
    """Whether an operand's data needs no copy: unit stride along K, or expanded values in column-major order."""
    return data.stride(-1) == 1 or (layout == EXPANDED and data.stride(-2) == 1)


class _EagerGemm:
    """What a dense GEMM without ``out`` is fixed by its key (:func:`_dense_gemm`: both operands' shapes,
    layouts, strides, amax kinds and E, the bias kind, the output dtype, the device, each pointer's
    16-byte alignment): the fused kernel's launch and its scalar arguments, so that a call only
    allocates the output and launches. ``launch`` is None where the call takes another path (stream,
    B pre-decoded, an operand needing a copy): then :func:`_launch` runs it. On the dequant_mm path
    (``dequant``) the plan holds _launch's choices and the call prepares the operands."""

    __slots__ = ("launch", "dequant", "out_shape", "a_flat", "b_flat", "a_amax_fix", "b_amax_fix", "tail")

    def __init__(self, ad, asc, aam, a_layout, e_max_a, bd, bsc, bam, b_layout, e_max_b, bias, k, out_dtype,
                 pr3045: bool, aligned_ptrs: tuple):
        self.launch = self.dequant = None
        m, n, device = ad.shape[0], bd.shape[0], ad.device
        if (m * n * k == 0 or not _takes_strides(ad, a_layout) or not _takes_strides(bd, b_layout)
                or (bias is not None and not bias.is_contiguous())):
            return
        a_op = operand(ad, asc, a_layout, aam, k)
        b_op = operand(bd, bsc, b_layout, bam, k)
        if any(not op.swizzled and op.scale is not raw for op, raw in ((a_op, asc), (b_op, bsc))):
            return  # a strided scale matrix is copied per call
        config = opt_flags.resolve_config(None, m, n, k, 1, False, False, device)
        if a_op.expanded or b_op.expanded:
            config = opt_flags.dequant_config(device)
        if config.stream or config.b_predecode:
            return
        b_mode = 0 if b_op.amax.numel() == 1 else (2 if b_op.amax.numel() == n and n != 1 else 1)  # as _launch's
        bias_mode = 0 if bias is None else 1
        flags = dict(A_AMAX_ROWS=a_op.amax.numel() != 1, B_AMAX_MODE=b_mode, BIAS_MODE=bias_mode, ACCUMULATE=False,
                     OUT_BF16=out_dtype == torch.bfloat16, SOFT_BF16=soft_bf16_loads(device), EPI_PR3045=bool(pr3045))
        self.out_shape = (m, n)
        if config.dequant_mm:  # _launch's choices, made once; the operands are prepared per call
            self.dequant = (config, opt_flags.default_decode(device), flags, gemm_inv(e_max_a, e_max_b), m, n, k)
            return
        decode = opt_flags.fused_decode(opt_flags.default_decode(device), config)
        dtypes = (ad.dtype, a_op.scale.dtype, a_op.amax.dtype, bd.dtype, b_op.scale.dtype, b_op.amax.dtype,
                  (bias if bias is not None else a_op.amax).dtype, out_dtype, a_op.amax.dtype)
        self.tail = (m, n, k, ad.stride(0), a_op.scale_stride, a_op.cols4, bd.stride(0), b_op.scale_stride, b_op.cols4,
                     n, 1, 1, gemm_inv(e_max_a, e_max_b), fused.TAB_LO)
        # fused.gemm's key for these tensors (the output is new, so aligned; offs is a's amax)
        alignment = (*aligned_ptrs[:6], aligned_ptrs[6] if bias is not None else aligned_ptrs[2], True, aligned_ptrs[2])
        spec = (device, *zip(dtypes, alignment), self.tail[3:11])
        self.launch = fused.gemm_launch(m, n, k, 1, False, config, decode, tuple(flags.items()), a_op.swizzled,
                                        b_op.swizzled, spec)
        self.a_flat = a_op.swizzled and asc.dim() != 1
        self.b_flat = b_op.swizzled and bsc.dim() != 1
        self.a_amax_fix = aam.dim() != 1 or aam.dtype != torch.float32
        self.b_amax_fix = bam.dim() != 1 or bam.dtype != torch.float32


_EAGER_GEMMS: dict = {}


def _dense_gemm(a_data, a_scale, a_amax, a_layout, e_max_a, b_data, b_scale, b_amax, b_layout, e_max_b, bias, k,
                out_dtype, pr3045=False):
    """``a @ b^T`` into a new tensor (the arguments of :func:`_gemm_op`, which runs it): through a cached
    :class:`_EagerGemm`, or :func:`_launch` where the plan says the call takes another path."""
    ad, asc, aam, bd, bsc, bam = a_data, a_scale, a_amax, b_data, b_scale, b_amax
    # Triton specializes each pointer on its 16-byte alignment (split views of a bulk amax are not aligned)
    aligned_ptrs = (ad.data_ptr() & 15 == 0, asc.data_ptr() & 15 == 0, aam.data_ptr() & 15 == 0, bd.data_ptr() & 15 == 0,
                    bsc.data_ptr() & 15 == 0, bam.data_ptr() & 15 == 0, bias is None or bias.data_ptr() & 15 == 0)
    key = (aligned_ptrs, k, a_layout, b_layout, e_max_a, e_max_b, pr3045, out_dtype, ad.device, ad.dtype, ad.shape,
           ad.stride(), asc.dtype, asc.shape, asc.stride(), aam.dtype, aam.shape, bd.dtype, bd.shape, bd.stride(),
           bsc.dtype, bsc.shape, bsc.stride(), bam.dtype, bam.shape,
           None if bias is None else (bias.dtype, bias.shape, bias.stride()))
    plan = _EAGER_GEMMS.get(key)
    if plan is None:
        if len(_EAGER_GEMMS) >= 4096:
            _EAGER_GEMMS.clear()
        plan = _EAGER_GEMMS[key] = _EagerGemm(ad, asc, aam, a_layout, e_max_a, bd, bsc, bam, b_layout, e_max_b, bias, k,
                                              out_dtype, pr3045, aligned_ptrs)
    launch = plan.launch
    if launch is None:
        if plan.dequant is None:
            m, n = ad.shape[0], bd.shape[0]
            out = torch.empty((m, n), dtype=out_dtype, device=ad.device)
            return _launch(ad, asc, a_layout, aam, bd, bsc, b_layout, bam, None, bias, out, m=m, n=n, k=k, num_experts=1,
                           e_max_a=e_max_a, e_max_b=e_max_b, accumulate=False, grouped=False, pr3045=pr3045)
        config, decode, flags, inv_e, m, n, k = plan.dequant
        out = torch.empty(plan.out_shape, dtype=out_dtype, device=ad.device)
        a_op = operand(ad, asc, a_layout, aam, k)
        b_op = operand(bd, bsc, b_layout, bam, k)
        return dequant_mm.gemm(a_op, b_op, bias if bias is not None else a_op.amax, out, flags, m, n, k, inv_e, config,
                               decode)
    out = torch.empty(plan.out_shape, dtype=out_dtype, device=ad.device)
    if plan.a_flat:
        asc = asc.reshape(-1)
    if plan.b_flat:
        bsc = bsc.reshape(-1)
    if plan.a_amax_fix:
        aam = aam.reshape(-1).to(torch.float32)
    if plan.b_amax_fix:
        bam = bam.reshape(-1).to(torch.float32)
    launch(ad, asc, aam, bd, bsc, bam, bias if bias is not None else aam, out, aam, *plan.tail)
    return out


# ------------------------------------------------------------------------------ Python wrappers
def nvfp4_gemm(a, b, *, out_dtype=torch.bfloat16, bias=None, out=None, accumulate=False):
    """``a @ b^T`` of two NVFP4Tensors' rowwise copies or NVFP4Operands (dequant_mm path, expanding only the
    packed one) (checked by :func:`nvfp4lab.ops.nvfp4_gemm`,
    which also handles M, N or K == 0). Writes ``out`` in place when given. Calls without ``out`` run
    through a plan cached per operand kinds (:class:`_EagerGemm`): eager ones directly, traced ones
    through the custom op, whose implementation runs the same plan."""
    if out is None:
        ac, bc = a.config, b.config
        if type(a) is NVFP4Operand or type(b) is NVFP4Operand:
            args = (*operand_args(a), *operand_args(b), bias, a.k, out_dtype, _pr3045(a, b))
        else:  # operand_args and _pr3045 inline (the eager host path)
            args = (a.rowwise_data, a.rowwise_scale, a.rowwise_amax, ac.scale_layout, ac.e4m3_max, b.rowwise_data,
                    b.rowwise_scale, b.rowwise_amax, bc.scale_layout, bc.e4m3_max, bias, a.shape[-1], out_dtype,
                    ac.numerics == "te_pr3045" and bc.numerics == "te_pr3045")
        if tracing(args[0]):
            return _gemm_op.op(*args)
        return _dense_gemm(*args)
    _gemm_out_op(*operand_args(a), *operand_args(b), bias, a.k, out, bool(accumulate), _pr3045(a, b))
    return out


def nvfp4_grouped_gemm(a, b, offs, num_experts, *, out_dtype=torch.bfloat16, bias=None, out=None,
                       accumulate=False, splits=None, a_per_expert=False):
    """Grouped ``a[rows of e] @ b[e]^T`` for the bulk ``a`` (M, K) and the stacked ``b`` (E*N rows);
    checked by :func:`nvfp4lab.ops.nvfp4_grouped_gemm`. ``offs``: device int tensor (E,) of cumulative
    row ends; ``splits``: the same sizes on the host, or None (then always the one-launch kernel);
    ``a_per_expert``: a's rowwise amax holds one value per expert (E,) instead of (1,) / (M,)."""
    splits = None if splits is None else [int(s) for s in splits]
    if out is None:
        return _grouped_op(*operand_args(a), *operand_args(b), offs, num_experts, bias, a.k,
                           out_dtype, splits, _pr3045(a, b), bool(a_per_expert))
    _grouped_out_op(*operand_args(a), *operand_args(b), offs, num_experts, bias, a.k, out,
                    bool(accumulate), splits, _pr3045(a, b), bool(a_per_expert))
    return out

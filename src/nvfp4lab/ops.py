"""Public quantize / dequantize / GEMM ops: input checks, then dispatch to a backend.

Backends: ``"ref"`` (plain PyTorch, :mod:`nvfp4lab.ref`, CPU and GPU) and ``"triton"``
(:mod:`nvfp4lab.kernels`). ``backend=None`` picks Triton for CUDA tensors when Triton is installed and
the reference otherwise. The environment variable ``NVFP4LAB_BACKEND`` (``ref`` or ``triton``)
overrides that default choice (never an explicit ``backend=`` argument).
"""
from __future__ import annotations

import os
from dataclasses import replace
from typing import Optional, Sequence, Union

import torch

from . import moe, ref
from .checks import (
    check_amax_values,
    check_grouped_copy,
    check_int,
    check_integer_vector,
    check_mxfp8_copy,
    check_nvfp4_copy,
    check_rowwise_parts,
    check_seed,
    check_split_sizes,
)
from .checks import check_multiple as _check_multiple
from .checks import check_tensor as _check_tensor
from .config import MXFP8QuantConfig, NVFP4QuantConfig, operand_config
from .runtime import compiling, graph_capturing, host_ints_on_device  # noqa: F401  (ops.compiling etc. are public)
from .tensors import GroupedNVFP4Tensor, MXFP8Tensor, NVFP4Operand, NVFP4Tensor, cumulative_offsets, register_dequantize

try:  # the Triton backend; the reference backend needs no Triton
    from .kernels import dequantize as dequant_kernels
    from .kernels import grouped_quantize, nvfp4_quantize
    from .kernels import mxfp8 as mxfp8_kernels
    from .kernels import nvfp4_gemm as gemm_kernels
    from .kernels import swizzle as swizzle_kernels
    _TRITON_ERROR = None
except ImportError as err:  # pragma: no cover - depends on the installation
    _TRITON_ERROR = err

BACKENDS = ("ref", "triton")
OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


# ------------------------------------------------------------------------------------- helpers
def triton_available() -> bool:
    return _TRITON_ERROR is None


_ENV = getattr(os.environ, "_data", None)  # the environment's encoded mapping: one dict lookup per call
_ENV_KEY = os.environ.encodekey("NVFP4LAB_BACKEND") if _ENV is not None else None


def _env_backend() -> Optional[str]:
    if _ENV is None:  # pragma: no cover - an os.environ without its mapping
        return os.environ.get("NVFP4LAB_BACKEND") or None
    value = _ENV.get(_ENV_KEY)
    return os.environ.decodevalue(value) or None if value is not None else None


def resolve_backend(backend: Optional[str], device: torch.device) -> str:
    if backend == "triton" and _TRITON_ERROR is None:  # the common explicit choice, checked first
        return backend
    if backend is None:
        backend = _env_backend()
    if backend is None:
        return "triton" if device.type == "cuda" and triton_available() else "ref"
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS} or None, got {backend!r}")
    if backend == "triton" and not triton_available():
        raise ValueError("backend='triton' needs the triton package (pip install triton)")
    return backend


def flatten_2d(name: str, x: torch.Tensor) -> torch.Tensor:
    """Leading dims flatten into M; the result is contiguous (M, K)."""
    if x.dim() == 2:
        return x if x.is_contiguous() else x.contiguous()
    if x.dim() < 2:
        raise ValueError(f"{name} must have at least 2 dims (M, K) after flattening leading dims, got shape {tuple(x.shape)}")
    m = 1
    for d in x.shape[:-1]:
        m *= d
    return x.reshape(m, x.shape[-1]).contiguous()


def _check_amax(name: str, amax, expected: tuple[int, ...], device) -> Optional[torch.Tensor]:
    if amax is None:
        return None
    if not isinstance(amax, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(amax).__name__}")
    if not amax.dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating-point tensor, got {amax.dtype}")
    if amax.numel() not in expected:
        raise ValueError(f"{name} must have {' or '.join(map(str, expected))} elements, got shape {tuple(amax.shape)}")
    if amax.is_meta and torch.device(device).type != "meta":
        raise ValueError(f"{name} is a meta tensor (it holds no values) while x is on {device}")
    if not compiling():  # traced values are symbolic: no host read
        check_amax_values(name, amax)
    return amax.to(device=device, dtype=torch.float32).reshape(-1)


def _dequant_source(t, cls, dtype, which: str):
    """Shared checks of the dequantize ops; returns (dtype, the copy's data tensor)."""
    if not isinstance(t, cls):
        raise TypeError(f"t must be an {cls.__name__}, got {type(t).__name__}")
    dtype = t.dtype if dtype is None else dtype
    if dtype not in OUT_DTYPES:
        raise TypeError(f"dtype must be float32, bfloat16 or float16, got {dtype}")
    if which not in ("rowwise", "columnwise"):
        raise ValueError(f"which must be 'rowwise' or 'columnwise', got {which!r}")
    data = t.rowwise_data if which == "rowwise" else t.columnwise_data
    if data is None:
        raise ValueError(f"which={which!r}: this {cls.__name__} has no {which} copy")
    if cls is NVFP4Tensor:
        check_nvfp4_copy(t, which)
    else:
        check_mxfp8_copy(t, which)
    return dtype, data


# ---------------------------------------------------------------------------------------- NVFP4
_CONFIGS: dict = {}
# the option arguments of quantize_nvfp4 and their defaults (config= replaces all of them)
_OPTION_DEFAULTS = dict(block="1x16", rowwise=True, columnwise=False, per_token=False, rht=False, rht_sign_mask=0xD7E8,
                        four_over_six=None, e4m3_max=None, stochastic_rounding=False, scale_layout="compact")
_DEFAULT_VALUES = tuple(_OPTION_DEFAULTS.values())
_DEFAULT_TYPES = tuple(map(type, _DEFAULT_VALUES))


def _check_no_options(values: tuple) -> None:
    """With config= the option arguments must keep their defaults (they would be ignored)."""
    if values != _DEFAULT_VALUES or tuple(map(type, values)) != _DEFAULT_TYPES:
        given = [f"{name}={v!r}" for (name, d), v in zip(_OPTION_DEFAULTS.items(), values) if v != d or type(v) is not type(d)]
        raise ValueError(f"pass either config= or individual options, not both: config= replaces {', '.join(given)}")


def _nvfp4_config(**options) -> NVFP4QuantConfig:
    """The NVFP4QuantConfig of the option arguments, built and validated once per distinct combination."""
    try:
        values = tuple(options.values())
        key = (values, tuple(map(type, values)))  # types too: True and 1 hash alike
        config = _CONFIGS.get(key)
    except TypeError:  # an unhashable option: the config's own check names it
        return NVFP4QuantConfig(**options)
    if config is None:
        config = NVFP4QuantConfig(**options)
        if len(_CONFIGS) < 4096:
            _CONFIGS[key] = config
    return config


def _check_nvfp4_shape_and_seed(config: NVFP4QuantConfig, m: int, k: int, seed, generator, device, k_name: str,
                                m_name: str) -> None:
    """The shape rules of an NVFP4 quantize of (M, K) with ``config`` and the SR seed arguments."""
    if k % 16:
        _check_multiple(k_name, k, 16, "NVFP4 blocks hold 16 elements along K")
    if m % 16 and (config.columnwise or config.block == "16x16"):
        _check_multiple(m_name, m, 16, "columnwise and 16x16 outputs block 16 rows")
    check_seed(seed, device, generator)


def _ref_generator(config: NVFP4QuantConfig, seed, generator, device: torch.device):
    """The reference backend's SR generator: the caller's, else one seeded with ``seed`` (an int, or a tensor's value:
    one host sync; None on the meta device, which holds no values to round)."""
    if config.stochastic_rounding and generator is None and seed is not None and device.type != "meta":
        return torch.Generator(device=device).manual_seed(int(seed))
    return generator


def quantize_nvfp4(
    x: torch.Tensor,
    *,
    block: str = "1x16",
    rowwise: bool = True,
    columnwise: bool = False,
    per_token: bool = False,
    rht: bool = False,
    rht_sign_mask: int = 0xD7E8,
    four_over_six: Optional[str] = None,
    e4m3_max: Optional[float] = None,
    stochastic_rounding: bool = False,
    seed: Union[int, torch.Tensor, None] = None,
    generator: Optional[torch.Generator] = None,
    amax: Optional[torch.Tensor] = None,
    columnwise_amax: Optional[torch.Tensor] = None,
    scale_layout: str = "compact",
    numerics: str = "te_main",
    config: Optional[NVFP4QuantConfig] = None,
    backend: Optional[str] = None,
) -> NVFP4Tensor:
    """Quantize ``x`` (..., K) to NVFP4 (see :class:`NVFP4QuantConfig` for the options).

    Leading dims flatten into M; K (and M when a columnwise or 16x16 output is asked) must be
    multiples of 16. ``config`` replaces the individual option arguments when given (they must keep
    their defaults then: ValueError otherwise). ``amax`` / ``columnwise_amax``: >= 0 and not NaN
    (checked for host tensors). Stochastic rounding takes ``seed`` (an int in [-2**63, 2**64), or an int64
    one-element tensor on x's device: its value, read by the kernel without a host sync, is the int seed; drawn on the
    device inside a CUDA graph, each replay draws anew) or ``generator``; the same seed repeats the same bits on the
    same backend and device.
    """
    _check_tensor("x", x)
    if config is None:
        config = _nvfp4_config(block=block, rowwise=rowwise, columnwise=columnwise, per_token=per_token, rht=rht,
                               rht_sign_mask=rht_sign_mask, four_over_six=four_over_six, e4m3_max=e4m3_max,
                               stochastic_rounding=stochastic_rounding, scale_layout=scale_layout, numerics=numerics)
    elif not isinstance(config, NVFP4QuantConfig):
        raise TypeError(f"config must be an NVFP4QuantConfig, got {type(config).__name__}")
    else:
        _check_no_options((block, rowwise, columnwise, per_token, rht, rht_sign_mask, four_over_six, e4m3_max,
                           stochastic_rounding, scale_layout))
    x2 = flatten_2d("x", x)
    m, k = x2.shape
    _check_nvfp4_shape_and_seed(config, m, k, seed, generator, x.device, "x.shape[-1] (K)",
                                "M (product of x's leading dims)")
    if amax is not None or columnwise_amax is not None:
        per_vector = config.per_token and not config.broadcast_2d  # PR 3045's 2D weight takes the tensor's scalar
        amax = _check_amax("amax", amax, (m,) if per_vector else (1,), x.device)
        col_expected = (k,) if per_vector else (1,)
        columnwise_amax = _check_amax("columnwise_amax", columnwise_amax, col_expected, x.device)
    backend = resolve_backend(backend, x.device)
    if backend == "triton":
        out = nvfp4_quantize.quantize(x2, config, amax=amax, columnwise_amax=columnwise_amax, seed=seed, generator=generator)
    else:
        out = ref.nvfp4.quantize(x2, config, amax=amax, columnwise_amax=columnwise_amax,
                                 generator=_ref_generator(config, seed, generator, x.device))
    out.shape = x.shape
    return out


def quantize_nvfp4_dbias(
    x: torch.Tensor,
    *,
    config: NVFP4QuantConfig,
    dbias_dtype: Optional[torch.dtype] = None,
    seed: Union[int, torch.Tensor, None] = None,
    generator: Optional[torch.Generator] = None,
    backend: Optional[str] = None,
) -> tuple:
    """(:func:`quantize_nvfp4` of ``x`` (..., K) with ``config``, x's sum over its leading dims (K,)): the gradient's
    quantize with the bias gradient of a layer whose output gradient x is (TE's quantize with dbias), accumulated in
    fp32 and rounded once to ``dbias_dtype`` (default x's dtype). On the Triton backend the amax pass adds the sums
    as it reads x (no second read of x), in an order fixed per shape (the same bits call after call; the last bits
    may differ from ``torch.sum``'s order); the reference backend sums with torch (``ref.nvfp4.dbias``).
    """
    _check_tensor("x", x)
    if not isinstance(config, NVFP4QuantConfig):
        raise TypeError(f"config must be an NVFP4QuantConfig, got {type(config).__name__}")
    if dbias_dtype is None:
        dbias_dtype = x.dtype
    elif dbias_dtype not in OUT_DTYPES:
        raise TypeError(f"dbias_dtype must be one of {OUT_DTYPES}, got {dbias_dtype!r}")
    x2 = flatten_2d("x", x)
    m, k = x2.shape
    _check_nvfp4_shape_and_seed(config, m, k, seed, generator, x.device, "x.shape[-1] (K)",
                                "M (product of x's leading dims)")
    backend = resolve_backend(backend, x.device)
    if backend == "triton":
        out, db = nvfp4_quantize.quantize_dbias(x2, config, dbias_dtype, seed=seed, generator=generator)
    else:
        out = ref.nvfp4.quantize(x2, config, generator=_ref_generator(config, seed, generator, x.device))
        db = ref.nvfp4.dbias(x2, dbias_dtype)
    out.shape = x.shape
    return out, db


def quantize_nvfp4_operands(
    x: torch.Tensor,
    *,
    config: NVFP4QuantConfig,
    rowwise_operand: bool = True,
    columnwise_operand: bool = True,
    seed: Union[int, torch.Tensor, None] = None,
    generator: Optional[torch.Generator] = None,
    backend: Optional[str] = None,
    dbias_dtype: Optional[torch.dtype] = None,
) -> tuple:
    """:func:`quantize_nvfp4` of a 2-D ``x`` (M, K) where the named copies come as :class:`NVFP4Operand`: the exact
    BF16 values q * s that the Hopper GEMM (:func:`nvfp4_gemm`) consumes, written by the cast itself (the rowwise
    operand (M, K), the columnwise one (K, M): x^T, or RHT(x^T) with RHT), so the GEMM expands nothing for them.
    The same codes and scales as :func:`quantize_nvfp4` with the same seed; 16 bits per element, so for the copies
    a pass consumes at once (a layer's gradient), not for saved ones.

    Returns (packed, row, col): an NVFP4Tensor holding the config's other copies (None when none remain) and the
    operands (None where not asked or not in the config). Recipes without ``four_over_six`` (whose cast has no
    operand output) and without PR 3045's 2D weight config; M and K multiples of 16. With ``dbias_dtype``, also x's
    column sums (K,) in that dtype as a fourth element (the bias gradient, as :func:`quantize_nvfp4_dbias` sums it).
    """
    _check_tensor("x", x)
    if not isinstance(config, NVFP4QuantConfig):
        raise TypeError(f"config must be an NVFP4QuantConfig, got {type(config).__name__}")
    if config.four_over_six or config.broadcast_2d:
        raise ValueError("quantize_nvfp4_operands: configs without four_over_six and without PR 3045's 2D weight "
                         "(broadcast_2d) only")
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (M, K), got shape {tuple(x.shape)}")
    if dbias_dtype is not None and dbias_dtype not in OUT_DTYPES:
        raise TypeError(f"dbias_dtype must be None or one of {OUT_DTYPES}, got {dbias_dtype!r}")
    m, k = x.shape
    _check_nvfp4_shape_and_seed(config, m, k, seed, generator, x.device, "x.shape[1] (K)", "x.shape[0] (M)")
    backend = resolve_backend(backend, x.device)
    if backend == "triton":
        x2 = x if x.is_contiguous() else x.contiguous()
        return nvfp4_quantize.quantize_operands(x2, config, row_operand=rowwise_operand, col_operand=columnwise_operand,
                                                seed=seed, generator=generator, dbias_dtype=dbias_dtype)
    t = ref.nvfp4.quantize(x, config, generator=_ref_generator(config, seed, generator, x.device))
    out = ref.gemm.expanded_operands(t, rowwise_operand, columnwise_operand)
    return out if dbias_dtype is None else (*out, ref.nvfp4.dbias(x, dbias_dtype))



def nvfp4_operand(t: NVFP4Tensor, *, transposed: bool = False, backend: Optional[str] = None) -> NVFP4Operand:
    """The rowwise copy of a 2-D NVFP4Tensor ``t`` (M, K) as the :class:`NVFP4Operand` the Hopper GEMM consumes:
    its exact BF16 values q * s (M, K) in K order. A stack of experts' weights (E, N, K) (:func:`nvfp4_grouped_gemm`'s
    ``b``) gives (E, N, K) values (amax per expert).

    ``transposed=True`` gives the operand of t^T (K, M) from the same copy, as a column-major view of those values:
    for 16x16 blocks with a per-tensor amax, t's columnwise copy is exactly the transpose of its rowwise one (one
    scale per tile for both, spec section 5), so a GEMM contracting over M (a weight's dgrad) needs no columnwise
    copy (a stack: (E, K, N)). :func:`nvfp4_gemm` and :func:`nvfp4_grouped_gemm` (as ``b``, with ``m_splits``) read
    either form without a copy.
    """
    if not isinstance(t, NVFP4Tensor):
        raise TypeError(f"t must be an NVFP4Tensor, got {type(t).__name__}")
    if t.rowwise_data is None:
        raise ValueError("t has no rowwise copy: nvfp4_operand reads the rowwise copy (quantize with rowwise=True)")
    if len(t.shape) not in (2, 3):
        raise ValueError(f"t must be 2-D (M, K) or a stack of experts' weights (E, N, K), got shape {tuple(t.shape)}")
    check_rowwise_parts("t", t, amax_rule=len(t.shape) == 2)  # a stack's amax may be per expert
    config = t.config
    if transposed and (config.block != "16x16" or config.per_token or config.broadcast_2d):
        raise ValueError("transposed=True needs 16x16 blocks with a per-tensor amax (block='16x16', per_token=False, "
                         f"not PR 3045's 2D weight), where the columnwise copy is the rowwise one transposed; got {config}")
    backend = resolve_backend(backend, t.rowwise_data.device)
    if backend == "triton" and t.m != 0 and t.k != 0:
        values = gemm_kernels.expand_rowwise(t)
    else:
        values = ref.gemm.expanded_operands(t, True, False)[1].values
    if len(t.shape) == 3:
        values = values.unflatten(0, tuple(t.shape[:2]))
    if transposed:
        return NVFP4Operand(values.transpose(-1, -2), t.rowwise_amax, operand_config(config, True))
    return NVFP4Operand(values, t.rowwise_amax, operand_config(config, False))


def gemm_expand_rule(device, backend: Optional[str] = None) -> Optional[tuple]:
    """The size rule of the GEMMs on ``device`` that expand their operands to BF16 (the Triton backend's dequant_mm
    path on a GPU), which :func:`gemm_takes_expanded`, :func:`grouped_gemm_takes_expanded` and
    :func:`gemm_takes_operands` apply (:func:`takes_expanded_by_rule`); None on the reference backend and the CPU.
    It depends on the device alone, so a traced graph takes it as a constant and compares its (symbolic) sizes."""
    device = torch.device(device)
    if device.type != "cuda" or resolve_backend(backend, device) != "triton":
        return None
    return gemm_kernels.expand_rule(device)


def takes_expanded_by_rule(m, n, k, rule: Optional[tuple], num_experts: int = 0) -> bool:
    """Whether an (m, n, k) GEMM (``num_experts`` > 0: a grouped one with host split sizes) expands its operands
    under ``rule`` (:func:`gemm_expand_rule`): comparisons only, so symbolic sizes take it too."""
    return gemm_kernels.takes_expanded_by_rule(m, n, k, rule, num_experts)


def takes_operands_by_rule(m, n, k, rule: Optional[tuple], fprop: bool = False, sr_rows: bool = False) -> bool:
    """:func:`gemm_takes_operands` under ``rule`` (:func:`gemm_expand_rule`): comparisons only."""
    return takes_expanded_by_rule(m, n, k, rule) and operand_cast_pays(m, k, fprop, sr_rows)


def grouped_gemm_takes_expanded(m: int, n: int, k: int, num_experts: int, device, backend: Optional[str] = None) -> bool:
    """Whether an (m, n, k) :func:`nvfp4_grouped_gemm` of ``num_experts`` with ``m_splits`` on ``device`` runs as
    per-expert GEMMs on operands expanded to BF16 (the Triton backend on a GPU, for large experts), so that a ``b``
    given as an :class:`NVFP4Operand` costs it nothing. False on the reference backend and the CPU."""
    return takes_expanded_by_rule(m, n, k, gemm_expand_rule(device, backend), max(num_experts, 1))


def gemm_takes_expanded(m: int, n: int, k: int, device, backend: Optional[str] = None) -> bool:
    """Whether an (m, n, k) :func:`nvfp4_gemm` of two NVFP4Tensors on ``device`` expands its operands to BF16 (the
    Triton backend's large-M path on a GPU), so that an operand given as an :class:`NVFP4Operand` costs it nothing.
    False on the reference backend and the CPU."""
    return takes_expanded_by_rule(m, n, k, gemm_expand_rule(device, backend))


# ------------------------------------------------------------------------------- grouped NVFP4
def _split_offsets(name: str, split_sections, m: int, device, read_device: bool) -> torch.Tensor:
    """list of ints or 1-D integer tensor -> int64 offsets (n+1,) on ``device``; host sizes are checked,
    device sizes only when ``read_device`` (the reference backend, which reads them back anyway), tensor
    sizes not while torch.compile traces, nor meta ones (no values)."""
    if isinstance(split_sections, torch.Tensor):
        check_integer_vector(name, split_sections)
        if (split_sections.device.type == "cpu" or read_device) and not split_sections.is_meta and not compiling():
            check_split_sizes(name, split_sections.tolist(), m)
        sizes = split_sections.to(device=device, dtype=torch.int64)
        offsets = torch.zeros(sizes.numel() + 1, dtype=torch.int64, device=device)
        torch.cumsum(sizes, 0, out=offsets[1:])
        return offsets
    check_split_sizes(name, split_sections, m)
    return host_ints_on_device(cumulative_offsets(split_sections), device)


def _sections_on_host(split_sections) -> bool:
    return not isinstance(split_sections, torch.Tensor) or split_sections.device.type == "cpu"


def _given_split_offsets(split_offsets, split_sections, m: int, device, read_device: bool) -> torch.Tensor:
    """Checks of a caller's offsets for host ``split_sections``; their values are compared with the
    sections' when that costs no host sync (host offsets) or ``read_device`` (the reference backend)."""
    check_split_sizes("split_sections (with split_offsets)", split_sections, m)
    if not isinstance(split_offsets, torch.Tensor):
        raise TypeError(f"split_offsets must be a torch.Tensor or None, got {type(split_offsets).__name__}")
    if split_offsets.dtype != torch.int64:
        raise TypeError(f"split_offsets must be int64, got {split_offsets.dtype}")
    expected = (len(split_sections) + 1,)
    if split_offsets.shape != expected:
        raise ValueError(f"split_offsets must have shape (n + 1,) = {expected} for {len(split_sections)} split_sections, "
                         f"got {tuple(split_offsets.shape)}")
    if split_offsets.device != device:
        raise ValueError(f"split_offsets must be on x's device {device}, got {split_offsets.device}")
    if (split_offsets.device.type == "cpu" or read_device) and not split_offsets.is_meta and not compiling():
        expected_offsets = cumulative_offsets(split_sections)
        if split_offsets.tolist() != expected_offsets:
            raise ValueError(f"split_offsets must be the row offsets of split_sections, {expected_offsets}, "
                             f"got {split_offsets.tolist()}")
    return split_offsets


def quantize_nvfp4_grouped_bulk(
    x: torch.Tensor,
    split_sections,
    *,
    split_offsets: Optional[torch.Tensor] = None,
    config: Optional[NVFP4QuantConfig] = None,
    seed: Union[int, torch.Tensor, None] = None,
    generator: Optional[torch.Generator] = None,
    backend: Optional[str] = None,
    **options,
):
    """Quantize ``x`` (M, K) split along M into experts, each split with its own amax, into bulk buffers.

    ``split_sections``: list of ints, or a 1-D integer tensor (may live on the GPU: the Triton path
    reads the sizes on the device, so the call is CUDA-graph capturable; the sizes must then be >= 0
    and sum to M, which is checked for CPU tensors and on the reference backend, not for device sizes
    on the Triton path: that would be a host sync). A host list is copied to the device as offsets (during
    CUDA graph capture: written by fill kernels instead, see :func:`host_ints_on_device`);
    ``split_offsets``, the int64 (n + 1,) row offsets of a host ``split_sections`` already on x's device
    (a caller's cache), is used as given instead: no host->device copy. Its values must equal the
    offsets of ``split_sections``: checked (ValueError) for CPU offsets and on the reference backend;
    device offsets on the Triton path are not read (that would be a host sync).
    Returns a :class:`GroupedNVFP4Tensor`; every split is bit-identical to ``quantize_nvfp4`` of that split
    alone (stochastic rounding: statistically).
    Options as :func:`quantize_nvfp4`; scales are compact in the bulk buffers.
    Alignment: K % 16; each split a multiple of 16 when a columnwise or 16x16 output is asked.
    """
    config, x2, offsets, backend = _grouped_inputs(x, split_sections, split_offsets, config, seed, generator, backend,
                                                   options)
    if backend == "triton":
        return grouped_quantize.quantize_grouped(x2, offsets, config, seed=seed, generator=generator)
    return ref.nvfp4.quantize_grouped(x2, offsets, config, generator=_ref_generator(config, seed, generator, x.device))


def quantize_nvfp4_grouped_operands(
    x: torch.Tensor,
    split_sections,
    *,
    split_offsets: Optional[torch.Tensor] = None,
    config: NVFP4QuantConfig,
    seed: Union[int, torch.Tensor, None] = None,
    generator: Optional[torch.Generator] = None,
    backend: Optional[str] = None,
) -> tuple:
    """:func:`quantize_nvfp4_grouped_bulk` whose rowwise copy comes as the :class:`NVFP4Operand` the Hopper grouped
    GEMM consumes: the exact BF16 values q * s (M, K), written by the cast itself, with the rowwise amaxes (per split
    (n,), per row (M,) for per-token configs). Returns (packed, row): a :class:`GroupedNVFP4Tensor` holding the
    config's columnwise copy (None when the config has none) and that operand.

    Uses: the tokens of a grouped GEMM that expands its operands (:func:`nvfp4_grouped_gemm` takes the operand as
    ``a`` with ``offs`` and ``m_splits``), so the GEMM expands nothing for them; a stack of E experts' weights (E * N,
    K) split every N rows, whose values reshaped to (E, N, K) are what :func:`nvfp4_operand` would expand from their
    packed stack. Same arguments and checks as :func:`quantize_nvfp4_grouped_bulk`; configs with the rowwise copy and
    without ``four_over_six``.
    """
    if not isinstance(config, NVFP4QuantConfig):
        raise TypeError(f"config must be an NVFP4QuantConfig, got {type(config).__name__}")
    if not config.rowwise:
        raise ValueError("config: quantize_nvfp4_grouped_operands casts the rowwise copy as the operand (rowwise=True)")
    if config.four_over_six:
        raise ValueError("config: quantize_nvfp4_grouped_operands takes configs without four_over_six")
    config, x2, offsets, backend = _grouped_inputs(x, split_sections, split_offsets, config, seed, generator, backend,
                                                   {})
    if backend == "triton":
        return grouped_quantize.quantize_grouped_operand(x2, offsets, config, seed=seed, generator=generator)
    t = ref.nvfp4.quantize_grouped(x2, offsets, config, generator=_ref_generator(config, seed, generator, x.device))
    return ref.gemm.grouped_operands(t)


def _grouped_inputs(x, split_sections, split_offsets, config, seed, generator, backend, options) -> tuple:
    """(config, x (M, K), int64 offsets on x's device, backend) of a grouped quantize, its arguments checked."""
    _check_tensor("x", x)
    if config is None:
        config = NVFP4QuantConfig(**options)
    elif options:
        raise ValueError(f"pass either config= or individual options, not both (got {sorted(options)})")
    if config.scale_layout != "compact":
        raise ValueError("scale_layout: the grouped bulk buffers hold compact scales; use quantize_nvfp4_grouped "
                         "(per-split views) for padded/swizzled scales")
    if config.broadcast_2d:
        raise ValueError("config: PR 3045's 2D weight (numerics='te_pr3045', block='16x16') is a per-tensor cast; "
                         "quantize each weight alone with quantize_nvfp4 (TE's split_quantize rejects it too)")
    x2 = flatten_2d("x", x)
    m, k = x2.shape
    _check_multiple("x.shape[-1] (K)", k, 16, "NVFP4 blocks hold 16 elements along K")
    backend = resolve_backend(backend, x.device)
    if split_offsets is None:
        offsets = _split_offsets("split_sections", split_sections, m, x.device, backend == "ref")
    else:
        offsets = _given_split_offsets(split_offsets, split_sections, m, x.device, backend == "ref")
    if _sections_on_host(split_sections) and (config.columnwise or config.block == "16x16"):
        bad = [int(s) for s in split_sections if int(s) % 16]
        if bad:
            raise ValueError(f"split_sections must be multiples of 16 when a columnwise or 16x16 output is asked "
                             f"(16-row blocks), got {bad}")
    check_seed(seed, x.device, generator)
    return config, x2, offsets, backend


def quantize_nvfp4_grouped(x: torch.Tensor, split_sections, *, scale_layout: str = "compact", **kwargs) -> list:
    """Grouped quantize returning one :class:`NVFP4Tensor` per split (views into the bulk buffers).

    Same arguments as :func:`quantize_nvfp4_grouped_bulk`; ``scale_layout="padded"|"swizzled"`` converts
    each split's compact scales afterwards (new tensors, not views).
    """
    if scale_layout not in ("compact", "padded", "swizzled"):
        raise ValueError(f"scale_layout must be one of ('compact', 'padded', 'swizzled'), got {scale_layout!r}")
    bulk = quantize_nvfp4_grouped_bulk(x, split_sections, **kwargs)
    # host sections give the views without reading the device offsets back (a sync)
    parts = bulk.split([int(s) for s in split_sections] if _sections_on_host(split_sections) else None)
    if scale_layout != "compact":
        cfg = replace(bulk.config, scale_layout=scale_layout)
        for t in parts:
            t.config = cfg
            if t.rowwise_scale is not None:
                t.rowwise_scale = ref.swizzle.apply_scale_layout(t.rowwise_scale, scale_layout)
            if t.columnwise_scale is not None:
                t.columnwise_scale = ref.swizzle.apply_scale_layout(t.columnwise_scale, scale_layout)
    return parts


def dequantize_nvfp4(
    t: NVFP4Tensor,
    *,
    dtype: Optional[torch.dtype] = None,
    which: str = "rowwise",
    backend: Optional[str] = None,
) -> torch.Tensor:
    """NVFP4Tensor -> high precision in the original shape (``dtype`` defaults to the original)."""
    dtype, data = _dequant_source(t, NVFP4Tensor, dtype, which)
    if data.numel() == 0:
        return torch.empty(t.shape, dtype=dtype, device=data.device)
    backend = resolve_backend(backend, data.device)
    if backend == "triton":
        return dequant_kernels.dequantize_nvfp4(t, dtype=dtype, which=which)
    return ref.nvfp4.dequantize(t, dtype, which)


# ---------------------------------------------------------------------------------------- MXFP8
def quantize_mxfp8(
    x: torch.Tensor,
    *,
    rowwise: bool = True,
    columnwise: bool = False,
    fp8_format: str = "e4m3",
    scale_layout: str = "compact",
    config: Optional[MXFP8QuantConfig] = None,
    backend: Optional[str] = None,
) -> MXFP8Tensor:
    """Quantize ``x`` (..., K) to MXFP8: rowwise needs K % 32 == 0, columnwise needs M % 32 == 0.
    ``config`` replaces the option arguments (they must keep their defaults then)."""
    _check_tensor("x", x)
    if config is None:
        config = MXFP8QuantConfig(rowwise=rowwise, columnwise=columnwise, fp8_format=fp8_format, scale_layout=scale_layout)
    elif not isinstance(config, MXFP8QuantConfig):
        raise TypeError(f"config must be an MXFP8QuantConfig, got {type(config).__name__}")
    elif rowwise is not True or columnwise is not False or fp8_format != "e4m3" or scale_layout != "compact":
        raise ValueError("pass either config= or individual options (rowwise, columnwise, fp8_format, scale_layout), not both")
    x2 = flatten_2d("x", x)
    m, k = x2.shape
    if config.rowwise:
        _check_multiple("x.shape[-1] (K)", k, 32, "MXFP8 rowwise blocks hold 32 elements along K")
    if config.columnwise:
        _check_multiple("M (product of x's leading dims)", m, 32, "MXFP8 columnwise blocks hold 32 rows")
    backend = resolve_backend(backend, x.device)
    if backend == "triton":
        out = mxfp8_kernels.quantize_mxfp8(x2, config)
    else:
        out = ref.mxfp8.quantize(x2, config)
    out.shape = torch.Size((m, k))
    return out


def dequantize_mxfp8(
    t: MXFP8Tensor,
    *,
    dtype: Optional[torch.dtype] = None,
    which: str = "rowwise",
    backend: Optional[str] = None,
) -> torch.Tensor:
    """MXFP8Tensor -> high precision (M, K)."""
    dtype, data = _dequant_source(t, MXFP8Tensor, dtype, which)
    if data.numel() == 0:
        return torch.empty(t.shape, dtype=dtype, device=data.device)
    backend = resolve_backend(backend, data.device)
    if backend == "triton":
        return mxfp8_kernels.dequantize_mxfp8(t, dtype=dtype, which=which)
    return ref.mxfp8.dequantize(t, dtype, which)


# ---------------------------------------------------------------------------------------- swizzle
def swizzle_scales(scale: torch.Tensor, *, backend: Optional[str] = None) -> torch.Tensor:
    """Compact (R, C) uint8 scales -> (roundup(R,128), roundup(C,4)) in cuBLAS' 128x4 order, padding 0."""
    _check_tensor("scale", scale, (torch.uint8,))
    if scale.dim() != 2:
        raise ValueError(f"scale must be 2-D (R, C), got shape {tuple(scale.shape)}")
    if resolve_backend(backend, scale.device) == "triton" and scale.numel() > 0:
        return swizzle_kernels.swizzle_scales(scale)
    return ref.swizzle.swizzle_scales(scale)


def unswizzle_scales(swizzled: torch.Tensor, rows: int, cols: int, *, backend: Optional[str] = None) -> torch.Tensor:
    """Inverse of :func:`swizzle_scales`: a swizzled buffer (flat or 2-D) -> compact (rows, cols)."""
    _check_tensor("swizzled", swizzled, (torch.uint8,))
    check_int("rows", rows, 0)
    check_int("cols", cols, 0)
    need = ref.swizzle.roundup(rows, 128) * ref.swizzle.roundup(cols, 4)
    if swizzled.numel() != need:
        raise ValueError(f"swizzled must hold roundup(rows,128)*roundup(cols,4) = {need} bytes, got {swizzled.numel()}")
    if resolve_backend(backend, swizzled.device) == "triton" and need > 0:
        return swizzle_kernels.unswizzle_scales(swizzled, rows, cols)
    return ref.swizzle.unswizzle_scales(swizzled, rows, cols)


def _check_out(out, accumulate: bool, m: int, n: int, out_dtype: torch.dtype) -> torch.dtype:
    """Shared GEMM output checks; the dtype of a given ``out`` wins over ``out_dtype``."""
    if accumulate and out is None:
        raise ValueError("accumulate=True needs out= (the tensor to accumulate into)")
    if out is None:
        return out_dtype
    _check_tensor("out", out, OUT_DTYPES)
    if out.shape != (m, n):
        raise ValueError(f"out must have shape (M, N) = ({m}, {n}), got {tuple(out.shape)}")
    return out.dtype


# ------------------------------------------------------------------------------------------ GEMM
def _check_operand_values(name: str, t: NVFP4Operand) -> None:
    """An NVFP4Operand of a dense GEMM: 2-D floating values (rows, K) and an fp amax of 1 or rows values."""
    values, amax = t.values, t.amax
    if (not isinstance(values, torch.Tensor) or not values.dtype.is_floating_point or values.dim() != 2
            or not isinstance(amax, torch.Tensor) or not amax.dtype.is_floating_point
            or amax.numel() not in (1, values.shape[0])):
        raise ValueError(f"{name} (an NVFP4Operand) must hold floating values (rows, K) and a floating amax of 1 or "
                         f"rows elements, got values {getattr(values, 'dtype', type(values).__name__)} "
                         f"{tuple(getattr(values, 'shape', ()))}, amax {tuple(getattr(amax, 'shape', ()))}")


def _check_same_numerics(a, b) -> None:
    if a.config.numerics != b.config.numerics:
        raise ValueError(f"a and b must share numerics (a {a.config.numerics!r}, b {b.config.numerics!r}): PR 3045's "
                         "per-token GEMM takes two PR 3045 operands (its epilogue order differs from TE main's)")


def nvfp4_gemm(
    a: Union[NVFP4Tensor, NVFP4Operand],
    b: Union[NVFP4Tensor, NVFP4Operand],
    *,
    out_dtype: torch.dtype = torch.bfloat16,
    bias: Optional[torch.Tensor] = None,
    out: Optional[torch.Tensor] = None,
    accumulate: bool = False,
    backend: Optional[str] = None,
) -> torch.Tensor:
    """``a @ b^T`` from the rowwise copies of two NVFP4Tensors (both K-major, cuBLAS TN).

    a: logical (M, K); b: logical (N, K). Per-tensor or per-token amax on either side; each side's own
    E (448/256). bias: (N,). out: (M, N) written in place (and added to first when ``accumulate``).
    Either operand may be an :class:`NVFP4Operand` (:func:`quantize_nvfp4_operands`): its values are used as they
    are (on the GPU the product then runs on expanded operands, whatever its size).
    """
    for name, t in (("a", a), ("b", b)):
        if isinstance(t, NVFP4Operand):
            _check_operand_values(name, t)
            continue
        if not isinstance(t, NVFP4Tensor):
            raise TypeError(f"{name} must be an NVFP4Tensor or NVFP4Operand, got {type(t).__name__}")
        if t.rowwise_data is None:
            raise ValueError(f"{name} has no rowwise copy: nvfp4_gemm reads rowwise data (quantize with rowwise=True)")
        check_rowwise_parts(name, t)
    k = a.k
    if k != b.k:
        raise ValueError(f"a and b must share K (the contraction dim), got a K={k}, b K={b.k}")
    if a.config.numerics != b.config.numerics:
        _check_same_numerics(a, b)
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype must be float32, bfloat16 or float16, got {out_dtype}")
    m, n = a.m, b.m
    device = (a.values if isinstance(a, NVFP4Operand) else a.rowwise_data).device
    b_device = (b.values if isinstance(b, NVFP4Operand) else b.rowwise_data).device
    if b_device != device:
        raise ValueError(f"a and b must be on one device, got {device} and {b_device}")
    if bias is not None:
        _check_tensor("bias", bias)
        if bias.shape != (n,):
            raise ValueError(f"bias must have shape (N,) = ({n},), got {tuple(bias.shape)}")
        if bias.device != device:
            raise ValueError(f"bias must be on a's device {device}, got {bias.device}")
    if out is not None or accumulate:
        out_dtype = _check_out(out, accumulate, m, n, out_dtype)
        if out is not None and out.device != device:
            raise ValueError(f"out must be on a's device {device}, got {out.device}")
    if m == 0 or n == 0 or k == 0:
        result = torch.zeros(m, n, dtype=torch.float32, device=device)
        if bias is not None:
            result = result + bias.float()
        if accumulate:
            result = result + out.float()
        if out is not None:
            out.copy_(result)
            return out
        return result.to(out_dtype)
    backend = resolve_backend(backend, device)
    if backend == "triton":
        return gemm_kernels.nvfp4_gemm(a, b, out_dtype=out_dtype, bias=bias, out=out, accumulate=accumulate)
    return ref.gemm.nvfp4_gemm(a, b, out_dtype=out_dtype, bias=bias, out=out, accumulate=accumulate)


def gemm_takes_operands(m: int, n: int, k: int, device, backend: Optional[str] = None, *, fprop: bool = False,
                        sr_rows: bool = False) -> bool:
    """Whether the A operand (m, k) of an (m, n, k) :func:`nvfp4_gemm` on ``device`` is best cast as an
    :class:`NVFP4Operand` (:func:`quantize_nvfp4_operands`): the GEMM expands its operands to BF16 anyway (the
    Triton backend's large-M path on a GPU), and A is large enough for the operand cast, which writes 4x the bytes
    of a packed one, to beat the packed cast plus that expansion (``fprop``: A is a Linear forward's input, cast
    while the weight's cast runs beside it, which pays from a smaller size). False on the reference backend and the
    CPU."""
    return takes_operands_by_rule(m, n, k, gemm_expand_rule(device, backend), fprop, sr_rows)


def operand_cast_pays(m: int, k: int, fprop: bool = False, sr_rows: bool = False) -> bool:
    """Whether casting an (m, k) GEMM operand as BF16 values (:func:`quantize_nvfp4_operands`,
    :func:`quantize_nvfp4_grouped_operands`) is expected to beat the packed cast plus the GEMM's expansion of it, for
    a GEMM that expands its operands (:func:`gemm_takes_expanded`); ``fprop``: a Linear forward's input (see
    :func:`gemm_takes_operands`). False without the Triton backend."""
    return triton_available() and nvfp4_quantize.operand_cast_pays(m, k, fprop, sr_rows)


def _check_offs_values(ends: list, m: int, m_splits) -> None:
    """Host values of the grouped GEMM's offs: nondecreasing cumulative row ends from 0 ending at M,
    and the sizes of ``m_splits`` when that is given."""
    starts = [0] + ends[:-1]
    if any(e < s for s, e in zip(starts, ends)) or ends[-1] != m:
        raise ValueError(f"offs must be nondecreasing cumulative row ends (>= 0) with offs[-1] == M = {m}, got {ends}")
    if m_splits is not None and [e - s for s, e in zip(starts, ends)] != list(m_splits):
        raise ValueError(f"m_splits must be the sizes offs holds, {[e - s for s, e in zip(starts, ends)]}, got {list(m_splits)}")


def nvfp4_grouped_gemm(
    a: Union[NVFP4Tensor, GroupedNVFP4Tensor, NVFP4Operand, Sequence[NVFP4Tensor]],
    b: Union[NVFP4Tensor, NVFP4Operand, Sequence[NVFP4Tensor]],
    offs: Optional[torch.Tensor] = None,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
    bias: Optional[torch.Tensor] = None,
    out: Optional[torch.Tensor] = None,
    accumulate: bool = False,
    backend: Optional[str] = None,
    m_splits: Optional[Sequence[int]] = None,
) -> torch.Tensor:
    """Grouped (MoE) GEMM: rows of expert e of A times expert e's weights, TN.

    a: the tokens sorted by expert, either one NVFP4Tensor (M, K) whose rowwise amax is (1,) or
       per token (M,) -- an activation quantized per expert split is this form with each split's
       amax repeated over its rows -- together with ``offs``; or a list of E per-expert NVFP4Tensors
       (M_e, K), concatenated here by :func:`nvfp4lab.moe.concat_tokens` (one copy of codes and
       scales; offs must then be None); or a :class:`GroupedNVFP4Tensor` (its rowwise copy; each split is an
       expert's rows, ``offs`` must be None: its split offsets are used), whose per-split amax the GEMM
       reads as is (large GEMMs then scale in cuBLAS' epilogue, one alpha per expert); or an
       :class:`NVFP4Operand` of values (M, K) (the rowwise operand of :func:`quantize_nvfp4_grouped_operands`)
       with its amax per split (E,) (per row (M,) for a per-token config, or (1,)), together with ``offs`` and
       ``m_splits``: it runs as per-expert GEMMs on expanded operands, as ``b`` given so does.
    b: the weights, either one NVFP4Tensor of logical shape (E, N, K) (rowwise amax (1,), (E,) per
       expert or (E*N,) per row), or a list of E NVFP4Tensors (N, K), stacked here by
       :func:`nvfp4lab.moe.stack_weights` (one copy; stack once and pass the result to avoid it), or an
       :class:`NVFP4Operand` of values (E, N, K) (:func:`nvfp4_operand` of a stack; needs ``m_splits``).
    offs: int32/int64 tensor (E,) on a's device, cumulative row ends (torch._grouped_mm's ``offs``):
       expert e owns rows offs[e-1]:offs[e] (offs[-1] := 0). Zero-size experts are allowed. It must
       be nondecreasing and end at M: checked (ValueError) when offs is a CPU tensor or the backend is
       the reference; the Triton path on the GPU reads it on the device without a host sync and does
       not check it, but still writes every row: expert e then owns rows [end_{e-1}, end_e) with end_e
       the running maximum of offs[0..e] clipped to [0, M], and rows past the last end are zeros
       (left as they are with ``accumulate``).
    bias: (N,) or (E, N); out: (M, N), written in place (added to when ``accumulate``).
    m_splits: optional host copy of the split sizes (E ints summing to M, the sizes ``offs`` holds;
       compared with ``offs`` where offs is checked, not for device offs on the Triton path, where
       the per-expert cuBLAS path follows m_splits and the one-launch kernel offs). With it, on the
       GPU, experts of at least 128 rows on average (and 2^30 multiply-adds each) run as per-expert
       cuBLAS GEMMs on expanded operands, as dense GEMMs of that size do; without it, or for
       smaller experts, one Triton launch covers all experts. A list of activations gives it here.
    Per expert the result is exactly :func:`nvfp4_gemm` of its rows and weights.
    """
    a_experts = bulk = None  # a's amax per expert (E,): a grouped tensor quantized per split
    if isinstance(a, GroupedNVFP4Tensor):
        if a.rowwise_data is None:
            raise ValueError("a has no rowwise copy: the GEMM reads rowwise data (quantize with rowwise=True)")
        if offs is not None:
            raise ValueError("offs must be None when a is a GroupedNVFP4Tensor (its split_offsets say which rows belong "
                             "to which expert)")
        check_grouped_copy(a, "rowwise", "a")
        offs = a.split_offsets[1:]
        if not a.config.per_token:
            a_experts = a.rowwise_amax
        bulk, a = a, moe.token_operand(a, a.rowwise_amax)
    elif isinstance(a, NVFP4Tensor):
        moe.check_rowwise("a", a)
        if offs is None:
            raise ValueError("offs is required when a is one NVFP4Tensor (it says which rows belong to which expert)")
    elif isinstance(a, NVFP4Operand):
        if a.values.dim() != 2:
            raise ValueError(f"a given as an NVFP4Operand must be the tokens' values (M, K), got shape {tuple(a.shape)}")
        if offs is None or m_splits is None:
            raise ValueError("a given as an NVFP4Operand needs offs and m_splits (the split sizes on the host): it runs "
                             "as per-expert GEMMs on expanded operands")
        _check_tensor("offs", offs, (torch.int32, torch.int64))
        if not a.config.per_token and a.amax.numel() == offs.numel():
            a_experts = a.amax
    elif offs is not None:
        raise ValueError("offs must be None when a is a list of per-expert NVFP4Tensors (their sizes give the split)")
    else:
        if m_splits is None:
            m_splits = [t.m for t in a]
        a, offs = moe.concat_tokens(a, backend=backend)
    if isinstance(b, NVFP4Operand):
        if b.values.dim() != 3:
            raise ValueError(f"b given as an NVFP4Operand must be the experts' weights stacked (E, N, K), got shape "
                             f"{tuple(b.shape)}")
        if m_splits is None:
            raise ValueError("b given as an NVFP4Operand needs m_splits (the split sizes on the host): it runs as "
                             "per-expert GEMMs on expanded operands")
        b_amax = b.amax
    elif isinstance(b, NVFP4Tensor):
        if len(b.shape) != 3:
            raise ValueError(f"b must have logical shape (E, N, K) (the experts' weights stacked), got {tuple(b.shape)}")
        moe.check_rowwise("b", b, amax_rule=False)  # its amax: 1, E or E*N values (checked below)
        b_amax = b.rowwise_amax
    else:
        b = moe.stack_weights(b, backend=backend)
        b_amax = b.rowwise_amax
    num_experts = int(b.shape[0])
    if a.k != b.k:
        raise ValueError(f"a and b must share K (the contraction dim), got a K={a.k}, b K={b.k}")
    _check_same_numerics(a, b)
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype must be float32, bfloat16 or float16, got {out_dtype}")
    m, k = a.m, a.k
    n = b.m // num_experts
    a_amax = a.amax if isinstance(a, NVFP4Operand) else a.rowwise_amax
    device = a_amax.device
    if bulk is not None and offs.numel() != num_experts:
        raise ValueError(f"a must have E = {num_experts} splits (one per expert of b), got {offs.numel()}")
    _check_tensor("offs", offs, (torch.int32, torch.int64))
    if offs.shape != (num_experts,):
        raise ValueError(f"offs must have shape (E,) = ({num_experts},) (one cumulative row end per expert), got {tuple(offs.shape)}")
    if offs.device != device:
        raise ValueError(f"offs must be on a's device {device}, got {offs.device}")
    if m_splits is not None:
        if not isinstance(m_splits, (list, tuple)) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in m_splits):
            raise TypeError(f"m_splits must be a list or tuple of ints, got {m_splits!r}")
        if len(m_splits) != num_experts or sum(m_splits) != m or min(m_splits) < 0:
            raise ValueError(f"m_splits must hold E = {num_experts} sizes >= 0 summing to M = {m}, got {list(m_splits)}")
    if a_experts is None and a_amax.numel() not in (1, m):
        raise ValueError(f"a's rowwise_amax must have 1, M = {m} or (a GroupedNVFP4Tensor or NVFP4Operand) E = "
                         f"{num_experts} elements, got {a_amax.numel()}")
    if b_amax.numel() not in (1, num_experts, num_experts * n):
        raise ValueError(f"b's rowwise_amax must have 1, E = {num_experts} or E*N = {num_experts * n} elements, "
                         f"got {b_amax.numel()}")
    if bias is not None:
        _check_tensor("bias", bias)
        if bias.shape not in ((n,), (num_experts, n)):
            raise ValueError(f"bias must have shape (N,) = ({n},) or (E, N) = ({num_experts}, {n}), got {tuple(bias.shape)}")
    out_dtype = _check_out(out, accumulate, m, n, out_dtype)
    backend = resolve_backend(backend, device)
    # values readable without a sync (the reference reads them anyway); traced values are symbolic
    if (offs.device.type == "cpu" or backend == "ref") and not offs.is_meta and not compiling():
        _check_offs_values(offs.tolist(), m, m_splits)
    if m == 0 or n == 0 or k == 0:
        result = torch.zeros(m, n, dtype=torch.float32, device=device)
        if bias is not None and m > 0:
            b2 = bias.float().reshape(1, n) if bias.dim() == 1 else bias.float()  # (N,) or (E, N)
            expert = torch.bucketize(torch.arange(m, device=device), offs.to(torch.int64), right=True)
            result = result + b2[expert.clamp(max=b2.shape[0] - 1)]
        if accumulate:
            result = result + out.float()
        if out is not None:
            out.copy_(result)
            return out
        return result.to(out_dtype)
    if backend == "triton":
        return gemm_kernels.nvfp4_grouped_gemm(a, b, offs, num_experts, out_dtype=out_dtype, bias=bias, out=out,
                                               accumulate=accumulate, splits=m_splits, a_per_expert=a_experts is not None)
    if device.type == "meta":  # no values (the reference reads offs): the result's shape and dtype
        return out if out is not None else torch.empty((m, n), dtype=out_dtype, device=device)
    if a_experts is not None:  # the reference reads a per-row amax
        if bulk is None:
            a = NVFP4Operand(a.values, torch.repeat_interleave(a_experts, torch.tensor(m_splits, device=device),
                                                               output_size=m), a.config)
        else:
            a = moe.token_operand(bulk, moe.per_row_amax(bulk))
    return ref.gemm.nvfp4_grouped_gemm(a, b, offs, out_dtype=out_dtype, bias=bias, out=out, accumulate=accumulate)


def _columnwise_operand(t: NVFP4Tensor) -> NVFP4Tensor:
    """The columnwise copy of one split (M_e, K) as a rowwise GEMM operand (K, M_e)."""
    config = replace(t.config, rowwise=True, columnwise=False, rht=False)
    return NVFP4Tensor.from_parts(torch.Size((t.k, t.m)), t.dtype, config,
                                  rowwise=(t.columnwise_data, t.columnwise_scale, t.columnwise_amax))


def nvfp4_grouped_wgrad(
    dy: GroupedNVFP4Tensor,
    x: GroupedNVFP4Tensor,
    split_sections: Sequence[int],
    *,
    out_dtype: torch.dtype = torch.bfloat16,
    backend: Optional[str] = None,
) -> torch.Tensor:
    """MoE weight gradients: ``dW[e] = dy_e^T x_e`` (E, N, K) from the columnwise copies of two grouped
    tensors split alike (``dy`` (M, N) and ``x`` (M, K), e.g. from :func:`quantize_nvfp4_grouped_bulk`),
    each split's product over its own tokens. ``split_sections``: the host split sizes (E ints, each a
    multiple of 16, summing to M; the tensors' device offsets are not read back). An empty split gives
    zeros. Per split the result is :func:`nvfp4_gemm` of the two columnwise copies as rowwise operands
    (RHT and per-token amaxes included); on the GPU all splits share one expansion launch per split,
    one cuBLAS GEMM each and one epilogue."""
    for name, t in (("dy", dy), ("x", x)):
        if not isinstance(t, GroupedNVFP4Tensor):
            raise TypeError(f"{name} must be a GroupedNVFP4Tensor, got {type(t).__name__}")
        if t.columnwise_data is None:
            raise ValueError(f"{name} has no columnwise copy: the weight gradient reads it (quantize with columnwise=True)")
    _check_same_numerics(dy, x)
    check_grouped_copy(dy, "columnwise", "dy")
    check_grouped_copy(x, "columnwise", "x")
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype must be float32, bfloat16 or float16, got {out_dtype}")
    check_split_sizes("split_sections", split_sections)
    sizes = [int(s) for s in split_sections]
    m, n, k = int(dy.shape[0]), int(dy.shape[-1]), int(x.shape[-1])
    num = len(sizes)
    if int(x.shape[0]) != m or sum(sizes) != m:
        raise ValueError(f"dy and x must have the same rows M, the sum of split_sections; got dy {tuple(dy.shape)}, "
                         f"x {tuple(x.shape)}, sum {sum(sizes)}")
    if dy.num_splits != num or x.num_splits != num:
        raise ValueError(f"split_sections must have one size per split of dy ({dy.num_splits}) and x ({x.num_splits}), "
                         f"got {num}")
    bad = [s for s in sizes if s % 16]
    if bad:
        raise ValueError(f"split_sections must be multiples of 16 (columnwise copies block 16 tokens), got {bad}")
    device = dy.columnwise_data.device
    if x.columnwise_data.device != device:
        raise ValueError(f"dy and x must be on one device, got {device} and {x.columnwise_data.device}")
    if n == 0 or k == 0 or m == 0:
        return torch.zeros((num, n, k), dtype=out_dtype, device=device)
    backend = resolve_backend(backend, device)
    if backend == "triton":
        return gemm_kernels.nvfp4_grouped_wgrad(dy, x, sizes, out_dtype=out_dtype)
    out = torch.empty((num, n, k), dtype=out_dtype, device=device)
    for e, (dy_e, x_e) in enumerate(zip(dy.split(sizes), x.split(sizes))):
        if sizes[e] == 0:
            out[e].zero_()
        else:
            out[e] = ref.gemm.nvfp4_gemm(_columnwise_operand(dy_e), _columnwise_operand(x_e), out_dtype=out_dtype)
    return out


register_dequantize(NVFP4Tensor, dequantize_nvfp4)
register_dequantize(MXFP8Tensor, dequantize_mxfp8)

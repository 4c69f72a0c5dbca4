"""Input validators shared by the public ops and the layers above them: one definition per rule, each
raising a TypeError / ValueError that names the argument and the rule."""
from __future__ import annotations

import torch

from .layout import roundup

HIGH_PRECISION_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_tensor(name: str, x, dtypes=HIGH_PRECISION_DTYPES) -> None:
    """``x`` is a torch.Tensor with a dtype in ``dtypes`` (default: fp32, bf16, fp16)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} must have dtype in ({names}), got {str(x.dtype).replace('torch.', '')}")


def check_multiple(name: str, value: int, mult: int, why: str) -> None:
    if value % mult != 0:
        raise ValueError(f"{name} must be a multiple of {mult} ({why}), got {value}")


def check_int_list(name: str, values) -> None:
    """A list or tuple of Python ints (bools refused)."""
    if not isinstance(values, (list, tuple)) or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise TypeError(f"{name} must be a list or tuple of ints, got {values!r}")


def check_split_sizes(name: str, sizes, total=None, count=None) -> None:
    """Host split sizes: a list of ints, at least one (exactly ``count`` when given), each >= 0,
    summing to ``total`` (the rows being split) when given."""
    check_int_list(name, sizes)
    if count is not None and len(sizes) != count:
        raise ValueError(f"{name} must have {count} entries (one per split), got {len(sizes)}")
    if len(sizes) == 0:
        raise ValueError(f"{name} must name at least one split")
    if any(s < 0 for s in sizes):
        raise ValueError(f"{name} must be >= 0 each, got {list(sizes)}")
    if total is not None and sum(sizes) != total:
        raise ValueError(f"{name} must sum to M = {total} (the rows being split), got {sum(sizes)}")


def check_integer_vector(name: str, t: torch.Tensor) -> None:
    """A 1-D integer (not bool) tensor."""
    if t.dim() != 1 or t.dtype.is_floating_point or t.dtype == torch.bool:
        raise TypeError(f"{name} must be a 1-D integer tensor or a list of ints, got {t.dtype} shape {tuple(t.shape)}")


def check_int(name: str, value, low=None, high=None) -> None:
    """A Python int (bools refused: True would pass as 1), low <= value < high where given."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if high is None and low is not None and value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    if high is not None and not low <= value < high:
        raise ValueError(f"{name} must be in [{low}, {high}), got {value}")


def check_seed(seed, device: torch.device, generator=None) -> None:
    """An SR seed: None, an int that torch.Generator.manual_seed takes, [-2^63, 2^64), or an int64 tensor of one
    element on ``device`` (the input's), read by the kernel: a seed drawn on the device, which no host sync reads.
    Not together with a ``generator``."""
    if seed is None:
        return
    if generator is not None:
        raise ValueError("seed and generator: pass one of them, not both")
    if isinstance(seed, torch.Tensor):
        if seed.dtype != torch.int64 or seed.numel() != 1:
            raise ValueError(f"seed as a tensor must be int64 with one element, got {str(seed.dtype).replace('torch.', '')} "
                             f"of shape {tuple(seed.shape)}")
        if seed.device != device:
            raise ValueError(f"seed as a tensor must be on the input's device {device}, got {seed.device}")
        return
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, an int64 tensor or None, got {type(seed).__name__} {seed!r}")
    if not -(1 << 63) <= seed < (1 << 64):
        raise ValueError(f"seed must be in [-2**63, 2**64) (torch.Generator.manual_seed's range), got {seed}")


def check_amax_values(name: str, amax: torch.Tensor) -> None:
    """Every element >= 0 and not NaN (an amax is a max |x|); +inf is allowed (the spec's S_enc = 1).

    Read only for host (CPU) tensors: reading a device tensor's values would be a host sync."""
    if amax.device.type == "cpu" and amax.numel() and not bool((amax >= 0).all()):
        raise ValueError(f"{name} must be >= 0 and not NaN (it is a max |x|), got {amax.flatten()[:8].tolist()}")


def check_nvfp4_copy(t, which: str) -> None:
    """The parts of one copy of an NVFP4Tensor agree with its shape and config: data (R, C/2) uint8,
    scales of the layout's shape, amax (1,) or (R,) per token; R, C = M, K (rowwise) or K, M."""
    m, k = t.m, t.k
    rows, cols = (m, k) if which == "rowwise" else (k, m)
    data, scale, amax = (getattr(t, f"{which}_{part}") for part in ("data", "scale", "amax"))
    for part, value in (("data", data), ("scale", scale)):
        if not isinstance(value, torch.Tensor) or value.dtype != torch.uint8:
            raise TypeError(f"{which}_{part} must be a uint8 tensor, got {getattr(value, 'dtype', type(value).__name__)}")
    if cols % 16 != 0:
        raise ValueError(f"the quantized matrix must have a multiple of 16 columns (whole NVFP4 blocks), got {cols}")
    if tuple(data.shape) != (rows, cols // 2):
        raise ValueError(f"{which}_data must have shape {(rows, cols // 2)} (two E2M1 codes per byte), got {tuple(data.shape)}")
    blocks = cols // 16
    layout = t.scale_layout
    want = (rows, blocks) if layout == "compact" else (roundup(rows, 128), roundup(blocks, 4))
    if scale.numel() != want[0] * want[1] or (layout != "swizzled" and tuple(scale.shape) != want):
        raise ValueError(f"{which}_scale must have shape {want} for scale_layout={layout!r}, got {tuple(scale.shape)}")
    if not isinstance(amax, torch.Tensor) or not amax.dtype.is_floating_point:
        raise TypeError(f"{which}_amax must be a floating-point tensor, got {getattr(amax, 'dtype', type(amax).__name__)}")
    expected = rows if t.per_token else 1
    if amax.numel() != expected:
        raise ValueError(f"{which}_amax must have {expected} elements (per_token={t.per_token}), got {amax.numel()}")
    check_same_device(which, data, scale, amax)


def check_same_device(which: str, data: torch.Tensor, *parts, name: str = "") -> None:
    """The other parts of a copy (scale, amax) live on its data's device: a kernel reads them all from there.
    ``name``: the argument the message starts with."""
    for part, value in zip(("scale", "amax"), parts):
        if value.device != data.device:
            raise ValueError(f"{name + ': ' if name else ''}{which}_{part} must be on {which}_data's device "
                             f"{data.device}, got {value.device}")


def check_rowwise_parts(name: str, t, amax_rule: bool = True) -> None:
    """The rowwise copy's data and scales (and with ``amax_rule`` its amax) agree with ``t``'s shape and config, as
    :func:`check_nvfp4_copy` defines it (an NVFP4Tensor, 2-D or a stack): a malformed container would be read out of
    bounds. A fast test of the rule on the hot path; the full check names the part that breaks it."""
    shape = t.shape
    rows = int(shape[0]) if len(shape) == 2 else t.m
    cols = int(shape[-1])
    data, scale, amax = t.rowwise_data, t.rowwise_scale, t.rowwise_amax
    blocks = cols >> 4
    layout = t.config.scale_layout
    ok = (isinstance(data, torch.Tensor) and isinstance(scale, torch.Tensor) and isinstance(amax, torch.Tensor)
          and not cols & 15
          and data.dtype == torch.uint8 and scale.dtype == torch.uint8 and data.shape == (rows, cols >> 1)
          and scale.numel() == (rows * blocks if layout == "compact" else roundup(rows, 128) * roundup(blocks, 4))
          and (layout == "swizzled" or scale.dim() == 2)
          and amax.dtype.is_floating_point and (not amax_rule or amax.numel() == (rows if t.config.per_token else 1))
          and scale.device == data.device and amax.device == data.device)
    if not ok:
        try:
            check_nvfp4_copy(t, "rowwise")
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{name}: {exc}") from None
        check_same_device("rowwise", data, scale, amax, name=name)
        if amax_rule:
            raise ValueError(f"{name}'s rowwise copy does not match its shape {tuple(shape)} and config")


def check_grouped_copy(t, which: str, name: str = "") -> None:
    """The bulk buffers of one copy of a GroupedNVFP4Tensor (M, K) of n splits agree with its shape and config (the
    layout of :class:`~nvfp4lab.tensors.GroupedNVFP4Tensor`, compact scales): uint8 data of M*K/2 bytes and scales of
    M*K/16, an amax of n values per tensor, or M (rowwise) / n*K (columnwise) per token. ``name``: the argument the
    messages start with."""
    m, k = int(t.shape[0]), int(t.shape[-1])
    n = t.split_offsets.numel() - 1
    at = f"{name}: {which}" if name else which
    data, scale, amax = (getattr(t, f"{which}_{part}") for part in ("data", "scale", "amax"))
    for part, value in (("data", data), ("scale", scale)):
        if not isinstance(value, torch.Tensor) or value.dtype != torch.uint8:
            raise TypeError(f"{at}_{part} must be a uint8 tensor, got {getattr(value, 'dtype', type(value).__name__)}")
    if data.numel() != m * k // 2:
        raise ValueError(f"{at}_data must hold M*K/2 = {m * k // 2} bytes (two E2M1 codes per byte), got {data.numel()}")
    if scale.numel() != m * k // 16:
        raise ValueError(f"{at}_scale must hold M*K/16 = {m * k // 16} compact scales, got {scale.numel()}")
    if not isinstance(amax, torch.Tensor) or not amax.dtype.is_floating_point:
        raise TypeError(f"{at}_amax must be a floating-point tensor, got {getattr(amax, 'dtype', type(amax).__name__)}")
    expected = (m if which == "rowwise" else n * k) if t.config.per_token else n
    if amax.numel() != expected:
        raise ValueError(f"{at}_amax must have {expected} elements ({n} splits, per_token={t.config.per_token}), "
                         f"got {amax.numel()}")
    check_same_device(which, data, scale, amax, name=name)


def mxfp8_scale_shape(rows: int, cols: int, layout: str, which: str) -> tuple[int, int]:
    """Scale shape of one copy of an (M, K) = (rows, cols) MXFP8 tensor: rowwise compact (M, K/32),
    padded / swizzled (roundup(M,128), roundup(K/32,4)); columnwise compact (M/32, K), padded
    (roundup(M/32,4), roundup(K,128)), swizzled (the transpose's) (roundup(K,128), roundup(M/32,4))."""
    if which == "rowwise":
        return (rows, cols // 32) if layout == "compact" else (roundup(rows, 128), roundup(cols // 32, 4))
    if layout == "compact":
        return (rows // 32, cols)
    if layout == "padded":
        return (roundup(rows // 32, 4), roundup(cols, 128))
    return (roundup(cols, 128), roundup(rows // 32, 4))


def check_mxfp8_copy(t, which: str) -> None:
    """The parts of one copy of an MXFP8Tensor (M, K) agree with its shape: data (M, K) uint8 and the
    layout's scale shape (:func:`mxfp8_scale_shape`; a swizzled buffer may also be flat)."""
    rows, cols = int(t.shape[0]), int(t.shape[1])
    data, scale = getattr(t, f"{which}_data"), getattr(t, f"{which}_scale")
    for part, value in (("data", data), ("scale", scale)):
        if not isinstance(value, torch.Tensor) or value.dtype != torch.uint8:
            raise TypeError(f"{which}_{part} must be a uint8 tensor, got {getattr(value, 'dtype', type(value).__name__)}")
    if tuple(data.shape) != (rows, cols):
        raise ValueError(f"{which}_data must have shape {(rows, cols)}, got {tuple(data.shape)}")
    if which == "rowwise" and cols % 32 != 0:
        raise ValueError(f"K must be a multiple of 32 for the rowwise copy, got {cols}")
    if which == "columnwise" and rows % 32 != 0:
        raise ValueError(f"M must be a multiple of 32 for the columnwise copy, got {rows}")
    scale_shape = mxfp8_scale_shape(rows, cols, t.scale_layout, which)
    if tuple(scale.shape) != scale_shape and not (t.scale_layout == "swizzled" and scale.numel() == scale_shape[0] * scale_shape[1]):
        raise ValueError(f"{which}_scale must have shape {scale_shape} for scale_layout={t.scale_layout!r}, got {tuple(scale.shape)}")
    check_same_device(which, data, scale)

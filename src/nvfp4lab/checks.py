"""Input validators shared by the public ops and the layers above them: one definition per rule, each
raising a TypeError / ValueError that names the argument and the rule."""
from __future__ import annotations

import torch

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

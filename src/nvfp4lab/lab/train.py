"""``nvfp4lab train``: train the same small character-level transformer under several recipes and compare
their loss curves against the BF16 baseline.

Every recipe starts from the same initial weights, sees the same batches in the same order and seeds the
stochastic-rounding RNG the same way, so the loss differences come from the quantization alone.

Model: byte-level (vocab 256) decoder-only transformer: token + learned position embeddings, ``layers``
pre-LayerNorm blocks of causal self-attention (fused qkv Linear, output Linear) and a GELU MLP (two
Linears), final LayerNorm and an untied LM head. :func:`nvfp4lab.convert` swaps the four Linears of each
block; the embeddings and the LM head stay in high precision (the usual NVFP4 practice: the head's
output feeds the loss directly and is the layer most sensitive to 4-bit error). Master weights and
AdamW states are fp32; every recipe runs under BF16 autocast, so the baseline ``bf16`` is a plain BF16
mixed-precision run and the quantized recipes differ from it only in their Linear GEMMs.

Corpus (offline everywhere): the Python standard library's own ``*.py`` files under
``sysconfig.get_paths()["stdlib"]`` (site-packages excluded), in sorted relative-path order, concatenated
and cut to ``corpus_bytes``; the last ``val_fraction`` of the slice is the validation split. The stdlib
differs between Python versions, so the run records the Python version and the slice's SHA-256.
"""
from __future__ import annotations

import copy
import difflib
import hashlib
import math
import platform
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

from ..modules import convert
from ..ops import resolve_backend
from ..recipes import ALIASES, display_name, from_recipe_name, recipe_summary
from .command import run_and_print
from .recipes import split_names
from .results import FINAL_LOSS_WINDOW, RecipeRun, TrainResults
from .runner import check_device, check_out_dir, progress_bar, run_info

VOCAB = 256  # bytes
DEFAULT_OUT = "train-out"
BASELINE = "bf16"
EXCLUDED_DIRS = {"site-packages", "dist-packages", "__pycache__"}


# ------------------------------------------------------------------------------------ recipes
@dataclass(frozen=True)
class TrainRecipe:
    name: str
    summary: str

    def recipe(self):
        """The registry's recipe (None for the unconverted ``bf16`` baseline)."""
        return from_recipe_name(self.name)


def train_recipe(name: str) -> TrainRecipe:
    from_recipe_name(name)  # ValueError for an invalid name
    return TrainRecipe(display_name(ALIASES.get(name, name)), recipe_summary(name))


# The catalogue `--recipes list` shows (any other registry name runs too); the first six run by default.
TRAIN_RECIPES: dict[str, TrainRecipe] = {r.name: r for r in map(train_recipe, (
    BASELINE, "mxfp8", "nvfp4", "te", "nvfp4-w2d-pt-sr", "nvfp4-w2d-4o6mae-sr",
    "mxfp8-hybrid", "nvfp4-w2d-pt-ptg-sr", "nvfp4-w2d-4o6w-rht-sr", "nvfp4-w2d-rht-sr-hpbwd",
))}
DEFAULT_TRAIN_RECIPES = ("bf16", "mxfp8", "nvfp4", "te", "nvfp4-w2d-pt-sr", "nvfp4-w2d-4o6mae-sr")


def resolve_train_recipes(names=None) -> list[TrainRecipe]:
    """Names (space- or comma-separated; None = the defaults, "all" = the catalogue; any registry name,
    see :mod:`nvfp4lab.recipes`) -> recipes in the given order, the baseline always first (added when
    missing: the gap columns are measured against it). ValueError lists the catalogue."""
    flat = split_names(names, DEFAULT_TRAIN_RECIPES)
    if not flat:
        raise ValueError(f"no recipe named; valid names: {', '.join(TRAIN_RECIPES)} (or 'all')")
    if "all" in flat:
        flat = list(TRAIN_RECIPES)
    specs, unknown = {}, []
    for n in flat:
        try:
            spec = TRAIN_RECIPES.get(n) or train_recipe(n)
        except ValueError:
            unknown.append(n)
            continue
        specs.setdefault(spec.name, spec)
    if unknown:
        hints = [f"{n} -> did you mean {', '.join(close)}?" for n in unknown
                 if (close := difflib.get_close_matches(n, list(TRAIN_RECIPES), n=2))]
        raise ValueError(f"unknown recipe(s): {', '.join(unknown)}. " + (" ".join(hints) + " " if hints else "")
                         + f"Valid names: {', '.join(TRAIN_RECIPES)} (or 'all', or any name of nvfp4lab.recipes)")
    baseline = TRAIN_RECIPES[BASELINE]
    return [baseline] + [spec for name, spec in specs.items() if name != BASELINE]


def recipe_lines() -> list[str]:
    width = max(len(n) for n in TRAIN_RECIPES)
    lines = [f"{'name':<{width}}  default  summary"]
    for name, r in TRAIN_RECIPES.items():
        lines.append(f"{name:<{width}}  {'   *   ' if name in DEFAULT_TRAIN_RECIPES else '       '}  {r.summary}")
    return lines


# -------------------------------------------------------------------------------------- sizes
@dataclass(frozen=True)
class TrainSize:
    """Model, batch and schedule of one run. d_model, 3*d_model and 4*d_model must be multiples of 32
    (MXFP8 blocks); d_model a multiple of heads."""

    d_model: int
    layers: int
    heads: int
    ctx: int
    batch: int
    steps: int
    lr: float
    corpus_bytes: int
    val_windows: int  # validation windows of ctx tokens, evaluated at every eval point
    evals: int = 10  # evaluation points after step 0

    def __post_init__(self):
        for name in ("d_model", "layers", "heads", "ctx", "batch", "steps", "corpus_bytes", "val_windows", "evals"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.d_model % 32:
            raise ValueError(f"d_model must be a multiple of 32 (MXFP8 blocks), got {self.d_model}")
        if self.d_model % self.heads:
            raise ValueError(f"d_model ({self.d_model}) must be a multiple of heads ({self.heads})")
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a positive number, got {self.lr!r}")

    @property
    def tokens_per_step(self) -> int:
        return self.batch * self.ctx


# small: the CPU default, all six default recipes in under 5 minutes on 2 cores with the reference
# backend (its quantize/GEMM emulation costs ~5-10x a BF16 step). medium: a GPU size.
SIZES = {
    "tiny": TrainSize(d_model=64, layers=1, heads=2, ctx=32, batch=8, steps=60, lr=3e-3, corpus_bytes=1 << 19, val_windows=32),
    "small": TrainSize(d_model=128, layers=2, heads=4, ctx=64, batch=8, steps=120, lr=3e-3, corpus_bytes=2 << 20, val_windows=48, evals=4),
    "medium": TrainSize(d_model=384, layers=6, heads=6, ctx=256, batch=64, steps=2000, lr=1e-3, corpus_bytes=16 << 20, val_windows=1024),
}
DEFAULT_SIZE = "small"


def resolve_size(size: Union[str, TrainSize], steps: Optional[int] = None) -> TrainSize:
    if isinstance(size, str):
        if size not in SIZES:
            raise ValueError(f"unknown size {size!r}; valid sizes: {', '.join(SIZES)}")
        size = SIZES[size]
    elif not isinstance(size, TrainSize):
        raise TypeError(f"size must be a size name or a TrainSize, got {type(size).__name__}")
    if steps is not None:
        if isinstance(steps, bool) or not isinstance(steps, int) or steps <= 0:
            raise ValueError(f"steps must be a positive integer, got {steps!r}")
        size = TrainSize(**{**size.__dict__, "steps": steps})
    return size


# ------------------------------------------------------------------------------------- corpus
def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def corpus_files(root: Path) -> list[Path]:
    """``*.py`` under ``root`` without site-packages, sorted by relative POSIX path (the same order on
    every file system)."""
    files = [p for p in root.rglob("*.py") if p.is_file() and not EXCLUDED_DIRS & set(p.relative_to(root).parts)]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


@dataclass
class Corpus:
    source: str
    train: torch.Tensor  # uint8 bytes
    val: torch.Tensor
    files: int
    sha256: str

    @property
    def nbytes(self) -> int:
        return self.train.numel() + self.val.numel()


def load_corpus(path=None, nbytes: int = 2 << 20, val_fraction: float = 0.1) -> Corpus:
    """The first ``nbytes`` of the corpus as bytes, split train | val (the tail). ``path``: None (the
    stdlib), a text file, or a folder (its ``*.py`` files, like the stdlib)."""
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    if path is None:
        root, files = stdlib_root(), corpus_files(stdlib_root())
        source = f"python{platform.python_version()} stdlib *.py ({root})"
    else:
        root = Path(path).expanduser()
        if root.is_dir():
            files = corpus_files(root)
        elif root.is_file():
            files = [root]
        else:
            raise ValueError(f"corpus {str(root)!r} is neither a file nor a folder")
        source = str(root)
    chunks, total = [], 0
    for f in files:
        if total >= nbytes:
            break
        data = f.read_bytes()
        chunks.append(data)
        total += len(data)
    blob = b"".join(chunks)[:nbytes]
    n_val = int(len(blob) * val_fraction)
    if n_val < 1024 or len(blob) - n_val < 1024:
        raise ValueError(f"corpus {source} holds {len(blob)} bytes; need at least 1 KiB for each split")
    data = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    return Corpus(source, data[: len(blob) - n_val].clone(), data[len(blob) - n_val:].clone(), len(chunks),
                  hashlib.sha256(blob).hexdigest())


def batch_starts(n_train: int, size: TrainSize, seed: int) -> torch.Tensor:
    """(steps, batch) window starts into the train split, drawn once so every recipe sees the same
    batches in the same order."""
    hi = n_train - size.ctx - 1
    if hi <= 0:
        raise ValueError(f"train split ({n_train} bytes) is shorter than ctx + 1 = {size.ctx + 1}")
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, hi, (size.steps, size.batch), generator=g)


def val_starts(n_val: int, size: TrainSize) -> torch.Tensor:
    """Evenly spaced (overlapping only when the split is short) validation window starts."""
    hi = n_val - size.ctx - 1
    if hi <= 0:
        raise ValueError(f"validation split ({n_val} bytes) is shorter than ctx + 1 = {size.ctx + 1}")
    return torch.linspace(0, hi, size.val_windows).round().long()


def windows(data: torch.Tensor, starts: torch.Tensor, ctx: int) -> tuple[torch.Tensor, torch.Tensor]:
    idx = starts.reshape(-1, 1) + torch.arange(ctx + 1, device=starts.device)
    w = data[idx].long()
    return w[:, :-1], w[:, 1:]


# -------------------------------------------------------------------------------------- model
class Block(nn.Module):
    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, 4 * d_model, bias=False)
        self.fc2 = nn.Linear(4 * d_model, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class CharTransformer(nn.Module):
    def __init__(self, size: TrainSize):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, size.d_model)
        self.pos = nn.Embedding(size.ctx, size.d_model)
        self.blocks = nn.ModuleList(Block(size.d_model, size.heads) for _ in range(size.layers))
        self.ln_f = nn.LayerNorm(size.d_model)
        self.head = nn.Linear(size.d_model, VOCAB, bias=False)
        for name, p in self.named_parameters():  # GPT-2 init; residual outputs scaled by depth
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * size.layers) if name.endswith(("proj.weight", "fc2.weight")) else 0.02
                nn.init.normal_(p, std=std)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def _keep_head(name: str, module: nn.Linear) -> bool:
    return name != "head"


# --------------------------------------------------------------------------------------- runs
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _lr_at(step: int, size: TrainSize) -> float:
    """Linear warmup over 10% of the steps, then cosine decay to 10% of the peak."""
    warmup = max(1, size.steps // 10)
    if step < warmup:
        return size.lr * (step + 1) / warmup
    t = (step - warmup) / max(1, size.steps - warmup)
    return size.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * t)))


@torch.no_grad()
def evaluate(model: nn.Module, data: torch.Tensor, starts: torch.Tensor, size: TrainSize, amp) -> float:
    """Mean next-byte cross-entropy (nats) over the validation windows, with the recipe's forward."""
    model.eval()
    total, count = torch.zeros((), dtype=torch.float64, device=data.device), 0
    for chunk in starts.split(size.batch):
        x, y = windows(data, chunk, size.ctx)
        with amp():
            logits = model(x)
        total += F.cross_entropy(logits.float().reshape(-1, VOCAB), y.reshape(-1), reduction="sum").double()
        count += y.numel()
    model.train()
    return float(total) / count


def eval_points(size: TrainSize) -> list[int]:
    """Steps completed at each evaluation: 0 (the initial weights), evenly spaced, and the last."""
    return sorted({0, *(round(size.steps * i / size.evals) for i in range(1, size.evals + 1))})


def train_one(spec: TrainRecipe, init_state: dict, size: TrainSize, corpus_dev: tuple, starts: torch.Tensor,
              vstarts: torch.Tensor, *, seed: int, device: torch.device, backend: Optional[str], bar=None, task=None) -> RecipeRun:
    train_data, val_data = corpus_dev
    model = CharTransformer(size)
    model.load_state_dict(init_state)
    model.to(device)
    recipe = spec.recipe()
    converted = [] if recipe is None else convert(model, recipe, filter=_keep_head, backend=backend).converted
    run = RecipeRun(spec.name, spec.summary, None if recipe is None else repr(recipe), converted)
    opt = torch.optim.AdamW(model.parameters(), lr=size.lr, betas=(0.9, 0.95), weight_decay=0.1)

    def amp():
        return torch.autocast(device.type, dtype=torch.bfloat16)

    # Stochastic rounding draws from the global RNG: the same seed for every recipe, set just before
    # its run, so runs do not depend on which recipes ran before them.
    torch.manual_seed(seed + 1)
    points = set(eval_points(size))
    pending = []  # step losses as 0-d device tensors, read back at evaluation points (one sync each)

    def evaluate_at(step_done: int) -> None:
        t0 = time.perf_counter()
        run.val_steps.append(step_done)
        run.val_losses.append(evaluate(model, val_data, vstarts, size, amp))
        run.eval_seconds += time.perf_counter() - t0

    evaluate_at(0)
    _sync(device)
    t_start = time.perf_counter()
    for step in range(size.steps):
        x, y = windows(train_data, starts[step], size.ctx)
        with amp():
            logits = model(x)
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, size)
        opt.step()
        pending.append(loss.detach())
        if step + 1 in points:
            _sync(device)
            run.train_seconds += time.perf_counter() - t_start
            run.train_losses.extend(torch.stack(pending).float().cpu().tolist())
            pending.clear()
            bad = [i for i, v in enumerate(run.train_losses) if not math.isfinite(v)]
            if bad:  # a diverged run stops: its later losses say nothing
                run.diverged_at = bad[0]
                run.train_losses += [math.nan] * (size.steps - len(run.train_losses))
                if bar is not None:
                    bar.advance(task, size.steps - step)  # this step and the skipped ones
                break
            evaluate_at(step + 1)
            if bar is not None:
                bar.update(task, description=f"{spec.name}: loss {run.train_losses[-1]:.3f}"[-34:])
            _sync(device)
            t_start = time.perf_counter()
        if bar is not None:
            bar.advance(task)
    return run


def run_train(
    *,
    recipes=None,
    steps: Optional[int] = None,
    size: Union[str, TrainSize] = DEFAULT_SIZE,
    device="cpu",
    out_dir=DEFAULT_OUT,
    seed: int = 0,
    corpus=None,
    backend: Optional[str] = None,
    progress: bool = True,
    write: bool = True,
) -> TrainResults:
    """Train the char transformer under each recipe (baseline first) and (``write``) save
    train-results.json and the loss plots into ``out_dir``. Bad arguments raise ValueError before any
    training starts."""
    start = time.perf_counter()
    specs = resolve_train_recipes(recipes)
    size = resolve_size(size, steps)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    dev = check_device(device)
    backend_name = resolve_backend(backend, dev)
    out = check_out_dir(out_dir) if write else None
    data = load_corpus(corpus, size.corpus_bytes)
    starts = batch_starts(data.train.numel(), size, seed).to(dev)
    vstarts = val_starts(data.val.numel(), size).to(dev)
    corpus_dev = (data.train.to(dev), data.val.to(dev))

    # The runs seed the global RNGs (initial weights, stochastic rounding); fork_rng restores the
    # caller's RNG state afterwards.
    rng_devices = [dev.index if dev.index is not None else torch.cuda.current_device()] if dev.type == "cuda" else []
    runs = []
    with torch.random.fork_rng(devices=rng_devices), progress_bar(progress) as bar:
        torch.manual_seed(seed)
        init_state = copy.deepcopy(CharTransformer(size).state_dict())  # built on CPU: same weights on any device
        params = sum(v.numel() for v in init_state.values())
        task = bar.add_task(specs[0].name, total=len(specs) * size.steps)
        for spec in specs:
            bar.update(task, description=spec.name)
            runs.append(train_one(spec, init_state, size, corpus_dev, starts, vstarts, seed=seed, device=dev,
                                  backend=backend, bar=bar, task=task))
    meta = {
        "model": f"char transformer d{size.d_model} x{size.layers} layers, {size.heads} heads",
        "size": {**size.__dict__, "params": params},
        "high_precision_layers": ["tok", "pos", "head", "LayerNorms"],
        "autocast": "bfloat16",
        "corpus": {"source": data.source, "files": data.files, "bytes": data.nbytes, "train_bytes": data.train.numel(),
                   "val_bytes": data.val.numel(), "sha256": data.sha256},
        "tokens_per_step": size.tokens_per_step,
        "final_train_loss_window": FINAL_LOSS_WINDOW,
        "recipes": [s.name for s in specs],
        "baseline": BASELINE,
        "device": str(dev),
        "backend": backend_name,
        "seed": seed,
        **run_info(start),
    }
    results = TrainResults(meta, runs)
    if write:
        from .train_report import write_outputs

        meta["files"] = write_outputs(results, out)
    return results


# ---------------------------------------------------------------------------------------- CLI
def add_parser(sub) -> None:
    p = sub.add_parser("train", help="train a small char transformer under each recipe; compare loss curves with BF16")
    p.add_argument("--recipes", nargs="+", default=None, metavar="NAME",
                   help=f"recipe names (space- or comma-separated), 'all', or 'list' (default: {' '.join(DEFAULT_TRAIN_RECIPES)}); "
                        f"the {BASELINE} baseline always runs first")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default: the size's, 200 for small)")
    p.add_argument("--size", default=DEFAULT_SIZE, choices=tuple(SIZES),
                   help="model/batch preset: tiny (smoke test), small (CPU default, < 5 min), medium (GPU)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"output folder for train-results.json and plots (default: ./{DEFAULT_OUT})")
    p.add_argument("--seed", type=int, default=0, help="weights, data order and stochastic-rounding seed")
    p.add_argument("--corpus", default=None, metavar="PATH",
                   help="text file, or folder of *.py files (default: the Python standard library's sources)")
    p.add_argument("--backend", choices=("ref", "triton"), default=None, help="quantization backend (default: triton on cuda, ref on cpu)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run_command)


def run_command(args) -> int:
    if args.recipes == ["list"]:
        print("\n".join(recipe_lines()))
        return 0
    from .train_report import print_results

    return run_and_print(
        lambda: run_train(recipes=args.recipes, steps=args.steps, size=args.size, device=args.device,
                          out_dir=args.out, seed=args.seed, corpus=args.corpus, backend=args.backend,
                          progress=not args.no_progress),
        print_results, args.out)

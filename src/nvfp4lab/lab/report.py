"""Lab outputs: the ranked rich table, results.json, results.csv (one row per recipe), layers.csv (one
row per recipe and layer) and PNG plots (SQNR by role as grouped bars, per-layer heat maps)."""
from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path

from .metrics import GEMM_METRICS, METRICS
from .recipes import BF16Format
from .results import LabResults

PLOT_ROLES = (  # (metric, label) of the grouped-bar plot: the operands of fprop, then the three GEMMs
    ("weight_rowwise", "W"), ("activation_rowwise", "x"), ("gradient_rowwise", "dy"),
    ("fprop", "fprop y"), ("dgrad", "dgrad dx"), ("wgrad", "wgrad dW"),
)
HEATMAPS = (("fprop", "fprop_sqnr_by_layer.png"), ("activation_rowwise", "activation_sqnr_by_layer.png"))


def finite_or_none(v):
    """JSON has no inf/nan: an exact copy (inf dB) is written as null."""
    return v if isinstance(v, (int, float)) and math.isfinite(v) else None


def summary_row(r) -> dict:
    row = {"rank": r.rank, "recipe": r.recipe.name, "cosine_mean": r.cosine_mean, "cosine_min": r.cosine_min}
    for m in METRICS:
        worst, layer = r.worst(m)
        row[f"{m}_mean_db"] = r.mean(m)
        row[f"{m}_worst_db"] = worst
        row[f"{m}_worst_layer"] = layer
    row["seconds"] = r.seconds
    return row


def to_json_dict(lab: LabResults) -> dict:
    recipes = []
    for r in lab.results:
        s = summary_row(r)
        recipes.append({
            "rank": r.rank,
            "name": r.recipe.name,
            "summary": r.recipe.summary,
            "formats": r.recipe.describe(),
            "end_to_end": {"cosine_mean": r.cosine_mean, "cosine_min": r.cosine_min},
            "sqnr_db": {m: {"mean": finite_or_none(s[f"{m}_mean_db"]), "worst": finite_or_none(s[f"{m}_worst_db"]),
                            "worst_layer": s[f"{m}_worst_layer"]} for m in METRICS},
            "layers": [{k: (v if k == "layer" else finite_or_none(v)) for k, v in row.items()} for row in r.layers],
            "seconds": round(r.seconds, 3),
        })
    return {"meta": lab.meta, "recipes": recipes}


def write_json(lab: LabResults, path: Path) -> None:
    path.write_text(json.dumps(to_json_dict(lab), indent=2, allow_nan=False) + "\n", encoding="utf-8")


def write_csv(lab: LabResults, path: Path) -> None:
    rows = [summary_row(r) for r in lab.results]
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def write_layers_csv(lab: LabResults, path: Path) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=["recipe", "layer", *METRICS])
        writer.writeheader()
        for r in lab.results:
            for row in r.layers:
                writer.writerow({"recipe": r.recipe.name, **row})


def _plot_value(v: float) -> float:
    return v if math.isfinite(v) else float("nan")


def plot_roles(lab: LabResults, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r.recipe.name for r in lab.results]
    width = 0.8 / len(PLOT_ROLES)
    fig, ax = plt.subplots(figsize=(max(8.0, 0.9 * len(names) + 3), 5))
    for i, (metric, label) in enumerate(PLOT_ROLES):
        xs = [j + (i - (len(PLOT_ROLES) - 1) / 2) * width for j in range(len(names))]
        ax.bar(xs, [_plot_value(r.mean(metric)) for r in lab.results], width, label=label)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=40, ha="right", fontsize=8)
    ax.set_ylabel("SQNR (dB), mean over layers")
    ax.set_title(f"SQNR by tensor role ({lab.meta['model']}, {lab.meta['tokens_per_layer']} tokens/layer); "
                 "recipes ranked by end-to-end cosine")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(ncol=len(PLOT_ROLES), fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def short_layer_names(names: list[str]) -> list[str]:
    """Drop the dotted prefix all names share ("encoder.layer.") so the labels fit."""
    prefix = os.path.commonprefix(names)
    prefix = prefix[: prefix.rfind(".") + 1]
    return [n[len(prefix):] or n for n in names]


def plot_heatmap(lab: LabResults, metric: str, path: Path) -> None:
    """Layers x recipes, each cell annotated with its SQNR. The color scale spans the quantized recipes;
    the BF16 baseline (~30 dB above them) saturates instead of flattening their differences."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    layers = short_layer_names(lab.layer_names)
    grid = np.array([[_plot_value(row[metric]) for row in r.layers] for r in lab.results]).T  # layers x recipes
    quantized = [j for j, r in enumerate(lab.results) if not isinstance(r.recipe.weight, BF16Format)]
    scale = grid[:, quantized] if quantized else grid
    vmin, vmax = float(np.nanmin(scale)), float(np.nanmax(scale))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.8 * len(lab.results) + 3), max(4.0, 0.24 * len(layers) + 2)))
    im = ax.imshow(grid, aspect="auto", cmap="viridis", vmin=vmin, vmax=vmax)
    for (i, j), v in np.ndenumerate(grid):
        if math.isfinite(v):
            light = (v - vmin) / max(vmax - vmin, 1e-9) < 0.6
            ax.text(j, i, f"{v:.1f}", ha="center", va="center", fontsize=5, color="white" if light else "black")
    ax.set_xticks(range(len(lab.results)))
    ax.set_xticklabels([r.recipe.name for r in lab.results], rotation=40, ha="right", fontsize=7)
    ax.set_yticks(range(len(layers)))
    ax.set_yticklabels(layers, fontsize=6)
    fig.colorbar(im, ax=ax, label=f"{metric} SQNR (dB)", extend="max")
    ax.set_title(f"{metric} SQNR per layer (dB), {lab.meta['model']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(lab: LabResults, out: Path) -> list[str]:
    """Write every output file into ``out`` (created if needed); returns their names."""
    out.mkdir(parents=True, exist_ok=True)
    files = ["results.json", "results.csv", "layers.csv", "sqnr_by_role.png", *(f for _, f in HEATMAPS)]
    lab.meta["files"] = files
    write_csv(lab, out / "results.csv")
    write_layers_csv(lab, out / "layers.csv")
    plot_roles(lab, out / "sqnr_by_role.png")
    for metric, name in HEATMAPS:
        plot_heatmap(lab, metric, out / name)
    write_json(lab, out / "results.json")  # last, so it lists files that exist
    return files


# ---------------------------------------------------------------------------------- terminal
def _db(v: float) -> str:
    return "exact" if v == math.inf else f"{v:.1f}"


def results_table(lab: LabResults):
    """rich Table, best end-to-end first."""
    from rich import box
    from rich.table import Table

    m = lab.meta
    table = Table(
        title=f"nvfp4lab lab: {m['model']} ({m['model_type']}), {m['sentences']} sentences, "
              f"{len(m['layers'])} Linear layers, {m['tokens_per_layer']} tokens/layer",
        caption="emb cos: cosine of sentence embeddings, fake-quantized forward vs FP32 (mean and min over sentences).\n"
                "SQNR in dB vs FP32, mean over layers: W/x/dy as rowwise/columnwise copy, GEMMs as mean/worst layer.",
        box=box.SIMPLE_HEAD, pad_edge=False,
    )
    table.add_column("#", justify="right")
    table.add_column("recipe", style="bold", no_wrap=True)
    table.add_column("emb cos", justify="right")
    table.add_column("min cos", justify="right")
    for label in ("W", "x", "dy"):
        table.add_column(label, justify="right", no_wrap=True)
    for g in GEMM_METRICS:
        table.add_column(g, justify="right", no_wrap=True)
    for r in lab.results:
        cells = [str(r.rank), r.recipe.name, f"{r.cosine_mean:.5f}", f"{r.cosine_min:.5f}"]
        for role in ("weight", "activation", "gradient"):
            cells.append(f"{_db(r.mean(role + '_rowwise'))}/{_db(r.mean(role + '_columnwise'))}")
        for g in GEMM_METRICS:
            cells.append(f"{_db(r.mean(g))}/{_db(r.worst(g)[0])}")
        table.add_row(*cells)
    return table


def default_console():
    from rich.console import Console

    console = Console()
    if not console.is_terminal:  # a file or pipe: keep whole rows rather than 80 columns
        console = Console(width=160)
    return console


def print_results(lab: LabResults, console=None) -> None:
    if console is None:
        console = default_console()
    console.print(results_table(lab))
    skipped = lab.meta.get("skipped_layers") or {}
    for name, why in skipped.items():
        console.print(f"[dim]not analysed: {name}: {why}[/dim]")

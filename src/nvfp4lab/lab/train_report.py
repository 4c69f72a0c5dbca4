"""``nvfp4lab train`` outputs: the rich table, train-results.json and two PNGs (loss curves of every
recipe, train and validation; their gap to the BF16 baseline)."""
from __future__ import annotations

import json
import math
from pathlib import Path

from .report import default_console, finite_or_none
from .results import FINAL_LOSS_WINDOW, TrainResults

FILES = ("train-results.json", "train-loss.png", "train-gap.png")


def gaps(results: TrainResults, run) -> dict:
    """The run's final losses against the baseline's: absolute difference and ratio."""
    base = results.baseline
    out = {}
    for split, mine, ref in (("train", run.final_train_loss, base.final_train_loss),
                             ("val", run.final_val_loss, base.final_val_loss)):
        out[f"{split}_abs"] = mine - ref
        out[f"{split}_ratio"] = mine / ref if ref > 0 else math.nan
    return out


def to_json_dict(results: TrainResults) -> dict:
    tps = results.meta["tokens_per_step"]
    runs = []
    for r in results.runs:
        runs.append({
            "name": r.name,
            "summary": r.summary,
            "recipe": r.recipe,
            "converted_layers": r.converted,
            "final_train_loss": finite_or_none(r.final_train_loss),
            "final_val_loss": finite_or_none(r.final_val_loss),
            "gap_vs_baseline": {k: finite_or_none(v) for k, v in gaps(results, r).items()},
            "tokens_per_second": finite_or_none(r.tokens_per_second(tps)),
            "train_seconds": round(r.train_seconds, 3),
            "eval_seconds": round(r.eval_seconds, 3),
            "diverged_at_step": r.diverged_at,
            "train_loss_per_step": [finite_or_none(v) for v in r.train_losses],
            "val_steps": r.val_steps,
            "val_loss": [finite_or_none(v) for v in r.val_losses],
        })
    return {"meta": results.meta, "recipes": runs}


def write_json(results: TrainResults, path: Path) -> None:
    path.write_text(json.dumps(to_json_dict(results), indent=2, allow_nan=False) + "\n", encoding="utf-8")


def smooth(values: list, window: int) -> list:
    """Trailing moving average (shorter at the start), the same for every recipe."""
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _title(results: TrainResults) -> str:
    m = results.meta
    return (f"{m['model']}, ctx {m['size']['ctx']}, batch {m['size']['batch']}, {m['size']['steps']} steps, "
            f"{m['device']}/{m['backend']}")


def plot_losses(results: TrainResults, path: Path) -> None:
    plt = _pyplot()
    steps = results.meta["size"]["steps"]
    window = max(1, steps // 20)
    fig, (ax_t, ax_v) = plt.subplots(1, 2, figsize=(12, 4.5))
    for r in results.runs:
        style = dict(color="black", linewidth=2) if r is results.baseline else dict(linewidth=1.2)
        ax_t.plot(range(1, len(r.train_losses) + 1), smooth(r.train_losses, window), label=r.name, **style)
        ax_v.plot(r.val_steps, r.val_losses, marker="o", markersize=3, label=r.name, **style)
    ax_t.set_title(f"train loss (moving average of {window} steps)")
    ax_v.set_title("validation loss")
    for ax in (ax_t, ax_v):
        ax.set_xlabel("step")
        ax.set_ylabel("cross-entropy (nats/byte)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(_title(results), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_gaps(results: TrainResults, path: Path) -> None:
    plt = _pyplot()
    base = results.baseline
    steps = results.meta["size"]["steps"]
    window = max(1, steps // 20)
    base_train = smooth(base.train_losses, window)
    fig, (ax_t, ax_v) = plt.subplots(1, 2, figsize=(12, 4.5))
    for r in results.runs[1:]:
        train = smooth(r.train_losses, window)
        ax_t.plot(range(1, len(train) + 1), [a - b for a, b in zip(train, base_train)], label=r.name, linewidth=1.2)
        ax_v.plot(r.val_steps, [a - b for a, b in zip(r.val_losses, base.val_losses)], marker="o", markersize=3, label=r.name)
    ax_t.set_title(f"train loss - {base.name} (moving average of {window} steps)")
    ax_v.set_title(f"validation loss - {base.name}")
    for ax in (ax_t, ax_v):
        ax.axhline(0.0, color="black", linewidth=1)
        ax.set_xlabel("step")
        ax.set_ylabel("loss gap (nats/byte)")
        ax.grid(alpha=0.3)
        if len(results.runs) > 1:
            ax.legend(fontsize=8)
    fig.suptitle(_title(results), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(results: TrainResults, out: Path) -> list[str]:
    out.mkdir(parents=True, exist_ok=True)
    results.meta["files"] = list(FILES)
    plot_losses(results, out / "train-loss.png")
    plot_gaps(results, out / "train-gap.png")
    write_json(results, out / "train-results.json")  # last, so it lists files that exist
    return list(FILES)


# ---------------------------------------------------------------------------------- terminal
def _loss(v: float) -> str:
    return f"{v:.4f}" if math.isfinite(v) else "-"


def results_table(results: TrainResults):
    from rich import box
    from rich.table import Table

    m = results.meta
    s = m["size"]
    table = Table(
        title=f"nvfp4lab train: {m['model']} ({s['params'] / 1e6:.2f}M params), ctx {s['ctx']}, batch {s['batch']}, "
              f"{s['steps']} steps, {m['corpus']['bytes'] / 2**20:.1f} MiB corpus, {m['device']}/{m['backend']}",
        caption=f"Losses in nats/byte. train: mean of the last {min(FINAL_LOSS_WINDOW, s['steps'])} steps; val: "
                f"{s['val_windows']} held-out windows after the last step.\n"
                f"gap: val loss minus the {m['baseline']} baseline's, and their ratio. tok/s: training steps only.",
        box=box.SIMPLE_HEAD, pad_edge=False,
    )
    table.add_column("recipe", style="bold", no_wrap=True)
    for label in ("train loss", "val loss", "val gap", "val ratio", "tok/s", "train s"):
        table.add_column(label, justify="right", no_wrap=True)
    table.add_column("notes")
    tps = m["tokens_per_step"]
    for r in results.runs:
        g = gaps(results, r)
        note = r.summary if r.diverged_at is None else f"diverged at step {r.diverged_at}"
        gap = "-" if r is results.baseline else (f"{g['val_abs']:+.4f}" if math.isfinite(g["val_abs"]) else "-")
        ratio = "-" if r is results.baseline else (f"{g['val_ratio']:.4f}" if math.isfinite(g["val_ratio"]) else "-")
        table.add_row(r.name, _loss(r.final_train_loss), _loss(r.final_val_loss), gap, ratio,
                      f"{r.tokens_per_second(tps):,.0f}", f"{r.train_seconds:.1f}", note)
    return table


def print_results(results: TrainResults, console=None) -> None:
    if console is None:
        console = default_console()
    console.print(results_table(results))

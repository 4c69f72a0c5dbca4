"""Result records of ``nvfp4lab lab`` and ``nvfp4lab train``: what the runners produce and the reports read."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from .recipes import LabRecipe

FINAL_LOSS_WINDOW = 20  # "final train loss" = mean of the last this-many step losses (one batch is noisy)


# ------------------------------------------------------------------------------------------ lab
@dataclass
class RecipeResult:
    recipe: LabRecipe
    layers: list  # one {"layer": name, <metric>: dB, ...} per analysed Linear
    cosine_mean: float  # end-to-end: mean over sentences of cos(embedding_quantized, embedding_fp32)
    cosine_min: float
    seconds: float
    rank: int = 0

    def values(self, metric: str) -> list[float]:
        return [row[metric] for row in self.layers]

    def mean(self, metric: str) -> float:
        """Mean over layers of the per-layer SQNR in dB."""
        vals = self.values(metric)
        return math.fsum(vals) / len(vals)

    def worst(self, metric: str) -> tuple[float, str]:
        """(lowest per-layer SQNR, that layer's name)."""
        row = min(self.layers, key=lambda r: r[metric])
        return row[metric], row["layer"]


@dataclass
class LabResults:
    meta: dict
    results: list = field(default_factory=list)  # RecipeResult, best end-to-end first

    @property
    def layer_names(self) -> list[str]:
        return [row["layer"] for row in self.results[0].layers] if self.results else []


# ---------------------------------------------------------------------------------------- train
@dataclass
class RecipeRun:
    name: str
    summary: str
    recipe: Optional[str]  # repr of the NVFP4Recipe / MXFP8Recipe; None for the baseline
    converted: list
    train_losses: list = field(default_factory=list)  # one per step (nan after a divergence)
    val_steps: list = field(default_factory=list)  # steps completed at each evaluation
    val_losses: list = field(default_factory=list)
    train_seconds: float = 0.0
    eval_seconds: float = 0.0
    diverged_at: Optional[int] = None  # first step whose loss was not finite

    @property
    def final_train_loss(self) -> float:
        """Mean of the last FINAL_LOSS_WINDOW step losses (nan after a divergence)."""
        tail = self.train_losses[-FINAL_LOSS_WINDOW:]
        return math.fsum(tail) / len(tail) if tail else math.nan

    @property
    def final_val_loss(self) -> float:
        return self.val_losses[-1] if self.val_losses else math.nan

    def tokens_per_second(self, tokens_per_step: int) -> float:
        done = len(self.train_losses) if self.diverged_at is None else self.diverged_at + 1
        return done * tokens_per_step / self.train_seconds if self.train_seconds > 0 else math.nan


@dataclass
class TrainResults:
    meta: dict
    runs: list  # RecipeRun, baseline first

    @property
    def baseline(self) -> RecipeRun:
        return self.runs[0]

"""``nvfp4lab train`` on the tiny size (1 block, d_model 64, ctx 32, batch 8), 30 steps: the CLI end to end,
determinism and isolation of the runs, the corpus, and argument errors. About 30 s on 2 CPU cores."""
from __future__ import annotations

import contextlib
import io
import json
import math

import pytest

from nvfp4lab import NVFP4Recipe
from nvfp4lab.cli import main
from nvfp4lab.lab import train as T
from nvfp4lab.lab.train_report import print_results, to_json_dict

STEPS = 30
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
BLOCK_LINEARS = ["blocks.0.qkv", "blocks.0.proj", "blocks.0.fc1", "blocks.0.fc2"]


def _strict_json(text: str):
    def refuse(name):
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def _mean(values):
    return sum(values) / len(values)


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    """The CLI with two recipes (the bf16 baseline is added in front)."""
    out = tmp_path_factory.mktemp("train-out")
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        rc = main(["train", "--size", "tiny", "--steps", str(STEPS), "--recipes", "mxfp8,te", "--out", str(out), "--no-progress"])
    return rc, out, stdout.getvalue()


def test_cli_writes_valid_json_and_pngs(cli_run):
    rc, out, stdout = cli_run
    assert rc == 0
    data = _strict_json((out / "train-results.json").read_text())
    assert [r["name"] for r in data["recipes"]] == ["bf16", "mxfp8", "te"]
    for name in data["meta"]["files"]:
        assert (out / name).is_file()
    pngs = [n for n in data["meta"]["files"] if n.endswith(".png")]
    assert len(pngs) == 2
    for name in pngs:
        assert (out / name).read_bytes()[:8] == PNG_MAGIC
    size = T.SIZES["tiny"]
    assert data["meta"]["size"]["steps"] == STEPS and data["meta"]["tokens_per_step"] == size.batch * size.ctx
    base = data["recipes"][0]
    for r in data["recipes"]:
        assert len(r["train_loss_per_step"]) == STEPS
        assert r["val_steps"][0] == 0 and r["val_steps"][-1] == STEPS
        assert r["final_val_loss"] == r["val_loss"][-1]
        assert r["final_train_loss"] == pytest.approx(_mean(r["train_loss_per_step"][-T.FINAL_LOSS_WINDOW:]))
        gap = r["gap_vs_baseline"]
        assert gap["val_abs"] == pytest.approx(r["final_val_loss"] - base["final_val_loss"])
        assert gap["val_ratio"] == pytest.approx(r["final_val_loss"] / base["final_val_loss"])
        assert r["tokens_per_second"] > 0 and r["diverged_at_step"] is None
    # the four Linears of the block are quantized; the LM head stays in high precision
    assert base["converted_layers"] == [] and base["recipe"] is None
    for r in data["recipes"][1:]:
        assert r["converted_layers"] == BLOCK_LINEARS
    assert "MXFP8Recipe" in data["recipes"][1]["recipe"] and "NVFP4Recipe" in data["recipes"][2]["recipe"]
    for name in ("bf16", "mxfp8", "te", "val loss", "tok/s"):
        assert name in stdout


def test_loss_decreases_for_each_recipe(cli_run):
    _, out, _ = cli_run
    data = _strict_json((out / "train-results.json").read_text())
    for r in data["recipes"]:
        losses = r["train_loss_per_step"]
        first, last = _mean(losses[:5]), _mean(losses[-5:])
        # near-uniform predictions at init (0.02-std weights): about ln(256) nats per byte
        assert abs(losses[0] - math.log(256)) < 0.1, r["name"]
        assert last < first - 1.0, (r["name"], first, last)
        assert r["val_loss"][-1] < r["val_loss"][0] - 1.0, r["name"]


def test_same_seed_same_losses_and_runs_independent_of_other_recipes(cli_run):
    """Running te alone (after the baseline) gives bit-identical losses to running it after mxfp8:
    same initial weights, same batches, same stochastic-rounding bits; the baseline repeats too."""
    _, out, _ = cli_run
    before = {r["name"]: r for r in _strict_json((out / "train-results.json").read_text())["recipes"]}
    again = T.run_train(recipes=["te"], size="tiny", steps=STEPS, write=False, progress=False)
    assert [r.name for r in again.runs] == ["bf16", "te"]
    for run in again.runs:
        assert run.train_losses == before[run.name]["train_loss_per_step"], run.name
        assert run.val_losses == before[run.name]["val_loss"], run.name


def test_other_seed_other_losses():
    a = T.run_train(recipes=["bf16"], size="tiny", steps=5, seed=0, write=False, progress=False)
    b = T.run_train(recipes=["bf16"], size="tiny", steps=5, seed=1, write=False, progress=False)
    assert a.runs[0].train_losses != b.runs[0].train_losses


def test_default_corpus_starts_with_the_first_stdlib_file():
    first = T.stdlib_root() / "__future__.py"  # the first *.py in sorted order
    corpus = T.load_corpus(nbytes=4096, val_fraction=0.25)
    assert bytes(corpus.train.tolist()) + bytes(corpus.val.tolist()) == first.read_bytes()[:4096]
    assert corpus.val.numel() == 1024 and corpus.files == 1


def test_folder_corpus_sorted_without_site_packages(tmp_path):
    files = {"b/c.py": b"c" * 3000, "a.py": b"a" * 3000, "site-packages/x.py": b"x" * 3000, "notes.txt": b"n" * 3000}
    for rel, content in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(content)
    corpus = T.load_corpus(tmp_path, nbytes=1 << 20, val_fraction=0.25)
    assert corpus.files == 2
    assert bytes(corpus.train.tolist()) == b"a" * 3000 + b"c" * 1500
    assert bytes(corpus.val.tolist()) == b"c" * 1500


def test_diverged_run_reports_nulls_and_note():
    size = T.resolve_size("tiny", 4)
    base = T.RecipeRun("bf16", "baseline", None, [], [3.0, 2.9, 2.8, 2.7], [0, 4], [3.1, 2.8], 1.0)
    bad = T.RecipeRun("nvfp4", "x", "NVFP4Recipe()", BLOCK_LINEARS, [3.0, math.nan, math.nan, math.nan], [0], [3.1], 1.0,
                      diverged_at=1)
    meta = {"model": "m", "size": {**size.__dict__, "params": 1}, "corpus": {"bytes": 1 << 20}, "device": "cpu",
            "backend": "ref", "baseline": "bf16", "tokens_per_step": size.tokens_per_step}
    results = T.TrainResults(meta, [base, bad])
    data = _strict_json(json.dumps(to_json_dict(results), allow_nan=False))
    row = data["recipes"][1]
    assert row["final_train_loss"] is None and row["train_loss_per_step"][1:] == [None] * 3
    assert row["diverged_at_step"] == 1 and row["final_val_loss"] == 3.1
    console_out = io.StringIO()
    from rich.console import Console

    print_results(results, Console(file=console_out, width=200))
    assert "diverged at step 1" in console_out.getvalue()


# ------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("argv, message", [
    (["--recipes", "bf16", "nvfp5"], "unknown recipe(s): nvfp5"),
    (["--steps", "0"], "steps must be a positive integer"),
    (["--steps", "-3"], "steps must be a positive integer"),
    (["--device", "tpu"], "device must be"),
])
def test_cli_bad_arguments_exit_nonzero_with_message(argv, message, tmp_path, capsys):
    out = tmp_path / "never-written"
    assert main(["train", "--size", "tiny", "--out", str(out), "--no-progress", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert not out.exists()


def test_unknown_recipe_error_lists_valid_names():
    with pytest.raises(ValueError) as info:
        T.run_train(recipes=["te", "nvfp4-w2d-pt-st"], size="tiny", steps=1, write=False, progress=False)
    text = str(info.value)
    assert "nvfp4-w2d-pt-st -> did you mean nvfp4-w2d-pt-sr" in text
    for name in T.DEFAULT_TRAIN_RECIPES:
        assert name in text


def test_api_bad_arguments():
    with pytest.raises(ValueError, match="steps must be a positive integer"):
        T.run_train(steps=0, write=False, progress=False)
    with pytest.raises(ValueError, match="unknown size"):
        T.run_train(size="huge", write=False, progress=False)
    with pytest.raises(ValueError, match="no recipe named"):
        T.run_train(recipes=[","], write=False, progress=False)
    with pytest.raises(ValueError, match="multiple of 32"):
        T.TrainSize(d_model=48, layers=1, heads=2, ctx=8, batch=2, steps=1, lr=1e-3, corpus_bytes=4096, val_windows=1)


def test_out_path_that_is_a_file_is_refused(tmp_path):
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(ValueError, match="not a folder"):
        T.run_train(size="tiny", steps=1, out_dir=target, progress=False)


def test_recipes_list_prints_catalogue(capsys):
    assert main(["train", "--recipes", "list"]) == 0
    text = capsys.readouterr().out
    for name in T.TRAIN_RECIPES:
        assert name in text


def test_any_registry_name_trains():
    specs = T.resolve_train_recipes(["nvfp4-rht-sr", "nvfp4-w2d-rht-sr"])
    assert [s.name for s in specs] == ["bf16", "nvfp4-rht-sr", "te"]
    assert specs[1].recipe() == NVFP4Recipe(weight_2d=False, rht=True, stochastic_rounding=True)
    assert specs[0].recipe() is None

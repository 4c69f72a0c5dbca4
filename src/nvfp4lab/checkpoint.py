"""Quantized checkpoints: save and load a converted model's packed weights, and export them in the
NVFP4 layout that inference engines read (NVIDIA Model Optimizer's Hugging Face checkpoint).

nvfp4lab's own file (:func:`save_quantized` / :func:`load_quantized`): one safetensors file. Per
nvfp4lab layer ``L`` (training-form :class:`~nvfp4lab.Linear` or :class:`InferenceLinear`)::

    L.weight_data   uint8 (N, K/2)   NVFP4 codes, element 2j in the low nibble   | MXFP8: (N, K) E4M3 bits
    L.weight_scale  uint8 (N, K/16)  E4M3 block scales, compact                  | MXFP8: (N, K/32) E8M0
    L.weight_amax   fp32  (1,)       per-tensor amax (NVFP4)

plus every other entry of the model's state_dict as is (biases, norms, embeddings). The metadata
holds ``format`` = "nvfp4lab.quantized", ``format_version``, ``nvfp4lab_version``, ``recipe`` (JSON,
when every layer has the same one) and ``layers`` (JSON: per layer its kind, features, bias, weight
dtype and recipe). A value is ``e2m1(code) * e4m3(scale) * amax / (6 * E)`` (README, "The NVFP4
layout"). Loading converts the listed layers of a model of the same architecture to
:class:`InferenceLinear` with the recorded recipe: its forward is the saved model's forward, bit for bit.

Serving layout (:func:`export_modelopt`), per exported Linear ``L`` (vLLM's ModelOpt NVFP4 linear
method reads exactly these)::

    L.weight          uint8 (N, K/2)          the same codes (ModelOpt packs element 2j low, 2j+1 high)
    L.weight_scale    float8_e4m3fn (N, K/16) the same scale bytes
    L.weight_scale_2  fp32 scalar             amax / (6 * E)   (ModelOpt: amax / (6 * 448))
    L.input_scale     fp32 scalar             calibrated input amax / (6 * 448)
    L.bias            as in the model

with ``hf_quant_config.json`` ({"producer": ..., "quantization": {"quant_algo": "NVFP4",
"kv_cache_quant_algo": null, "group_size": 16, "exclude_modules": [...]}}) and, for a Hugging Face
model, ``config.json`` carrying ``quantization_config`` ({"quant_method": "modelopt", "quant_algo":
"NVFP4", "group_size": 16, "kv_cache_quant_algo": null, "ignore": [...]}). A serving engine decodes
``e2m1 * e4m3 * weight_scale_2``: the codes and block scales are nvfp4lab's bits, and E = 256
(4over6 weights) is expressed through ``weight_scale_2`` = amax / 1536, so every NVFP4 weight recipe
(1x16 or 16x16 blocks, E = 448 or 256) exports without re-quantization. The activations are
quantized by the engine (per tensor with the static ``input_scale``, round to nearest, E = 448): a
per-token or 4over6 activation recipe is not reproduced there.

Distributed checkpoints (``torch.distributed.checkpoint`` of a sharded state_dict, e.g. FSDP2's) hold the
high-precision weights and each layer's recipe entry; :func:`dcp_recipes` reads the recipes back, so
the model can be built with them before ``dcp.load``.
"""
from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from torch import nn

from . import functional as F
from . import ops
from .layout import roundup
from .modules.inference import InferenceLinear
from .modules.linear import GroupedLinear, Linear
from .modules.state import EXTRA_STATE_FORMAT, decode_extra_state, recipe_differences, recipe_from_dict, recipe_to_dict
from .recipes import MXFP8Recipe, NVFP4Recipe
from .tensors import MXFP8Tensor, NVFP4Tensor
from .version import __version__

FORMAT = "nvfp4lab.quantized"
FORMAT_VERSION = 1
WEIGHT_KEYS = ("weight_data", "weight_scale", "weight_amax")
MODELOPT_E4M3_MAX = 448.0  # ModelOpt's (and the engines') E for activations: input_scale = amax / (6 * 448)


# ------------------------------------------------------------------------------------- helpers
def _block(recipe) -> int:
    return 32 if isinstance(recipe, MXFP8Recipe) else 16


def _compact_scale(scale: torch.Tensor, layout: str, rows: int, cols: int) -> torch.Tensor:
    if layout == "compact":
        return scale
    if layout == "padded":
        return scale[:rows, :cols]
    return ops.unswizzle_scales(scale, rows, cols)


def _layout_scale(compact: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "compact":
        return compact
    if layout == "swizzled":
        return ops.swizzle_scales(compact)
    rows, cols = compact.shape
    padded = compact.new_zeros((roundup(rows, 128), roundup(cols, 4)))
    padded[:rows, :cols] = compact
    return padded


def _quantized_layers(model: nn.Module) -> dict:
    """name -> nvfp4lab layer (Linear, InferenceLinear, GroupedLinear), every path of a shared one."""
    return {name: m for name, m in model.named_modules(remove_duplicate=False)
            if isinstance(m, (Linear, InferenceLinear, GroupedLinear))}


def _rowwise_weight(name: str, layer):
    """The rowwise quantized weight of a Linear / InferenceLinear (the bits its forward uses)."""
    if isinstance(layer.recipe, NVFP4Recipe) and layer.recipe.tensor_config("weight").per_token:
        raise ValueError(f"layer {name!r}: its recipe quantizes the weight per token (PR 3045, numerics='te_pr3045'), "
                         "which has no quantized checkpoint form (one weight amax per tensor); save its state_dict instead")
    if isinstance(layer, InferenceLinear):
        return layer.quantized_weight()
    if isinstance(layer, GroupedLinear):
        raise ValueError(f"layer {name!r}: GroupedLinear has no quantized checkpoint form yet; save its state_dict "
                         "(high-precision weights and recipe) instead")
    with torch.no_grad():
        return F.quantize_weight(layer.weight.detach(), layer.recipe, columnwise=False, backend=layer.backend)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


def _plain_state(model: nn.Module, layers: Mapping[str, nn.Module], dtype: torch.dtype | None = None) -> dict:
    """The model's state_dict without the quantized layers' weights and every recipe entry; floating
    tensors cast to ``dtype`` when given. Tensors sharing storage are copied (safetensors needs that)."""
    dropped = set()
    for name in layers:
        dropped.update(f"{name}.{k}" for k in ("weight", *WEIGHT_KEYS))
    state, seen = {}, set()
    for key, value in model.state_dict().items():
        if key in dropped or key.endswith("_extra_state"):
            continue
        value = value.detach()
        if dtype is not None and value.is_floating_point():
            value = value.to(dtype)
        value = value.contiguous()
        if value.data_ptr() in seen and value.numel():
            value = value.clone()
        seen.add(value.data_ptr())
        state[key] = value.cpu()
    return state


# ----------------------------------------------------------------------------- nvfp4lab's file
def save_quantized(model: nn.Module, path) -> dict:
    """Write ``model``'s quantized layers (packed data, compact scales, amax) and the rest of its
    state_dict to one safetensors file at ``path`` (layout and metadata: module docstring). Layers
    in training form are quantized with their recipe's weight config (rowwise copy: the bits their
    forward uses). Returns the metadata written. GroupedLinear layers raise ValueError (no quantized
    form yet)."""
    from safetensors.torch import save_file

    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ValueError(f"path must name a file, {path!r} is a directory")
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"path's folder {folder!r} does not exist")
    layers = _quantized_layers(model)
    if not layers:
        raise ValueError("model has no nvfp4lab layers: convert it first (nvfp4lab.convert)")
    tensors, records = {}, {}
    for name, layer in layers.items():
        q = _rowwise_weight(name, layer)
        n, k = q.shape
        tensors[f"{name}.weight_data"] = q.rowwise_data.contiguous().cpu()
        tensors[f"{name}.weight_scale"] = _compact_scale(q.rowwise_scale, q.scale_layout, n, k // _block(layer.recipe)).contiguous().cpu()
        if isinstance(q, NVFP4Tensor):
            tensors[f"{name}.weight_amax"] = q.rowwise_amax.to(torch.float32).reshape(1).cpu()
        records[name] = {"kind": "Linear", "in_features": k, "out_features": n, "bias": layer.bias is not None,
                         "weight_dtype": _dtype_name(q.dtype), "recipe": recipe_to_dict(layer.recipe)}
    rest = _plain_state(model, layers)
    clash = sorted(set(rest) & set(tensors))
    if clash:
        raise ValueError(f"state_dict entries {clash} collide with the quantized weights' names")
    tensors.update(rest)
    recipes = {json.dumps(r["recipe"], sort_keys=True) for r in records.values()}
    metadata = {"format": FORMAT, "format_version": str(FORMAT_VERSION), "nvfp4lab_version": __version__,
                "recipe": recipes.pop() if len(recipes) == 1 else "per layer",
                "layers": json.dumps(records, sort_keys=True)}
    save_file(tensors, path, metadata=metadata)
    return metadata


def read_metadata(path) -> dict:
    """The metadata of an nvfp4lab quantized checkpoint, checked (format and version), with
    ``layers`` decoded; ValueError for another file."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(os.fspath(path), framework="pt") as f:
            metadata = dict(f.metadata() or {})
    except SafetensorError as exc:
        raise ValueError(f"{os.fspath(path)!r} is not a safetensors file ({exc})") from None
    if metadata.get("format") != FORMAT:
        raise ValueError(f"{os.fspath(path)!r} is not an nvfp4lab quantized checkpoint "
                         f"(metadata format {metadata.get('format')!r}, expected {FORMAT!r})")
    if metadata.get("format_version") != str(FORMAT_VERSION):
        raise ValueError(f"{os.fspath(path)!r} has checkpoint format version {metadata.get('format_version')!r}; "
                         f"this nvfp4lab ({__version__}) reads version {FORMAT_VERSION}")
    try:
        metadata["layers"] = json.loads(metadata["layers"])
    except (KeyError, json.JSONDecodeError) as exc:
        raise ValueError(f"{os.fspath(path)!r}: unreadable 'layers' metadata: {exc}") from None
    return metadata


def _layer_device(module: nn.Module) -> torch.device:
    for t in (*module.parameters(recurse=False), *module.buffers(recurse=False)):
        if t.device.type != "meta":
            return t.device
    return torch.device("cpu")


def _inference_layer(name: str, record: dict, module: nn.Module, f, backend) -> InferenceLinear:
    """Check the checkpoint's layer against the model's and build its InferenceLinear."""
    try:
        recipe = recipe_from_dict(record.get("recipe"))
    except (ValueError, TypeError) as exc:
        raise ValueError(f"layer {name!r}: the checkpoint's recipe is unreadable: {exc}") from None
    if record.get("kind") != "Linear":
        raise ValueError(f"layer {name!r}: checkpoint layer kind {record.get('kind')!r} is not supported")
    if isinstance(module, (Linear, InferenceLinear)) and module.recipe != recipe:
        raise ValueError(f"layer {name!r}: the checkpoint was saved with another recipe "
                         f"({recipe_differences(recipe, module.recipe)}); load it into a plain model or one "
                         f"converted with {recipe!r}")
    if not isinstance(module, (nn.Linear, InferenceLinear)):
        raise ValueError(f"layer {name!r}: the checkpoint holds a Linear there, the model has {type(module).__name__}")
    n, k = record["out_features"], record["in_features"]
    if (module.out_features, module.in_features) != (n, k):
        raise ValueError(f"layer {name!r}: the checkpoint holds a weight of shape (out, in) = ({n}, {k}), the model's "
                         f"layer is ({module.out_features}, {module.in_features})")
    if (module.bias is not None) != record["bias"]:
        raise ValueError(f"layer {name!r}: bias={record['bias']} in the checkpoint, bias={module.bias is not None} in the model")
    device = _layer_device(module)
    parts = {}
    expected = {"weight_data": (n, k // 2), "weight_scale": (n, k // 16), "weight_amax": (1,)}
    if isinstance(recipe, MXFP8Recipe):
        expected = {"weight_data": (n, k), "weight_scale": (n, k // 32)}
    keys = set(f.keys())
    for key, shape in expected.items():
        if f"{name}.{key}" not in keys:
            raise ValueError(f"layer {name!r}: the checkpoint has no {name}.{key}")
        t = f.get_tensor(f"{name}.{key}")
        want = torch.float32 if key == "weight_amax" else torch.uint8
        if tuple(t.shape) != shape or t.dtype != want:
            raise ValueError(f"layer {name!r}: {key} is {t.dtype} {tuple(t.shape)} in the checkpoint, expected {want} {shape}")
        parts[key] = t.to(device)
    config = recipe.tensor_config("weight", rowwise=True, columnwise=False)
    scale = _layout_scale(parts["weight_scale"], recipe.scale_layout)
    weight_dtype = _dtype_from_name(record.get("weight_dtype", "float32"))
    if isinstance(recipe, MXFP8Recipe):
        q = MXFP8Tensor(shape=torch.Size((n, k)), dtype=weight_dtype, config=config, rowwise_data=parts["weight_data"],
                        rowwise_scale=scale)
    else:
        q = NVFP4Tensor(shape=torch.Size((n, k)), dtype=weight_dtype, config=config, rowwise_data=parts["weight_data"],
                        rowwise_scale=scale, rowwise_amax=parts["weight_amax"])
    layer_backend = backend if backend is not None else getattr(module, "backend", None)
    new = InferenceLinear.from_quantized(q, module.bias, recipe, backend=layer_backend)
    new.train(module.training)
    return new


def load_quantized(model: nn.Module, path, *, backend: str | None = None, strict: bool = True) -> nn.Module:
    """Load an nvfp4lab quantized checkpoint into ``model`` (same architecture; its layers plain
    nn.Linear, or converted with the same recipe) and return it: every layer listed in the file
    becomes an :class:`InferenceLinear` with the recorded recipe and packed weight, the rest of the
    state_dict is loaded as is. ``strict``: the file and the model must hold the same other entries.
    Raises ValueError naming the layer for another shape, recipe or layer kind, and for another
    checkpoint format or version. Nothing in the model changes when a check fails."""
    from safetensors import safe_open

    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    metadata = read_metadata(path)
    records = metadata["layers"]
    modules = dict(model.named_modules(remove_duplicate=False))
    built = {}
    with safe_open(os.fspath(path), framework="pt") as f:
        for name, record in records.items():
            if name not in modules or name == "":
                raise ValueError(f"layer {name!r} of the checkpoint is not a submodule of the model")
            built[name] = _inference_layer(name, record, modules[name], f, backend)
        quantized_keys = {f"{name}.{key}" for name in records for key in WEIGHT_KEYS}
        rest = {key: f.get_tensor(key) for key in f.keys() if key not in quantized_keys}  # noqa: SIM118 (a safe_open handle)
    current = model.state_dict()
    for key, value in rest.items():
        if key in current and tuple(current[key].shape) != tuple(value.shape):
            raise ValueError(f"{key}: shape {tuple(value.shape)} in the checkpoint, {tuple(current[key].shape)} in the model")
    expected = {key for key in current if not key.endswith("_extra_state")}
    expected -= {f"{name}.{key}" for name in records for key in ("weight", *WEIGHT_KEYS)}
    if strict:
        missing, unexpected = sorted(expected - set(rest)), sorted(set(rest) - set(current))
        if missing or unexpected:
            raise ValueError(f"the checkpoint and the model differ: missing from the file {missing[:8]}, "
                             f"not in the model {unexpected[:8]} (strict=False loads what matches)")
    for name, new in built.items():
        parent_name, _, child = name.rpartition(".")
        setattr(modules[parent_name] if parent_name else model, child, new)
    model.load_state_dict({k: v for k, v in rest.items() if k in current}, strict=False)
    return model


# ----------------------------------------------------------------------- distributed checkpoints
def _is_recipe_state(value: torch.Tensor) -> bool:
    """Whether an extra-state tensor is nvfp4lab's recipe entry (other libraries keep theirs too)."""
    try:
        data = json.loads(bytes(value.flatten().tolist()).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(data, dict) and data.get("format") == EXTRA_STATE_FORMAT


def dcp_recipes(checkpoint_id) -> dict:
    """The recipes recorded in a distributed checkpoint (``torch.distributed.checkpoint.save`` of a
    state_dict holding nvfp4lab layers, e.g. ``get_model_state_dict`` of an FSDP2 model): per layer
    name, the recipe of its ``_extra_state`` entry. Names are the checkpoint's keys without the
    suffix (a checkpoint of ``{"model": state_dict}`` gives ``"model.<layer>"``; a layer at the root
    gives ``""``). Build the model with these recipes, then ``dcp.load`` into its state_dict: each
    layer checks the saved recipe when the state_dict is loaded and refuses another one.

    Reads on this process alone (no collective, no process group needed). Extra-state entries of other
    libraries are skipped; ValueError naming the entry for an nvfp4lab entry this version cannot read."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    path = os.fspath(checkpoint_id)
    metadata = dcp.FileSystemReader(path).read_metadata()
    entries = {key: torch.empty(md.size, dtype=md.properties.dtype) for key, md in metadata.state_dict_metadata.items()
               if key.rpartition(".")[2] == "_extra_state" and isinstance(md, TensorStorageMetadata)
               and md.properties.dtype == torch.uint8}
    if not entries:
        return {}
    with warnings.catch_warnings():  # DCP warns that it loads in one process, which is what is asked here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        dcp.load(entries, checkpoint_id=path, no_dist=True)
    recipes = {}
    for key, value in entries.items():
        if not _is_recipe_state(value):
            continue
        try:
            recipes[key.rpartition(".")[0]] = decode_extra_state(value)
        except ValueError as exc:
            raise ValueError(f"{path!r}, entry {key!r}: {exc}") from None
    return recipes


# ----------------------------------------------------------------------------- serving export
def collect_input_amax(model: nn.Module, run: Callable[[], object]) -> dict:
    """Calibration for :func:`export_modelopt`: call ``run()`` (e.g. ``lambda: model(**batch)``)
    under ``torch.no_grad()`` and return, per nvfp4lab Linear / InferenceLinear, the max |x| of the
    inputs it saw (a float)."""
    amax: dict = {}
    handles = []

    def hook(name):
        def record(_module, args):
            x = args[0]
            if x.numel():
                amax[name] = max(amax.get(name, 0.0), float(x.detach().abs().max()))
        return record

    for name, layer in model.named_modules():
        if isinstance(layer, (Linear, InferenceLinear)):
            handles.append(layer.register_forward_pre_hook(hook(name)))
    try:
        with torch.no_grad():
            run()
    finally:
        for h in handles:
            h.remove()
    return amax


def export_modelopt(model: nn.Module, path, input_amax: Mapping[str, float], *, dtype: torch.dtype | None = None) -> dict:
    """Write ``model`` (converted or frozen with NVFP4 recipes) to the folder ``path`` in Model
    Optimizer's NVFP4 Hugging Face layout (module docstring): ``model.safetensors``,
    ``hf_quant_config.json`` and, when ``model.config`` has ``to_dict()`` (a transformers model),
    ``config.json`` with its ``quantization_config``. ``input_amax``: per exported layer name the
    calibrated max |input| (:func:`collect_input_amax`); ``input_scale`` = amax / (6 * 448).
    ``dtype``: cast the unquantized floating tensors (biases, norms, embeddings) to it (default: as
    in the model). nn.Linear layers left unconverted are listed in ``exclude_modules``. MXFP8 and
    GroupedLinear layers raise ValueError naming the layer. Returns a summary dict."""
    from safetensors.torch import save_file

    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if not isinstance(input_amax, Mapping):
        raise TypeError(f"input_amax must be a mapping layer name -> amax (collect_input_amax), got {type(input_amax).__name__}")
    if Path(path).exists() and not Path(path).is_dir():
        raise ValueError(f"path {os.fspath(path)!r} exists and is not a folder")
    layers = _quantized_layers(model)
    tensors, exported = {}, []
    for name, layer in layers.items():
        if not isinstance(layer.recipe, NVFP4Recipe):
            raise ValueError(f"layer {name!r}: {type(layer.recipe).__name__} has no ModelOpt NVFP4 form; export takes NVFP4 recipes")
        q = _rowwise_weight(name, layer)
        n, k = q.shape
        if name not in input_amax:
            raise ValueError(f"layer {name!r}: no calibrated input amax (input_amax has no entry for it)")
        a = float(input_amax[name])
        if not (a > 0 and a < float("inf")):
            raise ValueError(f"layer {name!r}: input amax must be finite and > 0, got {a}")
        tensors[f"{name}.weight"] = q.rowwise_data.contiguous().cpu()
        scale = _compact_scale(q.rowwise_scale, q.scale_layout, n, k // 16)
        tensors[f"{name}.weight_scale"] = scale.contiguous().cpu().view(torch.float8_e4m3fn)
        tensors[f"{name}.weight_scale_2"] = (q.rowwise_amax.to(torch.float32).reshape(()) / (6.0 * q.e4m3_max)).cpu()
        tensors[f"{name}.input_scale"] = torch.tensor(a, dtype=torch.float32) / (6.0 * MODELOPT_E4M3_MAX)
        exported.append(name)
    if not exported:
        raise ValueError("model has no nvfp4lab layers to export: convert it first (nvfp4lab.convert)")
    tensors.update(_plain_state(model, layers, dtype))
    excluded = sorted(name for name, m in model.named_modules() if isinstance(m, nn.Linear) and not isinstance(m, Linear))
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, os.fspath(out / "model.safetensors"), metadata={"format": "pt"})
    recipes = sorted({repr(layers[name].recipe) for name in exported})
    producer = {"name": "nvfp4lab", "version": __version__, "recipes": recipes}
    quant = {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16, "exclude_modules": excluded}
    (out / "hf_quant_config.json").write_text(json.dumps({"producer": producer, "quantization": quant}, indent=2) + "\n")
    config = getattr(model, "config", None)
    wrote_config = callable(getattr(config, "to_dict", None))
    if wrote_config:
        data = config.to_dict()
        if dtype is not None:
            data["torch_dtype"] = _dtype_name(dtype)
        data["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                                       "kv_cache_quant_algo": None, "ignore": excluded, "producer": producer}
        (out / "config.json").write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    files = ["model.safetensors", "hf_quant_config.json"] + (["config.json"] if wrote_config else [])
    return {"layers": exported, "exclude_modules": excluded, "files": files, "recipes": recipes}

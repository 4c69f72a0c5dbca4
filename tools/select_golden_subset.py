"""Copy a compact subset of a golden-vector folder into the package (nvfp4lab/data/golden).

    python tools/select_golden_subset.py ../shared/golden src/nvfp4lab/data/golden [BUDGET_MB]
    python tools/select_golden_subset.py ../shared/golden_pr3045 src/nvfp4lab/data/golden --prefix pr3045_ \\
        --cases nvfp4_quantize_0010 nvfp4_quantize_0014 ...

Default mode: for every distinct (op, params) signature the smallest case is taken, plus the smallest
case of each input kind for the plain 1x16 recipe, so that every op and recipe is covered in a few MB.
``--prefix P --cases ...``: the named cases of another folder (e.g. TE PR 3045's vectors, whose file
names repeat those of shared/golden), copied as ``P<name>``; the runner finds them like every other case.
Each mode replaces only its own files (the default mode those without a prefix it does not own) and its
rows of INDEX.md. Files are copied byte for byte, never regenerated.
"""
import argparse
import json
import shutil
from pathlib import Path

from safetensors import safe_open

PREFIXES = ("pr3045_",)  # prefixed case sets the default mode leaves alone


def signature(path: Path):
    with safe_open(str(path), "pt") as f:
        case = json.loads(f.metadata()["case"])
    return json.dumps({"op": case["op"], "params": case.get("params", {})}, sort_keys=True), case


def _index_rows(index: Path, names: set, rename=lambda n: n) -> list:
    rows = []
    for line in index.read_text().splitlines():
        cells = line.split(" ")
        if line.startswith("| ") and len(cells) > 1 and cells[1] in names:
            rows.append(line.replace(cells[1], rename(cells[1]), 1))
    return rows


def main(src: str, dst: str, budget_mb: float = 3.0) -> None:
    src_p, dst_p = Path(src), Path(dst)
    dst_p.mkdir(parents=True, exist_ok=True)
    files = sorted(src_p.glob("*.safetensors"), key=lambda p: p.stat().st_size)
    chosen, seen = [], set()
    for p in files:
        sig, _ = signature(p)
        if sig not in seen:
            seen.add(sig)
            chosen.append(p)
    # then fill the budget with the next smallest cases (more input kinds per recipe)
    total = sum(p.stat().st_size for p in chosen)
    for p in files:
        if p in chosen:
            continue
        if total + p.stat().st_size > budget_mb * 2**20:
            break
        chosen.append(p)
        total += p.stat().st_size
    for old in dst_p.glob("*.safetensors"):
        if not old.name.startswith(PREFIXES):
            old.unlink()
    for p in chosen:
        shutil.copyfile(p, dst_p / p.name)
    index = src_p / "INDEX.md"
    if index.exists():
        names = {p.name for p in chosen}
        lines = [line for line in index.read_text().splitlines()
                 if not line.startswith("| ") or line.split(" ")[1] in names or line.startswith("| file")]
        kept = _prefixed_section(dst_p / "INDEX.md")
        (dst_p / "INDEX.md").write_text("\n".join(lines + kept) + "\n")
    print(f"{len(chosen)} cases, {total / 2**20:.2f} MiB, {len(seen)} signatures")


def _prefixed_section(index: Path) -> list:
    """The prefixed sets' part of an existing INDEX.md (from its first '## ' heading on)."""
    if not index.exists():
        return []
    lines = index.read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("## ")), None)
    return [""] + lines[start:] if start is not None else []


def add_prefixed(src: str, dst: str, prefix: str, cases: list) -> None:
    """Copy ``cases`` (names with or without .safetensors) of ``src`` to ``dst`` as ``prefix + name``,
    replacing the earlier files with that prefix, and write their INDEX rows under a '## prefix' heading."""
    src_p, dst_p = Path(src), Path(dst)
    names = [c if c.endswith(".safetensors") else f"{c}.safetensors" for c in cases]
    missing = [n for n in names if not (src_p / n).is_file()]
    if missing:
        raise SystemExit(f"not in {src_p}: {missing}")
    for old in dst_p.glob(f"{prefix}*.safetensors"):
        old.unlink()
    for name in names:
        shutil.copyfile(src_p / name, dst_p / f"{prefix}{name}")
    index = dst_p / "INDEX.md"
    lines = index.read_text().splitlines() if index.exists() else []
    heading = f"## {prefix.rstrip('_')}: from {src_p.name}"
    if heading in lines:  # drop the previous section of this prefix (up to the next heading)
        start = lines.index(heading)
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        lines = lines[:start] + lines[end:]
        while lines and not lines[-1]:
            lines.pop()
    rows = _index_rows(src_p / "INDEX.md", set(names), lambda n: prefix + n) if (src_p / "INDEX.md").exists() else []
    section = ["", heading, "", f"Copied byte for byte from {src_p.name} (format additions: its README.md), renamed with the "
               f"prefix {prefix!r}.", "", "| file | op | params | shape | x dtype | input | notes |",
               "|---|---|---|---|---|---|---|", *rows]
    index.write_text("\n".join(lines + section) + "\n")
    size = sum((dst_p / f"{prefix}{n}").stat().st_size for n in names)
    print(f"{len(names)} cases with prefix {prefix!r}, {size / 2**20:.2f} MiB")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src")
    parser.add_argument("dst")
    parser.add_argument("budget_mb", nargs="?", type=float, default=3.0)
    parser.add_argument("--prefix", default=None, help="copy --cases under this file-name prefix")
    parser.add_argument("--cases", nargs="*", default=[])
    args = parser.parse_args()
    if args.prefix is not None:
        add_prefixed(args.src, args.dst, args.prefix, args.cases)
    else:
        main(args.src, args.dst, args.budget_mb)

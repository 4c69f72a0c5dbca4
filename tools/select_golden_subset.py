"""Copy a compact subset of a golden-vector folder into the package (nvfp4lab/data/golden).

For every distinct (op, params) signature the smallest case is taken, plus the smallest case of each
input kind for the plain 1x16 recipe, so that every op and recipe is covered in a few MB. Files are
copied byte for byte, never regenerated.
"""
import json
import shutil
import sys
from pathlib import Path

from safetensors import safe_open


def signature(path: Path):
    with safe_open(str(path), "pt") as f:
        case = json.loads(f.metadata()["case"])
    return json.dumps({"op": case["op"], "params": case.get("params", {})}, sort_keys=True), case


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
        old.unlink()
    for p in chosen:
        shutil.copyfile(p, dst_p / p.name)
    index = src_p / "INDEX.md"
    if index.exists():
        names = {p.name for p in chosen}
        lines = [l for l in index.read_text().splitlines() if not l.startswith("| ") or l.split(" ")[1] in names or l.startswith("| file")]
        (dst_p / "INDEX.md").write_text("\n".join(lines) + "\n")
    print(f"{len(chosen)} cases, {total / 2**20:.2f} MiB, {len(seen)} signatures")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]) if len(sys.argv) > 3 else 3.0)

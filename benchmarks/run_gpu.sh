#!/usr/bin/env bash
# One call on the GPU machine: environment, the GPU test tier, conformance (triton on cuda), and
# every benchmark; full logs and JSON results go to $OUT (or ./gpu-out); a short table is printed last.
#   usage: bash benchmarks/run_gpu.sh [quick|full] [step ...]
#   steps: env tests conf quantize dequantize mxfp8 grouped grouped_moe gemm linear host prev train lab
# Stage inputs first (git-ignored, carried): python tools/stage_gpu_inputs.py --golden ../shared/golden
#   ../shared/golden_pr3045 --prev COMMIT [--minilm]
# "prev" runs the quantize / gemm / linear benchmarks of the previous version (.gpu/prev_tree, its own scripts)
# in the same call, for before/after tables; "host" loads it too (.gpu/prev) for its previous-version columns.
set -u
cd "$(dirname "$0")/.."
MODE=${1:-quick}; shift || true
STEPS=${*:-env tests conf quantize dequantize mxfp8 grouped grouped_moe gemm linear host prev train lab}
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export NVFP4LAB_GOLDEN=${NVFP4LAB_GOLDEN:-$PWD/.gpu/golden}
QUICK=$([ "$MODE" = quick ] && echo --quick || echo "")
BENCH_LIMIT=${BENCH_LIMIT:-$([ "$MODE" = quick ] && echo 150 || echo 540)}
SUMMARY=()

step() {  # step NAME TIMEOUT CMD...
  local name=$1 limit=$2; shift 2
  case " $STEPS " in *" $name "*) ;; *) return ;; esac
  local t0=$(date +%s)
  echo "===== $name: $*" | tee -a "$OUT/gpu.log"
  timeout "$limit" "$@" > >(tee "$OUT/$name.log" >> "$OUT/gpu.log") 2>&1
  local rc=$?
  local last=$(grep -v '^\s*$' "$OUT/$name.log" | tail -n 1 | cut -c1-90)
  SUMMARY+=("$(printf '%-11s rc=%-3s %4ss  %s' "$name" "$rc" "$(( $(date +%s) - t0 ))" "$last")")
}

step env 60 bash -c 'nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; python3 -c "import torch, triton; print(\"torch\", torch.__version__, \"triton\", triton.__version__, torch.cuda.get_device_name())"'
# (the reference on cuda is checked by the GPU test tier: tests/test_conformance.py)
# conformance and the test tier in worker processes: on a fresh machine Triton compiles every kernel first (CPU-bound)
export JOBS=${JOBS:-12}
# -v: each test's outcome is in tests.log as it ends, so a run cut by its limit still names its failures
step tests ${TESTS_LIMIT:-560} python3 -m pytest -v -m gpu -n "$JOBS" --maxfail=25 -p no:cacheprovider --durations=12 -rf tests
# after the tests: it reuses the kernels they compiled
step conf 200 bash -c 'for d in "$NVFP4LAB_GOLDEN" .gpu/golden_pr3045; do [ -d "$d" ] && echo "$d: $(python3 -m nvfp4lab conformance "$d" --backend triton --device cuda --jobs $JOBS | tail -n 1)"; done'
for b in quantize dequantize mxfp8 grouped gemm linear; do
  script=benchmarks/$b.py; [ "$b" = grouped ] && script=benchmarks/grouped_quantize.py
  extra=""; limit=$BENCH_LIMIT
  # linear: three Linear shapes and the MoE case, + each preset's costliest kernels
  # (and, with .gpu/prev staged, the previous version's step in the same process: alternating rounds)
  [ "$b" = linear ] && extra="--breakdown 12$([ -d .gpu/prev/nvfp4lab_prev ] && echo ' --prev .gpu/prev')" && limit=$((BENCH_LIMIT * 2))
  [ -f "$script" ] && step "$b" "$limit" python3 "$script" $QUICK $extra --out "$OUT/$b.json"
done
# the MoE step's grouped quantizes (and the previous version's, with .gpu/prev staged)
step grouped_moe "$BENCH_LIMIT" python3 benchmarks/grouped_quantize.py --moe \
  $([ -d .gpu/prev/nvfp4lab_prev ] && echo --prev .gpu/prev) --out "$OUT/grouped_moe.json"
step host "$BENCH_LIMIT" python3 benchmarks/host.py $QUICK --prev-steps --out "$OUT/host.json"
# the previous version's own scripts on its own package, same machine and call
if [ -d .gpu/prev_tree ]; then
  step prev $((BENCH_LIMIT * 3)) bash -c 'cd .gpu/prev_tree && for b in '"${PREV_BENCHES:-quantize gemm linear}"'; do
    PYTHONPATH=$PWD/src python3 benchmarks/$b.py '"$QUICK"' --out "'"$OUT"'/prev_$b.json" > "'"$OUT"'/prev_$b.log" 2>&1; echo "prev $b rc=$?"; done'
fi
step train "$BENCH_LIMIT" python3 -m nvfp4lab train --device cuda --size medium --steps ${TRAIN_STEPS:-100} --recipes bf16 te \
  --no-progress --out "$OUT/train"

# the accuracy lab on the GPU (model folder carried as .gpu/minilm when the package is not installed there)
LAB_MODEL=$([ -d .gpu/minilm ] && echo "--model .gpu/minilm" || echo "")
step lab "$BENCH_LIMIT" python3 -m nvfp4lab lab $LAB_MODEL --device cuda --no-progress --out "$OUT/lab"

echo
echo "===== summary ($MODE)"
printf '%s\n' "${SUMMARY[@]}"

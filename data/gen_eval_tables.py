#!/usr/bin/env python3
"""Derive the linear-probe and compositionality tables of the bundled sample from its zero-shot
set (`data/train_sample/zeroshot.parquet`, made by `data/gen_train_sample.py`):

- `data/train_sample/probe.parquet` (`path`, `label`, `split`) for `curate eval RUN_DIR --probe`:
  per class, in row order, 6 images `train`, 2 `val`, 2 `test` (24 classes x 10 images);
- `data/train_sample/attributes.parquet` (`path`, `attributes`) for `curate eval RUN_DIR
  --compose`: each image's colour, shape and background, as the phrases its captions use
  (`red`, `circle`, `grey background`). The background is read back from the image's corner
  pixel (the shapes never touch the corners), matched to the generator's four backgrounds.

Deterministic: `python3 data/gen_eval_tables.py` rewrites identical files. Needs pillow and
pyarrow.
"""

import os

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = os.path.join(ROOT, "data", "train_sample")
# The generator's backgrounds (`BACKGROUNDS` in data/gen_train_sample.py).
BACKGROUNDS = {(245, 245, 245): "white", (150, 150, 150): "grey", (20, 20, 20): "black", (225, 210, 180): "beige"}


def main():
    zs = pq.read_table(os.path.join(SAMPLE, "zeroshot.parquet")).to_pylist()
    seen = {}
    probe = {"path": [], "label": [], "split": []}
    attributes = {"path": [], "attributes": []}
    for row in zs:
        path, label = row["path"], row["label"]
        k = seen.get(label, 0)
        seen[label] = k + 1
        probe["path"].append(path)
        probe["label"].append(label)
        probe["split"].append("train" if k % 10 < 6 else "val" if k % 10 < 8 else "test")
        corner = Image.open(os.path.join(ROOT, path)).convert("RGB").getpixel((0, 0))
        background = BACKGROUNDS[tuple(corner)]
        colour, shape = label.split(" ", 1)
        attributes["path"].append(path)
        attributes["attributes"].append([colour, shape, f"{background} background"])
    pq.write_table(pa.table(probe), os.path.join(SAMPLE, "probe.parquet"))
    pq.write_table(
        pa.table({"path": attributes["path"], "attributes": pa.array(attributes["attributes"], pa.list_(pa.string()))}),
        os.path.join(SAMPLE, "attributes.parquet"),
    )
    print(f"{len(zs)} images, {len(seen)} classes")


if __name__ == "__main__":
    main()

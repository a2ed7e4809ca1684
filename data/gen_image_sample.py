#!/usr/bin/env python3
"""Deterministic generator of a tiny ImageNet-21k-layout image folder for
`pipelines/image_teacher.toml` (no download needed).

Layout, as ImageNet-21k ships it and `read_imagenet21k` reads it::

    data/imagenet21k_sample/words.txt                  synset<TAB>words
    data/imagenet21k_sample/n01440764/n01440764_1.JPEG ...

Three synsets x three synthetic JPEGs (shapes and gradients drawn with PIL, odd
sizes in portrait and landscape, one grayscale), plus one corrupt file
(`n03000684/n03000684_4.JPEG`: the first 300 bytes of a JPEG, no image data) so
the pipeline shows an `encode_image/undecodable_image` reject. The images are
not photographs of the classes: they exercise decoding, resizing and batching,
not recognition.

    pip install pillow
    python3 data/gen_image_sample.py   # rewrites data/imagenet21k_sample/

Same Pillow version, same bytes (nothing random is unseeded).
"""
import io
import os
import random
import shutil

from PIL import Image, ImageDraw

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "imagenet21k_sample")
SYNSETS = [
    ("n01440764", "tench, Tinca tinca"),
    ("n02102040", "English springer, English springer spaniel"),
    ("n03000684", "chain saw, chainsaw"),
]
SIZES = [(160, 120), (120, 170), (211, 149)]


def draw(rng, w, h, gray):
    img = Image.new("RGB", (w, h))
    px = img.load()
    c0 = [rng.randrange(256) for _ in range(3)]
    c1 = [rng.randrange(256) for _ in range(3)]
    for y in range(h):
        for x in range(w):
            t = (x / w + y / h) / 2
            px[x, y] = tuple(int(a + (b - a) * t) for a, b in zip(c0, c1))
    d = ImageDraw.Draw(img)
    for _ in range(6):
        x0, y0 = rng.randrange(w), rng.randrange(h)
        x1, y1 = x0 + rng.randrange(10, w // 2), y0 + rng.randrange(10, h // 2)
        fill = tuple(rng.randrange(256) for _ in range(3))
        if rng.random() < 0.5:
            d.ellipse([x0, y0, x1, y1], fill=fill)
        else:
            d.rectangle([x0, y0, x1, y1], fill=fill)
    for _ in range(4):
        d.line([rng.randrange(w), rng.randrange(h), rng.randrange(w), rng.randrange(h)],
               fill=tuple(rng.randrange(256) for _ in range(3)), width=3)
    return img.convert("L") if gray else img


def main():
    rng = random.Random(0)
    shutil.rmtree(ROOT, ignore_errors=True)
    os.makedirs(ROOT)
    with open(os.path.join(ROOT, "words.txt"), "w") as f:
        for synset, words in SYNSETS:
            f.write(f"{synset}\t{words}\n")
    total = 0
    for s, (synset, _) in enumerate(SYNSETS):
        os.makedirs(os.path.join(ROOT, synset))
        for i, (w, h) in enumerate(SIZES):
            buf = io.BytesIO()
            draw(rng, w, h, gray=(s, i) == (1, 2)).save(buf, "JPEG", quality=85)
            path = os.path.join(ROOT, synset, f"{synset}_{i + 1}.JPEG")
            with open(path, "wb") as f:
                f.write(buf.getvalue())
            total += buf.tell()
    corrupt = os.path.join(ROOT, SYNSETS[-1][0], f"{SYNSETS[-1][0]}_4.JPEG")
    with open(corrupt, "wb") as f:
        f.write(buf.getvalue()[:300])
    print(f"{len(SYNSETS) * len(SIZES)} images ({total} bytes) + 1 corrupt file in {ROOT}")


if __name__ == "__main__":
    main()

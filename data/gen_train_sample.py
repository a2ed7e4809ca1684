#!/usr/bin/env python3
"""Generate `data/train_sample/`: the bundled image-caption sample that `pipelines/train.toml`
trains a tiny dual encoder on (issue 4, item 7).

Images are 32x32 PNGs of one coloured shape (6 colours x 4 shapes = 24 classes) on a plain
neutral background, at a random size and position. Training captions describe the colour and
shape in varied wording (synonyms, word order, filler phrases); they never use the zero-shot
prompt template `a photo of a {}.`, so zero-shot classification measures transfer to held-out
prompts. Held-out images (their own seeds) with their class name make the zero-shot set.

Also written:
- `text_model/`: a BERT `config.json` (tiny sizes, trained from scratch) and a word-level
  `tokenizer.json` over the sample's vocabulary (BERT-style `[CLS] ... [SEP]`);
- `teacher_image.parquet` / `teacher_text.parquet` (CUSA teacher features): fixed random
  projections (seed 7) to 64-d of the mean-centred 8x8 thumbnail (images) and of the word
  counts (captions), L2-normalised. A stand-in for Unicom / Sentence-BERT that carries real
  uni-modal similarity (same colour, same words) at no cost.

Deterministic: `python3 data/gen_train_sample.py` rewrites identical files.
Needs numpy, pillow, pyarrow.
"""

import io
import json
import os
import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image, ImageDraw

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_sample")
REL = "data/train_sample"  # paths in the tables are relative to the repository root
SIZE = 32
TRAIN_PER_CLASS = 24
EVAL_PER_CLASS = 10
UNALIGNED_PER_CLASS = 5
RETRIEVAL_PER_CLASS = 5

COLOURS = {
    "red": ((220, 30, 30), ["red", "red", "red", "crimson", "scarlet"]),
    "green": ((30, 170, 40), ["green", "green", "green", "lime", "grassy"]),
    "blue": ((30, 60, 220), ["blue", "blue", "blue", "navy", "azure"]),
    "yellow": ((235, 215, 20), ["yellow", "yellow", "yellow", "golden", "lemon"]),
    "purple": ((140, 40, 170), ["purple", "purple", "purple", "violet", "lilac"]),
    "orange": ((245, 140, 20), ["orange", "orange", "orange", "amber", "tangerine"]),
}
SHAPES = {
    "circle": ["circle", "circle", "circle", "disk", "round blob"],
    "square": ["square", "square", "square", "box", "block"],
    "triangle": ["triangle", "triangle", "triangle", "wedge", "pyramid shape"],
    "cross": ["cross", "cross", "cross", "plus sign", "x shape"],
}
BACKGROUNDS = [("white", (245, 245, 245)), ("grey", (150, 150, 150)), ("black", (20, 20, 20)), ("beige", (225, 210, 180))]
TEMPLATES = [
    "a {c} {s}",
    "a {c} {s} on a {bg} background",
    "{s}, {c}",
    "there is a {c} {s} in the picture",
    "one small {c} {s}",
    "a big {c} {s} in the middle",
    "the {s} is {c}",
    "simple drawing of a {c} {s}",
    "{c} coloured {s} on {bg}",
    "close up of a {c} {s}",
    "an image with a single {c} {s}",
    "a {s} painted {c}",
]
PROMPTS = ["a photo of a {}."]


def draw(rng, colour, shape):
    bg_name, bg = rng.choice(BACKGROUNDS)
    img = Image.new("RGB", (SIZE, SIZE), bg)
    d = ImageDraw.Draw(img)
    jitter = lambda v: max(0, min(255, v + rng.randint(-20, 20)))
    fill = tuple(jitter(v) for v in colour)
    r = rng.randint(7, 14)
    cx, cy = rng.randint(r, SIZE - 1 - r), rng.randint(r, SIZE - 1 - r)
    if shape == "circle":
        d.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
    elif shape == "square":
        d.rectangle([cx - r, cy - r, cx + r, cy + r], fill=fill)
    elif shape == "triangle":
        d.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=fill)
    else:
        w = max(2, r // 3)
        d.rectangle([cx - r, cy - w, cx + r, cy + w], fill=fill)
        d.rectangle([cx - w, cy - r, cx + w, cy + r], fill=fill)
    return img, bg_name


def png(img):
    buf = io.BytesIO()
    img.save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def main():
    rng = random.Random(0)
    os.makedirs(os.path.join(OUT, "images"), exist_ok=True)
    train, evals = [], []
    for split, per_class, rows in (("train", TRAIN_PER_CLASS, train), ("eval", EVAL_PER_CLASS, evals)):
        for k in range(per_class):
            for colour, (rgb, colour_words) in COLOURS.items():
                for shape, shape_words in SHAPES.items():
                    img, bg = draw(rng, rgb, shape)
                    name = f"{split}_{colour}_{shape}_{k:02d}.png"
                    with open(os.path.join(OUT, "images", name), "wb") as f:
                        f.write(png(img))
                    caption = rng.choice(TEMPLATES).format(
                        c=rng.choice(colour_words), s=rng.choice(shape_words), bg=bg
                    )
                    rows.append((f"{split}/{name}", caption, f"{REL}/images/{name}", f"{colour} {shape}", img))

    pq.write_table(
        pa.table({
            "sample_id": [r[0] for r in train],
            "caption": [r[1] for r in train],
            "path": [r[2] for r in train],
        }),
        os.path.join(OUT, "train.parquet"),
    )
    pq.write_table(
        pa.table({"sample_id": [r[0] for r in evals], "path": [r[2] for r in evals], "label": [r[3] for r in evals]}),
        os.path.join(OUT, "zeroshot.parquet"),
    )
    classes = [f"{c} {s}" for c in COLOURS for s in SHAPES]
    with open(os.path.join(OUT, "classes.txt"), "w") as f:
        f.write("# zero-shot classes of the bundled sample (data/gen_train_sample.py); prompt: `a photo of a {}.`\n")
        f.write("\n".join(classes) + "\n")
    with open(os.path.join(OUT, "captions.tsv"), "w") as f:
        f.write("sample_id\tcaption\tpath\n")
        for r in train:
            f.write(f"{r[0]}\t{r[1]}\t{r[2]}\n")

    # Word-level tokenizer over every word of the captions and prompts.
    words = set()
    texts = [r[1] for r in train] + [p.format(c) for p in PROMPTS for c in classes]
    for t in texts:
        words.update(t.lower().replace(",", " , ").replace(".", " . ").split())
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
    vocab = {tok: i for i, tok in enumerate(specials + sorted(words))}
    cls, sep = {"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"SpecialToken": {"id": "[SEP]", "type_id": 0}}
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
            for i, t in enumerate(specials)
        ],
        "normalizer": {"type": "Lowercase"},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [cls, {"Sequence": {"id": "A", "type_id": 0}}, sep],
            "pair": [cls, {"Sequence": {"id": "A", "type_id": 0}}, sep, {"Sequence": {"id": "B", "type_id": 1}}, sep],
            "special_tokens": {
                "[CLS]": {"id": "[CLS]", "ids": [2], "tokens": ["[CLS]"]},
                "[SEP]": {"id": "[SEP]", "ids": [3], "tokens": ["[SEP]"]},
            },
        },
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"},
    }
    model_dir = os.path.join(OUT, "text_model")
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, "tokenizer.json"), "w") as f:
        json.dump(tokenizer, f, indent=1, sort_keys=True)
    config = {
        "model_type": "bert",
        "vocab_size": len(vocab),
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "max_position_embeddings": 32,
        "type_vocab_size": 2,
        "layer_norm_eps": 1e-12,
        "hidden_act": "gelu",
        "pad_token_id": 0,
        # A tiny model trained from scratch for a few hundred steps: no dropout (transformers'
        # default would be 0.1).
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
    }
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=1, sort_keys=True)

    # CUSA teacher features: fixed random projections (documented in the module docstring).
    prng = np.random.default_rng(7)
    p_img = prng.standard_normal((8 * 8 * 3, 64)).astype(np.float32)
    word_list = sorted(words)
    p_txt = prng.standard_normal((len(word_list), 64)).astype(np.float32)

    def unit(x):
        return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)

    thumbs = np.stack([np.asarray(r[4].resize((8, 8), Image.BILINEAR), dtype=np.float32).reshape(-1) / 255.0 for r in train])
    img_feat = unit((thumbs - thumbs.mean(axis=0)) @ p_img)
    counts = np.zeros((len(train), len(word_list)), dtype=np.float32)
    for i, r in enumerate(train):
        for w in r[1].lower().replace(",", " , ").split():
            counts[i, word_list.index(w)] += 1
    txt_feat = unit(counts @ p_txt)

    def features(rows, feat, path):
        flat = pa.array(feat.astype(np.float32).reshape(-1), type=pa.float32())
        pq.write_table(
            pa.table({"sample_id": [r[0] for r in rows], "embedding": pa.FixedSizeListArray.from_arrays(flat, 64)}),
            os.path.join(OUT, path),
        )

    features(train, img_feat, "teacher_image.parquet")
    features(train, txt_feat, "teacher_text.parquet")
    print(f"wrote {len(train)} training pairs, {len(evals)} zero-shot images, {len(classes)} classes, "
          f"{len(vocab)} tokens to {OUT}")
    unaligned = write_unaligned()
    images, captions = write_retrieval()
    print(f"wrote {unaligned} uncaptioned images (unaligned/), {images} retrieval images with {captions} captions")


def write_unaligned():
    """`unaligned/`: uncaptioned images in ImageNet-21k layout (`nXXXXXXXX/nXXXXXXXX_K.png`, one
    made-up synset per class, `n9000000` + class number) with `words.txt` (`synset<TAB>class`):
    the images pseudo-BoW mining labels (issue 6); their class is kept aside to score the mined
    words. Own random stream, so the files above do not change."""
    rng = random.Random(1)
    root = os.path.join(OUT, "unaligned")
    lines = []
    n = 0
    for i, (colour, (rgb, _)) in enumerate(COLOURS.items()):
        for j, shape in enumerate(SHAPES):
            synset = f"n9{i * len(SHAPES) + j + 1:07d}"
            lines.append(f"{synset}\t{colour} {shape}")
            os.makedirs(os.path.join(root, synset), exist_ok=True)
            for k in range(UNALIGNED_PER_CLASS):
                img, _ = draw(rng, rgb, shape)
                with open(os.path.join(root, synset, f"{synset}_{k}.png"), "wb") as f:
                    f.write(png(img))
                n += 1
    with open(os.path.join(root, "words.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return n


def write_retrieval():
    """`retrieval_images.parquet` (`coco_image_id`, `path`) and `retrieval_captions.parquet`
    (`coco_caption_id`, `coco_image_id`, `caption`): held-out images with 5 captions each in the
    training captions' wording, a COCO-style retrieval set for `curate eval RUN_DIR`. Own random
    stream."""
    rng = random.Random(2)
    images, captions = [], []
    for k in range(RETRIEVAL_PER_CLASS):
        for colour, (rgb, colour_words) in COLOURS.items():
            for shape, shape_words in SHAPES.items():
                img, bg = draw(rng, rgb, shape)
                name = f"retrieval_{colour}_{shape}_{k:02d}.png"
                with open(os.path.join(OUT, "images", name), "wb") as f:
                    f.write(png(img))
                image_id = len(images) + 1
                images.append((image_id, f"{REL}/images/{name}"))
                for _ in range(5):
                    caption = rng.choice(TEMPLATES).format(c=rng.choice(colour_words), s=rng.choice(shape_words), bg=bg)
                    captions.append((len(captions) + 1, image_id, caption))
    pq.write_table(
        pa.table({
            "coco_image_id": pa.array([i for i, _ in images], type=pa.int64()),
            "path": [p for _, p in images],
        }),
        os.path.join(OUT, "retrieval_images.parquet"),
    )
    pq.write_table(
        pa.table({
            "coco_caption_id": pa.array([c[0] for c in captions], type=pa.int64()),
            "coco_image_id": pa.array([c[1] for c in captions], type=pa.int64()),
            "caption": [c[2] for c in captions],
        }),
        os.path.join(OUT, "retrieval_captions.parquet"),
    )
    return len(images), len(captions)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Training samples/s of the paper preset on a GPU: `curate train --device cuda` against the same
step in PyTorch, on the same machine in one run (issue 4's GPU figure).

The paper preset (`pipelines/train_paper.toml`, spec `bow-and-otter.md` §4): ResNet-50
(torchvision layout) with a 2048 -> 768 projection, DistilBERT-base (6 layers, 768 wide, 12
heads) with mean pooling, 224-px images, SGD with momentum 0.9. Both sides start from random
weights (the checkpoints are not bundled; the speed does not depend on the values). Text: the
bundled sample's captions (`data/train_sample/train.parquet`), tokenised with a BERT uncased
WordPiece `tokenizer.json` (`--tokenizer`, e.g. all-MiniLM-L6-v2's, which has
distilbert-base-uncased's 30,522-word vocabulary), padded to each batch's longest.

- curate: `curate train` on a generated config (the sample's 32-px PNGs, RandomResizedCrop to
  224 px, flip, tokenisation: its whole input pipeline), `--steps` steps, the median of the
  `samples_per_s` windows of `metrics.jsonl` after the first (which compiles the GPU kernels).
  Loss `infonce` (learnable temperature, as the PyTorch side), then `memory_bank` (the paper's:
  K = 8192, tau = 0.02, EMA encoders, which adds their two forward passes).
- PyTorch: torchvision `resnet50` + `transformers` `DistilBertModel`, the same step (forward,
  symmetric InfoNCE, backward, SGD), on images already on the GPU (random pixels), fp32; run
  with PyTorch's defaults (TF32 for cuDNN convolutions only) and with TF32 matrix products too
  (cubecl multiplies f32 matrices in TF32). Median step time after `--warmup` steps.

    python3 benches/train_gpu_bench.py --curate target/release/curate --tokenizer models/all-MiniLM-L6-v2/tokenizer.json
"""
import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import tempfile
import time

import pyarrow.parquet as pq
import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DISTILBERT = {  # distilbert-base-uncased's config.json sizes
    "model_type": "distilbert", "vocab_size": 30522, "dim": 768, "n_layers": 6, "n_heads": 12,
    "hidden_dim": 3072, "max_position_embeddings": 512, "activation": "gelu", "pad_token_id": 0,
}


def write_config(tmp, batch, steps, loss, tokenizer):
    text = os.path.join(tmp, "distilbert")
    os.makedirs(text, exist_ok=True)
    with open(os.path.join(text, "config.json"), "w") as f:
        json.dump(DISTILBERT, f)
    shutil.copy(tokenizer, os.path.join(text, "tokenizer.json"))
    loss_lines = {"infonce": 'type = "infonce"',
                  "memory_bank": 'type = "memory_bank"\nsize = 8192\ntemperature = 0.02\nmomentum = 0.999'}[loss]
    path = os.path.join(tmp, f"paper_{loss}.toml")
    with open(path, "w") as f:
        f.write(f"""name = "paper_gpu_bench"
output_dir = "{tmp}/run_{loss}"
seed = 0
steps = {steps}
batch_size = {batch}
log_every = 5
checkpoint_every = 0

[model]
embed_dim = 768
image_size_px = 224

[model.image]
preset = "resnet50"

[model.text]
dir = "{text}"
pretrained = false
pooling = "mean"
max_tokens = 60

[data]
tables = ["{ROOT}/data/train_sample/train.parquet"]
image_root = "{ROOT}"

[loss]
{loss_lines}

[optim]
optimizer = "sgd"
lr = 3e-3
momentum = 0.9
weight_decay = 0.0
""")
    return path


def curate_rates(curate, config, out_dir, device, timeout, workers):
    t = time.perf_counter()
    try:
        run = subprocess.run([curate, "train", config, "--device", device, "--progress", "never",
                              "--workers", str(workers)],
                             capture_output=True, text=True, timeout=timeout)
        if run.returncode != 0:
            raise SystemExit(f"curate train failed ({run.returncode}):\n{run.stderr[-3000:]}")
    except subprocess.TimeoutExpired:
        # A fresh machine compiles every kernel first: report the windows logged so far.
        print(f"curate train stopped after {timeout} s; windows logged so far:", flush=True)
    wall = time.perf_counter() - t
    path = os.path.join(out_dir, "metrics.jsonl")
    rows = [json.loads(l) for l in open(path)] if os.path.exists(path) else []
    rates = [r["samples_per_s"] for r in rows if "samples_per_s" in r]
    losses = [(r["step"], round(r["loss"], 4)) for r in rows if "loss" in r]
    return rates, losses, wall


def torch_rate(batch, steps, warmup, captions, tokenizer, tf32, device):
    import torchvision
    from tokenizers import Tokenizer
    from transformers import DistilBertConfig, DistilBertModel

    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.manual_seed(0)
    dev = torch.device(device)
    tok = Tokenizer.from_file(tokenizer)
    tok.enable_truncation(60)
    tok.enable_padding(pad_id=0)
    image = torchvision.models.resnet50(weights=None)
    image.fc = torch.nn.Identity()
    image = image.to(dev)
    proj = torch.nn.Linear(2048, 768).to(dev)
    text = DistilBertModel(DistilBertConfig(**{k: v for k, v in DISTILBERT.items() if k != "model_type"})).to(dev)
    log_scale = torch.nn.Parameter(torch.tensor(math.log(1 / 0.07), device=dev))
    params = list(image.parameters()) + list(proj.parameters()) + list(text.parameters()) + [log_scale]
    opt = torch.optim.SGD(params, lr=3e-3, momentum=0.9)
    labels = torch.arange(batch, device=dev)
    times = []
    for step in range(warmup + steps):
        t0 = time.perf_counter()
        batch_caps = [captions[(step * batch + i) % len(captions)] for i in range(batch)]
        enc = tok.encode_batch(batch_caps)
        ids = torch.tensor([e.ids for e in enc], device=dev)
        mask = torch.tensor([e.attention_mask for e in enc], device=dev)
        x = torch.randn(batch, 3, 224, 224, device=dev)
        u = F.normalize(proj(image(x)), dim=-1)
        h = text(input_ids=ids, attention_mask=mask).last_hidden_state
        m = mask[:, :, None].float()
        v = F.normalize((h * m).sum(1) / m.sum(1).clamp_min(1e-9), dim=-1)
        logits = log_scale.exp().clamp(max=100) * u @ v.t()
        loss = (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss.item()  # waits for the step
        times.append(time.perf_counter() - t0)
    return batch / statistics.median(times[warmup:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--curate", default=os.path.join(ROOT, "target", "release", "curate"))
    ap.add_argument("--tokenizer", required=True, help="a BERT uncased tokenizer.json (30,522 words)")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=40, help="curate's steps (windows of 5)")
    ap.add_argument("--torch-steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--device", default="cuda", help="curate's --device")
    ap.add_argument("--torch-device", default="cuda")
    ap.add_argument("--losses", default="infonce,memory_bank")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per curate run")
    ap.add_argument("--workers", type=int, default=2, help="curate's --workers (batch decoding threads)")
    ap.add_argument("--skip-torch", action="store_true", help="only the curate side")
    args = ap.parse_args()
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    print(f"GPU: {gpu}, torch {torch.__version__}; batch {args.batch}, 224 px, "
          f"ResNet-50 + DistilBERT-base, SGD", flush=True)
    captions = [c for c in pq.read_table(os.path.join(ROOT, "data/train_sample/train.parquet"),
                                         columns=["caption"]).column("caption").to_pylist() if c]
    with tempfile.TemporaryDirectory(prefix="train_gpu_") as tmp:
        for loss in [l for l in args.losses.split(",") if l]:
            cfg = write_config(tmp, args.batch, args.steps, loss, args.tokenizer)
            rates, losses, wall = curate_rates(args.curate, cfg, os.path.join(tmp, f"run_{loss}"), args.device,
                                              args.timeout, args.workers)
            median = statistics.median(rates[1:]) if len(rates) > 1 else None
            print(json.dumps({"side": f"curate {loss}, {args.workers} workers", "median_samples_per_s": median,
                              "windows": [round(r, 1) for r in rates], "wall_s": round(wall, 1),
                              "losses": losses}), flush=True)
    for tf32 in () if args.skip_torch else (False, True):
        r = torch_rate(args.batch, args.torch_steps, args.warmup, captions, args.tokenizer, tf32, args.torch_device)
        print(json.dumps({"side": f"torch infonce, tf32 matmul {tf32}", "median_samples_per_s": r}), flush=True)


if __name__ == "__main__":
    main()

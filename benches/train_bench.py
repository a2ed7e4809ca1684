#!/usr/bin/env python3
"""Training throughput of `curate train` against an equivalent PyTorch training step, on the
same machine in one run (issue 4, item 8). Not a test: prints figures.

Configuration: `pipelines/train.toml` (tiny ResNet [1,1,1,1] width 8 with a 256 -> 64
projection, 2-layer BERT hidden 64 / 4 heads / FFN 128 with mean pooling, symmetric InfoNCE with
a learnable temperature, AdamW, batch 64, 32-px images).

- curate: `curate train pipelines/train.toml --set steps=N` (release build), median of the
  `samples_per_s` lines of `metrics.jsonl` after the first; this includes curate's whole data
  pipeline (PNG decoding, RandomResizedCrop, tokenisation on worker threads sharing the cores).
- PyTorch: the same architecture and step (forward, InfoNCE, backward, AdamW) on tensors already
  in memory (random pixels, token ids of typical caption length) — no data loading at all, so
  the ratio is conservative for curate.

The two sides alternate for `--rounds` rounds (the machine's speed drifts between runs: one
side measured once after the other can move the ratio by a third); the figures are the medians
over the rounds, and each round's ratio is printed too.

Usage: python3 benches/train_bench.py [--steps 200] [--threads 2] [--rounds 3]
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Bottleneck(nn.Module):
    def __init__(self, inplanes, planes, stride):
        super().__init__()
        out = planes * 4
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.down = None
        if stride != 1 or inplanes != out:
            self.down = nn.Sequential(nn.Conv2d(inplanes, out, 1, stride, bias=False), nn.BatchNorm2d(out))

    def forward(self, x):
        idt = x if self.down is None else self.down(x)
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        return F.relu(self.bn3(self.conv3(y)) + idt)


class TinyResNet(nn.Module):
    def __init__(self, width=8, layers=(1, 1, 1, 1)):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        blocks, inplanes = [], width
        for stage, n in enumerate(layers):
            for i in range(n):
                blocks.append(Bottleneck(inplanes, width << stage, 2 if i == 0 and stage > 0 else 1))
                inplanes = (width << stage) * 4
        self.blocks = nn.Sequential(*blocks)
        self.dim = inplanes

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        return self.blocks(x).mean(dim=(2, 3))


class BertLayer(nn.Module):
    def __init__(self, h, heads, ffn):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(h, h) for _ in range(4))
        self.ln1, self.ln2 = nn.LayerNorm(h, eps=1e-12), nn.LayerNorm(h, eps=1e-12)
        self.fc1, self.fc2 = nn.Linear(h, ffn), nn.Linear(ffn, h)
        self.heads = heads

    def forward(self, x, pad):
        b, s, h = x.shape
        split = lambda t: t.view(b, s, self.heads, h // self.heads).transpose(1, 2)
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        att = (q @ k.transpose(2, 3)) / math.sqrt(h // self.heads) + pad
        ctx = (att.softmax(-1) @ v).transpose(1, 2).reshape(b, s, h)
        x = self.ln1(self.o(ctx) + x)
        return self.ln2(self.fc2(F.gelu(self.fc1(x))) + x)


class TinyBert(nn.Module):
    def __init__(self, vocab, h=64, layers=2, heads=4, ffn=128, positions=32):
        super().__init__()
        self.word, self.pos, self.tt = nn.Embedding(vocab, h), nn.Embedding(positions, h), nn.Embedding(2, h)
        self.ln = nn.LayerNorm(h, eps=1e-12)
        self.layers = nn.ModuleList(BertLayer(h, heads, ffn) for _ in range(layers))

    def forward(self, ids, mask):
        s = ids.shape[1]
        x = self.ln(self.word(ids) + self.pos.weight[:s] + self.tt.weight[0])
        pad = (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
        for layer in self.layers:
            x = layer(x, pad)
        m = mask[:, :, None].float()
        return (x * m).sum(1) / m.sum(1).clamp_min(1e-9)


def torch_samples_per_s(steps, batch, vocab, seq=12, size=32, dim=64):
    torch.manual_seed(0)
    image, text = TinyResNet(), TinyBert(vocab)
    proj = nn.Linear(image.dim, dim)
    log_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))
    params = list(image.parameters()) + list(text.parameters()) + list(proj.parameters())
    opt = torch.optim.AdamW([{"params": params, "weight_decay": 0.01}, {"params": [log_scale], "weight_decay": 0.0}],
                            lr=2e-3)
    x = torch.randn(batch, 3, size, size)
    ids = torch.randint(4, vocab, (batch, seq))
    mask = torch.ones(batch, seq, dtype=torch.long)
    labels = torch.arange(batch)
    times = []
    for step in range(steps):
        t0 = time.perf_counter()
        u = F.normalize(proj(image(x)), dim=-1)
        v = F.normalize(text(ids, mask), dim=-1)
        logits = log_scale.exp().clamp(max=100) * u @ v.t()
        loss = (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    warm = times[len(times) // 10:]
    return batch / statistics.median(warm)


def curate_samples_per_s(steps, threads):
    with tempfile.TemporaryDirectory() as out:
        cmd = ["target/release/curate", "train", "pipelines/train.toml", "--progress", "never",
               "--set", f"steps={steps}", "--set", "log_every=10", "--set", "checkpoint_every=0",
               "--set", f"eval.every_steps={10 * steps}", "--set", f"output_dir={out}"]
        env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
        subprocess.run(cmd, check=True, env=env, stderr=subprocess.DEVNULL)
        with open(os.path.join(out, "metrics.jsonl")) as f:
            rates = [json.loads(l)["samples_per_s"] for l in f if "samples_per_s" in l]
    return statistics.median(rates[1:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    with open("data/train_sample/text_model/config.json") as f:
        vocab = json.load(f)["vocab_size"]
    cs, ts = [], []
    for r in range(a.rounds):
        cs.append(curate_samples_per_s(a.steps, a.threads))
        ts.append(torch_samples_per_s(a.steps, 64, vocab))
        print(f"round {r + 1}: curate {cs[-1]:8.1f}, PyTorch {ts[-1]:8.1f} samples/s, ratio {cs[-1] / ts[-1]:.2f}")
    c, t = statistics.median(cs), statistics.median(ts)
    print(f"curate train : {c:8.1f} samples/s (whole pipeline: decode, augment, tokenise, step; median of {a.rounds})")
    print(f"PyTorch {torch.__version__}: {t:8.1f} samples/s (training step only, tensors in memory; median of {a.rounds})")
    print(f"ratio curate/PyTorch: {c / t:.2f} ({a.threads} threads, batch 64, {a.steps} steps)")


if __name__ == "__main__":
    main()

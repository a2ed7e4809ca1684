#!/usr/bin/env python3
"""Writes a model folder with all-mpnet-base-v2's sizes (12 layers, 768 wide, 12 heads, 32
relative-position buckets) and random weights, for speed figures of CUSA's text teacher where
the published checkpoint cannot be downloaded. The tokenizer and Sentence-BERT files come from
a BERT uncased folder (all-MiniLM-L6-v2's: ids below MPNet's 30,527), the pooling widened to 768.

    python3 benches/random_mpnet_base.py --out /tmp/mpnet_base [--tokenizer-from models/all-MiniLM-L6-v2]
    python3 benches/text_encoder_bench.py --model /tmp/mpnet_base --rows 2000 --repeat 3
"""
import argparse
import json
import os
import shutil

import torch
from transformers import MPNetConfig, MPNetModel

FILES = ["tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json", "modules.json",
         "sentence_bert_config.json", "config_sentence_transformers.json"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokenizer-from", default="models/all-MiniLM-L6-v2")
    args = ap.parse_args()
    torch.manual_seed(0)
    MPNetModel(MPNetConfig(vocab_size=30527), add_pooling_layer=False).save_pretrained(args.out)
    for f in FILES:
        shutil.copy(os.path.join(args.tokenizer_from, f), args.out)
    pooling = os.path.join(args.out, "1_Pooling")
    shutil.copytree(os.path.join(args.tokenizer_from, "1_Pooling"), pooling, dirs_exist_ok=True)
    with open(os.path.join(pooling, "config.json")) as f:
        config = json.load(f)
    config["word_embedding_dimension"] = 768
    with open(os.path.join(pooling, "config.json"), "w") as f:
        json.dump(config, f)


if __name__ == "__main__":
    main()

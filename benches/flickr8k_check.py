#!/usr/bin/env python3
"""Check curate's BoW operators against an independent count on the real Flickr8k captions.

Runs `curate run pipelines/flickr8k_only_bow.toml` twice ("only BoW" + RmStopNalpha, then
+ Keep(4)), reads the Parquet output with pyarrow, and recomputes everything in plain Python:
words = caption.lower().split(), RmStopNalpha keeps w.isalpha() and w not in NLTK's English
stopwords. Asserts, per caption, that the BoW caption has exactly min(4, k) words (k = words
surviving RmStopNalpha), that its words are a sub-multiset of the survivors, and that rows and
rejects match; prints the mean words per caption (spec §1.1 measured 10.40 / 5.78 / 3.80 on CC3M
validation; paper 10.3 / 5.8 / 3.8 on CC3M train).

    python3 benches/flickr8k_check.py [--curate target/release/curate]
"""
import argparse
import collections
import glob
import subprocess

import pyarrow.parquet as pq

STOP = set(open("src/text/stopwords_en.txt").read().split())
DATA = "../shared/data/flickr8k_captions.tsv"


def content(words):
    return [w for w in words if w.isalpha() and w not in STOP]


def run(curate, out, sets):
    cmd = [curate, "run", "pipelines/flickr8k_only_bow.toml", "--progress", "never", "--set", f"output_dir={out}"]
    for s in sets:
        cmd += ["--set", s]
    subprocess.run(cmd, check=True, stderr=subprocess.DEVNULL)
    data = pq.read_table(sorted(glob.glob(f"{out}/data/*.parquet"))).to_pydict()
    rej = pq.read_table(sorted(glob.glob(f"{out}/rejects/*.parquet"))).to_pydict()
    return data, rej


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--curate", default="target/release/curate")
    args = ap.parse_args()

    # Independent parse: a line is a pair iff it has exactly one tab (the reader's rule).
    pairs = {}
    malformed = 0
    with open(DATA, "rb") as f:
        for line in f:
            fields = line.rstrip(b"\n").split(b"\t")
            if len(fields) < 2:
                malformed += 1
                continue
            pairs[fields[0].decode()] = fields[1].decode()
    raw = {k: v.lower().split() for k, v in pairs.items()}
    kept = {k: content(v) for k, v in raw.items()}
    n = len(raw)
    print(f"{n} captions, {malformed} malformed lines")
    print(f"independent: mean words raw {sum(map(len, raw.values())) / n:.3f}, "
          f"after RmStopNalpha {sum(map(len, kept.values())) / n:.3f}, "
          f"after + Keep(4) {sum(min(4, len(v)) for v in kept.values()) / n:.3f}")

    for keep in (0, 4):
        data, rej = run(args.curate, f"out/flickr8k_check_keep{keep}", [f"bow.keep_words={keep}"])
        got = dict(zip(data["sample_id"], data["caption"]))
        emptied = {i for i, r in zip(rej["sample_id"], rej["reason"]) if r == "empty_after_bow"}
        bad_lines = sum(1 for r in rej["reason"] if r == "wrong_field_count")
        assert bad_lines == malformed, (bad_lines, malformed)
        assert set(got) | emptied == set(raw) and not (set(got) & emptied)
        for sid, survivors in kept.items():
            if not survivors:
                assert sid in emptied, sid
                continue
            words = got[sid].split()
            want = len(survivors) if keep == 0 else min(keep, len(survivors))
            assert len(words) == want, (sid, words, survivors)
            assert not (collections.Counter(words) - collections.Counter(survivors)), (sid, words, survivors)
        mean = sum(len(c.split()) for c in got.values()) / len(got)
        print(f"curate keep_words={keep}: {len(got)} captions out, {len(emptied)} emptied, "
              f"mean words {mean:.3f}; per-caption counts match the independent count")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Check curate's `bow` stage against the independent Python reference,
tests/fixtures/bow/bow_reference.py (written from the spec and curate's docs, not from the Rust
code of the stage; see its docstring).

Every case runs `curate run` (pipelines/bow.toml, or pipelines/flickr8k_only_bow.toml for the
`read_table` cases) and the reference on the same input and compares them exactly: every output
row (sample_id, caption, original_caption, split, in order), every reject per stage in order
(row, sample_id, reason, raw bytes), and the report's bow statistics (counts, Δ size, mean
words, vocabularies, top_removed, both length histograms, each rank-frequency sample; floats to
rel 1e-12). The reference takes its seed from curate's resolved config.json (the stage `seed`,
which defaults to the pipeline `seed`).

Inputs and cases:
  * data/cc3m_sample.tsv (bundled, 5 malformed lines), the crafted file (below) and
    tests/fixtures/bow/golden_input.tsv: the F-T4/F-T5 ablation rows of pipelines/ablations.py
    (its ROWS, imported) plus the extra `--set` lines in EXTRA below (t edges, raw candidates,
    base fractions, seeds, dedup, ...). `base_fraction` 0 or 1 and seed 2^64-1 are refused by
    curate's config check: "refused (expected)".
  * the crafted file: `tests/fixtures/bow/gen_crafted.py --rows 3000 --seed 1
    --no-version-dependent` (tricky Unicode, whitespace and malformed lines). With
    --version-dependent it keeps the line with letters added after Unicode 14; Python 3.11's
    str.lower/isalpha do not know them, so several cases then differ for that line only.
  * golden_input.tsv with make_golden.py's 14 configurations, and a check that the committed
    golden_expected.json is what the reference writes now.
  * a 300,005-line file (`data/gen_cc3m_sample.py --rows 300000 --seed 3 --malformed`: many
    chunks); tiny files (the first 1..35 random rows of the crafted file: base-set rounding);
    an 800-row file whose name makes `tag ‖ 0 ‖ sample_id` longer than 128 bytes; two input
    files in one run; URL fields blank by Python's str.split() (and a zero-width space, which is
    not); 4,000 × "dog dog cat" (dedup + Keep(1) must give dog and cat 1/2 each);
    a small header-less table through `read_table`.
  * Flickr8k (../shared/data/flickr8k_captions.tsv relative to the repository root), only-BoW
    and mostly-BoW, if that file exists ("skipped" otherwise).
  * determinism: the same bytes (data, rejects, report.json) with RAYON_NUM_THREADS=1,
    --threads 1/7, --cache-mib 0/1 as with the defaults, and `curate run <out>/config.json`
    reproducing its run.

Generated inputs and curate's outputs go to --scratch (default: /tmp/curate-bow-reference,
i.e. the system temp folder); results.json there has every case in detail. Needs pyarrow and
xxhash, and snowballstemmer 2.x for the stemmer cases. Exit status 1 if any case differs or fails.

    python3 benches/bow_reference_check.py [--curate target/release/curate] [--quick]
        [--scratch DIR] [--only SUBSTRING] [--version-dependent] [--no-determinism]

--quick runs only the bundled sample's ablation rows and the crafted file's cases (~a minute).
"""
import argparse
import glob
import hashlib
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "bow"
sys.path.insert(0, str(FIXTURE))

import bow_reference as ref  # noqa: E402

CC = ROOT / "data" / "cc3m_sample.tsv"
GOLDEN = FIXTURE / "golden_input.tsv"
BOW_TOML = ROOT / "pipelines" / "bow.toml"
FLICKR = ROOT.parent / "shared" / "data" / "flickr8k_captions.tsv"
FLICKR_TOML = ROOT / "pipelines" / "flickr8k_only_bow.toml"

ONLY = ["bow.mode=only", "bow.limit_to_base_vocab=false", "bow.rm_top_freq=0"]
# (name, --set lines, curate refuses it by design: `base_fraction` must be in (0, 1), a seed is a
# TOML integer <= 2^63 - 1)
EXTRA = [
    ("mode only (default ops)", ONLY, False),
    ("raw candidates", ["bow.frequency_candidates=raw"], False),
    ("t=0", ["bow.rm_top_freq=0"], False),
    ("t=1", ["bow.rm_top_freq=1"], False),
    ("t=100000", ["bow.rm_top_freq=100000"], False),
    ("raw t=100000", ["bow.frequency_candidates=raw", "bow.rm_top_freq=100000"], False),
    ("keep 0", ["bow.keep_words=0"], False),
    ("base 0.0", ["bow.base_fraction=0.0"], True),
    ("base 0.0 no limit/top", ["bow.base_fraction=0.0", "bow.limit_to_base_vocab=false", "bow.rm_top_freq=0"], True),
    ("base 0.05", ["bow.base_fraction=0.05"], False),
    ("base 0.5", ["bow.base_fraction=0.5"], False),
    ("base 1.0", ["bow.base_fraction=1.0"], True),
    ("no shuffle", ["bow.shuffle=false"], False),
    ("seed 7", ["seed=7"], False),
    ("bow.seed 12345", ["bow.seed=12345"], False),
    ("seed 2^64-1", ["seed=18446744073709551615"], True),
    ("dedup", ["bow.dedup=true"], False),
    ("dedup keep0", ["bow.dedup=true", "bow.keep_words=0"], False),
    ("dedup no shuffle", ["bow.dedup=true", "bow.shuffle=false"], False),
    ("no stop, limit, t=100000", ["bow.rm_stop_nalpha=false", "bow.rm_top_freq=100000"], False),
    ("no stop, raw t=5", ["bow.rm_stop_nalpha=false", "bow.frequency_candidates=raw", "bow.rm_top_freq=5"], False),
    ("no limit, t=5, keep 1, no shuffle",
     ["bow.limit_to_base_vocab=false", "bow.rm_top_freq=5", "bow.keep_words=1", "bow.shuffle=false"], False),
    ("base tiny (0 base rows)", ["bow.base_fraction=0.00000001"], False),
    ("base tiny, no limit, t=0", ["bow.base_fraction=0.00000001", "bow.limit_to_base_vocab=false", "bow.rm_top_freq=0"],
     False),
    ("base 0.99999999", ["bow.base_fraction=0.99999999"], False),
    ("stemmer", ["bow.stemmer=english"], False),
    ("stemmer raw t=50", ["bow.stemmer=english", "bow.frequency_candidates=raw", "bow.rm_top_freq=50"], False),
    ("stemmer no stop, keep 0", ["bow.stemmer=english", "bow.rm_stop_nalpha=false", "bow.keep_words=0"], False),
    ("split_punct", ["bow.split_punct=true"], False),
    ("split_punct no stop, raw t=20, keep 0",
     ["bow.split_punct=true", "bow.rm_stop_nalpha=false", "bow.frequency_candidates=raw", "bow.rm_top_freq=20",
      "bow.keep_words=0"], False),
]
# URL fields that are empty or blank by Python's str.split() (`missing_url`), and ones that are not
URLS = (b"a dog\thttp://x/1\ncat on a sofa\t \nbird\t\nfish\t\xc2\xa0\nred car\t\x1c\x85\n"
        b"two cats\t\xe2\x80\x8b\nboat\t\xe3\x80\x80 \t\nsun\thttp://x/2\n")
# the head of a header-less 2-column table: malformed lines, blank/duplicate ids, empty captions
TABLE = (b"id1\tcap one\nid2\tcap two\nid3 cap three\nid4\tcap\textra\nid1\tdup caption\n\tno id\n \tblank id\n"
         b"id5\t\nid6\t   \nid7\t\x1c\nid8\tdog cat\n")


def ablation_rows():
    """pipelines/ablations.py's ROWS as (name, --set lines)."""
    spec = importlib.util.spec_from_file_location("ablations", ROOT / "pipelines" / "ablations.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return [(f"F-T{table} {label}", overrides) for table, label, overrides, *_ in mod.ROWS]


# ---------------------------------------------------------------------------------------------
# curate and the comparison (also used by tests/fixtures/bow/make_golden.py)


def run_curate(curate, pipeline, out, sets, extra_args=(), env=None):
    """`curate run PIPELINE --set output_dir=OUT --set ...`; returns its rows, rejects and report
    (or {"error": stderr} if it fails)."""
    import pyarrow.parquet as pq

    if os.path.isdir(out):
        shutil.rmtree(out)
    cmd = [str(curate), "run", str(pipeline), "--progress", "never", "--set", f"output_dir={out}"]
    for s in sets:
        cmd += ["--set", s]
    cmd += list(extra_args)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if p.returncode != 0:
        return {"error": p.stderr.strip() or f"exit status {p.returncode}", "rc": p.returncode, "cmd": cmd}
    with open(os.path.join(out, "manifest.json")) as f:
        man = json.load(f)
    data_dir = os.path.join(out, man.get("data_dir", "data"))
    rows = []
    for sh in man["data_shards"]:
        rows += pq.read_table(os.path.join(data_dir, sh["file"])).to_pylist()
    rejects = []
    for sh in man["reject_shards"]:
        rejects += pq.read_table(os.path.join(out, "rejects", sh["file"])).to_pylist()
    with open(os.path.join(out, "report.json")) as f:
        report = json.load(f)
    return {"rows": rows, "rejects": rejects, "report": report, "cmd": cmd, "stderr": p.stderr, "out": out}


def _diff_lists(name, exp, got, errs, limit=5):
    if exp == got:
        return
    errs.append(f"{name}: expected {len(exp)} items, got {len(got)}")
    n = 0
    for i in range(max(len(exp), len(got))):
        e = exp[i] if i < len(exp) else None
        g = got[i] if i < len(got) else None
        if e != g:
            errs.append(f"  [{i}] expected {e!r}\n       got      {g!r}")
            n += 1
            if n >= limit:
                break


def _num_eq(a, b):
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15)
    return a == b


def compare(exp, got, reader_stage="read_cc_tsv"):
    """The reference's result `exp` (bow_reference.run) vs curate's `got` (run_curate): a list of
    mismatch descriptions, empty if they agree exactly."""
    errs = []
    key = ("sample_id", "caption", "original_caption", "split")
    _diff_lists("rows", [tuple(r[k] for k in key) for r in exp["rows"]],
                [tuple(r[k] for k in key) for r in got["rows"]], errs)
    for stage in (reader_stage, "bow"):
        e = [(r["row"], r["sample_id"], r["reason"], bytes(r["raw"])) for r in exp["rejects"] if r["stage"] == stage]
        g = [(r["row"], r["sample_id"], r["reason"], bytes(r["raw"])) for r in got["rejects"] if r["stage"] == stage]
        _diff_lists(f"rejects[{stage}]", e, g, errs)
    other = {r["stage"] for r in got["rejects"]} - {reader_stage, "bow"}
    if other:
        errs.append(f"rejects from unexpected stages {other}")
    es, gs = exp["stats"], got["report"]["stages"]["bow"]
    only_mode = gs.get("mode") == "only"
    for k in ("rows_in", "rows_without_caption", "captions_in", "captions_out", "base", "deformed_in",
              "deformed_out", "emptied", "delta_dataset_size", "mean_words_before", "mean_words_after",
              "mean_words_deformed_after", "vocabulary_before", "vocabulary_after", "vocabulary_deformed_after",
              "base_vocabulary"):
        if k not in gs:
            if only_mode and k in ("base", "deformed_in", "deformed_out", "emptied", "base_vocabulary",
                                   "mean_words_deformed_after", "vocabulary_deformed_after"):
                continue
            errs.append(f"stats.{k}: missing in report.json")
        elif not _num_eq(es[k], gs[k]):
            errs.append(f"stats.{k}: expected {es[k]!r}, got {gs[k]!r}")
    _diff_lists("stats.top_removed", [(d["word"], d["base_df"]) for d in es["top_removed"]],
                [(d["word"], d["base_df"]) for d in gs.get("top_removed", [])], errs)
    for which in ("before", "after"):
        _diff_lists(f"stats.length_histogram_{which}", es[f"length_histogram_{which}"],
                    gs[f"length_histogram_{which}"], errs)
        freqs, samples = es[f"frequencies_{which}"], gs[f"rank_frequency_{which}"]
        bad = [(r, f, freqs[r - 1] if r <= len(freqs) else None) for r, f in samples
               if r > len(freqs) or freqs[r - 1] != f]
        if bad:
            errs.append(f"stats.rank_frequency_{which}: (rank, got, expected) {bad[:5]}")
        if samples and samples[-1][0] != len(freqs):
            errs.append(f"stats.rank_frequency_{which}: last rank {samples[-1][0]} != vocabulary {len(freqs)}")
    return errs


# ---------------------------------------------------------------------------------------------
# Inputs and cases


def gen(args, label):
    t = time.time()
    subprocess.run([sys.executable, *map(str, args)], check=True, cwd=ROOT, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    print(f"  generated {label} ({time.time() - t:.1f} s)", flush=True)


def make_inputs(scratch, version_dependent, quick):
    """Generates the inputs into SCRATCH/inputs; returns their paths."""
    d = scratch / "inputs"
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    p = {"crafted": d / "crafted.tsv"}
    gen([FIXTURE / "gen_crafted.py", "--rows", 3000, "--seed", 1, "--out", p["crafted"]]
        + ([] if version_dependent else ["--no-version-dependent"]), "crafted.tsv")
    if quick:
        return p
    p["cc300k"] = d / "cc300k.tsv"
    gen([ROOT / "data" / "gen_cc3m_sample.py", "--rows", 300000, "--seed", 3, "--malformed", "--out", p["cc300k"]],
        "cc300k.tsv")
    # the random rows of the crafted file (their URLs end in /1/<i>.jpg), from row 12 on
    lines = p["crafted"].read_bytes().split(b"\n")
    rand = [ln for ln in lines if b"\thttp://example.com/1/" in ln][12:]
    for k in (1, 2, 3, 5, 10, 15, 25, 35):
        p[f"tiny{k}"] = d / f"tiny{k}.tsv"
        p[f"tiny{k}"].write_bytes(b"\n".join(rand[:k]) + b"\n")
    p["long"] = d / ("L" * 70 + "_" + "ü" * 30 + ".tsv")  # "bow.shuffle\0" + name + "#800" > 128 bytes
    p["long"].write_bytes(b"\n".join(rand[:800]) + b"\n")
    p["bias"] = d / "bias.tsv"
    p["bias"].write_bytes(b"".join(b"dog dog cat\thttp://x/%d\n" % i for i in range(4000)))
    p["table"] = d / "table.tsv"
    p["table"].write_bytes(TABLE)
    p["urls"] = d / "urls.tsv"
    p["urls"].write_bytes(URLS)
    return p


def cc_case(group, name, inp, sets, refused=False):
    paths = [inp] if isinstance(inp, Path) else inp
    path_set = (f"read_cc_tsv.path={paths[0]}" if len(paths) == 1
                else "read_cc_tsv.path=[" + ", ".join(json.dumps(str(x)) for x in paths) + "]")
    return {"group": group, "name": f"{group}: {name}", "pipeline": BOW_TOML, "input": [str(x) for x in paths],
            "sets": [path_set] + sets, "ref_sets": sets, "reader": "cc_tsv", "refused": refused}


def cases(p, quick):
    abl = [(n, s, False) for n, s in ablation_rows()]
    cs = [cc_case("cc3m_sample", n, CC, s, r) for n, s, r in abl]
    if not quick:
        cs += [cc_case("cc3m_sample", n, CC, s, r) for n, s, r in EXTRA]
    cs += [cc_case("crafted", n, p["crafted"], s, r) for n, s, r in abl + EXTRA]
    if quick:
        return cs
    cs += [cc_case("golden_input", n, GOLDEN, s, r) for n, s, r in abl + EXTRA]
    import make_golden

    cs += [cc_case("golden configs", n, GOLDEN, s) for n, s in make_golden.CONFIGS]
    big = [("t4 default", []), ("only", ONLY),
           ("raw t=4000 base 0.3 seed 5", ["bow.frequency_candidates=raw", "bow.rm_top_freq=4000",
                                           "bow.base_fraction=0.3", "seed=5"]),
           ("dedup no keep", ["bow.dedup=true", "bow.keep_words=0"])]
    cs += [cc_case("cc300k", n, p["cc300k"], s) for n, s in big]
    for k in (1, 2, 3, 5, 10, 15, 25, 35):
        for n, s in [("base 0.1", ["bow.limit_to_base_vocab=false", "bow.rm_top_freq=1"]),
                     ("base 0.5", ["bow.base_fraction=0.5", "bow.rm_top_freq=2"]),
                     ("base 0.3", ["bow.base_fraction=0.3", "bow.rm_top_freq=2"]),
                     ("base 0.9999", ["bow.base_fraction=0.9999"])]:
            cs.append(cc_case("tiny files", f"tiny{k} {n}", p[f"tiny{k}"], s))
    cs += [cc_case("long file name", n, p["long"], s) for n, s in [("t=20", ["bow.rm_top_freq=20"]), ("only", ONLY)]]
    two = [p["crafted"], p["tiny35"]]
    cs += [cc_case("two files", n, two, s)
           for n, s in [("t=20", ["bow.rm_top_freq=20"]), ("base 0.3", ["bow.base_fraction=0.3", "bow.rm_top_freq=5"])]]
    cs += [cc_case("blank urls", n, p["urls"], s) for n, s in [("only", ONLY), ("keep 0", ["bow.keep_words=0"])]]
    keep1 = ONLY + ["bow.keep_words=1"]
    cs += [cc_case("dedup bias", n, p["bias"], s)
           for n, s in [("only keep 1", keep1), ("only dedup keep 1", keep1 + ["bow.dedup=true"])]]
    table = {"group": "read_table", "pipeline": FLICKR_TOML, "reader": "table_tsv", "refused": False}
    cs.append(dict(table, name="read_table: small table", input=[str(p["table"])],
                   sets=[f"read_table.path={p['table']}"], ref_sets=ONLY))
    if FLICKR.exists():
        mostly = ["bow.mode=mostly", "bow.limit_to_base_vocab=true", "bow.rm_top_freq=1000"]
        cs.append(dict(table, group="flickr8k", name="flickr8k: only BoW (pipeline)", input=[str(FLICKR)],
                       sets=[f"read_table.path={FLICKR}"], ref_sets=ONLY))
        cs.append(dict(table, group="flickr8k", name="flickr8k: mostly BoW defaults", input=[str(FLICKR)],
                       sets=[f"read_table.path={FLICKR}"] + mostly, ref_sets=[]))
        stem = ["bow.stemmer=english"]
        cs.append(dict(table, group="flickr8k", name="flickr8k: mostly BoW, stemmer", input=[str(FLICKR)],
                       sets=[f"read_table.path={FLICKR}"] + mostly + stem, ref_sets=stem))
        stem_t = stem + ["bow.rm_stop_nalpha=false", "bow.rm_top_freq=100"]
        cs.append(dict(table, group="flickr8k", name="flickr8k: mostly BoW, stemmer, stopwords kept, t=100",
                       input=[str(FLICKR)], sets=[f"read_table.path={FLICKR}"] + mostly + stem_t, ref_sets=stem_t))
    return cs


def ref_cfg(case, config_json):
    """The reference's config: its defaults (those of pipelines/bow.toml, and of the `bow` stage of
    flickr8k_only_bow.toml after ONLY), the case's `bow.` --set lines, and the stage seed from
    curate's resolved config.json."""
    cfg = {}
    for s in case["ref_sets"]:
        k, v = s.split("=", 1)
        if k.startswith("bow.") and k != "bow.seed":
            v = {"true": True, "false": False}.get(v, v)
            for conv in (int, float):
                if isinstance(v, str):
                    try:
                        v = conv(v)
                    except ValueError:
                        pass
            cfg[k[4:]] = v
    # A stage seed taken from the run's is left out of config.json (README: `--set seed=N` then
    # reseeds the stage): the stage's own, else the run's.
    bow = [s for s in config_json["stage"] if s["type"] == "bow"][0]
    cfg["seed"] = bow.get("seed", config_json["seed"])
    return cfg


def run_case(curate, scratch, case, whitespace):
    """Returns a result dict with `status`: match, refused, differs or error."""
    slug = "".join(ch if ch.isalnum() else "_" for ch in case["name"])[:100]
    out = str(scratch / "out" / slug)
    got = run_curate(curate, case["pipeline"], out, case["sets"])
    res = {"group": case["group"], "name": case["name"], "cmd": " ".join(got["cmd"])}
    if "error" in got:
        res["curate_error"] = got["error"]
        res["status"] = "refused" if case["refused"] else "error"
        return res
    with open(os.path.join(out, "config.json")) as f:
        cfg = ref_cfg(case, json.load(f))
    res["cfg"] = cfg
    try:
        exp = ref.run(case["input"], cfg, reader=case["reader"], whitespace=whitespace)
    except ValueError as e:
        res["ref_error"] = str(e)
        res["status"] = "error"
        return res
    stage = "read_cc_tsv" if case["reader"] == "cc_tsv" else "read_table"
    res["mismatches"] = compare(exp, got, stage)
    if not res["mismatches"]:
        res["status"] = "match"
    else:
        res["status"] = "differs"
    res["warnings"] = got["report"]["stages"]["bow"].get("warnings")
    if res["status"] == "match":
        shutil.rmtree(out, ignore_errors=True)  # keep only what needs a look
    return res


def tree_digest(out):
    files = sorted(glob.glob(os.path.join(out, "data", "*.parquet")))
    files += sorted(glob.glob(os.path.join(out, "rejects", "*.parquet")))
    h = {}
    for f in files + [os.path.join(out, "report.json")]:
        with open(f, "rb") as fh:
            h[os.path.relpath(f, out)] = hashlib.sha256(fh.read()).hexdigest()
    return h


def determinism(curate, scratch, label, inp):
    """Same data, rejects and report.json bytes whatever the threads and cache size."""
    results = []
    variants = [("default", [], {}), ("RAYON_NUM_THREADS=1", [], {"RAYON_NUM_THREADS": "1"}),
                ("--threads 1", ["--threads", "1"], {}), ("--threads 7", ["--threads", "7"], {}),
                ("--cache-mib 0", ["--cache-mib", "0"], {}), ("--cache-mib 1", ["--cache-mib", "1"], {})]
    for cfg_name, sets in (("default", []), ("only", ONLY), ("dedup", ["bow.dedup=true"])):
        digests = {}
        for i, (name, args, env) in enumerate(variants):
            out = str(scratch / "out" / f"det_{label}_{cfg_name}_{i}")
            r = run_curate(curate, BOW_TOML, out, [f"read_cc_tsv.path={inp}"] + sets, args, dict(os.environ, **env))
            digests[name] = "ERROR " + r["error"][:200] if "error" in r else tree_digest(out)
            if name != "default" or label != "cc3m_sample" or cfg_name != "default":
                shutil.rmtree(out, ignore_errors=True)
        differs = [k for k, d in digests.items() if d != digests["default"]]
        errors = [k for k, d in digests.items() if isinstance(d, str)]
        results.append({"group": "determinism", "name": f"determinism: {label} {cfg_name} (6 variants)",
                        "status": "error" if errors else "differs" if differs else "match",
                        "differs": differs, "errors": {k: digests[k] for k in errors}})
    return results


def rerun_config(curate, scratch):
    """`curate run OUT/config.json` reproduces the run (README)."""
    first = str(scratch / "out" / "det_cc3m_sample_default_0")
    again = str(scratch / "out" / "det_rerun")
    r = run_curate(curate, os.path.join(first, "config.json"), again, [])
    ok = "error" not in r and tree_digest(first) == tree_digest(again)
    return {"group": "determinism", "name": "determinism: curate run OUT/config.json reproduces OUT",
            "status": "match" if ok else "differs", "error": r.get("error")}


def golden_up_to_date():
    import make_golden

    doc = make_golden.build(GOLDEN)
    ok = make_golden.dumps(doc) == (FIXTURE / "golden_expected.json").read_text(encoding="utf-8")
    return {"group": "golden configs", "name": "golden configs: golden_expected.json is what the reference writes",
            "status": "match" if ok else "differs"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--curate", default=str(ROOT / "target" / "release" / "curate"))
    ap.add_argument("--scratch", default=os.path.join(tempfile.gettempdir(), "curate-bow-reference"),
                    help="generated inputs, curate's outputs and results.json (default: %(default)s)")
    ap.add_argument("--quick", action="store_true",
                    help="only the bundled sample's ablation rows and the crafted file's cases")
    ap.add_argument("--only", default="", help="run only the cases whose name contains this")
    vd = ap.add_mutually_exclusive_group()
    vd.add_argument("--version-dependent", dest="version_dependent", action="store_true",
                    help="keep the crafted file's line with letters added after Unicode 14 (differs under Python 3.11)")
    vd.add_argument("--no-version-dependent", dest="version_dependent", action="store_false",
                    help="leave that line out (the default)")
    ap.add_argument("--no-determinism", action="store_true", help="skip the determinism checks")
    ap.add_argument("--whitespace", default="python", choices=["python", "rust"],
                    help="the reference's whitespace rule (curate follows Python's str.split)")
    a = ap.parse_args()
    curate = Path(a.curate).resolve()
    if not curate.is_file():
        sys.exit(f"error: no curate binary at `{curate}`\nhint: cargo build --release, or pass --curate")
    scratch = Path(a.scratch).resolve()
    (scratch / "out").mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    print(f"curate: {curate}\nscratch: {scratch}", flush=True)
    p = make_inputs(scratch, a.version_dependent, a.quick)
    results = []
    for case in cases(p, a.quick):
        if a.only not in case["name"]:
            continue
        r = run_case(curate, scratch, case, a.whitespace)
        results.append(r)
        line = f"{r['name']:60s} {r['status']}"
        if r["status"] in ("error", "refused"):
            msg = (r.get("curate_error") or r.get("ref_error") or "").splitlines() or [""]
            line += ": " + next((m for m in msg if m.startswith("error")), msg[-1])[:150]
        print(line, flush=True)
        if r["status"] == "differs":
            for m in r["mismatches"][:8]:
                print("    " + m)
    if not a.quick and not a.only:
        results.append(golden_up_to_date())
        print(f"{results[-1]['name']:60s} {results[-1]['status']}", flush=True)
    skipped = []
    if not a.quick and not a.only and not FLICKR.exists():
        skipped.append(f"flickr8k: skipped (no {FLICKR})")
    if a.quick or a.no_determinism or a.only:
        skipped.append("determinism: skipped")
    else:
        for label, inp in (("cc3m_sample", CC), ("crafted", p["crafted"]), ("cc300k", p["cc300k"])):
            for r in determinism(curate, scratch, label, inp):
                results.append(r)
                print(f"{r['name']:60s} {r['status']}" + (f" {r['differs']}" if r["differs"] else ""), flush=True)
        results.append(rerun_config(curate, scratch))
        print(f"{results[-1]['name']:60s} {results[-1]['status']}", flush=True)
    with open(scratch / "results.json", "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1, ensure_ascii=False, default=str)

    # summary: one line per group of cases
    print("\n| case | result |\n| --- | --- |")
    groups = {}
    for r in results:
        groups.setdefault(r["group"], []).append(r["status"])
    for g, st in groups.items():
        names = {"refused": "refused by curate's config check (expected)"}
        counts = [f"{st.count(s)} {names.get(s, s)}" for s in ("match", "refused", "differs", "error")
                  if st.count(s)]
        print(f"| {g} ({len(st)}) | {', '.join(counts)} |")
    for s in skipped:
        print(f"| {s.split(':')[0]} | {s.split(': ', 1)[1]} |")
    bad = [r for r in results if r["status"] in ("differs", "error")]
    print(f"\n{len(results)} cases, {len(bad)} failing, {time.time() - t0:.0f} s; "
          f"details in {scratch / 'results.json'}")
    if bad:
        print("failing: " + "; ".join(r["name"] for r in bad))
        sys.exit(1)


if __name__ == "__main__":
    main()

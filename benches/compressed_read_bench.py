#!/usr/bin/env python3
"""Reading compressed text inputs: an intact `curate run` (read a CC TSV, write its pairs) on
the plain, gzip and bzip2 forms of one file, against the command-line decoders in the same run
(`gzip -dc`, `bzip2 -dc`, and the parallel `lbzip2 -dc` / `pbzip2 -dc` where installed).

    python3 benches/compressed_read_bench.py --curate target/release/curate --input big.tsv

`--input` is a CC-format TSV (`caption<TAB>url`; `data/gen_cc3m_sample.py --rows 1000000`
makes one); its `.gz` and `.bz2` forms are made beside it once (with `gzip -6` and `bzip2 -9`,
the usual levels) and reused. `--baseline` times a second curate build on the same inputs, for
A/B comparisons. Prints the best wall time of `--repeat` runs of each, and ratios.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

PIPELINE = """output_dir = "{out}"
[[stage]]
type = "read_cc_tsv"
path = "{path}"
[[stage]]
type = "write_parquet"
"""


def best_of(cmd, repeat, stdout=subprocess.DEVNULL):
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=stdout, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - t)
    return min(times), times


def compressed(path, suffix, cmd):
    out = path + suffix
    if not os.path.exists(out) or os.path.getmtime(out) < os.path.getmtime(path):
        with open(path, "rb") as src, open(out + ".part", "wb") as dst:
            subprocess.run(cmd, stdin=src, stdout=dst, check=True)
        os.replace(out + ".part", out)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--curate", required=True)
    ap.add_argument("--baseline", help="another curate binary, timed on the same inputs")
    ap.add_argument("--input", required=True, help="a CC-format TSV")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    plain = os.path.abspath(args.input)
    gz = compressed(plain, ".gz", ["gzip", "-6", "-c"])
    bz2 = compressed(plain, ".bz2", ["bzip2", "-9", "-c"])
    mb = os.path.getsize(plain) / 1e6
    rows = sum(1 for _ in open(plain, "rb"))
    print(f"input: {plain} ({rows} lines, {mb:.0f} MB of text; gzip {os.path.getsize(gz) / 1e6:.0f} MB, "
          f"bzip2 {os.path.getsize(bz2) / 1e6:.0f} MB), {os.cpu_count()} cores")

    jobs = []
    for tool in ["gzip", "bzip2", "lbzip2", "pbzip2"]:
        if shutil.which(tool):
            jobs.append((f"`{tool} -dc`", [tool, "-dc", gz if tool == "gzip" else bz2]))
    binaries = [("curate", args.curate)] + ([("baseline", args.baseline)] if args.baseline else [])
    scratch = tempfile.mkdtemp(prefix="curate-zbench-")
    try:
        for name, binary in binaries:
            for kind, path in [("plain", plain), ("gzip", gz), ("bzip2", bz2)]:
                toml = os.path.join(scratch, f"{name}-{kind}.toml")
                with open(toml, "w") as f:
                    f.write(PIPELINE.format(out=os.path.join(scratch, f"{name}-{kind}"), path=path))
                jobs.append((f"{name} run, {kind}", [binary, "run", toml]))
        results = {}
        print("| job | best wall s | MB of text/s | all runs s |")
        print("| --- | ---: | ---: | --- |")
        for label, cmd in jobs:
            best, times = best_of(cmd, args.repeat)
            results[label] = best
            print(f"| {label} | {best:.2f} | {mb / best:.0f} | {', '.join(f'{t:.2f}' for t in times)} |")
        bz = results["curate run, bzip2"]
        print(f"curate run from bzip2 / `bzip2 -dc`: {bz / results['`bzip2 -dc`']:.2f}x; "
              f"/ plain run: {bz / results['curate run, plain']:.2f}x")
        for peer in ["`lbzip2 -dc`", "`pbzip2 -dc`", "baseline run, bzip2"]:
            if peer in results:
                print(f"curate run from bzip2 / {peer}: {bz / results[peer]:.2f}x")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

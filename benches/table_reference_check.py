#!/usr/bin/env python3
"""Randomized differential check of curate's `read_table` reader (TSV, CSV, Parquet) against an
independent Python reference, benches/table_reference.py.

The reference was written from curate's documentation (README "Readers", schemas/pairs.md,
schemas/rejects.md, tests/fixtures/readers/README.md) and the reader's specification as its
maintainers state it, not from the Rust code; its docstring lists the rules it encodes.

Each random case writes 1-3 input files of one format (TSV, CSV or Parquet; extensions in any
letter case; sometimes one file with another format's extension, which without `format` must be
a config error), with or without a header, a different column order per file, quoting, `""`,
embedded LF/CR/CRLF, LF/CRLF/lone-CR/mixed line ends, BOMs, blank lines, too many or too few
fields, unterminated quotes, invalid UTF-8, empty and whitespace-only captions (U+001C..U+001F,
U+0085, ZWSP, ...), null/blank/duplicate ids, 95-140 rows for the first-100-lines width rule,
empty headerless files (a table of no rows), Parquet with six codecs, row groups,
dictionary/large/binary/int/float/bool/date columns, string columns holding bytes that are not
UTF-8 (mapped or not), and
timestamps (s/ms/us/ns, tz-naive, UTC, named zones and offsets), `path_cut_at`, `image_root`,
`check_files` (missing files, folders, empty path cells), `source`, `label`/`label_text`. It
runs `curate run` (read_table + write_parquet) and compares every data row and column in order,
the rejects in order (stage, source_file, row, sample_id, reason, raw; `detail` is not
compared), and the manifest's `rows` and `rejects_by_reason`. Floats written as text are
compared by value (the docs fix no digits); everything else exactly. It also runs fixed edge
cases, and config-error cases through `curate validate` (exit 2 with file:line, no panic).

    python3 benches/table_reference_check.py [--curate target/release/curate] [--cases N]
        [--seed S] [--keep DIR] [--only K]

Scratch files go to a temporary folder (removed at the end; --keep DIR copies the differing
cases there). Prints a summary; exit status 1 on any difference.
"""
import argparse
import datetime
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

import numpy  # noqa: F401  (the reference formats float32 values as numpy prints them)
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import table_reference as R  # noqa: E402  (benches/table_reference.py)

LOGICAL = ["id", "text", "url", "img", "lab", "labt", "extra"]
TARGET = {"id": "sample_id", "text": "caption", "url": "url", "img": "path", "lab": "label",
          "labt": "label_text"}
WORDS = ["a", "dog", "runs", "caf\u00e9", "\u00fcber", "sky", "x.y", "\u65e5\u672c", "emoji\U0001F600",
         "the", "red", "sign"]
WS = [" ", "\t", "\u00a0", "\u3000", "\u2003", "\x0b", "\x0c", "\x1c", "\x1f", "\u0085",
      "\u2028", "\u200b", "\ufeff", "\x00"]


def toml_val(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_val(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {toml_val(x)}" for k, x in v.items()) + " }"
    raise TypeError(v)


def write_pipeline(path, outdir, stage):
    lines = [f"output_dir = {json.dumps(outdir)}", "seed = 0", "[[stage]]", 'type = "read_table"']
    for k, v in stage.items():
        lines.append(f"{k} = {toml_val(v)}")
    lines += ["[[stage]]", 'type = "write_parquet"', ""]
    open(path, "w").write("\n".join(lines))


def run_curate(curate, d, stage, cmd="run"):
    out = os.path.join(d, "out")
    p = os.path.join(d, "pipeline.toml")
    write_pipeline(p, out, stage)
    r = subprocess.run([curate, cmd, p], capture_output=True, cwd=d, timeout=120)
    res = {"rc": r.returncode, "stderr": r.stderr.decode("utf-8", "replace")}
    if cmd == "run" and r.returncode == 0:
        m = json.load(open(os.path.join(out, "manifest.json")))
        data, rej = [], []
        for s in m["data_shards"]:
            data += pq.read_table(os.path.join(out, m.get("data_dir", "data"), s["file"])).to_pylist()
        for s in m["reject_shards"]:
            rej += pq.read_table(os.path.join(out, "rejects", s["file"])).to_pylist()
        res.update(manifest=m, data=data, rejects=rej)
    return res


# ------------------------------------------------------------------ generators
def gen_word(rng):
    return rng.choice(WORDS)


def gen_caption(rng, kind):
    """Returns (value str|bytes, note). bytes => contains invalid UTF-8."""
    k = rng.random()
    if k < 0.06:
        return ""
    if k < 0.14:
        return "".join(rng.choice(WS) for _ in range(rng.randint(1, 3)))
    if k < 0.19:
        return b"caf\xe9 " + gen_word(rng).encode()
    words = [gen_word(rng) for _ in range(rng.randint(1, 4))]
    if rng.random() < 0.3:
        words.insert(rng.randint(0, len(words)), rng.choice([",", '"', "a,b", 'say "hi"', "\n", "\r\n",
                                                            "\r", "\t", "x\ty", "''", "#"]))
    if rng.random() < 0.1:
        words.append(rng.choice(WS))
    return " ".join(words) if rng.random() < 0.8 else "".join(words)


def gen_id(rng, pool):
    k = rng.random()
    if k < 0.06:
        return ""
    if k < 0.1:
        return rng.choice([" ", "\t", "\u3000", "\x1c"])
    if k < 0.13:
        return b"id\xff"
    if k < 0.3 and pool:
        return rng.choice(pool)
    v = rng.choice(["", "n", "id-", "\u00e9"]) + str(rng.randint(0, 40))
    if rng.random() < 0.05:
        v = " " + v
    pool.append(v)
    return v


def gen_img(rng, imgs, cut):
    k = rng.random()
    if k < 0.05:
        return ""
    if cut and k < 0.08:
        return cut + str(rng.randint(0, 4))  # empty after the cut
    name = rng.choice(imgs + ["nope.jpg", "sub/none.jpg", "sub", "sub/"])
    if rng.random() < 0.08:
        name = "/abs/none.jpg"
    if cut and rng.random() < 0.7:
        name += cut + str(rng.randint(0, 4))
    return name


def gen_plain(rng, prefix):
    k = rng.random()
    if k < 0.1:
        return ""
    if k < 0.13:
        return b"\xc3(" + prefix.encode()
    return prefix + str(rng.randint(0, 99)) + rng.choice(["", " x", ",y", "\u00e9"])


def gen_rows(rng, n, pool, imgs, cut):
    rows = []
    for _ in range(n):
        rows.append({"id": gen_id(rng, pool), "text": gen_caption(rng, None),
                     "url": gen_plain(rng, "http://u/"), "img": gen_img(rng, imgs, cut),
                     "lab": gen_plain(rng, "n0"), "labt": gen_plain(rng, "class "),
                     "extra": gen_plain(rng, "e")})
    return rows


def b(v):
    return v if isinstance(v, bytes) else v.encode("utf-8")


def csv_field(rng, v, force_quote=False):
    v = b(v)
    special = any(c in v for c in (b",", b'"', b"\n", b"\r"))
    if special or force_quote or rng.random() < 0.15:
        return b'"' + v.replace(b'"', b'""') + b'"'
    return v


def line_end(rng, fmt, style):
    if style == "lf":
        return b"\n"
    if style == "crlf":
        return b"\r\n"
    if style == "cr":
        return b"\r" if fmt == "csv" else b"\n"
    return rng.choice([b"\n", b"\r\n", b"\r"] if fmt == "csv" else [b"\n", b"\r\n", b"\n", b"\r"])


def write_text(rng, path, fmt, header, order, rows):
    style = rng.choice(["lf", "crlf", "cr", "mixed"])
    sep = b"," if fmt == "csv" else b"\t"
    lines = []
    if header:
        names = [c.encode() for c in order]
        if fmt == "csv" and rng.random() < 0.2:
            names = [b'"' + n + b'"' for n in names]
        lines.append(sep.join(names))
    for r in rows:
        k = rng.random()
        if k < 0.04:
            lines.append(b"")  # blank line
        if fmt == "tsv":
            vals = [b(r[c]) for c in order]
            # a tab or newline inside a TSV value would change the line shape: keep them, that
            # is what the test is about (a tab => wrong_field_count), but newlines/CR split lines
            vals = [v.replace(b"\n", b" ").replace(b"\r", b" ") if rng.random() < 0.8 else v
                    for v in vals]
            line = sep.join(vals)
        else:
            vals = []
            for c in order:
                v = r[c]
                if c == "text" and rng.random() < 0.05:
                    vals.append(b(v).replace(b'"', b"") + b", unquoted comma")
                else:
                    vals.append(csv_field(rng, v))
            line = sep.join(vals)
        k = rng.random()
        if k < 0.05:
            line += sep + b"extra"
        elif k < 0.09 and len(order) > 1:
            line = sep.join(line.split(sep)[:-1]) if fmt == "tsv" else line.rsplit(sep, 1)[0]
        lines.append(line)
    if fmt == "csv" and rng.random() < 0.05 and lines:
        lines.append(b'"unterminated' + sep + b"x")
    out = b""
    for i, l in enumerate(lines):
        out += l
        if i < len(lines) - 1 or rng.random() < 0.7:
            out += line_end(rng, fmt, style)
    if rng.random() < 0.05:
        out += line_end(rng, fmt, style)  # trailing blank line
    if rng.random() < 0.2:
        out = R.BOM + out
    open(path, "wb").write(out)


def write_parquet(rng, path, order, rows, types):
    cols = {}
    for c in order:
        vals = []
        for r in rows:
            v = r[c]
            if rng.random() < 0.08:
                v = None
            vals.append(v)
        t = types[c]
        if t == "binary":
            cols[c] = pa.array([b(v) if v is not None else None for v in vals], pa.binary())
            continue
        if t == "badstr":  # a string column holding the bytes as they are (maybe not UTF-8)
            cols[c] = pa.array([b(v) if v is not None else None for v in vals], pa.binary()).view(pa.string())
            continue
        vals = [v.decode("latin-1") if isinstance(v, bytes) else v for v in vals]
        if t == "int":
            cols[c] = pa.array([rng.randint(-5, 30) if v is not None else None for v in vals], pa.int64())
        elif t == "float":
            cols[c] = pa.array([rng.choice([0.5, 2.0, -3.25, 1e20, 1e-7, 100.0]) if v is not None else None
                                for v in vals], pa.float64())
        elif t == "bool":
            cols[c] = pa.array([rng.random() < 0.5 if v is not None else None for v in vals])
        elif t == "ts":
            cols[c] = pa.array([datetime.datetime(2020, 1, rng.randint(1, 28), 3, 4, 5) if v is not None
                                else None for v in vals], pa.timestamp("s"))
        elif t == "f32":
            cols[c] = pa.array([rng.choice([0.5, 1.1, 3e38, -2.0]) if v is not None else None
                                for v in vals], pa.float32())
        elif t == "date":
            cols[c] = pa.array([datetime.date(2021, 2, rng.randint(1, 28)) if v is not None else None
                                for v in vals], pa.date32())
        elif t == "tsms":
            cols[c] = pa.array([datetime.datetime(2020, 1, 2, 3, 4, 5, rng.choice([0, 120000, 999000]))
                                if v is not None else None for v in vals], pa.timestamp("ms"))
        elif t.startswith("tsx:"):  # any unit, tz-naive or with a zone: from the stored integer
            _, unit, tz = t.split(":", 2)
            per = {"s": 1, "ms": 1000, "us": 1000000, "ns": 1000000000}[unit]
            ints = []
            for v in vals:
                if v is None:
                    ints.append(None)
                    continue
                secs = rng.choice([1577934245, 0, -1, 951782400, 1710054000, 4102444799, -86400 * 365])
                frac = rng.choice([0, 0, per // 2, per // 8, per - 1, 1, per * 12 // 100])
                ints.append(secs * per + frac)
            cols[c] = pa.array(ints, pa.int64()).cast(pa.timestamp(unit, tz=tz or None))
        elif t == "large":
            cols[c] = pa.array(vals, pa.large_string())
        elif t == "dict":
            cols[c] = pa.array(vals, pa.string()).dictionary_encode()
        else:
            cols[c] = pa.array(vals, pa.string())
    table = pa.table(cols)
    comp = rng.choice(["snappy", "zstd", "gzip", "brotli", "lz4", "none"])
    pq.write_table(table, path, compression=comp,
                   row_group_size=rng.choice([None, 1, 2, 3]),
                   use_dictionary=rng.random() < 0.5,
                   data_page_size=rng.choice([None, 64]))


def gen_case(rng, d):
    fmt = rng.choices(["tsv", "csv", "parquet"], [4, 5, 3])[0]
    nfiles = rng.choices([1, 2, 3], [6, 3, 1])[0]
    header = True if fmt == "parquet" else rng.random() < 0.6
    stage = {}
    explicit_fmt = rng.random() < 0.5
    exts = {"tsv": [".tsv", ".txt", ".TSV", ".dat"], "csv": [".csv", ".CSV", ".Csv"],
            "parquet": [".parquet", ".PARQUET", ".Parquet"]}
    if explicit_fmt:
        stage["format"] = fmt
    if fmt != "parquet" and (rng.random() < 0.5 or header != (fmt == "csv")):
        stage["header"] = header
    cut = rng.choice([None, None, "#", "::"])
    # images
    imgdir = os.path.join(d, "imgs")
    os.makedirs(os.path.join(imgdir, "sub"), exist_ok=True)
    imgs = []
    for i in range(3):
        n = f"im{i}.jpg" if i < 2 else f"sub/im{i}.jpg"
        open(os.path.join(imgdir, n), "wb").write(b"\xff\xd8")
        imgs.append(n)
    use_root = rng.random() < 0.4
    # mapping
    mapped = ["text"] if rng.random() < 0.92 else []
    for c in ["id", "url", "img", "lab", "labt"]:
        if rng.random() < (0.6 if c == "id" else 0.4):
            mapped.append(c)
    if not mapped:
        mapped = ["url"]
    base_order = ["id", "text", "url", "img", "lab", "labt", "extra"]
    rng.shuffle(base_order)
    if not header:
        order_fixed = base_order
    pool = []
    files = []
    ptypes = {}
    for c in LOGICAL:
        if fmt == "parquet":
            if c == "id":
                ptypes[c] = rng.choice(["string", "string", "int", "binary", "large", "dict", "badstr"])
            elif c in ("url", "lab", "labt"):
                ptypes[c] = rng.choice(["string", "binary", "int", "float", "bool", "ts", "dict", "large",
                                        "f32", "date", "tsms", "tsx", "tsx", "badstr"])
                if ptypes[c] == "tsx":
                    ptypes[c] = "tsx:%s:%s" % (rng.choice(["s", "ms", "us", "ns"]),
                                               rng.choice(["", "UTC", "+02:00", "-05:30", "+00:00",
                                                           "America/New_York", "Europe/Paris",
                                                           "Asia/Kolkata", "Etc/GMT+3"]))
            elif c == "img":
                ptypes[c] = rng.choice(["string", "string", "binary", "badstr"])
            else:
                ptypes[c] = rng.choice(["string", "string", "binary", "large", "dict", "badstr"])
    for fi in range(nfiles):
        sub = os.path.join(d, "in" if use_root else "imgs")
        if use_root:
            os.makedirs(sub, exist_ok=True)
        ext = rng.choice(exts[fmt])
        if fi > 0 and rng.random() < 0.06:  # another format's extension: a config error without `format`
            ext = rng.choice(exts[rng.choice([f for f in exts if f != fmt])])
        name = f"f{fi}{ext}"
        if fi > 0 and rng.random() < 0.1:
            sub2 = os.path.join(d, f"other{fi}")
            os.makedirs(sub2, exist_ok=True)
            p = os.path.join(sub2, name)
        else:
            p = os.path.join(sub, name)
        order = list(base_order) if not header else rng.sample(base_order, len(base_order))
        nrows = rng.randint(0, 10) if rng.random() < 0.93 else rng.randint(95, 140)
        rows = gen_rows(rng, nrows, pool, imgs, cut)
        if fmt == "parquet":
            ft = dict(ptypes)
            if rng.random() < 0.2 and "id" in ft:
                ft["id"] = rng.choice(["string", "int", "large", "dict"])
            write_parquet(rng, p, order, rows, ft)
        else:
            write_text(rng, p, fmt, header, order, rows)
            # an empty headerless file is a table of no rows (README); with a header, a config
            # error, which the fixed cases check
            if os.path.getsize(p) == 0 and (header or rng.random() < 0.5):
                open(p, "wb").write(b"id\n" if header else b"x\n")
        files.append((p, order))
    cols = {}
    for c in mapped:
        if header:
            cols[TARGET[c]] = c
        else:
            cols[TARGET[c]] = files[0][1].index(c)
    stage["columns"] = cols
    stage["path"] = [f for f, _ in files] if (nfiles > 1 or rng.random() < 0.5) else files[0][0]
    if cut:
        stage["path_cut_at"] = cut
    if use_root:
        stage["image_root"] = imgdir if rng.random() < 0.7 else "imgs"
    if rng.random() < 0.6:
        stage["check_files"] = rng.random() < 0.5
    if rng.random() < 0.2:
        stage["source"] = "src" + str(rng.randint(0, 9))
    return stage, [f for f, _ in files]


# ------------------------------------------------------------------ comparison
def compare(curate, d, stage, files):
    diffs = []
    cwd = os.getcwd()
    os.chdir(d)
    try:
        try:
            ref = R.reference(stage, files)
            ref_err = None
        except R.ConfigError as e:
            ref, ref_err = None, str(e)
    finally:
        os.chdir(cwd)
    res = run_curate(curate, d, stage)
    if ref_err is not None or res["rc"] != 0:
        if ref_err is not None and res["rc"] == 2:
            return []
        return [f"exit: curate rc={res['rc']} ({res['stderr'].strip()[:300]}), reference error={ref_err}"]
    rows, rejects, counts, by = ref
    cd, cr = res["data"], res["rejects"]
    for i in range(max(len(rows), len(cd))):
        a = rows[i] if i < len(rows) else None
        c = cd[i] if i < len(cd) else None
        if not R.loose_eq(a, c):
            diffs.append(f"data[{i}]: ref={a} curate={c}")
            if len(diffs) > 6:
                break
    for i in range(max(len(rejects), len(cr))):
        a = rejects[i] if i < len(rejects) else None
        c = cr[i] if i < len(cr) else None
        if c is not None:
            c = {k: v for k, v in c.items() if k != "detail"}
        if not R.loose_eq(a, c):
            diffs.append(f"rejects[{i}]: ref={a} curate={c}")
            if len(diffs) > 12:
                break
    m = res["manifest"]
    if m["rows"] != counts:
        diffs.append(f"manifest rows: ref={counts} curate={m['rows']}")
    if m["rejects_by_reason"] != by:
        diffs.append(f"manifest rejects_by_reason: ref={by} curate={m['rejects_by_reason']}")
    return diffs



# ------------------------------------------------------------------ fixed edge cases
def _pq(table, **kw):
    return lambda p: pq.write_table(table, p, **kw)


def edge_cases():
    E = []
    E.append(("tsv lone CR is data", {"a.tsv": b"1\ta\rb\n2\tc\r\n3\td\r\r\n"}, {"columns": {"sample_id": 0, "caption": 1}}))
    E.append(("tsv blank lines do not vote", {"a.tsv": b"a\tb\nx\ty\n\n\n\nc\n"}, {"columns": {"caption": 0}}))
    E.append(("tsv width: blank lines inside the first 100",
              {"a.tsv": b"a\tb\n" * 3 + b"\n" * 97 + b"c\n" * 4}, {"columns": {"caption": 0}}))
    E.append(("csv width: a record spanning 150 lines",
              {"a.csv": b'a,"' + b"\n" * 150 + b'x"\nq\nr\ns\n'}, {"header": False, "columns": {"caption": 0}}))
    E.append(("csv width: 100 records",
              {"a.csv": b"a,b\n" * 99 + b"c\n" * 5}, {"header": False, "columns": {"caption": 0}}))
    E.append(("width tie", {"a.tsv": b"1\ta\n2\tb\tc\n"}, {"columns": {"caption": 0}}))
    E.append(("tsv headerless: index past the usual width", {"a.tsv": b"h\tb\nh\tb\nx\tb\tc\n"},
              {"columns": {"caption": 0, "label": 2}}))
    E.append(("csv headerless: index past the usual width", {"a.csv": b'"h",b\n"h",b\nx,b,c\n'},
              {"header": False, "columns": {"caption": 0, "label": 2}}))
    E.append(("csv headerless: a quoted comma is no separator", {"a.csv": b'"h,y",b\n'},
              {"header": False, "columns": {"caption": 0, "label": 2}}))
    E.append(("csv: last record starts with a BOM", {"a.csv": b"1,a\n\xef\xbb\xbfx,\n"},
              {"header": False, "columns": {"sample_id": 0, "caption": 1}}))
    E.append(("csv blank lines before header", {"a.csv": b"\r\n\nid,text\n1,a\n"}, {"columns": {"caption": "text"}}))
    E.append(("csv whitespace-only line", {"a.csv": b"id,text\n1,a\n   \n2,b\n"}, {"columns": {"caption": "text"}}))
    E.append(("csv CR then CRLF", {"a.csv": b"id,text\r1,a\r\r\n2,b"}, {"columns": {"caption": "text"}}))
    E.append(("tsv CR CR LF", {"a.tsv": b"1\ta\r\r\n2\tb"}, {"columns": {"sample_id": 0, "caption": 1}}))
    E.append(("tsv width 1 with blank line", {"a.tsv": b"a\n\nb\n"}, {"columns": {"caption": 0}}))
    E.append(("tsv only a blank line", {"a.tsv": b"\n"}, {"columns": {"caption": 0}}))
    E.append(("csv NUL byte", {"a.csv": b"id,text\n1,a\x00b\n"}, {"columns": {"caption": "text"}}))
    E.append(("BOM inside data", {"a.csv": b"id,text\n1,\xef\xbb\xbfa\n"}, {"columns": {"caption": "text"}}))
    E.append(("BOM then blank line", {"a.csv": b"\xef\xbb\xbf\nid,text\n1,a\n"}, {"columns": {"caption": "text"}}))
    E.append(("BOM headerless tsv id", {"a.tsv": b"\xef\xbb\xbfx1\ta\n"}, {"columns": {"sample_id": 0, "caption": 1}}))
    E.append(("duplicate header names", {"a.csv": b"id,text,text\n1,a,b\n"}, {"columns": {"caption": "text"}}))
    E.append(("quoted header names", {"a.csv": b'"id","te,xt"\n1,a\n'}, {"columns": {"caption": "te,xt"}}))
    E.append(("header only", {"a.csv": b"id,text\n"}, {"columns": {"caption": "text"}}))
    E.append(("unterminated quote, right width", {"a.csv": b'id,text\n1,"abc\n'}, {"columns": {"caption": "text"}}))
    E.append(("unterminated quote, wrong width", {"a.csv": b'id,text,u\n1,"abc\n'}, {"columns": {"caption": "text"}}))
    E.append(("empty path cell", {"a.csv": b"id,text,p\n1,a,\n"}, {"columns": {"caption": "text", "path": "p"}, "check_files": False}))
    E.append(("empty path cell, check_files", {"a.csv": b"id,text,p\n1,a,\n"}, {"columns": {"caption": "text", "path": "p"}, "check_files": True}))
    E.append(("path empty after the cut", {"a.csv": b"id,text,p\n1,a,#3\n2,b,d#1\n", "d/x": b"x"},
              {"columns": {"caption": "text", "path": "p"}, "check_files": True, "path_cut_at": "#"}))
    E.append(("blank ids (Python whitespace)", {"a.tsv": b"\x1c\ta\n\x1c\tb\n \tc\n\x85\td\n\u200b\te\n".replace(b"\\u200b", "\u200b".encode())},
              {"columns": {"sample_id": 0, "caption": 1}}))
    for fmt, data in (("tsv", b"1\ta\n1\t\n2\t\xff\tx\n3\t\n3\tok\n"), ("csv", b"1,a\n1,\n2,\xff,x\n3,\n3,ok\n")):
        E.append((f"check order ({fmt})", {f"a.{fmt}": data}, {"header": False, "columns": {"sample_id": 0, "caption": 1}}))
    t6 = pa.table({"id": pa.array(["1", "1", "2", "3", "3", None, " "]),
                   "text": pa.array([b"a", b"", b"\xff", b"", b"ok", b"\xfe", b"x"], pa.binary())})
    E.append(("check order (parquet)", {"a.parquet": _pq(t6)}, {"columns": {"sample_id": "id", "caption": "text"}}))
    E.append(("path to a directory", {"a.csv": b"id,text,p\n1,a,d\n", "d/x": b"x"}, {"columns": {"caption": "text", "path": "p"}, "check_files": True}))
    E.append(("cut marker twice", {"a.csv": b"id,text,p\n1,a,im.jpg#1#2\n"}, {"columns": {"caption": "text", "path": "p"}, "check_files": False, "path_cut_at": "#"}))
    E.append(("glob order", {"b.csv": b"id,text\nb,x\n", "a.csv": b"id,text\na,y\n", "c.csv": b"id,text\nc,z\n"},
              {"columns": {"sample_id": "id", "caption": "text"}, "path": "GLOB:*.csv"}))
    E.append(("id with surrounding space kept", {"a.csv": b"id,text\n 1 ,a\n1,b\n"}, {"columns": {"sample_id": "id", "caption": "text"}}))
    E.append(("dup id across files, first file rejected row", {"a.csv": b"id,text\n1,\n", "b.csv": b"id,text\n1,ok\n1,again\n"},
              {"columns": {"sample_id": "id", "caption": "text"}}))
    import decimal
    t = pa.table({"text": pa.array(["a", "b", "c", "d"]),
                  "f32": pa.array([1.1, 0.1, 3e38, None], pa.float32()),
                  "f64": pa.array([2.0, 1e16, 1e15, 1e-5], pa.float64()),
                  "d32": pa.array([datetime.date(2020, 1, 2)] * 4, pa.date32()),
                  "i16": pa.array([1, -2, 3, None], pa.int16()),
                  "u8": pa.array([0, 255, 3, 4], pa.uint8())})
    E.append(("parquet numeric types", {"a.parquet": _pq(t, row_group_size=1)},
              {"columns": {"caption": "text", "url": "f32", "label": "f64", "label_text": "d32"}}))
    E.append(("parquet ints", {"a.parquet": _pq(t, compression="lz4")}, {"columns": {"caption": "text", "url": "i16", "label": "u8"}}))
    E.append(("parquet by index", {"a.parquet": _pq(t, compression="brotli")}, {"columns": {"caption": 0, "url": 4}}))
    t2 = pa.table({"text": pa.array(["a", "b"]),
                   "ts": pa.array([datetime.datetime(2020, 1, 2, 3, 4, 5)] * 2, pa.timestamp("s", tz="UTC"))})
    E.append(("parquet tz timestamp, not mapped", {"a.parquet": _pq(t2)}, {"columns": {"caption": "text"}}))
    E.append(("parquet tz timestamp, mapped", {"a.parquet": _pq(t2)}, {"columns": {"caption": "text", "label": "ts"}}))
    for tz in ("+02:00", "-05:30", "Europe/Paris", "America/New_York", "Asia/Kolkata"):
        ints = pa.array([1577934245120, 1593648000000, -1500, None], pa.int64())
        t7 = pa.table({"text": pa.array(["a", "b", "c", "d"]), "ts": ints.cast(pa.timestamp("ms", tz=tz))})
        E.append((f"parquet tz timestamp {tz}", {"a.parquet": _pq(t7)}, {"columns": {"caption": "text", "url": "ts", "sample_id": "ts"}}))
    t3 = pa.table({"text": pa.array(["a", "b"]),
                   "ts": pa.array([datetime.datetime(2020, 1, 2, 3, 4, 5, 120000)] * 2, pa.timestamp("ms"))})
    E.append(("parquet ms timestamp", {"a.parquet": _pq(t3)}, {"columns": {"caption": "text", "label": "ts"}}))
    t4 = pa.table({"id": pa.array(["x", "x", "y"]), "text": pa.array([None, "b", ""])})
    E.append(("parquet null caption does not claim id", {"a.parquet": _pq(t4, compression="gzip")},
              {"columns": {"sample_id": "id", "caption": "text"}}))
    t8 = pa.table({"text": pa.array(["a", "b"]), "u": pa.array([None, None])})  # a Null-typed column
    E.append(("parquet null-typed column", {"a.parquet": _pq(t8)}, {"columns": {"caption": "text", "url": "u"}}))
    E.append(("tsv CR at the end of the file", {"a.tsv": b"1\ta\r\n2\tb\r"}, {"columns": {"sample_id": 0, "caption": 1}}))
    E.append(("tsv header-only file ending in CR", {"a.tsv": b"text\tid\r"}, {"header": True, "columns": {"sample_id": "id", "caption": "text"}}))
    t5 = pa.table({"text": pa.array([], pa.string())})
    E.append(("parquet zero rows", {"a.parquet": _pq(t5, compression="zstd")}, {"columns": {"caption": "text"}}))
    E.append(("mixed extensions, no format (config error)", {"a.tsv": b"1\tx\n", "b.csv": b"2,y\n"}, {"columns": {"caption": 1}}))
    E.append(("mixed extensions, format set", {"a.tsv": b"1,x\n", "b.csv": b"2,y\n"}, {"format": "csv", "header": False, "columns": {"caption": 1}}))
    E.append(("upper-case .CSV", {"a.CSV": b"id,text\n1,a\n"}, {"columns": {"caption": 1}}))
    E.append(("upper-case .TSV and .txt", {"a.TSV": b"1\tx\n", "b.txt": b"2\ty\n"}, {"columns": {"caption": 1}}))
    # an empty headerless file is a table of no rows (README); with a header it is a config error
    E.append(("empty headerless tsv", {"a.tsv": b""}, {"columns": {"caption": 0}}))
    E.append(("empty headerless csv, index 5", {"a.csv": b""}, {"header": False, "columns": {"caption": 5, "sample_id": 2}}))
    E.append(("BOM-only headerless tsv", {"a.tsv": b"\xef\xbb\xbf"}, {"columns": {"caption": 3}}))
    E.append(("empty headerless file beside another", {"a.tsv": b"1\tx\n2\ty\n", "b.tsv": b""}, {"columns": {"sample_id": 0, "caption": 1}}))
    E.append(("empty csv with a header (config error)", {"a.csv": b""}, {"columns": {"caption": "text"}}))
    E.append(("BOM-only tsv with a header (config error)", {"a.tsv": b"\xef\xbb\xbf"}, {"header": True, "columns": {"caption": "text"}}))
    tb = pa.table({"id": pa.array([b"1", b"2", b"\xff", None, b"5"], pa.binary()).view(pa.string()),
                   "text": pa.array([b"a", b"caf\xe9", b"c", b"d", b"e"], pa.binary()).view(pa.string()),
                   "other": pa.array([b"\xfe", b"x", b"y", b"z", b"\xc3"], pa.binary()).view(pa.string())})
    E.append(("parquet string column holding non-UTF-8 bytes", {"a.parquet": _pq(tb)}, {"columns": {"sample_id": "id", "caption": "text"}}))
    E.append(("parquet non-UTF-8 bytes, no mapped id", {"a.parquet": _pq(tb)}, {"columns": {"caption": "text", "label": "other"}}))
    return E


def run_edges(curate, work, verbose=False):
    import glob as _glob
    probs = []
    for i, (name, files, stage) in enumerate(edge_cases()):
        d = os.path.join(work, f"edge-{i}")
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        paths = []
        for fn, content in files.items():
            p = os.path.join(d, fn)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            if isinstance(content, bytes):
                open(p, "wb").write(content)
            else:
                content(p)
            if not fn.startswith("d/"):
                paths.append(p)
        st = dict(stage)
        if str(st.get("path", "")).startswith("GLOB:"):
            st["path"] = os.path.join(d, st["path"][5:])
            files_for_ref = sorted(_glob.glob(st["path"]))
        else:
            st["path"] = paths if len(paths) > 1 else paths[0]
            files_for_ref = paths
        try:
            diffs = compare(curate, d, st, files_for_ref)
        except Exception:
            diffs = ["harness exception: " + traceback.format_exc()]
        if diffs:
            probs.append((i, name, d, diffs))
    return probs


# ------------------------------------------------------------------ config errors
def config_error_cases(curate, work):
    """Config errors: `curate validate` must exit 2 with file:line and not crash."""
    probs = []
    d = os.path.join(work, "cfg")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    csvp = os.path.join(d, "a.csv")
    open(csvp, "wb").write(b"id,text\n1,hello\n")
    tsvp = os.path.join(d, "a.tsv")
    open(tsvp, "wb").write(b"1\thello\n")
    os.makedirs(os.path.join(d, "x"), exist_ok=True)
    dup = os.path.join(d, "x", "a.csv")
    open(dup, "wb").write(b"id,text\n2,x\n")
    pqp = os.path.join(d, "p.parquet")
    pq.write_table(pa.table({"id": [1], "text": ["a"], "lst": [[1]]}), pqp)
    cases = [
        ("missing mapped column (csv)", {"path": csvp, "columns": {"caption": "nope"}}),
        ("missing mapped column (parquet)", {"path": pqp, "columns": {"caption": "nope"}}),
        ("index past width", {"path": tsvp, "columns": {"caption": 7}}),
        ("unknown format", {"path": csvp, "format": "xlsx", "columns": {"caption": "text"}}),
        ("name without header", {"path": tsvp, "columns": {"caption": "text"}}),
        ("no column mapped", {"path": csvp, "columns": {}}),
        ("unknown mapping key", {"path": csvp, "columns": {"captoin": "text"}}),
        ("duplicate file names", {"path": [csvp, dup], "columns": {"caption": "text"}}),
        ("missing input", {"path": os.path.join(d, "none.csv"), "columns": {"caption": "text"}}),
        ("glob matching nothing", {"path": os.path.join(d, "*.nothing"), "columns": {"caption": "text"}}),
        ("list-typed column", {"path": pqp, "columns": {"caption": "lst"}}),
        ("negative index", {"path": tsvp, "columns": {"caption": -1}}),
        ("header wrong type", {"path": csvp, "header": "yes", "columns": {"caption": "text"}}),
        ("unknown key", {"path": csvp, "colums": {"caption": "text"}, "columns": {"caption": "text"}}),
        ("empty path_cut_at", {"path": csvp, "path_cut_at": "", "columns": {"caption": "text"}}),
        ("mixed extensions, no format", {"path": [csvp, tsvp], "columns": {"caption": 1}}),
        ("csv + parquet, no format", {"path": [csvp, pqp], "columns": {"caption": "text"}}),
    ]
    for name, st in cases:
        res = run_curate(curate, d, st, cmd="validate")
        err = res["stderr"]
        ok = res["rc"] == 2 and "pipeline.toml:" in err and "panicked" not in err
        if not ok:
            probs.append(f"config error `{name}`: rc={res['rc']} stderr={err.strip()[:400]!r}")
    # the same inputs are fine once `format` is set, or when the extensions agree in any case
    up = os.path.join(d, "u")
    os.makedirs(up, exist_ok=True)
    open(os.path.join(up, "b.CSV"), "wb").write(b"id,text\n3,z\n")
    fine = [
        ("mixed extensions, format set", {"path": [csvp, tsvp], "format": "tsv", "header": False, "columns": {"caption": 0}}),
        (".csv + .CSV", {"path": [csvp, os.path.join(up, "b.CSV")], "columns": {"caption": "text"}}),
    ]
    for name, st in fine:
        res = run_curate(curate, d, st, cmd="validate")
        if res["rc"] != 0:
            probs.append(f"valid config `{name}`: rc={res['rc']} stderr={res['stderr'].strip()[:400]!r}")
    return probs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--curate", default="target/release/curate")
    ap.add_argument("--cases", type=int, default=1500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", metavar="DIR", help="copy the differing cases into DIR")
    ap.add_argument("--no-fixed", action="store_true", help="skip the fixed edge and config-error cases")
    ap.add_argument("--only", type=int, default=None, help="run only random case K")
    a = ap.parse_args()
    curate = os.path.abspath(a.curate)
    if not os.path.exists(curate):
        sys.exit(f"no curate binary at {curate} (build it with cargo build --release, or pass --curate)")
    t0 = time.time()
    failed = 0
    fail_list = []
    rng_master = random.Random(a.seed)
    seeds = [rng_master.randrange(2**32) for _ in range(a.cases)]

    def keep(d, name):
        if a.keep:
            dst = os.path.join(a.keep, name)
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(d, dst)

    with tempfile.TemporaryDirectory(prefix="curate-table-check-") as work:
        for i in range(a.cases):
            if a.only is not None and i != a.only:
                continue
            rng = random.Random(seeds[i])
            d = os.path.join(work, f"case-{a.seed}-{i}")
            os.makedirs(d)
            try:
                stage, files = gen_case(rng, d)
                diffs = compare(curate, d, stage, files)
            except Exception:
                stage = {}
                diffs = ["harness exception: " + traceback.format_exc()]
            if diffs:
                failed += 1
                fail_list.append(i)
                print(f"--- case {i} stage={ {k: v for k, v in stage.items() if k != 'path'} }")
                for x in diffs[:15]:
                    print("   ", x)
                keep(d, f"case-{a.seed}-{i}")
            shutil.rmtree(d, ignore_errors=True)
        cfg = [] if a.no_fixed else config_error_cases(curate, work)
        edges = [] if a.no_fixed else run_edges(curate, work)
        for i, name, d, diffs in edges:
            print(f"--- edge case {i} `{name}`")
            for x in diffs[:8]:
                print("   ", x)
            keep(d, f"edge-{i}")
        for p in cfg:
            print("---", p)
    n = a.cases if a.only is None else 1
    nfixed = 0 if a.no_fixed else len(edge_cases())
    print(f"\nread_table reference check (seed {a.seed}): {n - failed}/{n} random cases agree, {failed} differ "
          f"{fail_list[:40]}; {nfixed - len(edges)}/{nfixed} fixed edge cases agree; "
          f"{len(cfg)} config-error problems; {time.time() - t0:.1f} s")
    sys.exit(1 if failed or cfg or edges else 0)


if __name__ == "__main__":
    main()

"""Independent Python reference of curate's `read_table` reader (TSV, CSV, Parquet), used by
benches/table_reference_check.py.

Written from curate's documentation (README "Readers", schemas/pairs.md, schemas/rejects.md,
tests/fixtures/readers/README.md) and the reader's specification as its maintainers state it, not
from the Rust code. CSV parsing uses Python's `csv` module; Parquet is read with pyarrow. Where
the docs leave a choice open, the choice taken is written next to the code ("docs-open").

Rules encoded here:
  * per-row check order, the same for every format: wrong_field_count -> invalid_utf8 (the whole
    line/record for TSV/CSV, the mapped values for Parquet) -> missing_id ->
    missing_caption / empty_caption -> missing_file -> duplicate_id (only kept rows claim their id);
  * "blank" id and "empty" caption = only whitespace in Python's str.isspace sense;
  * a CSV record that ends inside an unterminated quote keeps, in `raw`, the line-end bytes that
    belong to the open field;
  * Parquet values of other types are text; a timestamp with a time zone is the UTC instant in
    RFC 3339 with `Z` (`2020-01-02T03:04:05Z`, fractions as arrow prints them: `.120`), a
    tz-naive one has no `Z`;
  * an empty headerless text file (no bytes, or a BOM alone) is a table of no rows (no column
    index is checked against it); an empty file with a header is a config error, and so
    (docs-open) is a non-empty file with no non-blank line;
  * Parquet: a mapped value that is not UTF-8 (binary columns, or string columns holding
    such bytes) rejects its row, `invalid_utf8`, `raw` = that value's bytes (the first such one
    in the order sample_id, caption, url, path, label, label_text; `sample_id` = the mapped id
    when it is UTF-8 and not blank, else `file#row` without a mapped id, else null); a column
    that is not mapped is not checked;
  * an empty `path` cell (or one empty after `path_cut_at`) is a null path; with `check_files`
    a path that is not a regular file (missing, or a folder) is `missing_file`; an empty `url`
    cell, or one of whitespace only, is a null url;
  * a TSV file whose lines end in a lone CR (no LF) is a config error; CSV reads them as lines;
  * without `format`, each file's format comes from its extension, case-insensitively
    (`.parquet`, `.csv`, else TSV); inputs whose extensions give different formats are a
    config error unless `format` is set.
"""
import csv
import json
import math
import os
import re
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq

ORDER = ["sample_id", "caption", "url", "path", "label", "label_text"]
BOM = b"\xef\xbb\xbf"

# ---- docs-open choices --------------------------------------------------------------------
# Default `header`: true for csv and parquet, false for tsv. Default `check_files`: true.
# Headerless width: the most common field count over the first 100 non-blank lines (blank
# lines neither vote nor use up the window); a tie goes to the wider count.
# CSV: a blank line (outside quotes) is no record at all (neither row nor reject).
# TSV: a blank line is a row of one empty field.
# A relative `image_root` is resolved against the current directory.


class ConfigError(Exception):
    pass


class LooseFloat(str):
    """A float written as text: the docs say only "as text", so compare numerically."""


class LooseJson(bytes):
    """Parquet reject raw holding a float/time: compare element-wise, loosely."""


def text_blank(s):
    return len(s.split()) == 0


def line_split_keep(data):
    """Split bytes into lines, keeping terminators; LF, CRLF and lone CR end a line."""
    return re.findall(rb"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$", data)


def strip_end(b, crlf_only=False):
    if b.endswith(b"\r\n"):
        return b[:-2]
    if b.endswith(b"\n"):
        return b[:-1]
    if not crlf_only and b.endswith(b"\r"):
        return b[:-1]
    return b


def tsv_lines(data):
    """(line_no, raw_without_end) for a TSV: lines end in LF (a CR before it is dropped)."""
    if data.startswith(BOM):
        data = data[3:]
    parts = data.split(b"\n")
    if parts and parts[-1] == b"":
        parts.pop()
    out = []
    for i, p in enumerate(parts):
        # docs-open: one CR before the LF, or at the very end of the file, is part of the line end
        if p.endswith(b"\r"):
            p = p[:-1]
        out.append((i + 1, p))
    return out


def csv_records(data):
    """(start_line, fields(bytes), raw_bytes) for a CSV; blank lines are no records."""
    if data.startswith(BOM):
        data = data[3:]
    lines = line_split_keep(data)
    text_lines = [l.decode("latin-1") for l in lines]
    # feed lines one by one so we know how many each record took
    out = []
    pos = 0
    n = len(text_lines)
    while pos < n:
        start = pos
        it = iter(text_lines[pos:])
        r = csv.reader(it, strict=False)
        try:
            rec = next(r)
        except StopIteration:
            break
        consumed = r.line_num
        pos = start + consumed
        if rec == []:
            continue
        raw = b"".join(lines[start:pos])
        # strip the record's end only when the record ended outside quotes: detect an
        # unterminated quote by re-reading the raw record + a sentinel line
        raw_stripped = strip_end(raw)
        fields = [f.encode("latin-1") for f in rec]
        out.append((start + 1, fields, raw_stripped if not _unterminated(raw) else raw))
    return out


def _unterminated(raw_text_bytes):
    """True when the record ends inside an open quoted field (EOF in quotes)."""
    s = raw_text_bytes.decode("latin-1")
    inq = False
    at_field_start = True
    i = 0
    was_quoted = False
    while i < len(s):
        c = s[i]
        if inq:
            if c == '"':
                if i + 1 < len(s) and s[i + 1] == '"':
                    i += 2
                    continue
                inq = False
            i += 1
            continue
        if c == '"' and at_field_start:
            inq = True
            at_field_start = False
        elif c == ",":
            at_field_start = True
        else:
            at_field_start = False
        i += 1
    return inq


def text_width(rows):
    """Headerless width: the most common field count of the first 100 non-blank lines."""
    counts = Counter()
    nonblank = [f for f in rows if f != [b""]]
    for fields in nonblank[:100]:
        counts[len(fields)] += 1
    if not counts:
        return 1
    best = max(counts.values())
    cands = [w for w, c in counts.items() if c == best]
    return max(cands)  # docs-open: a tie goes to the wider count


def dec(b):
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return None


def resolve_path(v, index_file, stage):
    """The output `path` of a path cell: None for an empty cell or one empty after the cut."""
    cut = stage.get("path_cut_at")
    if cut:
        k = v.find(cut)  # docs-open: cut at the first occurrence
        if k >= 0:
            v = v[:k]
    if v == "":
        return None
    root = stage.get("image_root")
    if os.path.isabs(v):
        return v
    base = root if root is not None else os.path.dirname(index_file)
    if base == "":
        return v
    return os.path.join(base, v)


def fmt_float(x):
    """Floats as text: shortest round-trip digits (the docs say only 'as text')."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    r = repr(x)
    if "e" in r:
        m, e = r.split("e")
        e = int(e)
        return f"{m}e{e}"
    return r


def arrow_text(v, typ):
    if v is None:
        return None
    if pa.types.is_dictionary(typ):
        typ = typ.value_type
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        return v
    if pa.types.is_binary(typ) or pa.types.is_large_binary(typ):
        return v  # bytes: checked for UTF-8 by the caller
    if pa.types.is_boolean(typ):
        return "true" if v else "false"
    if pa.types.is_integer(typ):
        return str(v)
    if pa.types.is_floating(typ):
        if pa.types.is_float32(typ):
            return LooseFloat(_f32(v))
        return LooseFloat(fmt_float(v))
    if pa.types.is_timestamp(typ):
        return fmt_timestamp(v, typ)
    if pa.types.is_date(typ):
        return v.isoformat()
    return str(v)


_UNIT = {"s": 1, "ms": 1000, "us": 1000000, "ns": 1000000000}


def fmt_timestamp(v, typ):
    """v: the stored integer (UTC instant for tz-aware columns, wall time for naive ones)."""
    import datetime as _dt
    per = _UNIT[typ.unit]
    secs, frac = divmod(v, per)
    nanos = frac * (1000000000 // per)
    t = _dt.datetime(1970, 1, 1) + _dt.timedelta(seconds=secs)
    out = t.strftime("%Y-%m-%dT%H:%M:%S")
    if t.year < 1000:
        out = "%04d" % t.year + out[out.index("-"):]
    if nanos:  # arrow / chrono `%.f`: 3, 6 or 9 digits
        if nanos % 1000000 == 0:
            out += ".%03d" % (nanos // 1000000)
        elif nanos % 1000 == 0:
            out += ".%06d" % (nanos // 1000)
        else:
            out += ".%09d" % nanos
    return out + "Z" if typ.tz is not None else out


def _f32(v):
    import numpy as np
    r = str(np.float32(v))
    if "e" in r:
        m, e = r.split("e")
        return f"{m}e{int(e)}"
    return r


# Per-row checks after wrong_field_count and invalid_utf8, in order (all formats).
CHECK_ORDER = ["missing_id", "caption", "file", "dup"]


def ext_format(path):
    ext = os.path.splitext(path)[1].lower()
    return {".parquet": "parquet", ".csv": "csv"}.get(ext, "tsv")


class Reader:
    def __init__(self, stage, files):
        self.stage = stage
        self.files = files
        self.rows = []
        self.rejects = []
        self.seen = set()
        self.read = 0

    def fmt(self):
        f = self.stage.get("format")
        if f is not None:
            return f
        fmts = {ext_format(p) for p in self.files}
        if len(fmts) > 1:
            raise ConfigError(f"inputs of different formats {sorted(fmts)} and no `format`")
        return fmts.pop()

    def header(self, fmt):
        h = self.stage.get("header")
        if h is not None:
            return h
        return fmt != "tsv"

    def reject(self, fname, row, sid, reason, raw):
        self.rejects.append(dict(stage="read_table", source_file=fname, row=row,
                                 sample_id=sid, reason=reason, raw=raw))

    def finish(self, fname, row, vals, raw, index_file):
        for chk in CHECK_ORDER:
            r = getattr(self, "chk_" + chk)(fname, row, vals, raw, index_file)
            if r:
                return
        self.emit(vals, index_file)

    def sid_of(self, fname, row, vals):
        if "sample_id" not in self.stage["columns"]:
            return f"{fname}#{row}"
        sid = vals.get("sample_id")
        return sid if (sid is not None and not text_blank_id(sid)) else None

    def chk_caption(self, fname, row, vals, raw, index_file):
        if "caption" in self.stage["columns"]:
            c = vals.get("caption")
            if c is None:
                self.reject(fname, row, self.sid_of(fname, row, vals), "missing_caption", raw)
                return True
            if text_blank(c):
                self.reject(fname, row, self.sid_of(fname, row, vals), "empty_caption", raw)
                return True

    def chk_missing_id(self, fname, row, vals, raw, index_file):
        if "sample_id" in self.stage["columns"]:
            sid = vals.get("sample_id")
            if sid is None or text_blank_id(sid):
                self.reject(fname, row, None, "missing_id", raw)
                return True

    def chk_file(self, fname, row, vals, raw, index_file):
        if "path" in self.stage["columns"] and vals.get("path") is not None:
            path = resolve_path(vals["path"], index_file, self.stage)
            if path is not None and self.stage.get("check_files", True) and not os.path.isfile(path):
                self.reject(fname, row, self.sid_of(fname, row, vals), "missing_file", raw)
                return True

    def chk_dup(self, fname, row, vals, raw, index_file):
        if "sample_id" in self.stage["columns"]:
            sid = vals.get("sample_id")
            if sid is not None and not text_blank_id(sid) and sid in self.seen:
                self.reject(fname, row, sid, "duplicate_id", raw)
                return True

    def emit(self, vals, index_file):
        cols = self.stage["columns"]
        if "sample_id" in cols:
            self.seen.add(vals["sample_id"])
            sid = vals["sample_id"]
        else:
            sid = self._cur_sid
        path = None
        if "path" in cols and vals.get("path") is not None:
            path = resolve_path(vals["path"], index_file, self.stage)
        self.rows.append(dict(sample_id=sid, source=self.stage.get("source", "table"),
                              caption=vals.get("caption"), url=(vals.get("url") or "").strip() and vals["url"] or None, path=path,
                              shard=None, key=None, label=vals.get("label"),
                              label_text=vals.get("label_text")))

    def run(self):
        fmt = self.fmt()
        names = [os.path.basename(f) for f in self.files]
        if len(set(names)) != len(names):
            raise ConfigError("two inputs share a file name")
        for f in self.files:
            if fmt == "parquet":
                self.read_parquet(f)
            else:
                self.read_text(f, fmt)
        return self.rows, self.rejects

    def colmap(self, header_names, width, fname):
        out = {}
        for k, v in self.stage["columns"].items():
            if isinstance(v, int):
                if v >= width:
                    raise ConfigError(f"missing column #{v} in {fname}")
                out[k] = v
            else:
                if header_names is None:
                    raise ConfigError(f"column {v} named, but no header")
                if v not in header_names:
                    raise ConfigError(f"missing column {v} in {fname}")
                if header_names.count(v) > 1:
                    raise ConfigError(f"column {v} is named twice in the header of {fname}")
                out[k] = header_names.index(v)
        return out

    def read_text(self, path, fmt):
        fname = os.path.basename(path)
        data = open(path, "rb").read()
        hdr = self.header(fmt)
        # README (`read_table`): an empty headerless file is a table of no rows (its BOM, if
        # any, is not part of its text, so a file of a BOM alone is empty too); a mapped column
        # index cannot be past a width it does not have. With a header, an empty file has none:
        # a config error.
        if data in (b"", BOM):
            if hdr:
                raise ConfigError(f"{path} is empty")
            self.colmap(None, float("inf"), fname)  # a column named without a header is still an error
            return
        # README: a TSV whose lines end in a lone CR (a CR before the last byte, no LF in the
        # first 64 KiB) is refused: read at LF it would be one line.
        head = data[:1 << 16]
        if fmt == "tsv" and b"\n" not in head and b"\r" in head[:-1]:
            raise ConfigError(f"the lines of {path} end in a lone CR")
        if fmt == "tsv":
            recs = [(ln, raw.split(b"\t"), raw) for ln, raw in tsv_lines(data)]
        else:
            recs = csv_records(data)
        # README (`read_table`): a text file that is not empty but has only empty lines (line
        # ends alone) is a config error: its width cannot be known.
        if all(r[1] == [b""] for r in recs):
            raise ConfigError(f"{path} is empty")
        if hdr:
            if not recs:
                raise ConfigError("no header")
            _, hf, _ = recs[0]
            names = [dec(x) if dec(x) is not None else x.decode("latin-1") for x in hf]
            width = len(hf)
            recs = recs[1:]
            idx = self.colmap(names, width, fname)
        else:
            width = text_width([r[1] for r in recs])
            idx = self.colmap(None, width, fname)  # an index past the usual width: config error
        cols = self.stage["columns"]
        for ln, fields, raw in recs:
            self.read += 1
            self._cur_sid = f"{fname}#{ln}"
            if len(fields) != width:
                sid = None
                if "sample_id" not in cols:
                    sid = f"{fname}#{ln}"
                elif len(fields) > 1 and idx["sample_id"] < len(fields):
                    v = dec(fields[idx["sample_id"]])
                    if v is not None and not text_blank_id(v):
                        sid = v
                self.reject(fname, ln, sid, "wrong_field_count", raw)
                continue
            if dec(raw) is None:
                sid = f"{fname}#{ln}" if "sample_id" not in cols else None
                if "sample_id" in cols:
                    v = dec(fields[idx["sample_id"]])
                    if v is not None and not text_blank_id(v):
                        sid = v
                self.reject(fname, ln, sid, "invalid_utf8", raw)
                continue
            vals = {k: fields[i].decode("utf-8") for k, i in idx.items()}
            self.finish(fname, ln, vals, raw, path)

    def read_parquet(self, path):
        fname = os.path.basename(path)
        t = pq.read_table(path)
        names = t.column_names
        idx = {}
        for k, v in self.stage["columns"].items():
            if isinstance(v, int):
                if v >= len(names):
                    raise ConfigError(f"missing column #{v}")
                idx[k] = v
            else:
                if v not in names:
                    raise ConfigError(f"missing column {v}")
                if names.count(v) > 1:
                    raise ConfigError(f"column {v} is named twice")
                idx[k] = names.index(v)
        colvals = {}
        for k, i in idx.items():
            typ = t.schema.field(i).type
            col = t.column(i)
            if pa.types.is_timestamp(typ):
                col = col.cast(pa.int64())  # the stored integer; formatted by fmt_timestamp
            elif pa.types.is_string(typ):
                col = col.cast(pa.binary())  # as stored: a string column may hold non-UTF-8 bytes
            elif pa.types.is_large_string(typ):
                col = col.cast(pa.large_binary())
            colvals[k] = (col.to_pylist(), typ)
        for r in range(t.num_rows):
            self.read += 1
            self._cur_sid = f"{fname}#{r}"
            vals = {k: arrow_text(colvals[k][0][r], colvals[k][1]) for k in idx}
            bad = None
            for k in ORDER:
                v = vals.get(k)
                if isinstance(v, bytes):
                    d = dec(v)
                    if d is None:
                        if bad is None:
                            bad = v
                    else:
                        vals[k] = d
            if bad is not None:
                sid = f"{fname}#{r}" if "sample_id" not in idx else None
                if "sample_id" in idx and isinstance(vals.get("sample_id"), str) and not text_blank_id(vals["sample_id"]):
                    sid = vals["sample_id"]
                self.reject(fname, r, sid, "invalid_utf8", bad)
                continue
            raw = json.dumps([vals.get(k) for k in ORDER], ensure_ascii=False,
                             separators=(",", ":")).encode("utf-8")
            if any(isinstance(vals.get(k), LooseFloat) for k in ORDER):
                raw = LooseJson(raw)
            self.finish(fname, r, vals, raw, path)


def text_blank_id(s):
    return text_blank(s)


def reference(stage, files):
    """Returns (data_rows, rejects, counts) or raises ConfigError."""
    rd = Reader(stage, files)
    rows, rejects = rd.run()
    by = Counter(f"read_table/{r['reason']}" for r in rejects)
    counts = dict(read=rd.read, rejected=len(rejects), skipped=0, written=len(rows))
    return rows, rejects, counts, dict(by)


def loose_eq(ref, cur):
    """Equality that lets floats written as text differ in their digits (the docs say only
    "as text"); everything else is compared exactly."""
    if isinstance(ref, LooseFloat):
        try:
            a, b = float(ref), float(cur)
        except (TypeError, ValueError):
            return False
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(ref, LooseJson):
        try:
            ra, ca = json.loads(ref), json.loads(cur)
        except ValueError:
            return False
        if len(ra) != len(ca):
            return False
        for x, y in zip(ra, ca):
            if x == y:
                continue
            try:
                if float(x) == float(y):
                    continue
            except (TypeError, ValueError):
                pass
            return False
        return True
    if isinstance(ref, dict) and isinstance(cur, dict):
        return ref.keys() == cur.keys() and all(loose_eq(ref[k], cur[k]) for k in ref)
    return ref == cur

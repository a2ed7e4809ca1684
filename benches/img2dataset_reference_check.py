#!/usr/bin/env python3
"""Randomized differential check of curate's `read_img2dataset` reader against an independent
Python reference.

The reference in this file was written from curate's documentation (README "Readers",
schemas/pairs.md, schemas/rejects.md, tests/fixtures/readers/README.md) and the reader's
behaviour as specified by its maintainers, not from the Rust code. It has its own tar parser
(512-byte blocks, checksums, octal and base-256 sizes, pax `x` and GNU `L` headers,
end-of-archive, lone zero blocks), its own JSON validator (RFC 8259 plus what Python's
`json.loads` reads: `NaN`, `Infinity`, `-Infinity`, a leading BOM; iterative, so any nesting
depth; checked against `json.loads` itself where that can answer) and uses pyarrow only to write
inputs and read curate's output.

Each case writes 1-4 inputs (about 20% img2dataset Parquet, the rest webdataset tar shards) and
runs `curate run` with `read_img2dataset` + `write_parquet`. The tar shards have ordinary and
odd samples (missing `.txt`/image/`.json`, valid and invalid JSON of every kind, deep nesting,
huge numbers, lone surrogate escapes, invalid UTF-8, BOMs, whitespace-only captions, repeated
keys and members, sub-directory keys, long names through pax/GNU headers, member names that are
not UTF-8, empty keys like `.jpg` or `dir/.txt`, type-7 members, directories, extra files) and
damage (cuts anywhere, bad checksums, bad size fields, lone zero blocks, dangling extended
headers, data after the end-of-archive). The Parquet inputs have null/blank keys and captions,
every status, values that are not UTF-8 (in string and binary columns), six codecs and several
row groups. It compares every data column in order, the
rejects (`stage, source_file, row, sample_id, reason, raw`; `detail` is not compared) in order,
and the manifest's `rows` and `rejects_by_reason`.

Rules the reference encodes (docs + the reader's specification):
  * a sample is a run of consecutive regular members (type `0`, NUL or `7`) with the same key;
    key = member path up to the first `.` of its file name; extensions match case-insensitively;
    images are `jpg jpeg png webp bmp`; other member types are skipped but counted in `row`;
  * a member name that is not UTF-8 is a sample of its own: `invalid_utf8`, `sample_id` null,
    `raw` = the name bytes, `row` = its member index; it ends the run before it;
  * then a member name with nothing before its extension (`.jpg`, `dir/.txt`), or a blank key
    (` .jpg`, as a blank `key` in Parquet) -> `missing_key` (`raw` = the `.txt` bytes or empty); then `bad_json` > `missing_caption` > `missing_image` >
    `invalid_utf8` > `empty_caption` > `duplicate_key`;
  * a reject's `sample_id` is never blank (schemas/rejects.md): a blank key (empty, or
    whitespace only in Python's `str.split()` sense) names no sample, so every reject of it
    (`missing_key`, `duplicate_member`, `duplicate_key`, ..., and `truncated_tar`/`corrupt_tar`
    when the sample left out at the damage has a blank key) has `sample_id` null; a key such as
    `dir/` (from `dir/.jpg`) is not blank and is the `sample_id` of its `missing_key`;
  * `KEY.json`: any JSON text in UTF-8 is accepted as Python's `json.loads` reads what
    `json.dumps` writes: RFC 8259 (any depth, any number size, lone surrogate escapes) plus the
    values `NaN`, `Infinity`, `-Infinity` (not `-NaN`, `+Infinity`, `nan`, `infinity`) and one
    leading UTF-8 BOM (a second BOM, or a BOM after whitespace, is `bad_json`); bytes that are
    not UTF-8 (UTF-8-encoded surrogates included) are `bad_json`; `url` = the top-level object's
    last `url` member when it is a string (null otherwise; a string holding a lone surrogate
    cannot be stored as UTF-8: null; an empty or blank one is a null url);
  * a UTF-8 BOM at the start of `KEY.txt` is not part of the caption; `raw` is the `.txt` bytes
    as stored;
  * Parquet: `invalid_utf8` (a `key`, `caption`, `url` or `status` value that is not UTF-8;
    `raw` = the four values as stored joined by tabs, a null as nothing; `sample_id` = the key
    when it is UTF-8 and not blank, else null) > `missing_key` (null or blank key; `sample_id`
    null) > `download_failed` > `missing_caption` > `empty_caption` > `duplicate_key`;
    "blank"/"empty" = only whitespace in Python's `str.split()` sense (U+001C..U+001F too); the
    other rejects' `raw` (a JSON object of the four) is compared as parsed JSON;
  * two local pax headers in a row are `corrupt_tar` (a documented limitation).

usage: python3 benches/img2dataset_reference_check.py [--curate target/release/curate]
           [--cases N] [--seed S] [--keep DIR]
Scratch files go to a temporary folder (removed at the end). Exit status 1 on any difference.
"""
import argparse, collections, json, os, random, re, shutil, subprocess, sys, tempfile, time
import pyarrow as pa
import pyarrow.parquet as pq

BLOCK = 512
BOM = b"\xef\xbb\xbf"
STAGE = "read_img2dataset"
COLS = ["key", "caption", "url", "status"]
IMAGE_EXTS = {"jpg", "jpeg", "png", "webp", "bmp"}
REGULAR = (b"0", b"\0", b"7")


def blank(s: str) -> bool:
    """Only whitespace in Python's str.isspace / str.split() sense (U+001C..U+001F count)."""
    return len(s.split()) == 0


# ----------------------------------------------------------------------------- JSON
_WS = " \t\n\r"
_NUM = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_STR = re.compile(r'"(?:[^"\\\x00-\x1f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*"')


_LITERALS = ("true", "false", "null", "NaN", "Infinity", "-Infinity")


def parse_json(b: bytes):
    """RFC 8259 JSON text in UTF-8 (iterative: any depth), with what Python's `json.loads`
    also reads (README, readers table, `read_img2dataset`): the values `NaN`, `Infinity` and
    `-Infinity` (as `json.dumps` writes them) and one leading UTF-8 BOM. Returns (ok, url)."""
    ok, url = _parse_json(b)
    _cross_check(b, ok, url)
    return ok, url


def _cross_check(b, ok, url):
    """Self-check of the hand-written parser against Python's own `json.loads` (the docs define
    the accepted texts by it), where `json.loads` can answer: strict UTF-8 (json.loads(bytes)
    would also take UTF-16/32 and UTF-8-encoded surrogates, which the docs do not list) and
    shallow enough for its recursion limit."""
    body = b[3:] if b.startswith(BOM) else b
    try:
        s = body.decode("utf-8")
    except UnicodeDecodeError:
        return
    if s.count("[") + s.count("{") > 300:
        return
    try:
        v = json.loads(s)
        py_ok = True
    except RecursionError:
        return
    except ValueError:
        py_ok, v = False, None
    py_url = None
    if isinstance(v, dict) and isinstance(v.get("url"), str):
        py_url = v["url"]
        if any(0xD800 <= ord(ch) <= 0xDFFF for ch in py_url):
            py_url = None
    if (ok, url) != (py_ok, py_url):
        raise AssertionError(f"reference JSON parser disagrees with json.loads on {b[:200]!r}: "
                             f"{(ok, url)} vs {(py_ok, py_url)}")


def _parse_json(b: bytes):
    if b.startswith(BOM):  # one leading BOM, as json.loads(bytes) drops it (utf-8-sig)
        b = b[3:]
    try:
        s = b.decode("utf-8")  # strict: invalid bytes and UTF-8-encoded surrogates fail
    except UnicodeDecodeError:
        return False, None
    n = len(s)
    i = 0
    stack = []          # 'o' / 'a'
    url = None
    top_is_obj = False
    pending_key = None  # key of the member whose value comes next (top level only)

    def ws(i):
        while i < n and s[i] in _WS:
            i += 1
        return i

    i = ws(i)
    expect = "value"    # value | key_or_end | key | colon | comma_or_end | value_or_end
    started = False
    while True:
        i = ws(i)
        if expect in ("value", "value_or_end"):
            if i >= n:
                return False, None
            c = s[i]
            if expect == "value_or_end" and c == "]":
                stack.pop(); i += 1; expect = "after"
            elif c == "{":
                if not started:
                    top_is_obj = True
                if len(stack) == 1 and stack[0] == "o" and pending_key == "url":
                    url = None
                pending_key = None
                stack.append("o"); i += 1; expect = "key_or_end"; started = True
                continue
            elif c == "[":
                if len(stack) == 1 and stack[0] == "o" and pending_key == "url":
                    url = None
                pending_key = None
                stack.append("a"); i += 1; expect = "value_or_end"; started = True
                continue
            else:
                started = True
                lit = next((x for x in _LITERALS if s.startswith(x, i)), None)
                if c == '"':
                    m = _STR.match(s, i)
                    if not m:
                        return False, None
                    val = ("str", m.group(0))
                    i = m.end()
                elif lit is not None:  # true false null NaN Infinity -Infinity
                    val = ("other", None)
                    i += len(lit)
                elif c in "-0123456789":
                    m = _NUM.match(s, i)
                    if not m:
                        return False, None
                    val = ("other", None)
                    i = m.end()
                else:
                    return False, None
                if len(stack) == 1 and stack[0] == "o" and pending_key == "url":
                    url = None
                    if val[0] == "str":
                        v = json.loads(val[1])
                        url = None if any(0xD800 <= ord(ch) <= 0xDFFF for ch in v) else v
                pending_key = None
                expect = "after"
        elif expect in ("key_or_end", "key"):
            if i >= n:
                return False, None
            if expect == "key_or_end" and s[i] == "}":
                stack.pop(); i += 1; expect = "after"
            else:
                m = _STR.match(s, i)
                if not m:
                    return False, None
                i = m.end()
                if len(stack) == 1:
                    pending_key = json.loads(m.group(0))
                i = ws(i)
                if i >= n or s[i] != ":":
                    return False, None
                i += 1
                expect = "value"
                continue
        if expect == "after":
            i = ws(i)
            if not stack:
                if i != n:
                    return False, None
                return True, (url if top_is_obj else None)
            if i >= n:
                return False, None
            c = s[i]
            if c == ",":
                i += 1
                expect = "key" if stack[-1] == "o" else "value"
            elif c == "}" and stack[-1] == "o":
                stack.pop(); i += 1
            elif c == "]" and stack[-1] == "a":
                stack.pop(); i += 1
            else:
                return False, None


# ----------------------------------------------------------------------------- tar parsing
def _is_zero(b):
    return b.count(0) == len(b)


def _parse_octal(field: bytes):
    if field and field[0] & 0x80:  # GNU base-256
        n = field[0] & 0x7F
        for c in field[1:]:
            n = (n << 8) | c
        return n
    s = field.replace(b"\0", b" ").strip(b" ")
    if not s or not re.fullmatch(rb"[0-7]+", s):
        return None
    return int(s, 8)


def _checksum_ok(h: bytes):
    stored = _parse_octal(h[148:156])
    if stored is None:
        return False
    hh = h[:148] + b" " * 8 + h[156:]
    uns = sum(hh)
    sig = sum((c - 256 if c > 127 else c) for c in hh)
    return stored in (uns, sig)


def _pax_path(data: bytes):
    # malformed pax records are ignored, as Python's tarfile does; only `path` is used
    path = None
    pos = 0
    while pos < len(data):
        m = re.match(rb"(\d+) ", data[pos:])
        if not m:
            break
        n = int(m.group(1))
        if n <= 0:
            break
        rec = data[pos:pos + n]
        body = rec[m.end():]
        if body.endswith(b"\n"):
            body = body[:-1]
        if b"=" in body:
            k, v = body.split(b"=", 1)
            if k == b"path":
                path = v
        pos += n
    return path


def parse_tar(b: bytes):
    """Yield ('member', idx, name_bytes, typ, data) and a final ('end', kind, idx, name_or_None)
    kind in: eoa | truncated | truncated_eoa | corrupt."""
    out = []
    off = 0
    idx = 0
    pend = False        # an extended header is pending
    pend_name = None    # name it gave (pax path / GNU longname)
    n = len(b)
    while True:
        rem = n - off
        if rem <= 0:
            out.append(("end", "truncated", idx, pend_name if pend else None)); return out
        if rem < BLOCK:
            out.append(("end", "truncated", idx, pend_name if pend else None)); return out
        h = b[off:off + BLOCK]
        if _is_zero(h):
            if pend:
                out.append(("end", "corrupt", idx, pend_name)); return out
            if n - off - BLOCK < BLOCK:
                out.append(("end", "truncated_eoa", idx, None)); return out
            if _is_zero(b[off + BLOCK:off + 2 * BLOCK]):
                out.append(("end", "eoa", idx, None)); return out
            # a lone zero block followed by data: corrupt_tar, the sample before it is left out
            out.append(("end", "corrupt", idx, None)); return out
        if not _checksum_ok(h):
            out.append(("end", "corrupt", idx, pend_name if pend else None)); return out
        name = h[0:100].split(b"\0", 1)[0]
        if h[257:262] == b"ustar" and h[257:265] != b"ustar  \0":
            prefix = h[345:500].split(b"\0", 1)[0]
            if prefix:
                name = prefix + b"/" + name
        if pend and pend_name is not None:
            name = pend_name
        typ = h[156:157]
        size = _parse_octal(h[124:136])
        if size is None:
            is_ext = typ in (b"x", b"X", b"L", b"K", b"g")
            out.append(("end", "corrupt", idx, None if (is_ext and not pend) else name)); return out
        ds = off + BLOCK
        if ds + size > n:
            if typ in (b"x", b"X", b"L", b"K"):
                out.append(("end", "truncated", idx, pend_name if pend else None)); return out
            out.append(("end", "truncated", idx, name)); return out
        data = b[ds:ds + size]
        nxt = ds + ((size + BLOCK - 1) // BLOCK) * BLOCK
        if typ in (b"x", b"X"):
            if pend:  # two extended headers for one member -> corrupt_tar (documented limitation)
                p = _pax_path(data)
                out.append(("end", "corrupt", idx, p if p is not None else pend_name)); return out
            pend = True
            pend_name = _pax_path(data)
            off = nxt
            continue
        if typ in (b"L",):
            pend = True
            pend_name = data.split(b"\0", 1)[0]
            off = nxt
            continue
        out.append(("member", idx, name, typ, data))
        idx += 1
        pend = False
        pend_name = None
        off = nxt


def split_name(name: bytes):
    """(key, lower-case extension) of a UTF-8 member name: the path up to the first `.` of the
    file name."""
    s = name.decode("utf-8")
    d, sep, base = s.rpartition("/")
    stem, dot, ext = base.partition(".")
    return d + sep + stem, ext.lower(), stem == ""


def key_id(key):
    """A reject's `sample_id` from its key: none for an unknown, empty or blank key."""
    return None if key is None or blank(key) else key


def utf8(b: bytes):
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return None


# ----------------------------------------------------------------------------- reference reader
class Ref:
    def __init__(self, source="img2dataset"):
        self.kept = set()
        self.data = []
        self.rejects = []
        self.source = source

    def rej(self, src, row, sid, reason, raw):
        self.rejects.append(dict(stage=STAGE, source_file=src, row=row, sample_id=sid, reason=reason, raw=raw))

    def emit(self, sid, caption, url, shard):
        self.kept.add(sid)
        # An empty or blank url is a null url (schemas/pairs.md).
        url = url if url is not None and url.strip() else None
        self.data.append(dict(sample_id=sid, source=self.source, caption=caption, url=url, path=None,
                              shard=shard, key=sid, label=None, label_text=None))

    # ---- tar
    def finish_sample(self, s, src, shard):
        ex = s["exts"]
        js, txt = ex.get("json"), ex.get("txt")
        has_img = any(e in IMAGE_EXTS for e in ex)
        reason = raw = None
        url = None
        cap = None
        if s["empty_key"] or blank(s["key"]):
            reason, raw = "missing_key", txt if txt is not None else b""
        else:
            ok = True
            if js is not None:
                ok, url = parse_json(js)
            if not ok:
                reason, raw = "bad_json", js
            elif txt is None:
                reason, raw = "missing_caption", js if js is not None else b""
            elif not has_img:
                reason, raw = "missing_image", txt
            else:
                cap = utf8(txt)
                if cap is not None and cap.startswith("\ufeff"):
                    cap = cap[1:]
                if cap is None:
                    reason, raw = "invalid_utf8", txt
                elif blank(cap):
                    reason, raw = "empty_caption", txt
                elif s["key"] in self.kept:
                    reason, raw = "duplicate_key", txt
        rej = list(s["dups"])
        if reason:
            rej.append((s["first"], s["key"], reason, raw))
        else:
            self.emit(s["key"], cap, url, shard)
        for row, sid, r, rw in sorted(rej, key=lambda t: t[0]):
            self.rej(src, row, key_id(sid), r, rw)

    def read_tar(self, path):
        src = os.path.basename(path)
        shard = os.path.splitext(src)[0]
        b = open(path, "rb").read()
        cur = None
        for ev in parse_tar(b):
            if ev[0] == "member":
                _, idx, name, typ, data = ev
                if typ not in REGULAR:  # directories, links, ...: skipped, counted in `row`
                    continue
                if utf8(name) is None:  # a sample of its own
                    if cur is not None:
                        self.finish_sample(cur, src, shard)
                        cur = None
                    self.rej(src, idx, None, "invalid_utf8", name)
                    continue
                key, ext, empty = split_name(name)
                # a sample = a run of consecutive members with one key (webdataset)
                if cur is None or cur["key"] != key:
                    if cur is not None:
                        self.finish_sample(cur, src, shard)
                    cur = dict(key=key, first=idx, exts={}, dups=[], empty_key=empty)
                if ext in cur["exts"]:
                    cur["dups"].append((idx, key, "duplicate_member", name))
                else:
                    cur["exts"][ext] = data
                continue
            _, kind, idx, dname = ev
            if kind == "eoa":
                if cur is not None:
                    self.finish_sample(cur, src, shard)
                return
            if kind == "truncated_eoa":
                if cur is not None:
                    self.finish_sample(cur, src, shard)
                self.rej(src, idx, None, "truncated_tar", src.encode())
                return
            reason = "truncated_tar" if kind == "truncated" else "corrupt_tar"
            # the damaged member's name, when it can be read, tells whether the sample before
            # it is whole (another key follows) or not
            if dname is None:
                known, dkey = False, None
            elif utf8(dname) is None:
                known, dkey = True, None   # a non-UTF-8 name is a sample of its own
            else:
                known, dkey = True, split_name(dname)[0]
            if cur is not None:
                if known and (utf8(dname) is None or dkey != cur["key"]):
                    self.finish_sample(cur, src, shard)
                    left = dkey
                else:
                    left = cur["key"]
            else:
                left = dkey
            self.rej(src, idx, key_id(left), reason, src.encode())
            return

    # ---- parquet
    def read_parquet(self, path):
        src = os.path.basename(path)
        shard = os.path.splitext(src)[0]
        t = pq.read_table(path, columns=COLS)
        # the values as stored (bytes): a string column may hold bytes that are not UTF-8
        cols = {c: t.column(c).cast(pa.binary()).to_pylist() for c in COLS}
        for i in range(t.num_rows):
            stored = [cols[c][i] for c in COLS]
            text = [None if v is None else utf8(v) for v in stored]
            if any(v is not None and d is None for v, d in zip(stored, text)):
                # raw: the four values as stored, joined by tabs (a null as nothing); the key
                # names the row when it is UTF-8 and not blank
                raw = b"\t".join(v if v is not None else b"" for v in stored)
                self.rej(src, i, key_id(text[0]), "invalid_utf8", raw)
                continue
            k, cap, url, st = text
            raw = {"key": k, "caption": cap, "url": url, "status": st}
            if k is None or blank(k):
                self.rej(src, i, None, "missing_key", raw)
            elif st != "success":
                self.rej(src, i, k, "download_failed", raw)
            elif cap is None:
                self.rej(src, i, k, "missing_caption", raw)
            elif blank(cap):
                self.rej(src, i, k, "empty_caption", raw)
            elif k in self.kept:
                self.rej(src, i, k, "duplicate_key", raw)
            else:
                self.emit(k, cap, url, shard)

    def run(self, paths):
        for p in paths:
            if p.endswith(".parquet"):
                self.read_parquet(p)
            else:
                self.read_tar(p)
        by = collections.Counter(f"{STAGE}/{r['reason']}" for r in self.rejects)
        return self.data, self.rejects, dict(by)


# ----------------------------------------------------------------------------- tar writing
def _oct(n, w):
    return ("%o" % n).encode().rjust(w - 1, b"0") + b"\0"


def header(name, size, typ=b"0", magic=b"ustar\x0000", prefix=b""):
    h = bytearray(512)
    h[0:100] = name[:100].ljust(100, b"\0")
    h[100:108] = _oct(0o444, 8); h[108:116] = _oct(0, 8); h[116:124] = _oct(0, 8)
    h[124:136] = _oct(size, 12); h[136:148] = _oct(1600000000, 12)
    h[148:156] = b" " * 8
    h[156:157] = typ
    h[257:265] = magic
    h[265:297] = b"bigdata".ljust(32, b"\0"); h[297:329] = b"bigdata".ljust(32, b"\0")
    h[345:500] = prefix[:155].ljust(155, b"\0")
    h[148:156] = ("%06o" % sum(h)).encode() + b"\0 "
    return bytes(h)


def fix_checksum(h):
    h = bytearray(h)
    h[148:156] = b" " * 8
    h[148:156] = ("%06o" % sum(h)).encode() + b"\0 "
    return bytes(h)


def pad(d):
    return d + b"\0" * ((-len(d)) % 512)


def paxrec(k, v):
    body = b" " + k + b"=" + v + b"\n"
    n = len(body) + 1
    while len(str(n).encode()) + len(body) != n:
        n = len(str(n).encode()) + len(body)
    return str(n).encode() + body


class TarBuilder:
    def __init__(self):
        self.buf = bytearray()
        self.members = []  # dict(start, hdr, data_off, end, name)

    def add(self, name: bytes, data: bytes, kind="plain", typ=b"0"):
        start = len(self.buf)
        if kind == "pax":
            rec = paxrec(b"path", name)
            self.buf += header(b"PaxHeaders.0/" + name[-60:], len(rec), typ=b"x") + pad(rec)
            hname = name[-100:]
        elif kind == "gnu":
            ln = name + b"\0"
            self.buf += header(b"././@LongLink", len(ln), typ=b"L", magic=b"ustar  \0") + pad(ln)
            hname = name[:100]
        else:
            hname = name
        hdr = len(self.buf)
        self.buf += header(hname, len(data), typ=typ)
        self.buf += pad(data)
        self.members.append(dict(start=start, hdr=hdr, data_off=hdr + 512, end=len(self.buf), name=name, size=len(data)))

    def bytes(self, eoa=True, record_pad=False):
        b = bytes(self.buf)
        if eoa:
            b += b"\0" * 1024
            if record_pad:
                b += b"\0" * ((-len(b)) % 10240)
        return b


# ----------------------------------------------------------------------------- random generation
CAPTIONS = ["a dog on grass", "crème brûlée", "  padded  ", "", "   ", "\t\n", "\x1c", "\u3000", "\u00a0",
            "\u200b", "line\nbreak", "\ufeffbom caption", "\ufeff", "\ufeff \n", "\ufeff\ufeffx", "x\ufeff",
            "emoji 😀", "a\x00b", "x", "\x1f\x85\u2028"]
BAD_CAPS = [b"caf\xe9", b"\xff", b"\xc3", b"ok \xed\xa0\x80", b"\xef\xbb\xbf\xff", b"\xef\xbb"]
BAD_NAME_PARTS = [b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xe9t\xe9", b"\xc0\xaf"]


def rand_key(rng, pool):
    r = rng.random()
    if r < 0.55:
        return rng.choice(pool)
    if r < 0.65:
        return rng.choice(["sub/", "a.d/", "./", "x/y/"]) + rng.choice(pool)
    if r < 0.72:
        return "%09d" % rng.randrange(10 ** 9)
    if r < 0.76:
        return "L" * rng.randrange(90, 180) + rng.choice(pool)  # long names (pax / gnu)
    if r < 0.78:
        return "ké\u00e9y" + rng.choice(pool)
    if r < 0.81:
        return rng.choice(["", "", "dir/", "a.d/", "./"])  # empty key
    if r < 0.83:
        return rng.choice([" ", "\x1c", "\u3000", "dir/ "])  # blank key (kept; its rejects name no id)
    return rng.choice(pool)


def _rand_value(rng, d):
    r = rng.random()
    if d > 3 or r < 0.35:
        return rng.choice([1, -0.5, 1e300, 12345678901234567890123, "x", "u\u00e9\n", None, True, False,
                           "\ud800", "\udfff", 0, "https://q/\u00e9", "", float("nan"), float("inf"),
                           float("-inf")])
    if r < 0.7:
        return {rng.choice(["url", "a", "caption", "url"]): _rand_value(rng, d + 1) for _ in range(rng.randrange(4))}
    return [_rand_value(rng, d + 1) for _ in range(rng.randrange(4))]


def _mutate(rng, b):
    alpha = list(b'{}[],:"\\ \t\n\r0123456789-+.eEtrufalsnuNaIiy') + [0xff, 0xc3, 0x01, 0x80, 0xef]
    for _ in range(rng.randrange(1, 3)):
        op, pos = rng.randrange(3), rng.randrange(len(b) + 1)
        if op == 0:
            b = b[:pos] + bytes([rng.choice(alpha)]) + b[pos:]
        elif op == 1:
            b = b[:pos] + b[pos + 1:]
        else:
            b = b[:pos] + bytes([rng.choice(alpha)]) + b[pos + 1:]
    return b


def rand_json(rng, key, tags):
    r = rng.random()
    if r < 0.62:
        return json.dumps({"caption": "c", "url": f"https://u/{key}/{rng.randrange(99)}", "key": key,
                           "status": "success", "width": 8}, indent=4).encode()
    if r < 0.70:
        tags.add("bad_json")
        return rng.choice([b"{bad", b"", b"  \n", b'{"url": " \\t"}', b'{"url": ""}', b'{"url": "a"} x', b'{"url": nan}', b'{"url": -NaN}',
                           b'{"url": "\xff"}', b'\xef\xbb\xbf\xef\xbb\xbf{"url": "a"}', b'{"url": "a\tb"}', b'{"url": 01}',
                           b'{"url": "a",}', b'{"url": "a"}\x00', b'{"url": "\\x41"}', b'{"url": "\xed\xa0\x80"}',
                           b'{"url": "a", "k": [1, 2,]}', b'{"url": 1.}', b"{'url': 'a'}", b'{"url": +Infinity}',
                           b'{"url": "ok", "n": -}', b'{"url": "a"}}', b'[' * 300 + b']' * 299, b'{"url": infinity}',
                           b' \xef\xbb\xbf{"url": "a"}', b'{"url": "a", "n": NaNa}', b'{"url": "a", "n": -Inf}',
                           b'\xef\xbb\xbf', b'{"url": "a"}\xef\xbb\xbf'])
    if r < 0.80:
        tags.add("odd_json")
        return rng.choice([b"[1,2]", b'"s"', b"null", b"1e400", b'{"url": 5}', b'{"url": null}', b'{}',
                           b'{"url": "a", "url": "b"}', b'{"url": "a", "url": 7}', b'{"url": 7, "url": "b"}',
                           b'  {"url": "\\u00e9x"}  \n', b'{"url": "x\\ud800y"}', b'{"url": "\\ud83d\\ude00"}',
                           b'{"k": "\\udc00", "url": "s"}', b'{"x": {"url": "nested"}}', b'[{"url": "arr"}]',
                           b'{"url": ["a"]}', b'{"url": {"a": "b"}}', b'{"url": "a", "url": {"x": "y"}}',
                           b'{"u\\u0072l": "escaped-key"}', b'{"url": "\\/\\b\\f\\n\\r\\t\\"\\\\"}',
                           b'{"url": "big", "n": 1e400, "m": -1E-400, "i": 123456789012345678901234567890}',
                           b'\t{"url"\n:\r"ws"}\r\n',
                           # what Python's json.dumps writes and json.loads reads (README)
                           b'{"url": NaN}', b'{"url": Infinity}', b'{"url": -Infinity}', b'NaN', b'-Infinity',
                           b'{"url": "a", "w": NaN, "h": [Infinity, -Infinity]}', b'[NaN]',
                           b'{"url":"nan","x":-Infinity}', b'\xef\xbb\xbf{"url": "a"}', b'\xef\xbb\xbf\n {"url": "b"}',
                           b'\xef\xbb\xbf{"url": NaN}', b'\xef\xbb\xbf"s"', b'\xef\xbb\xbf[1]'])
    if r < 0.86:
        tags.add("deep_json")
        depth = rng.choice([129, 200, 1000, 5000, 100000])
        inner = rng.choice([b"[" * depth + b"]" * depth, b'{"a":' * depth + b"1" + b"}" * depth])
        return b'{"url": "deep", "x": ' + inner + b"}"
    if r < 0.94:
        tags.add("random_json")
        b = json.dumps(_rand_value(rng, 0), ensure_ascii=rng.random() < 0.5,
                       indent=rng.choice([None, 1])).encode("utf-8", "surrogatepass")
        if rng.random() < 0.1:
            b = BOM + b
        return _mutate(rng, b) if rng.random() < 0.5 else b
    return json.dumps({"url": f"https://u/{key}", "extra": list(range(rng.randrange(5)))}).encode()


def rand_caption(rng):
    r = rng.random()
    if r < 0.72:
        return rng.choice(["a dog on grass", "x", "emoji 😀", "two words", "un café s'il vous plaît"]).encode()
    if r < 0.92:
        return rng.choice(CAPTIONS).encode()
    return rng.choice(BAD_CAPS)


def gen_tar(rng, pool, tags):
    tb = TarBuilder()
    order = []
    for _ in range(rng.randrange(0, 7)):
        key = rand_key(rng, pool)
        exts = []
        if rng.random() < 0.9:
            exts.append(rng.choice(["jpg"] * 6 + ["png", "webp", "jpeg", "JPG", "bmp", "gif", "tiff"]))
        if rng.random() < 0.88:
            exts.append("txt")
        if rng.random() < 0.85:
            exts.append("json")
        if rng.random() < 0.1:
            exts.append(rng.choice(["cls", "npy", "mp4", "jpg.bak", "TXT"]))
        exts.sort()
        if rng.random() < 0.15:
            rng.shuffle(exts)
        mems = []
        for e in exts:
            if e in ("txt", "TXT"):
                d = rand_caption(rng)
            elif e == "json":
                d = rand_json(rng, key, tags)
            else:
                d = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 700)))
            mems.append((f"{key}.{e}".encode(), d))
        if key in ("", "dir/", "a.d/", "./"):
            tags.add("empty_key")
        elif blank(key.rpartition("/")[2]):
            tags.add("blank_key")
        if mems and rng.random() < 0.08:  # duplicate member
            mems.insert(rng.randrange(1, len(mems) + 1), rng.choice(mems)); tags.add("dup_member")
        order.append(mems)
    flat = [m for ms in order for m in ms]
    if len(flat) > 2 and rng.random() < 0.06:  # interleave two samples
        i = rng.randrange(len(flat) - 1); flat[i], flat[i + 1] = flat[i + 1], flat[i]; tags.add("interleave")
    if rng.random() < 0.1:
        flat.insert(rng.randrange(len(flat) + 1), (rng.choice([b"README", b"__meta__.json", b"notes.txt"]), b"{}"))
        tags.add("extra_file")
    if flat and rng.random() < 0.12:  # a member name that is not UTF-8
        i = rng.randrange(len(flat))
        nm, d = flat[i]
        bad = rng.choice(BAD_NAME_PARTS)
        pos = rng.randrange(len(nm) + 1)
        new = (nm[:pos] + bad + nm[pos:], d)
        if rng.random() < 0.5:
            flat[i] = new
        else:
            flat.insert(rng.randrange(len(flat) + 1), new)
        tags.add("bad_name")
    members = []
    for name, data in flat:
        typ = b"0"
        if rng.random() < 0.05:
            typ = rng.choice([b"7", b"\0"]); tags.add("type7_or_nul")
        members.append((name, data, typ))
    if rng.random() < 0.06:
        members.insert(rng.randrange(len(members) + 1), (rng.choice([b"somedir/", b"d\xff/"]), b"", b"5"))
        tags.add("dir")
    if rng.random() < 0.04:
        members.insert(rng.randrange(len(members) + 1), (b"link.jpg", b"", b"2")); tags.add("symlink")
    for name, data, typ in members:
        if len(name) > 100:
            kind = rng.choice(["pax", "gnu"]) if utf8(name) is not None else "gnu"
        else:
            kind = "pax" if rng.random() < 0.05 and utf8(name) is not None else "plain"
        tb.add(name, data, kind=kind, typ=typ)
    b = tb.bytes(record_pad=rng.random() < 0.3)
    # damage
    M = tb.members
    if rng.random() < 0.45 or not M:
        return b
    dmg = rng.choice(["cut_random", "cut_header", "cut_boundary", "cut_before_eoa", "cut_in_eoa",
                      "checksum", "size", "lone_zero", "cut_data", "ext_then_eoa", "trailing", "two_pax"])
    tags.add(dmg)
    body = bytes(tb.buf)
    if dmg == "cut_random":
        return b[:rng.randrange(0, len(b))]
    if dmg == "cut_header":
        m = rng.choice(M); return b[:m["hdr"] + rng.randrange(1, 512)] if rng.random() < .7 else b[:m["start"] + rng.randrange(1, 512)]
    if dmg == "cut_boundary":
        m = rng.choice(M); return b[:m["start"]] if rng.random() < 0.5 else b[:m["end"]]
    if dmg == "cut_before_eoa":
        return body
    if dmg == "cut_in_eoa":
        return body + b"\0" * rng.choice([0, 1, 511, 512, 513, 1023])
    if dmg == "cut_data":
        m = rng.choice(M); return b[:m["data_off"] + rng.randrange(0, max(1, m["size"] + 511))]
    if dmg == "checksum":
        m = rng.choice(M); pos = rng.choice([m["start"], m["hdr"]])
        bb = bytearray(b); bb[pos + rng.choice([0, 5, 130, 300])] ^= 0x41; return bytes(bb)
    if dmg == "size":
        m = rng.choice(M); pos = rng.choice([m["start"], m["hdr"]])
        h = bytearray(b[pos:pos + 512]); h[124:136] = rng.choice([b"0000000001x\0", b"\0" * 12, b"zzzzzzzzzzz\0", b"-0000000001\0"])
        return b[:pos] + fix_checksum(bytes(h)) + b[pos + 512:]
    if dmg == "lone_zero":
        m = rng.choice(M); return b[:m["start"]] + b"\0" * 512 + b[m["start"]:]
    if dmg == "ext_then_eoa":
        m = rng.choice(M)
        rec = paxrec(b"path", rng.choice([b"zz.jpg", m["name"]])) if rng.random() < 0.8 else paxrec(b"mtime", b"1")
        return b[:m["end"]] + header(b"PaxHeaders/x", len(rec), typ=b"x") + pad(rec) + rng.choice([b"\0" * 1024, b"", b"\0" * 100])
    if dmg == "two_pax":  # two local pax headers in a row: corrupt_tar (documented limitation)
        m = rng.choice(M)
        rec = paxrec(b"mtime", b"1")
        return b[:m["start"]] + header(b"PaxHeaders/m", len(rec), typ=b"x") + pad(rec) + b[m["start"]:]
    if dmg == "trailing":
        return b + rng.choice([b"garbage", b"\0" * 700, header(b"after.jpg", 1) + pad(b"I")])
    return b


def gen_parquet(rng, pool, path, tags):
    rows = []
    for _ in range(rng.randrange(0, 9)):
        k = rng.choice([rng.choice(pool)] * 8 + [None, "", "  ", "\x1c", "\x1f\u3000", "\u200b", "\ufeff", " k "])
        cap = rng.choice(["ok caption", "x", "", " ", "\x1c", "\u3000", None, "é \"q\" \\ \n \x01 \u2028", "😀",
                          "\ufeff", "\u200b"])
        st = rng.choice(["success"] * 6 + ["failed_to_download", "failed_to_resize", None, "Success", ""])
        url = rng.choice([None, "https://x/" + str(rng.randrange(99)), "ü"])
        err = rng.choice([None, None, "", "HTTP 404"]) if st != "success" else None
        rows.append(dict(caption=cap, url=url, key=k, status=st, error_message=err, width=8))
    bad = rng.random() < 0.25  # some values that are not UTF-8 (stored in a string column)
    if bad:
        tags.add("parquet_bad_utf8")
    cols = {}
    for c in ["caption", "url", "key", "status", "error_message"]:
        vals = [None if r[c] is None else r[c].encode() for r in rows]
        if bad and c != "error_message":
            vals = [rng.choice([b"caf\xe9", b"\xff", v + b"\xc3" if v else b"\xed\xa0\x80"])
                    if rng.random() < 0.15 else v for v in vals]
        typ = pa.binary() if rng.random() < 0.1 else pa.string()
        if typ == pa.binary():
            tags.add("parquet_binary_col")
        cols[c] = pa.array(vals, pa.binary()).view(typ)
    cols["width"] = pa.array([r["width"] for r in rows], pa.int64())
    t = pa.table(cols)
    if rng.random() < 0.3:
        t = t.select(["status", "width", "key", "url", "caption", "error_message"])
    codec = rng.choice(["snappy", "zstd", "gzip", "brotli", "lz4", "none"])
    pq.write_table(t, path, compression=codec, row_group_size=rng.choice([1, 3, 1000]))


# ----------------------------------------------------------------------------- run + compare
def run_curate(curate, paths, outdir):
    os.makedirs(outdir)
    toml = outdir + ".toml"
    with open(toml, "w") as f:
        f.write(f'output_dir = {json.dumps(outdir)}\nseed = 0\n[[stage]]\ntype = "{STAGE}"\n'
                f'path = {json.dumps(paths)}\n[[stage]]\ntype = "write_parquet"\n')
    p = subprocess.run([curate, "run", toml], capture_output=True, timeout=300)
    if p.returncode != 0:
        return None, p.stderr.decode(errors="replace")
    man = json.load(open(os.path.join(outdir, "manifest.json")))

    def rows(sub, shards):
        out = []
        for s in shards:
            out += pq.read_table(os.path.join(outdir, sub, s["file"])).to_pylist()
        return out
    return (rows(man.get("data_dir", "data"), man["data_shards"]), rows("rejects", man["reject_shards"]), man), None


def norm_raw(raw):
    if isinstance(raw, dict):
        return ("json", raw)
    return ("bytes", raw)


def norm_got_raw(r):
    if r["source_file"].endswith(".parquet") and r["reason"] != "invalid_utf8":
        try:
            return ("json", json.loads(r["raw"]))
        except ValueError:
            pass
    return ("bytes", r["raw"])


def compare(ref, got):
    rdata, rrej, rby = ref
    gdata, grej, man = got
    diffs = []
    if len(rdata) != len(gdata):
        diffs.append(f"data rows: ref {len(rdata)} curate {len(gdata)}")
    for i, (a, b) in enumerate(zip(rdata, gdata)):
        if a != b:
            diffs.append(f"data[{i}]: ref {a} | curate {b}")
    if len(rrej) != len(grej):
        diffs.append(f"reject rows: ref {len(rrej)} curate {len(grej)}")
    for i, (a, b) in enumerate(zip(rrej, grej)):
        ka = (a["stage"], a["source_file"], a["row"], a["sample_id"], a["reason"], norm_raw(a["raw"]))
        kb = (b["stage"], b["source_file"], b["row"], b["sample_id"], b["reason"], norm_got_raw(b))
        if ka != kb:
            diffs.append(f"rejects[{i}]: ref {ka} | curate {kb} ({b['detail']})")
    if len(rrej) != len(grej):
        for a in rrej[len(grej):]:
            diffs.append(f"  extra ref reject {a['source_file']} {a['row']} {a['sample_id']} {a['reason']}")
        for b in grej[len(rrej):]:
            diffs.append(f"  extra curate reject {b['source_file']} {b['row']} {b['sample_id']} {b['reason']} ({b['detail']})")
    exp_rows = {"read": len(rdata) + len(rrej), "rejected": len(rrej), "skipped": 0, "written": len(rdata)}
    if man["rows"] != exp_rows:
        diffs.append(f"manifest rows: ref {exp_rows} curate {man['rows']}")
    if man["rejects_by_reason"] != rby:
        diffs.append(f"manifest rejects_by_reason: ref {rby} curate {man['rejects_by_reason']}")
    if man.get("skipped_by_reason"):
        diffs.append(f"manifest skipped: {man['skipped_by_reason']}")
    return diffs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--curate", default="target/release/curate")
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", metavar="DIR", help="copy the inputs of differing cases into DIR")
    a = ap.parse_args()
    curate = os.path.abspath(a.curate)
    if not os.path.exists(curate):
        sys.exit(f"no curate binary at {curate} (build it with cargo build --release, or pass --curate)")
    rng = random.Random(a.seed)
    t0 = time.time()
    ndiff = 0
    tagcount = collections.Counter()
    difftags = collections.Counter()
    differing = []
    with tempfile.TemporaryDirectory(prefix="curate-i2d-check-") as work:
        for c in range(a.cases):
            d = os.path.join(work, f"case{c}")
            os.makedirs(d)
            pool = ["%09d" % i for i in range(rng.randrange(2, 12))]
            tags = set()
            paths = []
            for j in range(rng.randrange(1, 5)):
                if rng.random() < 0.2:
                    p = os.path.join(d, f"{j:05d}.parquet"); gen_parquet(rng, pool, p, tags); tags.add("parquet")
                else:
                    p = os.path.join(d, f"{j:05d}.tar")
                    open(p, "wb").write(gen_tar(rng, pool, tags))
                paths.append(p)
            tagcount.update(tags)
            ref = Ref().run(paths)
            got, err = run_curate(curate, paths, os.path.join(d, "out"))
            diffs = [f"curate failed: {err.strip()[:300]}"] if got is None else compare(ref, got)
            if diffs:
                ndiff += 1
                differing.append(c)
                difftags.update(tags)
                print(f"--- case {c} differs (tags {sorted(tags)})")
                for x in diffs[:12]:
                    print("   ", x[:600])
                if a.keep:
                    dst = os.path.join(a.keep, f"case{c}")
                    shutil.rmtree(dst, ignore_errors=True)
                    shutil.copytree(d, dst)
            shutil.rmtree(d, ignore_errors=True)
    print(f"\nread_img2dataset reference check: {a.cases} cases (seed {a.seed}), "
          f"{a.cases - ndiff} agree, {ndiff} differ {differing[:30]}; {time.time() - t0:.1f} s")
    print("feature coverage (cases):", dict(sorted(tagcount.items())))
    if ndiff:
        print("tags of differing cases:", dict(sorted(difftags.items())))
    sys.exit(1 if ndiff else 0)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Differential check of `read_yfcc`'s `strip_html` against Python's `html.parser`.

Writes a 25-field YFCC100M file whose titles are random mixes of words, tags (with quoted
attributes holding `>` and `&`), comments, declarations, stray `<` / `>` / `&` and character
references, runs curate on it (caption = title), and compares every caption with Python's
`html.parser` (`convert_charrefs=True`) with each tag, comment or declaration read as a space
(curate's documented choice: `a<br>b` is two words) and whitespace collapsed. The references
generated are the ones curate decodes (`&amp; &lt; &gt; &quot; &apos; &nbsp;`, numeric; with and without `;`);
Python also knows every HTML5 name (`&eacute;`), which curate leaves as text.

    python3 benches/yfcc_html_check.py [--curate target/release/curate] [--seed 1] [--rows 4000] [--pieces 12]

Needs pyarrow. Prints the first differences and exits 1 if any. The reference is the Python
that runs it: CPython 3.11.7 here; 2025 patch releases (gh-135462) read unclosed markup
differently, and the cases with `</` left open would then differ.
"""
import argparse
import glob
import os
import random
import subprocess
import sys
import tempfile
import urllib.parse
from html.parser import HTMLParser

import pyarrow.parquet as pq

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Text(HTMLParser):
    """The text of a document, a space for each tag, comment or declaration."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.out = []

    def handle_data(self, d):
        self.out.append(d)

    def space(self, *_):
        self.out.append(" ")

    handle_starttag = handle_endtag = handle_startendtag = space
    handle_comment = handle_decl = handle_pi = unknown_decl = space


def py_clean(t):
    p = Text()
    p.feed(t)
    p.close()
    return " ".join("".join(p.out).split())


WORDS = ["dog", "cat", "Rock", "roll", "5", "x", "-", "café", "ééé"]
REFS = ["&amp;", "&lt;", "&gt;", "&quot;", "&apos;", "&nbsp;", "&#39;", "&#x41;", "&#65;", "&#233;", "&#+5;",
        # without `;`, legacy-name prefixes, and the numbers html.unescape maps or drops
        "&amp", "&lt", "&gtx", "&quotx;", "&nbspx", "&apos", "&#65", "&#x4a", "&#0;", "&#1;", "&#13;", "&#127;",
        "&#128;", "&#x9d;", "&#xD800;", "&#xFFFE;", "&#x10FFFF;", "&#1114112;", "&#99999999999999;", "&#x;"]
ATTRS = [' href="http://x/?a=1&amp;b=2"', " alt='1 > 0'", " title=x", ' class="c"', ' data-x="a>b"']


def title(r, pieces):
    def piece():
        k = r.random()
        if k < 0.35:
            return r.choice(WORDS)
        if k < 0.45:
            return r.choice(REFS)
        if k < 0.6:
            tag = r.choice(["a", "b", "br", "img", "i"])
            attrs = "".join(r.choice(ATTRS) for _ in range(r.randint(0, 2)))
            return r.choice([f"<{tag}{attrs}>", f"</{tag}>", f"<{tag}{attrs}/>"])
        if k < 0.65:
            return r.choice(["<!-- note -->", "<!-- a > b -->", "<!DOCTYPE html>"])
        if k < 0.68:
            return r.choice(["<", ">", "< 5", "<3", "&", "AT&T"])
        if k < 0.72:
            # End tags Python reads loosely (`</ b>`, bogus comments `</1>`, the empty `</>`,
            # quotes that do not protect a `>`), and a NUL that ends a tag name.
            return r.choice(["</ b>", "</1>", "</$>", "</>", "</ b x>", '</a title="1 > 0">', "</é>",
                             "<b\x00>", "<b \x00>", "<b/\x00>", "</", "</ b",
                             # tags left open, with references in them
                             "<b title='&amp;", '<a href="x&#65;', "<b&amp;\x00", "<!-- &lt;", "<?x &amp;",
                             # start tags only Python's regular expressions read so, and `-- >`
                             '<b="x>y">', "<b c=\xa0'>'>", '<b c= "x>y', "<b c= 'x' = 'y>z'>", "<x'\x00B>",
                             "<!-- x -- >", "<!-- y --\n>", "<b\tc='>'>", '<b c=="x>y">'])
        return " "

    return "".join(piece() for _ in range(r.randint(1, pieces)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--curate", default=os.path.join(REPO, "target", "release", "curate"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rows", type=int, default=4000)
    ap.add_argument("--pieces", type=int, default=12,
                    help="at most this many pieces a title (more: long runs of markup left open, which the reader"
                         " reads with its scans remembered)")
    a = ap.parse_args()
    r = random.Random(a.seed)
    titles = [title(r, a.pieces) for _ in range(a.rows)]
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "yfcc100m_dataset.tsv")
        with open(data, "w", encoding="utf-8") as f:
            for i, t in enumerate(titles):
                fields = [""] * 25
                fields[0], fields[1], fields[2], fields[3] = str(i), str(1000 + i), "h", "u"
                fields[8] = urllib.parse.quote_plus(t)  # the title, URL-encoded as in the release
                fields[16], fields[24] = f"http://x/{i}.jpg", "0"
                f.write("\t".join(fields) + "\n")
        pipeline = os.path.join(tmp, "p.toml")
        with open(pipeline, "w") as f:
            f.write(f'output_dir = "{tmp}/out"\n[[stage]]\ntype = "read_yfcc"\npath = "{data}"\n'
                    'caption = "title"\n[[stage]]\ntype = "write_parquet"\n')
        subprocess.run([a.curate, "run", pipeline, "--progress", "never"], check=True, capture_output=True)
        got = {}
        for f in sorted(glob.glob(os.path.join(tmp, "out", "data", "*.parquet"))):
            t = pq.read_table(f).to_pydict()
            got.update(zip(t["sample_id"], t["caption"]))
    diff = 0
    for i, t in enumerate(titles):
        want, have = py_clean(t), got.get(str(1000 + i))
        if (have or "") != want:
            diff += 1
            if diff <= 10:
                print(f"{t!r}\n  python: {want!r}\n  curate: {have!r}")
    print(f"{diff} of {len(titles)} titles differ")
    sys.exit(1 if diff else 0)


if __name__ == "__main__":
    main()

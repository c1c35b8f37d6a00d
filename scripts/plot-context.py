#!/usr/bin/env python3
"""Draws decode speed against context depth and prefill time against prompt length as
one SVG, from `kvm bench --output json` lines and llama-bench's output (`-o json`,
`-o jsonl` or its markdown table). Standard library only.

    scripts/plot-context.py --kvm 'kvm, fixed state=/tmp/ctx/kvm.jsonl' \\
        --llama 'llama.cpp=/tmp/ctx/llama.jsonl' -o docs/long-context.svg

Every file may hold several rounds: each point is the median of the rates measured at
that depth or prompt length. Depth 0 has no place on a log axis and is left out.
"""

import argparse
import json
import math
import re
import statistics
import sys
from collections import defaultdict

COLOURS = ["#1b6ac9", "#d1495b", "#2e933c", "#7b4fa3", "#e08e0b"]
W, H = 1000, 420
PANEL_W, TOP, BOTTOM, LEFT = 400, 66, 340, 70


def read_kvm(path):
    """(decode tok/s by depth, prefill seconds by prompt length) from kvm bench JSON lines."""
    decode, prefill = defaultdict(list), defaultdict(list)
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            if "decode_tok_s" not in r:
                continue
            decode[r["context"]].append(r["decode_tok_s"])
            # A one-token prompt is how a decode from an empty context is asked for.
            if r["prompt_len"] > 1:
                prefill[r["prompt_len"]].append(r["prompt_len"] / r["prefill_tok_s"])
    return decode, prefill


def llama_rows(path):
    """llama-bench's results as (n_prompt, n_gen, n_depth, tok/s) rows."""
    text = open(path).read()
    objects = []
    try:
        parsed = json.loads(text)
        objects = parsed if isinstance(parsed, list) else [parsed]
    except json.JSONDecodeError:
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("{"):
                objects.append(json.loads(line))
    if objects:
        return [(o["n_prompt"], o["n_gen"], o.get("n_depth", 0), o["avg_ts"]) for o in objects]
    rows = []
    head = None
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if "test" in cells and "t/s" in cells:
            head = cells
            continue
        if head is None or len(cells) != len(head) or set(line) <= set("|-: "):
            continue
        test = re.fullmatch(r"(pp|tg)(\d+)(?: @ d(\d+))?", cells[head.index("test")])
        if not test:
            continue
        n = int(test.group(2))
        depth = int(test.group(3) or 0)
        rate = float(cells[head.index("t/s")].split("±")[0])
        rows.append((n, 0, depth, rate) if test.group(1) == "pp" else (0, n, depth, rate))
    return rows


def read_llama(path):
    decode, prefill = defaultdict(list), defaultdict(list)
    for n_prompt, n_gen, depth, rate in llama_rows(path):
        if n_gen > 0 and n_prompt == 0:
            decode[depth].append(rate)
        elif n_prompt > 0 and n_gen == 0:
            prefill[n_prompt].append(n_prompt / rate)
    return decode, prefill


def medians(d):
    return sorted((x, statistics.median(v)) for x, v in d.items() if x > 0 and v)


def nice_ticks(lo, hi, log):
    if log:
        ticks, t = [], 10 ** math.floor(math.log10(lo))
        while t <= hi * 1.0001:
            for m in (1, 2, 5):
                if lo / 1.0001 <= t * m <= hi * 1.0001:
                    ticks.append(t * m)
            t *= 10
        return ticks
    step = 10 ** math.floor(math.log10(hi / 5))
    step *= next(m for m in (1, 2, 5, 10) if hi / (step * m) <= 6)
    return [i * step for i in range(int(hi / step) + 1)]


def label(v):
    if v >= 1024 and v % 1024 == 0:
        return f"{v // 1024}k"
    if v >= 1:
        return f"{v:g}"
    return f"{v:.2g}"


def panel(out, x0, title, xlabel, ylabel, series, ylog):
    """One chart at x offset x0: series is [(name, colour, [(x, y)])], x on a log2 axis."""
    xs = [x for _, _, pts in series for x, _ in pts]
    ys = [y for _, _, pts in series for _, y in pts]
    if not xs:
        return
    xlo, xhi = min(xs), max(xs)
    if xlo == xhi:
        xlo, xhi = xlo / 2, xhi * 2
    ylo, yhi = (min(ys) / 1.5, max(ys) * 1.5) if ylog else (0.0, max(ys) * 1.1)

    def px(x):
        return x0 + PANEL_W * (math.log2(x) - math.log2(xlo)) / (math.log2(xhi) - math.log2(xlo))

    def py(y):
        if ylog:
            f = (math.log10(y) - math.log10(ylo)) / (math.log10(yhi) - math.log10(ylo))
        else:
            f = (y - ylo) / (yhi - ylo)
        return BOTTOM - (BOTTOM - TOP) * f

    out.append(f'<text x="{x0 + PANEL_W / 2}" y="{TOP - 12}" class="title">{title}</text>')
    out.append(f'<rect x="{x0}" y="{TOP}" width="{PANEL_W}" height="{BOTTOM - TOP}" class="frame"/>')
    for x in sorted(set(xs)):
        out.append(f'<line x1="{px(x):.1f}" y1="{TOP}" x2="{px(x):.1f}" y2="{BOTTOM}" class="grid"/>')
        out.append(f'<text x="{px(x):.1f}" y="{BOTTOM + 16}" class="tick">{label(x)}</text>')
    for y in nice_ticks(max(ylo, 1e-9), yhi, ylog):
        if not ylo <= y <= yhi:
            continue
        out.append(f'<line x1="{x0}" y1="{py(y):.1f}" x2="{x0 + PANEL_W}" y2="{py(y):.1f}" class="grid"/>')
        out.append(f'<text x="{x0 - 6}" y="{py(y) + 4:.1f}" class="ytick">{label(y)}</text>')
    out.append(f'<text x="{x0 + PANEL_W / 2}" y="{BOTTOM + 38}" class="axis">{xlabel}</text>')
    yl = (TOP + BOTTOM) / 2
    out.append(f'<text x="{x0 - 52}" y="{yl}" class="axis" transform="rotate(-90 {x0 - 52} {yl})">{ylabel}</text>')
    for name, colour, pts in series:
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2.2"/>')
        for x, y in pts:
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3.5" fill="{colour}"/>')


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kvm", action="append", default=[], metavar="NAME=FILE", help="kvm bench JSON lines")
    ap.add_argument("--llama", action="append", default=[], metavar="NAME=FILE", help="llama-bench output")
    ap.add_argument("--title", default="")
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args()
    sources = [(spec, read_kvm) for spec in a.kvm] + [(spec, read_llama) for spec in a.llama]
    if not sources:
        sys.exit("give at least one --kvm or --llama file")
    decode, prefill = [], []
    for i, (spec, read) in enumerate(sources):
        name, sep, path = spec.partition("=")
        if not sep:
            sys.exit(f"{spec}: expected NAME=FILE")
        d, p = read(path)
        colour = COLOURS[i % len(COLOURS)]
        if medians(d):
            decode.append((name, colour, medians(d)))
        if medians(p):
            prefill.append((name, colour, medians(p)))

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
        'font-family="sans-serif">',
        "<style>.title{font-size:15px;font-weight:bold;text-anchor:middle}"
        ".axis{font-size:13px;text-anchor:middle}.tick{font-size:11px;text-anchor:middle}"
        ".ytick{font-size:11px;text-anchor:end}.legend{font-size:12px}"
        ".frame{fill:none;stroke:#444}.grid{stroke:#ddd;stroke-width:1}</style>",
        f'<rect width="{W}" height="{H}" fill="white"/>',
    ]
    if a.title:
        out.append(f'<text x="{W / 2}" y="18" class="title">{a.title}</text>')
    panel(out, LEFT, "Decode after a context", "context depth, tokens (log)", "decode, tokens/s", decode, False)
    panel(out, LEFT + PANEL_W + 90, "Prefill", "prompt length, tokens (log)", "prefill time, s (log)", prefill,
          True)
    names = []
    for name, colour, _ in decode + prefill:
        if (name, colour) not in names:
            names.append((name, colour))
    x = LEFT
    for name, colour in names:
        out.append(f'<rect x="{x}" y="{H - 24}" width="14" height="4" fill="{colour}"/>')
        out.append(f'<text x="{x + 20}" y="{H - 18}" class="legend">{name}</text>')
        x += 30 + 7 * len(name)
    out.append("</svg>")
    with open(a.out, "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()

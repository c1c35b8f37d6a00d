#!/usr/bin/env python3
"""Runs `kvm bench` and llama.cpp's `llama-bench` side by side in interleaved rounds and
prints markdown tables of the medians of per-round ratios. Standard library only.

    scripts/side-by-side.py --kvm '/tmp/m/350m-{dtype}.kvm' --llama '/tmp/m/llama350-{dtype}.gguf' \\
        --dtypes f32,f16,q8_0,q4_0 --threads 1,2 --decode 128 --prefill 512 --rounds 3 -o /tmp/sbs

A round runs every test of the matrix (each dtype, thread count, decode depth and prompt
length) once on each side, one program right after the other (kvm first in odd rounds,
llama.cpp first in even ones), so both see the machine in the same minutes; each
kvm / llama.cpp ratio is taken within its round. `{dtype}` in a model path is replaced by
each of --dtypes. `--kvm NAME=PATH` may be given more than once (e.g. a fixed and a
growable state), each measured against the same llama.cpp runs.

`--kernels avx2` runs kvm with `KVM_KERNELS=avx2`: with `--llama-bench` pointing at a
llama.cpp built for AVX2 only, both sides measure the AVX2 tier on an AVX-512 CPU. Prefill
cells give kvm's `fma_fraction` too (its matrix products' FLOPs over its FMA probe's peak).

Decode `tgN @ dD` is N tokens after D tokens of context: `kvm bench --prompt-len D
--context D --gen N` (a timed D-token prefill, then the timed decode; `--prompt-len 1` at
D = 0) against `llama-bench -p 0 -n N -d D`. Prefill `ppP` is `kvm bench --prompt-len P
--gen 1` against `llama-bench -p P -n 0`. Every result line goes to OUT/NAME.jsonl (NAME:
kvm unless given) and OUT/llama.jsonl as the programs print it, plus a "side_by_side" key
(round, dtype, threads, test); a second run into the same OUT adds rounds, `--report` only
prints the tables of what OUT holds, and scripts/plot-context.py draws it (from a run of
one dtype and thread count). The tables also go to OUT/tables.md.
"""

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
from collections import defaultdict


def ints(s):
    return [int(x) for x in s.split(",") if x.strip()]


def tests(a):
    """(name, kind, tokens, depth) of every test, decode first, as llama-bench names them."""
    out = [(f"tg{a.decode}" + (f" @ d{d}" if d else ""), "tg", a.decode, d) for d in a.depths if a.decode]
    return out + [(f"pp{p}", "pp", p, 0) for p in a.prefill]


def kvm_cmd(a, model, threads, kind, n, depth):
    if kind == "tg":
        run = ["--prompt-len", str(depth or 1), "--context", str(depth), "--gen", str(n)]
    else:
        run = ["--prompt-len", str(n), "--gen", "1"]
    return [a.kvm_bin, "bench", "--model", model, "--threads", str(threads), "--bw-mib", "0", "--json", *run,
            *shlex.split(a.kvm_args)]


def llama_cmd(a, model, threads, kind, n, depth):
    run = ["-p", "0", "-n", str(n), "-d", str(depth)] if kind == "tg" else ["-p", str(n), "-n", "0"]
    return [a.llama_bench, "-m", model, "-t", str(threads), "-r", "1", "-o", "jsonl", *run,
            *shlex.split(a.llama_args)]


def run(cmd, path, tag, env=None):
    """Runs cmd (with `env` added to the environment) and appends each JSON line it prints
    to path, tagged."""
    shown = [f"{k}={v}" for k, v in (env or {}).items()]
    print("$ " + shlex.join(shown + cmd), file=sys.stderr, flush=True)
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True, env={**os.environ, **(env or {})}).stdout
    with open(path, "a") as f:
        for line in out.splitlines():
            if line.strip().startswith("{"):
                f.write(json.dumps({**json.loads(line), "side_by_side": tag}) + "\n")


def measure(a, variants):
    os.makedirs(a.out, exist_ok=True)
    files = [f"{v}.jsonl" for v, _ in variants] + ["llama.jsonl"]
    done = max((r for f in files for rounds in read(os.path.join(a.out, f)).values() for r in rounds), default=0)
    for r in range(done + 1, done + a.rounds + 1):
        for dtype in a.dtypes:
            for t in a.threads:
                for name, kind, n, depth in tests(a):
                    tag = {"round": r, "dtype": dtype, "threads": t, "test": name}
                    kvm_env = {"KVM_KERNELS": a.kernels} if a.kernels else None
                    sides = [(kvm_cmd(a, path.format(dtype=dtype), t, kind, n, depth), f"{v}.jsonl", kvm_env)
                             for v, path in variants]
                    if max(n if kind == "pp" else 0, depth) <= a.llama_max:
                        sides.append((llama_cmd(a, a.llama.format(dtype=dtype), t, kind, n, depth), "llama.jsonl", None))
                    for cmd, file, env in sides if r % 2 else reversed(sides):
                        run(cmd, os.path.join(a.out, file), tag, env)


def read(path):
    """{(dtype, threads, test): {round: record}} from one side's file, in the order run."""
    by = defaultdict(dict)
    if os.path.exists(path):
        with open(path) as f:
            for rec in map(json.loads, f):
                s = rec["side_by_side"]
                by[(s["dtype"], s["threads"], s["test"])][s["round"]] = rec
    return by


def cell(test, kvm_rounds, llama_rounds):
    """One test's medians: rates, the per-round ratio and its range, kvm's state and memory."""
    decode = test.startswith("tg")
    kvm = {r: rec["decode_tok_s" if decode else "prefill_tok_s"] for r, rec in kvm_rounds.items()}
    llama = {r: rec["avg_ts"] for r, rec in llama_rounds.items()}
    ratios = [kvm[r] / llama[r] for r in kvm if r in llama]
    return {
        "kvm": statistics.median(kvm.values()),
        "llama": statistics.median(llama.values()) if llama else None,
        "ratio": statistics.median(ratios) if ratios else None,
        "range": f"{min(ratios):.2f}-{max(ratios):.2f}" if ratios else "",
        "rounds": len(ratios),
        "slots": kvm_rounds[max(kvm_rounds)]["decode_state_slots" if decode else "prefill_state_slots"],
        "fma": None if decode or any("fma_fraction" not in rec for rec in kvm_rounds.values())
        else statistics.median(rec["fma_fraction"] for rec in kvm_rounds.values()),
        "tier": kvm_rounds[max(kvm_rounds)].get("kernel_tier", ""),
        "peak": statistics.median(rec["peak_rss_bytes"] for rec in kvm_rounds.values()) / 2**20,
    }


def fmt(x, digits=1):
    return "" if x is None else f"{x:,.{digits}f}"


def tables(name, cells):
    """The ratio of every test by dtype (thread counts in each cell), then every cell."""
    dtypes, threads, tests_run = ([*dict.fromkeys(k[i] for k in cells)] for i in range(3))
    threads.sort()
    lines = [f"### kvm `{name}` / llama.cpp, threads {' / '.join(map(str, threads))}: medians of per-round ratios",
             "", "| test | " + " | ".join(dtypes) + " |", "|---|" + "---:|" * len(dtypes)]
    for test in tests_run:
        row = [" / ".join(fmt(cells.get((d, t, test), {}).get("ratio"), 2) or "-" for t in threads) for d in dtypes]
        lines.append(f"| {test} | " + " | ".join(row) + " |")
    lines += ["", f"### kvm `{name}` and llama.cpp, every cell", "",
              "| dtype | threads | test | llama.cpp tok/s | kvm tok/s | kvm / llama.cpp | range | rounds "
              "| kvm tier | kvm fma_fraction | kvm state slots | kvm peak MiB |",
              "|---|---:|---|---:|---:|---:|---|---:|---|---:|---:|---:|"]
    for d in dtypes:
        for t in threads:
            for test in tests_run:
                c = cells.get((d, t, test))
                if c:
                    ratio = f"**{c['ratio']:.2f}x**" if c["ratio"] else ""
                    lines.append(f"| {d} | {t} | {test} | {fmt(c['llama']) or 'not run'} | {fmt(c['kvm'])} | {ratio} "
                                 f"| {c['range']} | {c['rounds']} | {c['tier']} | {fmt(c['fma'], 2)} | {c['slots']} "
                                 f"| {fmt(c['peak'])} |")
    return lines + [""]


def report(a, variants):
    llama = read(os.path.join(a.out, "llama.jsonl"))
    lines = []
    for name, _ in variants:
        kvm = read(os.path.join(a.out, f"{name}.jsonl"))
        if kvm:
            lines += tables(name, {key: cell(key[2], rounds, llama.get(key, {})) for key, rounds in kvm.items()})
    text = "\n".join(lines)
    print(text)
    path = os.path.join(a.out, "tables.md")
    with open(path + ".partial", "w") as f:
        f.write(text + "\n")
    os.replace(path + ".partial", path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kvm", action="append", required=True, metavar="[NAME=]PATH",
                    help="kvm model file, {dtype} replaced; repeatable with distinct names")
    ap.add_argument("--llama", required=True, metavar="PATH", help="llama.cpp GGUF file, {dtype} replaced")
    ap.add_argument("--kvm-bin", default="target/release/kvm")
    ap.add_argument("--llama-bench", default=os.environ.get("LLAMA_BENCH", "llama-bench"),
                    help="the llama-bench binary (default: $LLAMA_BENCH, else llama-bench on PATH)")
    ap.add_argument("--dtypes", default="f32,f16,q8_0,q4_0", type=lambda s: s.split(","))
    ap.add_argument("--threads", default="1,2", type=ints)
    ap.add_argument("--decode", default=128, type=int, help="tokens decoded per decode test (0: none)")
    ap.add_argument("--depths", default="0", type=ints, help="context depths of the decode tests")
    ap.add_argument("--prefill", default="512", type=ints, help="prompt lengths of the prefill tests ('': none)")
    ap.add_argument("--llama-max", default=1 << 30, type=int,
                    help="llama.cpp runs only tests of at most this many tokens (its cost grows with the context)")
    ap.add_argument("--rounds", default=3, type=int)
    ap.add_argument("--kvm-args", default="--cache f16",
                    help="more kvm bench arguments (default: --cache f16, as llama.cpp's f16 KV cache)")
    ap.add_argument("--llama-args", default="", help="more llama-bench arguments, e.g. '--repack 0'")
    ap.add_argument("--kernels", default="", metavar="TIER",
                    help="kvm's kernel tier (KVM_KERNELS), e.g. avx2 against an AVX2-only llama-bench")
    ap.add_argument("-o", "--out", required=True, help="directory of the result lines and tables.md")
    ap.add_argument("--report", action="store_true", help="only print the tables of the lines in --out")
    a = ap.parse_args()
    variants = [spec.split("=", 1) if "=" in spec else ("kvm", spec) for spec in a.kvm]
    if len({v for v, _ in variants} | {"llama"}) != len(variants) + 1:
        sys.exit("give each --kvm a distinct NAME other than llama")
    if not a.report:
        measure(a, variants)
    report(a, variants)


if __name__ == "__main__":
    main()

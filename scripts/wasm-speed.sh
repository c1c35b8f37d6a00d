#!/usr/bin/env bash
# Prefill and decode tokens/s, side by side in one run: `kvm bench` natively (one thread),
# the JS API in Node with simd128 and as scalar wasm (kvm-wasm/bench/speed.mjs), and the
# page in headless Chromium with simd128 (examples/web/test/speed.mjs), for tiny-kjv q8_0
# and paper-120m q8_0 (random weights: `kvm-export synth`). Three rounds, each path's
# median (min-max); prints a markdown table (docs/perf.md, "In Node and the browser").
#   bash scripts/wasm-speed.sh [PROMPT_LEN] [GEN]      default 64 64
set -euo pipefail
cd "$(dirname "$0")/.."
prompt_len=${1:-64} gen=${2:-64}

cargo build --release -p kvm-runtime -p kvm-export --quiet
bash scripts/wasm-pkg.sh >/dev/null
KVM_WASM_SCALAR=1 KVM_WASM_OUT=target/npm/kvm-wasm-scalar bash scripts/wasm-pkg.sh >/dev/null
bash scripts/web-serve.sh --assemble >/dev/null
big=target/paper-120m-q8_0.kvm
[ -f "$big" ] || target/release/kvm-export synth --preset paper-120m --dtype q8_0 -o "$big" -q

runs=target/wasm-speed.jsonl
: >"$runs"
# One JSON line a run: {path, model, prefill_tok_s, decode_tok_s}.
log() { node -e 'const r = JSON.parse(process.argv[1]);
  console.log(JSON.stringify({ path: process.argv[2], model: process.argv[3],
    prefill_tok_s: r.prefill_tok_s, decode_tok_s: r.decode_tok_s }))' "$1" "$2" "$3" >>"$runs"; }
for round in 1 2 3; do
    for m in models/tiny-kjv-q8_0.kvm "$big"; do
        name=$(basename "$m" .kvm)
        log "$(target/release/kvm bench --model "$m" --prompt-len "$prompt_len" --gen "$gen" --threads 1 \
            --bw-mib 0 --runs 1 --json)" native "$name"
        log "$(node kvm-wasm/bench/speed.mjs "$PWD/target/npm/kvm-wasm" "$m" "$prompt_len" "$gen")" "node simd128" "$name"
        log "$(node kvm-wasm/bench/speed.mjs "$PWD/target/npm/kvm-wasm-scalar" "$m" "$prompt_len" "$gen")" "node scalar" "$name"
        log "$(node examples/web/test/speed.mjs target/web "$m" "$prompt_len" "$gen")" "chromium simd128" "$name"
    done
    echo "round $round done" >&2
done

node - "$runs" <<'JS'
const rows = require("fs").readFileSync(process.argv[2], "utf8").trim().split("\n").map(JSON.parse);
const paths = ["node simd128", "node scalar", "chromium simd128", "native"];
const fmt = (x) => (x >= 100 ? Math.round(x).toLocaleString("en") : x.toFixed(1));
const stat = (xs) => {
  xs = xs.slice().sort((a, b) => a - b);
  return { med: xs[xs.length >> 1], text: `${fmt(xs[xs.length >> 1])} (${fmt(xs[0])}-${fmt(xs[xs.length - 1])})` };
};
console.log(`| model | tokens/s | ${paths.join(" | ")} | simd128 / scalar (Node) |`);
console.log(`|---|---|${paths.map(() => "---:").join("|")}|---:|`);
for (const model of [...new Set(rows.map((r) => r.model))]) {
  for (const what of ["decode", "prefill"]) {
    const s = paths.map((p) => stat(rows.filter((r) => r.model === model && r.path === p).map((r) => r[`${what}_tok_s`])));
    console.log(`| ${model} | ${what} | ${s.map((x) => x.text).join(" | ")} | ${(s[0].med / s[1].med).toFixed(1)}x |`);
  }
}
JS

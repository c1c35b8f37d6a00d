#!/usr/bin/env bash
# Builds the npm package of kvm-wasm into target/npm/kvm-wasm/ (not published; KVM_WASM_OUT
# for another directory): the crate for wasm32 with simd128 (KVM_WASM_SCALAR=1: without,
# for old engines), then wasm-bindgen's bindings and .d.ts types for Node (node/) and
# browsers (web/).
#   bash scripts/wasm-pkg.sh          build
#   bash scripts/wasm-pkg.sh --test   build, then the Node tests (kvm-wasm/test/) against
#                                     `kvm generate`'s greedy text (target/release/kvm)
set -euo pipefail
cd "$(dirname "$0")/.."

# The CLI must be the exact version of the crate's `wasm-bindgen = "=…"`. Only its
# `wasm-bindgen` binary, without TLS (which only the test runner's downloads need): 3.6
# CPU-minutes to build instead of 4.7 (docs/perf.md, "In Node").
version=$(sed -n 's/^wasm-bindgen = "=\(.*\)"/\1/p' kvm-wasm/Cargo.toml)
if [ "$(wasm-bindgen --version 2>/dev/null)" != "wasm-bindgen $version" ]; then
    cargo install --locked --quiet wasm-bindgen-cli --version "$version" --no-default-features --bin wasm-bindgen
fi

# The scalar build in a target directory of its own, so switching between the two
# rebuilds neither.
flags="-C target-feature=+simd128" target=target/kvm-wasm
[ "${KVM_WASM_SCALAR:-0}" = 1 ] && flags="" target=target/kvm-wasm-scalar
RUSTFLAGS="$flags" cargo build --manifest-path kvm-wasm/Cargo.toml --release \
    --target wasm32-unknown-unknown --target-dir "$target" --quiet
wasm=$target/wasm32-unknown-unknown/release/kvm_wasm.wasm
out=${KVM_WASM_OUT:-target/npm/kvm-wasm}
rm -rf "$out"
wasm-bindgen --target nodejs --out-dir "$out/node" "$wasm"
wasm-bindgen --target web --out-dir "$out/web" "$wasm"
# The browser build is ES modules; this tells Node and bundlers so.
echo '{ "type": "module" }' >"$out/web/package.json"
cp kvm-wasm/package.json kvm-wasm/README.md "$out/"
echo "kvm-wasm (${flags:-scalar}): $out"

if [ "${1:-}" = --test ]; then
    KVM_BIN=$(realpath "${KVM_BIN:-target/release/kvm}")
    export KVM_BIN
    export KVM_WASM_PKG="$PWD/$out" KVM_MODEL="$PWD/models/tiny-kjv-q8_0.kvm" KVM_PROMPT="And God said"
    cli() { "$KVM_BIN" generate --model "$KVM_MODEL" --prompt "$KVM_PROMPT" -n 64 "$@" 2>/dev/null; }
    KVM_WANT=$(cli --temperature 0)
    KVM_WANT_SAMPLED=$(cli --temperature 0.8 --top-p 0.9 --min-p 0.05 --repeat-penalty 1.1 --seed 7)
    KVM_WANT_DEFAULT=$(cli)
    export KVM_WANT KVM_WANT_SAMPLED KVM_WANT_DEFAULT
    node --test kvm-wasm/test/*.test.mjs
fi

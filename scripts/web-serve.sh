#!/usr/bin/env bash
# Serves the page of examples/web/ on http://127.0.0.1:PORT/ (default 8000): builds the
# web package of kvm-wasm (scripts/wasm-pkg.sh, simd128; KVM_WASM_SCALAR=1 for engines
# without it), then assembles target/web/ from the page's files, the package's web/ build
# and the bundled model (copied at each run, never committed twice), and serves it with
# `python3 -m http.server`.
#   bash scripts/web-serve.sh [PORT]
#   bash scripts/web-serve.sh --no-build [PORT]   the package already built
#   bash scripts/web-serve.sh --assemble          only assemble target/web/ (the page test)
set -euo pipefail
cd "$(dirname "$0")/.."

build=1 serve=1
case "${1:-}" in
--no-build) build=0; shift ;;
--assemble) build=0 serve=0; shift ;;
esac
port=${1:-8000}

[ "$build" = 1 ] && bash scripts/wasm-pkg.sh
pkg=target/npm/kvm-wasm/web
[ -f "$pkg/kvm_wasm.js" ] || { echo "no web package in $pkg: run scripts/wasm-pkg.sh" >&2; exit 1; }
out=target/web
rm -rf "$out"
mkdir -p "$out"
cp examples/web/index.html examples/web/app.js examples/web/worker.js examples/web/style.css "$out/"
cp "$pkg/kvm_wasm.js" "$pkg/kvm_wasm_bg.wasm" "$out/"
cp models/tiny-kjv-q8_0.kvm "$out/"
echo "page: $out"
[ "$serve" = 1 ] || exit 0
echo "open http://127.0.0.1:$port/"
exec python3 -m http.server "$port" --bind 127.0.0.1 --directory "$out"

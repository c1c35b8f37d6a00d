#!/bin/sh
# Regenerates kvm-runtime/include/kvm.h from the C API's Rust source with cbindgen.
#
#   scripts/gen-header.sh           rewrite the header
#   scripts/gen-header.sh --check   exit 1 (and show the diff) if the checked-in header
#                                   differs from what the source generates
#
# Needs cbindgen 0.29 (`cargo install cbindgen --locked --version 0.29.4`): other versions
# may format the header differently, which --check reports as drift.
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
header="$root/kvm-runtime/include/kvm.h"

if ! command -v cbindgen >/dev/null 2>&1; then
    echo "gen-header: cbindgen not found; install it with: cargo install cbindgen --locked --version 0.29.4" >&2
    exit 2
fi

generate() {
    (cd "$root" && cbindgen --quiet --config kvm-runtime/cbindgen.toml --crate kvm-runtime --output "$1" kvm-runtime)
}

case "${1:-}" in
    "")
        generate "$header"
        echo "gen-header: wrote ${header#"$root"/}"
        ;;
    --check)
        tmp=$(mktemp)
        trap 'rm -f "$tmp"' EXIT
        generate "$tmp"
        if ! diff -u "$header" "$tmp"; then
            echo "gen-header: ${header#"$root"/} is out of date; run scripts/gen-header.sh" >&2
            exit 1
        fi
        echo "gen-header: ${header#"$root"/} is up to date"
        ;;
    *)
        echo "usage: $0 [--check]" >&2
        exit 2
        ;;
esac

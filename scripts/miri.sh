#!/usr/bin/env bash
# Runs sessions of the core under Miri (tests/miri.rs): the small golden model in
# every weight dtype and attention cache, and a prompt long enough to fold. Not part of
# CI: it takes about an hour on one core (three tests; pass a name to run one).
set -euo pipefail
cd "$(dirname "$0")/.."

rustup toolchain install nightly --profile minimal --component miri,rust-src
models=$(mktemp -d)
trap 'rm -rf "$models"' EXIT
cargo build --release -p kvm-export --quiet
for dtype in f32 f32p f16 q8_0 q4_0; do
    target/release/kvm-export convert tests/data/golden/fixed_basic \
        -o "$models/fixed_basic-$dtype.kvm" --dtype "$dtype" -q
done
# libm's x86 square root is inline assembly, which Miri cannot run: its soft float instead.
# The prefetch helpers turn addresses into pointers they never dereference.
KVM_MIRI_MODELS="$models" \
MIRIFLAGS="-Zmiri-disable-isolation -Zmiri-permissive-provenance" \
    cargo +nightly miri test --features libm/force-soft-floats --test miri -- --ignored "$@"

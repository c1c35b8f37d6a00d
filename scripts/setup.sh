#!/usr/bin/env bash
# Installs what kvm's full test run needs beyond a Rust toolchain: cross targets,
# QEMU (the Arm and RISC-V boards), cross C compilers, valgrind, cmake (kvm's C library for
# C firmware), Chromium and its WebDriver (the page's test, examples/web), Node (the wasm32
# tests and the RP2040 emulator) and cbindgen. Idempotent; safe to re-run.
set -euo pipefail

sudo_() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

rustup component add rustfmt clippy >/dev/null
rustup target add thumbv7em-none-eabihf thumbv6m-none-eabi thumbv8m.main-none-eabihf \
    riscv32imac-unknown-none-elf riscv32imc-unknown-none-elf aarch64-unknown-linux-gnu \
    wasm32-unknown-unknown wasm32-wasip1 >/dev/null

need=()
for pkg in qemu-system-arm qemu-system-misc qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross \
           gcc-arm-none-eabi libnewlib-arm-none-eabi valgrind cmake chromium chromium-driver fonts-liberation; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
    sudo_ apt-get update -qq
    sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# Node.js (18 or later, for node:wasi) runs the core's wasm32 tests, and with npm rp2040js,
# the RP2040 emulator the Pico firmware runs in (scripts/boards-check.sh installs it with
# `npm ci` from examples/boards/emulate). By
# command, not package: a machine's Node may come from elsewhere (NodeSource's bundles npm).
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    sudo_ apt-get update -qq
    sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi

if ! command -v cbindgen >/dev/null || [ "$(cbindgen --version | cut -d' ' -f2)" != "0.29.4" ]; then
    cargo install cbindgen --version 0.29.4 --locked --quiet
fi

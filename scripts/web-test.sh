#!/usr/bin/env bash
# The page's test (examples/web/test/): headless Chromium, driven by chromedriver, opens
# the page from a local server and must show `kvm generate`'s greedy text, the core's
# message for a corrupt model, a dropped model's text, and stop when asked. Needs the web
# package (scripts/wasm-pkg.sh), target/release/kvm and kvm-export, and Debian's chromium
# and chromium-driver (scripts/setup.sh). Writes the screenshot to target/web-test/page.png,
# or where KVM_SCREENSHOT says (`KVM_SCREENSHOT=docs/web-page.png` refreshes the docs' one).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/web-serve.sh --assemble
# A corrupt model: the bundled one with one byte of a tensor flipped (its checksum fails).
bad=target/web-test/corrupt.kvm
drop=target/web-test/synth-tiny-q8_0.kvm
mkdir -p target/web-test
cp models/tiny-kjv-q8_0.kvm "$bad"
printf '\xff' | dd of="$bad" bs=1 seek=500000 conv=notrunc status=none
target/release/kvm-export synth --preset tiny --dtype q8_0 -o "$drop" -q

KVM_WEB_DIR=$PWD/target/web KVM_BIN=$PWD/target/release/kvm KVM_WASM_PKG=$PWD/target/npm/kvm-wasm \
KVM_MODEL=$PWD/models/tiny-kjv-q8_0.kvm KVM_BAD_MODEL=$PWD/$bad KVM_DROP_MODEL=$PWD/$drop \
KVM_SCREENSHOT=$(realpath -m "${KVM_SCREENSHOT:-target/web-test/page.png}") \
    node --test examples/web/test/page.test.mjs

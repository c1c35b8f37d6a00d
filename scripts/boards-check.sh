#!/usr/bin/env bash
# Builds the Raspberry Pi firmwares (examples/boards/pico, pico2), runs the Pico's under
# rp2040js (the RP2040's own emulator; no emulator of the RP2350 here) and checks them.
#
# usage: scripts/boards-check.sh [--n-gen N]
#
# --n-gen N: tokens the Pico generates in the emulator (default 32; the firmware a user
# builds generates 64). rp2040js runs ~10-30 M instructions/s here and a decode step is
# ~13 M instructions, so 64 tokens take 1-2 minutes, 32 about half.
#
# Checks:
# - the shared application's tests (examples/boards/app, on the host);
# - the Pico image (model linked in, its UF2 as a user would copy it) under rp2040js prints
#   "And God said" + its text equal to the first bytes of the host's
#   `kvm generate --prompt "And God said" -n N --temperature 0 --raw` on the same model (the
#   integer 256 KiB export of tiny-kjv), byte for byte;
# - the Pico image built to read the model slot (feature `slot`) refuses, in words, a copy
#   of that model with one weight byte flipped (the tensor CRC catches it) and an erased
#   slot, and prints the host's text with the good model in the slot (4 tokens);
# - the Pico 2 image (tiny-kjv q8_0, f16 cache, dsp tier) builds within the chip's flash
#   and RAM (a link-time check), its UF2 holds the IMAGE_DEF block in the first 4 KiB;
# - no image holds a semihosting call (check_no_semihosting, scripts/firmware-lib.sh);
# - the Pico built with `--features defmt,usb` (defmt over RTT, the console also on USB
#   CDC) runs under rp2040js as the USB host's CDC serial port (run.mjs --usb-cdc): the text
#   it sends over USB and on UART0 both equal the host's (4 tokens);
# then prints the budget table (scripts/board-budget.sh). Builds the host `kvm` and
# `kvm-export` (release). Prints "N passed, N failed"; exits non-zero on any failure.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
boards="$root/examples/boards"
# shellcheck source=firmware-lib.sh
source "$root/scripts/firmware-lib.sh"
n_gen=32
while [[ $# -gt 0 ]]; do
    case "$1" in
        --n-gen) n_gen="${2:?--n-gen needs a count}"; shift 2 ;;
        *) echo "usage: scripts/boards-check.sh [--n-gen N]" >&2; exit 2 ;;
    esac
done

passed=0
failed=0
check() { # name, command...
    local name="$1"; shift
    if "$@"; then passed=$((passed + 1)); echo "ok: $name"; else failed=$((failed + 1)); echo "FAILED: $name"; fi
}
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# The models: the Pico's (integer numerics, 256 KiB configuration) and the Pico 2's.
(cd "$root" && cargo build --quiet --release -p kvm-export -p kvm-runtime --bin kvm-export --bin kvm)
pico_model="$root/target/tiny-kjv-int-256k.kvm"
pico2_model="$root/target/tiny-kjv-q8_0-f16-cache.kvm"
"$root/target/release/kvm-export" convert "$root/models/tiny-kjv" --numerics int --cache q8 --slot-reads recomputed \
    -o "$pico_model" -q
"$root/target/release/kvm-export" convert "$root/models/tiny-kjv" --dtype q8_0 --cache f16 -o "$pico2_model" -q

# build DIR ELF_NAME OUT [ENV...] [-- CARGO_ARGS...]: a release build of the firmware in
# DIR (its lockfile as committed), its ELF copied to OUT.
build() {
    local dir="$1" name="$2" out="$3" envs=() cargo_args=()
    shift 3
    while [[ $# -gt 0 && $1 != -- ]]; do envs+=("$1"); shift; done
    [[ $# -eq 0 ]] || { shift; cargo_args=("$@"); }
    (cd "$dir" && env ${envs[@]+"${envs[@]}"} cargo build --quiet --release --locked ${cargo_args[@]+"${cargo_args[@]}"}) || return 1
    local target
    target="$(sed -n 's/^target = "\(.*\)"/\1/p' "$dir/.cargo/config.toml")"
    cp "$dir/target/$target/release/$name" "$out"
}

# run_pico IMAGE LOG [run.mjs args...]: the image under rp2040js, UART0 into LOG; the
# harness's exit code.
run_pico() {
    local image="$1" log="$2"
    shift 2
    local rc=0
    node "$boards/emulate/run.mjs" "$@" "$image" >"$log" || rc=$?
    cat "$log"
    return "$rc"
}

# host_text N OUT: prompt + the first N tokens of the host's greedy text on the Pico's model.
prompt="And God said"
host_text() {
    "$root/target/release/kvm" generate --model "$pico_model" --prompt "$prompt" -n "$1" --temperature 0 --raw \
        >"$work/host-stdout.txt" 2>/dev/null
    head -c $((${#prompt} + $1)) "$work/host-stdout.txt" >"$2"
}

# same_text LOG N: the text in LOG after the prompt equals the host's N tokens.
same_text() {
    local log="$1" n="$2"
    (check_text "$log" "$work/text.txt" "") || return 1
    printf '%s' "$prompt" | cat - "$work/text.txt" >"$work/full.txt"
    host_text "$n" "$work/host.txt"
    cmp "$work/full.txt" "$work/host.txt"
}

(cd "$boards/emulate" && npm ci --no-audit --no-fund --silent)

check "the application's tests on the host (kvm-board-app: slot verdicts, streamed text, fit)" \
    cargo test --quiet --locked --manifest-path "$boards/app/Cargo.toml"

# The Pico, model linked in: the image a user flashes, as its UF2.
pico="$work/kvm-pico.elf"
check "the Pico firmware builds (thumbv6m, rp2040-hal, $n_gen tokens)" \
    build "$boards/pico" kvm-pico "$pico" KVM_BOARD_MODEL="$pico_model" KVM_BOARD_N_GEN="$n_gen"
check "its UF2 image" python3 "$boards/uf2.py" --family rp2040 "$pico" "$boards/pico/target/kvm-pico.uf2"
check "no semihosting in the Pico image" check_no_semihosting "$pico"
start=$SECONDS
check "the Pico image runs under rp2040js" run_pico "$boards/pico/target/kvm-pico.uf2" "$work/pico.log"
echo "boards-check.sh: the Pico run took $((SECONDS - start)) s"
check "prompt + its text equals kvm generate -n $n_gen" same_text "$work/pico.log" "$n_gen"

# The Pico built to read the model slot.
slot="$work/kvm-pico-slot.elf"
check "the Pico firmware builds to read the model slot (feature slot)" \
    build "$boards/pico" kvm-pico "$slot" KVM_BOARD_MODEL="$pico_model" KVM_BOARD_N_GEN=4 -- --features slot
check "no semihosting in the slot image" check_no_semihosting "$slot"
# One weight byte flipped: the middle of the file is tensor data (the header, table and
# tokenizer are its first few KiB).
python3 - "$pico_model" "$work/bad.kvm" <<'EOF'
import sys
b = bytearray(open(sys.argv[1], "rb").read())
b[len(b) // 2] ^= 0x01
open(sys.argv[2], "wb").write(b)
EOF
refuses() { # LOG EXPECTED run.mjs args...: exit 1 and a line that starts with EXPECTED
    local log="$1" line="$2" rc=0
    shift 2
    run_pico "$slot" "$log" "$@" || rc=$?
    [[ $rc -eq 1 ]] && grep -q "^$line" "$log"
}
check "a flipped weight byte in the slot: the Pico refuses it in words" refuses "$work/bad.log" \
    "kvm-pico: error: bad model at 0x10100000: checksum mismatch in Tensor" --slot "$work/bad.kvm"
check "an erased slot: the Pico says so" refuses "$work/empty.log" \
    "kvm-pico: error: no model at 0x10100000: the slot is erased (0xFF)"
check "the good model in the slot: the host's text (4 tokens)" \
    eval 'run_pico "$slot" "$work/slot.log" --slot "$pico_model" && same_text "$work/slot.log" 4'

# One build for both optional features, run with rp2040js as its USB host (defmt's RTT
# buffer fills unread, as on a board without a probe).
usb="$work/kvm-pico-defmt-usb.elf"
check "the Pico builds with defmt over RTT and USB CDC (--features defmt,usb)" \
    build "$boards/pico" kvm-pico "$usb" KVM_BOARD_MODEL="$pico_model" KVM_BOARD_N_GEN=4 -- --features defmt,usb
check "no semihosting in the defmt and USB image" check_no_semihosting "$usb"
check "over USB CDC and UART0, the host's text (4 tokens)" \
    eval 'run_pico "$usb" "$work/usb-uart.log" --usb-cdc "$work/usb-cdc.log" && cat "$work/usb-cdc.log" &&
          same_text "$work/usb-cdc.log" 4 && same_text "$work/usb-uart.log" 4'

# The Pico 2: no emulator; it must build, fit and boot as the ROM expects.
pico2="$work/kvm-pico2.elf"
check "the Pico 2 firmware builds (thumbv8m.main, rp235x-hal, dsp tier, f16 cache)" \
    build "$boards/pico2" kvm-pico2 "$pico2" KVM_BOARD_MODEL="$pico2_model"
check "its UF2 image" python3 "$boards/uf2.py" --family rp2350 "$pico2" "$boards/pico2/target/kvm-pico2.uf2"
check "no semihosting in the Pico 2 image" check_no_semihosting "$pico2"
# The RP2350 boot ROM boots an image whose first 4 KiB hold an IMAGE_DEF block: it starts
# with the word 0xffffded3 and ends with 0xab123579 (the RP2350 datasheet, 5.9).
image_def() {
    python3 - "$1" <<'EOF'
import struct, sys
data = open(sys.argv[1], "rb").read()
first = b"".join(data[i + 32 : i + 32 + 256] for i in range(0, len(data), 512)
                 if struct.unpack_from("<I", data, i + 12)[0] < 0x1000_1000)
start = first.find(struct.pack("<I", 0xFFFFDED3))
sys.exit(not (0 <= start and first.find(struct.pack("<I", 0xAB123579), start) > start))
EOF
}
check "the Pico 2 UF2 holds an IMAGE_DEF block in its first 4 KiB" image_def "$boards/pico2/target/kvm-pico2.uf2"
check "the Pico 2 image uses the DSP extension (smlad)" \
    eval 'arm-none-eabi-objdump -d "$pico2" | grep -c smlad >/dev/null'

bash "$root/scripts/board-budget.sh" "$pico" "$slot" "$pico2"
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]

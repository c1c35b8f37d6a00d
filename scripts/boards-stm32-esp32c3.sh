#!/usr/bin/env bash
# The STM32F405 and ESP32-C3 firmwares (examples/boards/) and kvm's C static library for
# C firmware, as CI checks them:
#
# 1. STM32F405, its emulator build (`--features qemu`: the 16 MHz HSI, and a reset at the
#    end, which QEMU with -no-reboot turns into its exit), run under QEMU's netduinoplus2
#    (USART1 on -serial stdio): prompt + text equals the host's
#    `kvm generate --raw` of the same model (the synth `tiny` preset, q8_0; see
#    examples/boards/README.md), byte for byte. Then the `slot` build reads the same model
#    from the model slot at 0x0808_0000 (QEMU's loader device writes it there) and prints
#    the same text, and with one weight byte flipped it prints its refusal in words. No
#    `bkpt 0xab` (semihosting) in its disassembly.
# 2. ESP32-C3: tiny-kjv in the integer numerics (256 KiB configuration) linked for esp-hal's
#    memory map (the link fails if data RAM or the stack minimum is short); the image fits
#    the app partition (partitions.csv) and holds no RISC-V semihosting sequence
#    (scripts/elf-image-check.py); `espflash save-image` writes the flashable image
#    (espflash is installed for that, when missing). The `slot` build (the model read from
#    the `model` partition through MMU entries it writes) fits too, and its MMU writer is
#    in IRAM. Nothing of either runs: there is no ESP32-C3 emulator here.
# 3. the STM32's `defmt` build, its build for the chip (PLL at 168 MHz), with the RTT
#    console for users with a probe (the ESP32-C3's builds the same way; CI leaves it out
#    because it rebuilds esp-hal: about 1.5 minutes).
# 4. kvm's C static library (examples/c-firmware/kvm-fw) for thumbv6m, thumbv7em,
#    thumbv8m.main and riscv32imc through its CMake file, each exporting the C API.
#    (The C firmware itself builds through that file and runs in QEMU in scripts/mcu-check.sh.)
# Then the flash and RAM budget of the two images (scripts/board-budget.sh).
#
# usage: scripts/boards-stm32-esp32c3.sh [stm32 | esp32c3 | c-lib | defmt]...  (default: all)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=firmware-lib.sh
source "$root/scripts/firmware-lib.sh"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
prompt="And God said"
stm="$root/examples/boards/stm32f405"
esp="$root/examples/boards/esp32c3"
espflash_version=4.7.0
# The firmwares' default models (their build.rs), made here as their READMEs say.
stm_model="$root/target/synth-tiny-q8_0.kvm"
esp_model="$root/target/tiny-kjv-int-256k.kvm"

host_tools() {
    (cd "$root" && cargo build --release --quiet -p kvm-runtime --bin kvm -p kvm-export)
    "$root/target/release/kvm-export" synth --preset tiny --dtype q8_0 -o "$stm_model" -q
    "$root/target/release/kvm-export" convert "$root/models/tiny-kjv" --numerics int --cache q8 \
        --slot-reads recomputed -o "$esp_model" -q
}

# stm32_run LOG [QEMU_ARGS...]: the last-built STM32 image under QEMU, bounded in time.
stm32_run() {
    local log="$1"
    shift
    timeout --foreground 120 qemu-system-arm -M netduinoplus2 -display none -no-reboot -serial stdio \
        -monitor none "$@" -kernel "$stm/target/thumbv7em-none-eabihf/release/kvm-stm32f405" </dev/null >"$log" \
        || { cat "$log"; echo "boards: QEMU failed or timed out" >&2; exit 1; }
    cat "$log"
}

stm32() {
    echo "== STM32F405 (netduinoplus2): the host's text, from flash and from the model slot; a bad model refused"
    local elf="$stm/target/thumbv7em-none-eabihf/release/kvm-stm32f405"
    # Prompt then 64 one-byte tokens; what follows them (a final newline) is not text.
    "$root/target/release/kvm" generate --model "$stm_model" --prompt "$prompt" -n 64 --temperature 0 --raw \
        >"$work/host-stdout.txt" 2>/dev/null
    head -c $((${#prompt} + 64)) "$work/host-stdout.txt" >"$work/host.txt"

    (cd "$stm" && cargo build --release --locked --quiet --features qemu)
    check_no_semihosting "$elf"
    cp "$elf" "$work/kvm-stm32f405"
    stm32_run "$work/stm.log"
    same_text "$work/stm.log" "linked in"

    (cd "$stm" && cargo build --release --locked --quiet --features qemu,slot)
    check_no_semihosting "$elf"
    stm32_run "$work/slot.log" -device loader,file="$stm_model",addr=0x08080000
    same_text "$work/slot.log" "from the model slot"
    # One byte in the middle of the file flipped (a weight of the largest tensors): its
    # tensor's CRC no longer matches.
    python3 -c 'import sys; b = bytearray(open(sys.argv[1], "rb").read()); b[len(b) // 2] ^= 1; open(sys.argv[2], "wb").write(b)' \
        "$stm_model" "$work/bad.kvm"
    stm32_run "$work/bad.log" -device loader,file="$work/bad.kvm",addr=0x08080000
    grep -q '^kvm-stm32f405: error: bad model at 0x08080000: checksum mismatch' "$work/bad.log" \
        || { echo "boards: the STM32 did not refuse the bad model in words" >&2; exit 1; }
    ! grep -q -- '--- kvm output ---' "$work/bad.log" || { echo "boards: the STM32 ran a bad model" >&2; exit 1; }
    echo "ok: the STM32 refuses a model with a flipped byte"
}

# same_text LOG WHAT: the firmware's text in LOG, after the prompt, equals the host's.
same_text() {
    check_text "$1" "$work/fw.txt" ""
    printf '%s' "$prompt" | cat - "$work/fw.txt" >"$work/fw-full.txt"
    cmp "$work/fw-full.txt" "$work/host.txt" || { echo "boards: the STM32's text ($2) differs from kvm generate's" >&2; exit 1; }
    echo "ok: the STM32's text ($2) equals kvm generate --raw"
}

esp32c3() {
    echo "== ESP32-C3: builds, fits the chip, no semihosting"
    local elf="$esp/target/riscv32imc-unknown-none-elf/release/kvm-esp32c3" partition
    (cd "$esp" && cargo build --release --locked --quiet)
    partition=$(awk -F, '$1 == "factory" { gsub(/ /, "", $5); print $5 }' "$esp/partitions.csv")
    python3 "$root/scripts/elf-image-check.py" "$elf" --partition "$partition"
    cp "$elf" "$work/kvm-esp32c3"
    # The flashable image, as a user writes it: espflash is installed for this step alone
    # (about 5 minutes of CPU, 2-3 on CI's two cores), the version the README names.
    if [ "$(espflash --version 2>/dev/null | cut -d' ' -f2)" != "$espflash_version" ]; then
        cargo install --locked --quiet espflash --version "$espflash_version"
    fi
    espflash save-image --chip esp32c3 --partition-table "$esp/partitions.csv" "$elf" "$work/kvm-esp32c3.bin"
    echo "ok: espflash save-image wrote $(stat -c %s "$work/kvm-esp32c3.bin") bytes"

    echo "== ESP32-C3, built to read the model slot (feature slot): builds, fits, maps the slot from RAM"
    (cd "$esp" && cargo build --release --locked --quiet --features slot)
    python3 "$root/scripts/elf-image-check.py" "$elf" --partition "$partition"
    # The code that writes the MMU runs with the flash cache suspended, so it must be in
    # internal RAM (IRAM, 0x4037_C000..0x403E_0000), not in flash.
    local at
    at=$(nm -C "$elf" | awk '/ kvm_esp32c3::slot::write_entries$/ { print $1 }')
    [[ -n $at ]] && (( 0x$at >= 0x4037C000 && 0x$at < 0x403E0000 )) \
        || { echo "boards: the ESP32-C3's MMU writer is not in IRAM (at '$at')" >&2; exit 1; }
    echo "ok: the slot build fits, and its MMU writer is in IRAM at 0x$at"
}

defmt_build() {
    echo "== defmt over RTT: the STM32 firmware builds with it"
    (cd "$stm" && cargo build --release --locked --quiet --features defmt)
    echo "ok: the defmt build"
}

c_lib() {
    echo "== kvm's C static library through its CMake file, for the four targets"
    local t lib
    for t in thumbv6m-none-eabi thumbv7em-none-eabihf thumbv8m.main-none-eabihf riscv32imc-unknown-none-elf; do
        cmake -S "$root/examples/c-firmware/kvm-fw" -B "$work/cmake-$t" -DKVM_RUST_TARGET="$t" \
            -DKVM_CARGO_TARGET_DIR="$root/examples/c-firmware/kvm-fw/target" >/dev/null
        cmake --build "$work/cmake-$t" --target kvm_cargo >/dev/null
        lib="$root/examples/c-firmware/kvm-fw/target/$t/release/libkvm_fw.a"
        # The host's nm reads any little-endian ELF's symbols (into a file: `grep -q` on a
        # pipe would stop nm early and fail the pipeline).
        nm -g --defined-only "$lib" >"$work/symbols.txt" 2>/dev/null
        grep -q ' T kvm_model_load$' "$work/symbols.txt" \
            || { echo "boards: $lib does not export kvm_model_load" >&2; exit 1; }
        echo "ok: $t: $(stat -c %s "$lib") bytes, exports the C API"
    done
}

host_tools
for part in "${@:-stm32 esp32c3 defmt c-lib}"; do
    for p in $part; do
        case "$p" in
            stm32) stm32 ;;
            esp32c3) esp32c3 ;;
            defmt) defmt_build ;;
            c-lib) c_lib ;;
            *) echo "usage: scripts/boards-stm32-esp32c3.sh [stm32 | esp32c3 | c-lib | defmt]..." >&2; exit 2 ;;
        esac
    done
done
# The budget of the images built above (scripts/board-budget.sh), as in examples/boards/README.md.
images=()
for elf in "$work/kvm-stm32f405" "$work/kvm-esp32c3"; do
    [[ ! -f $elf ]] || images+=("$elf")
done
[[ ${#images[@]} -eq 0 ]] || bash "$root/scripts/board-budget.sh" "${images[@]}"

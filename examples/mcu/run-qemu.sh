#!/usr/bin/env bash
# Builds the kvm firmware for a QEMU board and runs it, under a timeout.
#
# usage: examples/mcu/run-qemu.sh [--board B] [--echo-prompt] [--dtype D] [--cache C] [--numerics N]
#                                 [--ram-kib K] [--heap] [--icount] [--out FILE]
#                                 [--expect FILE] [--timeout SECS] [MODEL]
#
#   --board an386   Cortex-M4F, thumbv7em-none-eabihf (default)
#   --board an385   ARMv6-M code (Cortex-M0+, RP2040 class), thumbv6m-none-eabi, on the
#                   board's Cortex-M3, which traps unaligned accesses as an M0+ does
#   --board an505   Cortex-M33, thumbv8m.main-none-eabihf
#   --board an547   Cortex-M55 (Helium), thumbv8m.main-none-eabihf -C target-cpu=cortex-m55
#   --board riscv32 RV32IMAC, riscv32imac-unknown-none-elf (QEMU virt, -bios none)
#   --board riscv32imc  RV32IMC (ESP32-C3 class: no atomics, no FPU),
#                   riscv32imc-unknown-none-elf, on QEMU virt with a CPU of that ISA
#   MODEL           the .kvm file to flash (default: models/tiny-kjv-q8_0.kvm)
#   --numerics N    float (default) or int: with int, instead of MODEL, convert
#                   models/tiny-kjv with kvm-export --numerics int (docs/integer.md: every
#                   step in integers; with --ram-kib, also --cache q8 --slot-reads
#                   recomputed) into examples/mcu/target/ and flash that
#   --dtype D       instead of MODEL, convert models/tiny-kjv with kvm-export --dtype D
#                   into examples/mcu/target/ and flash that
#   --cache C       with --dtype: export with --cache C (f32, f16, q8); with --heap: the
#                   firmware's choice at run time (its command line)
#   --heap          the `heap` build: the model is not linked in but loaded into the
#                   board's model slot, and the arena comes from an embedded-alloc heap
#   --ram-kib K     link with the board's RAM region cut to K KiB: statics plus the
#                   reserved stack that do not fit fail the build. Without MODEL or
#                   --dtype, flashes the 256 KiB configuration of tiny-kjv (README.md)
#   --echo-prompt   print the prompt before the continuation, as `kvm generate` does
#   --out FILE      write the text (exactly the bytes between the markers) to FILE
#   --expect FILE   fail (exit 3) unless the text is exactly FILE's bytes
#   --timeout SECS  QEMU wall-clock limit (default 300); on expiry exit 124
#   --icount        run QEMU with -icount shift=0 (one instruction per virtual ns) and
#                   turn the firmware's tick counts into instruction counts
#   --conformance   instead of generating text, run the kernel conformance firmware
#                   (src/bin/conformance.rs): the board's kernel tier against the scalar
#                   oracle and the oracle against reference computations, bit for bit;
#                   prints `kvm-conformance: tier <name>`; exits 0 when all match, 1 on a
#                   mismatch
#
# Prints everything the firmware prints. The text is the bytes after the line
# `--- kvm output ---` and before the newline that precedes the line `--- end ---`: the
# 64 greedy tokens of "And God said" (prompt first with --echo-prompt). The firmware adds
# that one newline itself, so a text without a trailing newline is still exact. Exit code:
# the firmware's (0 ok, 1 error, 101 panic, 102 hard fault), 124 on timeout, 2 on bad
# usage or a failed build, 3 when --expect does not match.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# shellcheck source=../../scripts/firmware-lib.sh
source "$root/scripts/firmware-lib.sh"

board=an386
model=""
dtype=""
numerics=float
cache=""
ram_kib=""
out=""
expect=""
timeout_s=300
features=()
heap=0
icount=()
bin=kvm-mcu
while [[ $# -gt 0 ]]; do
    case "$1" in
        --board) board="${2:?--board needs a value}"; shift 2 ;;
        --board=*) board="${1#*=}"; shift ;;
        --dtype) dtype="${2:?--dtype needs a value}"; shift 2 ;;
        --numerics) numerics="${2:?--numerics needs float or int}"; shift 2 ;;
        --cache) cache="${2:?--cache needs a value}"; shift 2 ;;
        --ram-kib) ram_kib="${2:?--ram-kib needs a size}"; shift 2 ;;
        --echo-prompt) features+=(--features echo-prompt); shift ;;
        --out) out="${2:?--out needs a file}"; shift 2 ;;
        --expect) expect="${2:?--expect needs a file}"; shift 2 ;;
        --icount) icount=(-icount shift=0); shift ;;
        --heap) heap=1; shift ;;
        --conformance) bin=kvm-mcu-conformance; shift ;;
        --timeout) timeout_s="${2:?--timeout needs seconds}"; shift 2 ;;
        -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        -*) echo "run-qemu.sh: unknown option $1" >&2; exit 2 ;;
        *) model="$1"; shift ;;
    esac
done

# One line per board: the Rust target, the QEMU command line, sysclk, the rate (Hz) of the
# firmware's tick counter (SysTick's processor clock on the Cortex-M boards; mcycle on
# RISC-V, which QEMU counts in instructions under -icount), and slot, the address of the
# `heap` build's model slot (as in the board's memory-*.x); rustflags, what the board's CPU
# adds to the target, whose builds go to a target directory of their own.
rustflags=""
target_dir="$here/target"
case "$board" in
    an386) target=thumbv7em-none-eabihf; qemu=(qemu-system-arm -M mps2-an386 -cpu cortex-m4); sysclk=25000000; slot=0x21000000 ;;
    # QEMU has no Cortex-M0+ board with room for a model; the M3 runs ARMv6-M code.
    an385) target=thumbv6m-none-eabi; qemu=(qemu-system-arm -M mps2-an385 -cpu cortex-m3); sysclk=25000000; slot=0x21000000 ;;
    an505) target=thumbv8m.main-none-eabihf; qemu=(qemu-system-arm -M mps2-an505 -cpu cortex-m33); sysclk=20000000; slot=0x80000000 ;;
    # Rust has no Armv8.1-M target: the M55's Helium (MVE) comes from target-cpu.
    an547) target=thumbv8m.main-none-eabihf; qemu=(qemu-system-arm -M mps3-an547 -cpu cortex-m55); sysclk=32000000; slot=0x70000000
        rustflags="-C target-cpu=cortex-m55"; target_dir="$here/target/an547" ;;
    riscv32) target=riscv32imac-unknown-none-elf; qemu=(qemu-system-riscv32 -M virt -bios none); sysclk=1000000000; slot=0x22000000 ;;
    # The CPU without the A, F, D, H and bit-manipulation extensions: RV32IMC (with Zicsr
    # and Zifencei), so an atomic or floating-point instruction traps (exit 102).
    riscv32imc) target=riscv32imc-unknown-none-elf; sysclk=1000000000; slot=0x22000000
        qemu=(qemu-system-riscv32 -M virt -bios none -cpu rv32,a=off,f=off,d=off,h=off,zba=off,zbb=off,zbc=off,zbs=off) ;;
    *) echo "run-qemu.sh: unknown board '$board' (an385, an386, an505, an547, riscv32 or riscv32imc)" >&2; exit 2 ;;
esac

[[ -z "$cache" || -n "$dtype" || $heap -eq 1 ]] || { echo "run-qemu.sh: --cache needs --dtype or --heap" >&2; exit 2; }
export_cache="$cache"
[[ $heap -eq 0 ]] || export_cache=""
case "$numerics" in
    float) ;;
    int)
        [[ -z "$model" && -z "$dtype" && -z "$cache" ]] || { echo "run-qemu.sh: --numerics int converts tiny-kjv itself: no MODEL, --dtype or --cache" >&2; exit 2; }
        mkdir -p "$here/target"
        # With --ram-kib, the integer 256 KiB configuration: i8 attention rows, slot reads
        # recomputed (docs/integer.md).
        small=()
        [[ -z "$ram_kib" ]] || small=(--cache q8 --slot-reads recomputed)
        model="$here/target/tiny-kjv-int${ram_kib:+-256k}.kvm"
        (cd "$root" && cargo run --quiet --release -p kvm-export -- convert models/tiny-kjv -o "$model" --numerics int ${small[@]+"${small[@]}"} --quiet) || exit 2
        ;;
    *) echo "run-qemu.sh: --numerics is float or int, not '$numerics'" >&2; exit 2 ;;
esac
if [[ -n "$ram_kib" && -z "$model" && -z "$dtype" ]]; then
    model="$(tiny_kjv_256k "$root" "$here/target")"
fi
if [[ -n "$dtype" ]]; then
    [[ -z "$model" ]] || { echo "run-qemu.sh: give MODEL or --dtype, not both" >&2; exit 2; }
    mkdir -p "$here/target"
    model="$here/target/tiny-kjv-$dtype${export_cache:+-$export_cache-cache}.kvm"
    convert_tiny_kjv "$root" "$dtype" "$model" ${export_cache:+--cache "$export_cache"}
fi
model="${model:-$root/models/tiny-kjv-q8_0.kvm}"
if [[ ! -f "$model" ]]; then
    echo "run-qemu.sh: no model at $model" >&2
    echo "  build one: cargo run --release -p kvm-export -- convert models/tiny-kjv -o $model --dtype q8_0" >&2
    echo "  or pass --dtype f16 to convert one into examples/mcu/target/" >&2
    exit 2
fi
model="$(cd "$(dirname "$model")" && pwd)/$(basename "$model")"

elf="$target_dir/$target/release/$bin"
ram=()
[[ -z "$ram_kib" ]] || ram=(KVM_MCU_RAM_KIB="$ram_kib")
load=()
if [[ $heap -eq 1 ]]; then
    features+=(--features heap)
    load=(-device "loader,file=$model,addr=$slot")
    [[ -z "$cache" ]] || load+=(-append "--cache $cache")
fi
# An empty RUSTFLAGS would override .cargo/config.toml's (the an505's cortex-m33): set it only
# for boards that need it.
[[ -z "$rustflags" ]] || ram+=(RUSTFLAGS="$rustflags")
(cd "$here" && env KVM_MCU_MODEL="$model" KVM_MCU_BOARD="$board" ${ram[@]+"${ram[@]}"} \
    cargo build --quiet --release --target "$target" --target-dir "$target_dir" --bin "$bin" \
    ${features[@]+"${features[@]}"}) || exit 2

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
run_qemu "$log" "$timeout_s" "${qemu[@]}" ${icount[@]+"${icount[@]}"} ${load[@]+"${load[@]}"} -kernel "$elf"
# The conformance firmware's exit code is its verdict (run_qemu exits on a failure).
[[ $bin == kvm-mcu ]] || exit 0
if [[ ${#icount[@]} -gt 0 ]]; then
    # Under -icount shift=0 virtual time is 1 ns per instruction, so a tick of the
    # sysclk-Hz counter is 1e9 / sysclk instructions.
    perl -ne 'BEGIN { $per = 1e9 / '"$sysclk"' }
        next unless /^kvm-mcu: (.*?(?:(\d+) tokens)?): .* (\d+) ticks/;
        my $n = $3 * $per;
        printf "run-qemu.sh: icount: %s: %.0f instructions%s\n", $1, $n,
            $2 ? sprintf(" (%.0f per token)", $n / $2) : "";' "$log"
fi

check_text "$log" "$out" "$expect"

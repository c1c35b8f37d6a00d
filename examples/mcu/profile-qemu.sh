#!/usr/bin/env bash
# Instructions per function of a firmware run, from QEMU's translation and execution log.
#
# usage: examples/mcu/profile-qemu.sh [--board an386|an385|an505|an547|riscv32|riscv32imc] [--top N] [ELF]
#
#   --board B  the board the ELF was built for (default an386)
#   --top N    functions to print (default 20)
#   ELF        default: the firmware `run-qemu.sh --board B` built last
#
# Runs the ELF once under `qemu-system-arm -d in_asm,exec,nochain` (every translated block
# with its instructions and symbol, then every execution of a block, unchained so that
# each one is logged) and sums instructions per symbol: the whole run, boot included.
# On an547 the blocks' listings around MVE instructions do not match what executes (their
# sums came out 22% above -icount's), so there QEMU translates one instruction per block
# (-singlestep) and each logged execution counts one: -icount's count exactly, a few
# times slower. With the bundled model a run logs a few GB and takes a minute or a few;
# the log is consumed as it is written, through a pipe, and never stored.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
board=an386
top=20
elf=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --board) board="${2:?--board needs a value}"; shift 2 ;;
        --top) top="${2:?--top needs a count}"; shift 2 ;;
        -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        -*) echo "profile-qemu.sh: unknown option $1" >&2; exit 2 ;;
        *) elf="$1"; shift ;;
    esac
done
one=()
dir="$here/target"
qemu=qemu-system-arm
case "$board" in
    an386) target=thumbv7em-none-eabihf; machine=(-M mps2-an386 -cpu cortex-m4) ;;
    an385) target=thumbv6m-none-eabi; machine=(-M mps2-an385 -cpu cortex-m3) ;;
    an505) target=thumbv8m.main-none-eabihf; machine=(-M mps2-an505 -cpu cortex-m33) ;;
    an547) target=thumbv8m.main-none-eabihf; machine=(-M mps3-an547 -cpu cortex-m55); one=(-singlestep); dir="$here/target/an547" ;;
    riscv32) target=riscv32imac-unknown-none-elf; qemu=qemu-system-riscv32; machine=(-M virt -bios none) ;;
    riscv32imc) target=riscv32imc-unknown-none-elf; qemu=qemu-system-riscv32
        machine=(-M virt -bios none -cpu rv32,a=off,f=off,d=off,h=off,zba=off,zbb=off,zbc=off,zbs=off) ;;
    *) echo "profile-qemu.sh: unknown board '$board' (an386, an385, an505, an547, riscv32 or riscv32imc)" >&2; exit 2 ;;
esac
elf="${elf:-$dir/$target/release/kvm-mcu}"
[[ -f "$elf" ]] || { echo "profile-qemu.sh: no ELF at $elf (run run-qemu.sh --board $board first)" >&2; exit 2; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkfifo "$work/log"
perl -e '
    my (%n, %sym, %hits, $pc, $cur);
    while (<STDIN>) {
        if (/^IN: ?(.*)$/) { $cur = $1 || "?"; $pc = undef; next }
        if (/^0x([0-9a-f]+):\s/) {
            if (!defined $pc) { $pc = hex $1; $n{$pc} = 0; $sym{$pc} = $cur }
            $n{$pc}++;
            next;
        }
        if (/^Trace \d+: \S+ \[[0-9a-f]+\/([0-9a-f]+)\//) { $hits{hex $1}++; $pc = undef }
    }
    my (%by, $total);
    for my $p (keys %hits) { my $c = $hits{$p} * ('"${#one[@]}"' ? 1 : ($n{$p} // 0)); $by{$sym{$p} // "?"} += $c; $total += $c }
    printf "%12d  100.0%%  (all)\n", $total;
    my $k = 0;
    for my $s (sort { $by{$b} <=> $by{$a} } keys %by) {
        last if $k++ >= '"$top"';
        printf "%12d %6.1f%%  %s\n", $by{$s}, 100 * $by{$s} / $total, $s;
    }' <"$work/log" | (command -v arm-none-eabi-c++filt >/dev/null && arm-none-eabi-c++filt || cat) | sed 's/::h[0-9a-f]\{16\}$//' &
reader=$!
timeout --foreground 1800 "$qemu" "${machine[@]}" ${one[@]+"${one[@]}"} -nographic -monitor none \
    -semihosting-config enable=on,target=native -kernel "$elf" \
    -d in_asm,exec,nochain -D "$work/log" </dev/null >/dev/null
wait "$reader"

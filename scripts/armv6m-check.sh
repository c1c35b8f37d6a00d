#!/usr/bin/env bash
# Checks that an ELF's code is ARMv6-M code (Cortex-M0/M0+), from its disassembly.
#
# usage: scripts/armv6m-check.sh ELF
#
# QEMU's mps2-an385 is a Cortex-M3 (ARMv7-M), which runs ARMv7-M instructions that a
# Cortex-M0+ does not have: a thumbv6m build that ran there could still hold one (from
# inline assembly, a mis-set target CPU, a hand-written routine). This disassembles every
# executable section with arm-none-eabi-objdump and accepts only what ARMv6-M has: 16-bit
# Thumb instructions, except the Thumb-2 ones (CBZ, CBNZ, IT), and of the 32-bit
# encodings only BL, MRS, MSR, DMB, DSB and ISB. Literal-pool data (`.word`, `.short`,
# `.byte`, marked by the compiler's mapping symbols) is not code and is skipped. Prints
# each offending instruction (the first 20) with its function, and exits 1 when there is
# any, or when the disassembly holds no instruction at all.
set -euo pipefail

elf="${1:?usage: scripts/armv6m-check.sh ELF}"
[[ -f "$elf" ]] || { echo "armv6m-check.sh: no ELF at $elf" >&2; exit 2; }
command -v arm-none-eabi-objdump >/dev/null \
    || { echo "armv6m-check.sh: arm-none-eabi-objdump not found (scripts/setup.sh installs gcc-arm-none-eabi)" >&2; exit 2; }

arm-none-eabi-objdump -d "$elf" | perl -e '
    my ($fn, $insns, $bad) = ("?", 0, 0);
    my %wide = map { $_ => 1 } qw(bl mrs msr dmb dsb isb);
    my %thumb2 = map { $_ => 1 } qw(cbz cbnz);
    while (<STDIN>) {
        if (/^[0-9a-f]+ <(.*)>:$/) { $fn = $1; next }
        # "   addr:<TAB>raw<TAB>mnemonic operands": raw is one halfword ("4770"), two
        # ("f003 f8a7": a 32-bit encoding) or a data word ("20000000" for .word).
        next unless /^\s*([0-9a-f]+):\t([0-9a-f ]+?)\s*\t(\S+)(.*)$/;
        my ($addr, $raw, $op, $rest) = ($1, $2, $3, $4);
        next if $op =~ /^\.(word|short|byte)$/;
        $insns++;
        my $why;
        if ($op =~ /undefined/i || $rest =~ /undefined/i) {
            $why = "not an instruction objdump knows for this ELF";
        } elsif ($raw =~ /^[0-9a-f]{4} [0-9a-f]{4}$/) {
            $why = "32-bit encoding other than BL, MRS, MSR, DMB, DSB, ISB" unless $wide{$op};
        } elsif ($raw !~ /^[0-9a-f]{4}$/) {
            $why = "unexpected encoding";
        } elsif ($thumb2{$op} || $op =~ /^it[te]{0,3}$/) {
            $why = "16-bit Thumb-2 instruction (ARMv7-M only)";
        }
        next unless $why;
        printf "  %s: %s%s  (%s; in %s)\n", $addr, $op, $rest, $why, $fn if $bad < 20;
        $bad++;
    }
    if ($insns == 0) { print STDERR "armv6m-check.sh: no instructions in the disassembly\n"; exit 1 }
    if ($bad) {
        print STDERR "armv6m-check.sh: FAILED: $bad of $insns instructions are not ARMv6-M\n";
        exit 1;
    }
    print "armv6m-check.sh: $insns instructions, all ARMv6-M\n";
' || { echo "armv6m-check.sh: $elf is not ARMv6-M code" >&2; exit 1; }

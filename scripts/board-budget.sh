#!/usr/bin/env bash
# Prints the flash and RAM budget of board firmware images, as a Markdown table, from the
# ELF files alone (any architecture: the ELF is read here, no binutils needed).
#
# usage: scripts/board-budget.sh ELF...
#
# Per image: flash used (every loaded section: code, read-only data, .data's initial
# values) and, split out of it, the code (executable sections) and the model (the static
# named `MODEL`); RAM statics (writable sections) and, split out, the arena (the static
# named `ARENA`); and the stack: the region the runtime leaves between the statics and the
# top of RAM (cortex-m-rt's `_stack_end`..`_stack_start`, riscv-rt's `__estack`..). The
# chip's totals come from the absolute symbols `_kvm_flash_len` and `_kvm_ram_len` that a
# board's memory.x defines (shown as "of N" when present). Sizes in bytes.
set -euo pipefail
[[ $# -gt 0 ]] || { echo "usage: scripts/board-budget.sh ELF..." >&2; exit 2; }

python3 - "$@" <<'EOF'
import re
import struct
import sys

SHF_WRITE, SHF_ALLOC, SHF_EXECINSTR = 0x1, 0x2, 0x4
SHT_SYMTAB, SHT_NOBITS = 2, 8


def read_elf(path):
    d = open(path, "rb").read()
    if d[:4] != b"\x7fELF" or d[5] != 1:
        sys.exit(f"board-budget.sh: {path}: not a little-endian ELF file")
    wide = d[4] == 2
    if wide:
        shoff, = struct.unpack_from("<Q", d, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", d, 0x3A)
        sh = lambda i: struct.unpack_from("<IIQQQQIIQQ", d, shoff + i * shentsize)
    else:
        shoff, = struct.unpack_from("<I", d, 0x20)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", d, 0x2E)
        sh = lambda i: struct.unpack_from("<IIIIIIIIII", d, shoff + i * shentsize)
    heads = [sh(i) for i in range(shnum)]
    strtab = heads[shstrndx]
    name = lambda off, tab: d[tab[4] + off : d.index(b"\0", tab[4] + off)].decode()
    sections = [(name(h[0], strtab), h[1], h[2], h[5]) for h in heads]  # name, type, flags, size
    symbols = {}
    for h in heads:
        if h[1] != SHT_SYMTAB:
            continue
        names = heads[h[6]]
        for at in range(h[4], h[4] + h[5], h[9]):
            if wide:
                st_name, _info, _other, _shndx, value, size = struct.unpack_from("<IBBHQQ", d, at)
            else:
                st_name, value, size = struct.unpack_from("<III", d, at)
            symbols[name(st_name, names)] = (value, size)
    return sections, symbols


def static_size(symbols, static):
    """The size of a static named `static`, by its plain or Rust-mangled name."""
    pat = re.compile(rf"(^|\d){static}(17h[0-9a-f]{{16}}E)?$|^{static}$")
    return sum(size for n, (_v, size) in symbols.items() if pat.search(n))


def of(used, total):
    return f"{used:,} of {total:,}" if total else f"{used:,}"


print("| image | flash used | code | model | RAM statics | arena | stack |")
print("|---|---|---|---|---|---|---|")
for path in sys.argv[1:]:
    sections, symbols = read_elf(path)
    alloc = [s for s in sections if s[2] & SHF_ALLOC]
    flash = sum(s[3] for s in alloc if s[1] != SHT_NOBITS)
    code = sum(s[3] for s in alloc if s[2] & SHF_EXECINSTR)
    ram = sum(s[3] for s in alloc if s[2] & SHF_WRITE)
    value = lambda n: symbols.get(n, (None,))[0]
    top = value("_stack_start")
    bottom = value("_stack_end") if "_stack_end" in symbols else value("__estack")
    stack = f"{top - bottom:,}" if top is not None and bottom is not None else "?"
    flash_len, ram_len = value("_kvm_flash_len"), value("_kvm_ram_len")
    print(
        f"| {path.rsplit('/', 1)[-1]} | {of(flash, flash_len)} | {code:,} | {static_size(symbols, 'MODEL'):,} "
        f"| {of(ram, ram_len)} | {static_size(symbols, 'ARENA'):,} | {stack} |"
    )
EOF

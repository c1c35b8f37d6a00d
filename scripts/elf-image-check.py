#!/usr/bin/env python3
"""Reads a bare-metal RISC-V ELF (the ESP32-C3 firmware) and checks, without a target
toolchain:

- no RISC-V semihosting call: the sequence `slli x0,x0,0x1f; ebreak; srai x0,x0,7`
  (always uncompressed, so three 32-bit words) at any 2-byte boundary of an executable
  section (a chip with no debugger attached stops at it);
- the ESP32-C3 image fits its app partition: flash-mapped segments (DROM 0x3C00_0000,
  IROM 0x4200_0000) share one flash range from the image's start to the end of the last
  of them, and RAM-loaded segments follow as copies; the total, with the image header
  (24 bytes) and each segment's (8), must not exceed --partition bytes.

usage: scripts/elf-image-check.py ELF --partition BYTES
Prints `flash N of M bytes (P%), RAM static N + stack N bytes`; exits 1 on a failed check.
"""
import argparse
import struct
import sys

SEMIHOSTING = struct.pack("<III", 0x01F01013, 0x00100073, 0x40705013)
FLASH_WINDOWS = [(0x3C000000, 0x3C800000), (0x42000000, 0x42800000)]
PT_LOAD = 1
SHF_EXECINSTR = 0x4


def sections(elf):
    """(name, flags, addr, offset, size, type) of every section header."""
    shoff, = struct.unpack_from("<I", elf, 0x20)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x2E)
    raw = [struct.unpack_from("<IIIIIIIIII", elf, shoff + i * shentsize) for i in range(shnum)]
    strtab = raw[shstrndx][4]
    out = []
    for name, typ, flags, addr, offset, size, *_ in raw:
        end = elf.index(b"\0", strtab + name)
        out.append((elf[strtab + name:end].decode(), flags, addr, offset, size, typ))
    return out


def segments(elf):
    """(vaddr, filesz, memsz) of every PT_LOAD program header."""
    phoff, = struct.unpack_from("<I", elf, 0x1C)
    phentsize, phnum = struct.unpack_from("<HH", elf, 0x2A)
    out = []
    for i in range(phnum):
        typ, _off, vaddr, _paddr, filesz, memsz, _flags, _align = struct.unpack_from("<IIIIIIII", elf, phoff + i * phentsize)
        if typ == PT_LOAD:
            out.append((vaddr, filesz, memsz))
    return out


def semihosting_calls(elf):
    """Addresses of semihosting sequences in executable sections (type 8 = NOBITS)."""
    hits = []
    for name, flags, addr, offset, size, typ in sections(elf):
        if flags & SHF_EXECINSTR and typ != 8:
            code = elf[offset:offset + size]
            at = code.find(SEMIHOSTING)
            while at >= 0:
                if at % 2 == 0:
                    hits.append((name, addr + at))
                at = code.find(SEMIHOSTING, at + 1)
    return hits


def in_flash(vaddr):
    return any(lo <= vaddr < hi for lo, hi in FLASH_WINDOWS)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("elf")
    ap.add_argument("--partition", type=lambda s: int(s, 0), required=True)
    args = ap.parse_args()
    elf = open(args.elf, "rb").read()
    if elf[:4] != b"\x7fELF" or elf[4] != 1 or elf[5] != 1:
        sys.exit(f"{args.elf}: not a 32-bit little-endian ELF")

    ok = True
    for name, addr in semihosting_calls(elf):
        print(f"{args.elf}: semihosting call in {name} at {addr:#010x}", file=sys.stderr)
        ok = False

    loads = [s for s in segments(elf) if s[1] > 0]
    mapped = [s for s in loads if in_flash(s[0])]
    copied = [s for s in loads if not in_flash(s[0])]
    # The mapped segments keep their 64 KiB page offsets, so the flash range they take runs
    # from the first window's base to the furthest end.
    mapped_end = max((v - lo + f) for v, f, _ in mapped for lo, hi in FLASH_WINDOWS if lo <= v < hi)
    flash = 24 + 8 * len(loads) + mapped_end + sum(f for _, f, _ in copied)
    secs = {s[0]: s[4] for s in sections(elf)}
    static = sum(secs.get(n, 0) for n in (".trap", ".rwtext", ".data", ".bss", ".noinit"))
    stack = secs.get(".stack", 0)
    print(f"flash {flash} of {args.partition} bytes ({100 * flash // args.partition}%), "
          f"RAM static {static} + stack {stack} bytes")
    if flash > args.partition:
        print(f"{args.elf}: the image ({flash} bytes) exceeds the partition ({args.partition})", file=sys.stderr)
        ok = False
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

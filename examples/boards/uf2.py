#!/usr/bin/env python3
"""Writes a UF2 image (what a Raspberry Pi Pico or Pico 2 in BOOTSEL mode takes as a USB
drive) from a firmware ELF, or from a raw file placed at an address.

usage: examples/boards/uf2.py --family rp2040|rp2350 ELF OUT.uf2
       examples/boards/uf2.py --family rp2040|rp2350 --base ADDR FILE OUT.uf2

The first form takes the ELF's loadable segments at their load addresses (flash only:
.data's initial values are there, RAM is not); the second places FILE's bytes at ADDR (a
model for the model slot: --base 0x10100000). Each 512-byte block carries 256 bytes of one
256-byte-aligned flash page (gaps within a page are zero), its address, its number, the
block count and the chip's family id (the UF2 spec, github.com/microsoft/uf2; family ids
from its uf2families.json): RP2040 0xe48bff56, RP2350 (Arm, secure) 0xe48bff59. Written
here rather than with elf2uf2-rs so CI needs no extra tool, and because elf2uf2-rs 2.2
knows only the RP2040.
"""
import argparse
import os
import struct
import sys

FAMILIES = {"rp2040": 0xE48BFF56, "rp2350": 0xE48BFF59}
FLASH = (0x1000_0000, 0x1100_0000)
PAGE = 256
MAGIC0, MAGIC1, MAGIC_END = 0x0A324655, 0x9E5D5157, 0x0AB16F30
FLAG_FAMILY_ID = 0x0000_2000


def elf_segments(data):
    """(address, bytes) of each PT_LOAD segment's file contents, at its physical address."""
    if data[:4] != b"\x7fELF" or data[4] != 1 or data[5] != 1:
        sys.exit("uf2.py: not a little-endian ELF32 file")
    phoff, = struct.unpack_from("<I", data, 28)
    phentsize, phnum = struct.unpack_from("<HH", data, 42)
    for i in range(phnum):
        p_type, offset, _vaddr, paddr, filesz = struct.unpack_from("<5I", data, phoff + i * phentsize)
        if p_type == 1 and filesz > 0:
            yield paddr, data[offset : offset + filesz]


def pages(segments):
    """The 256-byte flash pages the segments cover, by address, gaps zero-filled."""
    out = {}
    for addr, chunk in segments:
        if not (FLASH[0] <= addr and addr + len(chunk) <= FLASH[1]):
            sys.exit(f"uf2.py: {len(chunk)} bytes at {addr:#x} are not in flash")
        for i, b in enumerate(chunk):
            page = out.setdefault((addr + i) & ~(PAGE - 1), bytearray(PAGE))
            page[(addr + i) % PAGE] = b
    return sorted(out.items())


def uf2(pages, family):
    blocks = []
    for n, (addr, payload) in enumerate(pages):
        head = struct.pack("<8I", MAGIC0, MAGIC1, FLAG_FAMILY_ID, addr, PAGE, n, len(pages), family)
        blocks.append(head + payload + bytes(476 - PAGE) + struct.pack("<I", MAGIC_END))
    return b"".join(blocks)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--family", choices=FAMILIES, required=True)
    ap.add_argument("--base", type=lambda s: int(s, 0), help="place a raw file at this address")
    ap.add_argument("input")
    ap.add_argument("output")
    a = ap.parse_args()
    data = open(a.input, "rb").read()
    segments = [(a.base, data)] if a.base is not None else list(elf_segments(data))
    image = uf2(pages(segments), FAMILIES[a.family])
    # Written whole to a temporary name, then renamed: a failed run leaves no partial image.
    tmp = a.output + ".tmp"
    with open(tmp, "wb") as f:
        f.write(image)
    os.replace(tmp, a.output)
    print(f"uf2.py: {a.output}: {len(image) // 512} blocks ({a.family})", file=sys.stderr)


if __name__ == "__main__":
    main()

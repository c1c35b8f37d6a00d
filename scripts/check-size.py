#!/usr/bin/env python3
"""Lists functions longer than 80 lines and ISA kernel files longer than 800 in
kvm-core/src and kvm-runtime/src (STYLE rule 11: a function holds one level of the
story). Test code is left out: `tests.rs` files and items under `#[cfg(test)]`; so are
generated tables (a file whose first lines say it is generated). Exits 1 when it lists
anything, so the lint step can run it.

A function is counted from its `fn` line to its closing brace, found by matching braces
outside comments, strings and character literals (enough for this code base: no macro
defines a function's braces)."""
import pathlib
import re
import sys

MAX_FN = 80
MAX_ISA_FILE = 800
ROOTS = ["kvm-core/src", "kvm-runtime/src"]
# One file per ISA or a directory per ISA, as kernels/ lays them out.
ISA = re.compile(r"kvm-core/src/kernels/(x86_64/|aarch64/|arm/|riscv32\.rs)")
TEST_ATTR = re.compile(r"#\[cfg\((all\()?test\b")


def strip(text):
    """The text with comments, strings and char literals blanked (newlines kept), so
    that braces and keywords are only the code's."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif (m := re.match(r'b?r(#*)"', text[i:])) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = '"' + m.group(1)
            j = text.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(re.sub(r"[^\n]", " ", text[i : j + 1]))
            i = j + 1
        elif c == "'":
            # A char literal ('x', '\n', '\u{..}'), or a lifetime ('a) left as it is.
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", text[i:])
            if m:
                out.append(" " * m.end())
                i += m.end()
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def block_end(code, open_at):
    """Index just past the brace matching the `{` at open_at."""
    depth = 0
    for j in range(open_at, len(code)):
        if code[j] == "{":
            depth += 1
        elif code[j] == "}":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(code)


def item_body(code, start):
    """The `{` opening the body of the item starting at `start`, or None when a `;` at
    the top level ends it first (a declaration, `mod x;`)."""
    depth = 0
    for j in range(start, len(code)):
        c = code[j]
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        elif depth == 0 and c == ";":
            return None
        elif depth == 0 and c == "{":
            return j
    return None


def test_spans(code):
    """Character spans of items under #[cfg(test)]."""
    spans = []
    for m in TEST_ATTR.finditer(code):
        open_at = item_body(code, m.end())
        if open_at is not None:
            spans.append((m.start(), block_end(code, open_at)))
    return spans


def long_functions(path, code):
    line_of = lambda k: code.count("\n", 0, k) + 1
    skip = test_spans(code)
    for m in re.finditer(r"\bfn\s+([A-Za-z_][A-Za-z0-9_]*)", code):
        if any(a <= m.start() < b for a, b in skip):
            continue
        open_at = item_body(code, m.end())
        if open_at is None:
            continue
        first, last = line_of(m.start()), line_of(block_end(code, open_at) - 1)
        if last - first + 1 > MAX_FN:
            yield f"{path}:{first}: fn {m.group(1)} is {last - first + 1} lines (max {MAX_FN})"


def main():
    root = pathlib.Path(__file__).resolve().parent.parent
    found = []
    for top in ROOTS:
        for path in sorted((root / top).rglob("*.rs")):
            rel = path.relative_to(root).as_posix()
            text = path.read_text()
            if path.name == "tests.rs" or "generated" in "\n".join(text.splitlines()[:5]).lower():
                continue
            code = strip(text)
            found.extend(long_functions(rel, code))
            if ISA.match(rel):
                lines = text.count("\n")
                if lines > MAX_ISA_FILE:
                    found.append(f"{rel}: {lines} lines, an ISA file (max {MAX_ISA_FILE})")
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())

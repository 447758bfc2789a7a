#!/usr/bin/env python3
"""ncu_source_top.py — the instructions where a kernel's warps wait most, from an
`ncu --page source --print-source sass --csv` listing (run_all.sh part ncu_source).

usage: ncu_source_top.py FILE[.gz] [N]

Prints, per kernel listing in the file, the N (default 25) SASS instructions with the most warp
stall samples, their share of all samples, and the executed-instruction count when the listing
has one. The column names are found by their prefix, so minor ncu version differences in the
header do not matter."""
import csv
import gzip
import io
import sys


def open_text(path):
    if path.endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path), errors="replace")
    return open(path, errors="replace")


def listings(lines):
    """Yields (title, header, rows) for every CSV table whose header has a stall-sample column."""
    title, i = "", 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith('"'):
            if line.strip() and not line.startswith("=="):
                title = line.strip()
            i += 1
            continue
        header = next(csv.reader([line]))
        if header and header[0] == "Kernel Name" and len(header) > 1:
            title = header[1]
            i += 1
            continue
        if not any(h.startswith("Warp Stall Sampling") for h in header):
            i += 1
            continue
        rows, i = [], i + 1
        while i < len(lines) and lines[i].startswith('"'):
            rows.append(next(csv.reader([lines[i]])))
            i += 1
        yield title, header, rows


def number(s):
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 25
    lines = open_text(sys.argv[1]).read().splitlines()
    found = False
    for title, header, rows in listings(lines):
        found = True
        col = lambda prefix: next((k for k, h in enumerate(header) if h.startswith(prefix)), None)
        stall = col("Warp Stall Sampling (All")
        if stall is None:
            stall = col("Warp Stall Sampling")
        src, addr, execd = col("Source"), col("Address"), col("Instructions Executed")
        total = sum(number(r[stall]) for r in rows if len(r) > stall) or 1.0
        print(f"## {title or 'kernel'}: {len(rows)} instructions, {total:.0f} stall samples")
        ranked = sorted((r for r in rows if len(r) > stall), key=lambda r: -number(r[stall]))
        for r in ranked[:top]:
            share = 100.0 * number(r[stall]) / total
            where = r[addr] if addr is not None else ""
            ex = f" exec {r[execd]}" if execd is not None else ""
            print(f"{share:6.2f} %  {where:>8}  {r[src] if src is not None else ''}{ex}")
    if not found:
        sys.exit("no source listing with warp stall samples in " + sys.argv[1])


if __name__ == "__main__":
    main()

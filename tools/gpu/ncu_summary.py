#!/usr/bin/env python3
"""Per-kernel device time of one profiled decode step from an `ncu --csv --metrics
gpu__time_duration.sum,dram__bytes_read.sum` log (tools/gpu/run_all.sh, part ncu). The log may
hold several sections, each starting with a line "### <title>"; each is summarised by
(kernel, grid): launches, µs per step, mean µs per launch, DRAM MB read per step, GB/s, and the
section's totals (the sum of isolated kernel durations: no launch gaps, no PDL overlap)."""
import csv
import io
import re
import sys
from collections import defaultdict

UNIT_US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
UNIT_MB = {"byte": 1e-6, "B": 1e-6, "Kbyte": 1e-3, "KB": 1e-3, "Mbyte": 1.0, "MB": 1.0,
           "Gbyte": 1e3, "GB": 1e3}


def summarise(title, text):
    start = text.find('"ID"')
    print(f"## {title}")
    if start < 0:
        print("no ncu rows")
        return
    launches = defaultdict(dict)  # ID -> {name, grid, us, mb}
    for r in csv.DictReader(io.StringIO(text[start:])):
        try:
            v = float(r["Metric Value"].replace(",", ""))
        except (KeyError, ValueError, AttributeError):
            continue
        d = launches[r["ID"]]
        d["name"] = re.sub(r"\(.*", "", r.get("Kernel Name", "?"))[:44]
        d["grid"] = r.get("Grid Size", "")
        unit = r.get("Metric Unit", "")
        if r["Metric Name"] == "gpu__time_duration.sum":
            d["us"] = v * UNIT_US.get(unit, 1e-3)
        elif r["Metric Name"] == "dram__bytes_read.sum":
            d["mb"] = v * UNIT_MB.get(unit, 1e-6)
    acc = defaultdict(lambda: [0, 0.0, 0.0])
    for d in launches.values():
        a = acc[(d.get("name", "?"), d.get("grid", ""))]
        a[0] += 1
        a[1] += d.get("us", 0.0)
        a[2] += d.get("mb", 0.0)
    tot_us = sum(a[1] for a in acc.values())
    tot_mb = sum(a[2] for a in acc.values())
    print(f"{'kernel':44s} {'grid':>16s} {'n':>4s} {'us/step':>8s} {'us/call':>8s} {'MB/step':>8s} {'GB/s':>6s}")
    for (name, grid), (n, us, mb) in sorted(acc.items(), key=lambda kv: -kv[1][1]):
        gbs = mb / us * 1e3 if us > 0 else 0.0
        print(f"{name:44s} {grid:>16s} {n:4d} {us:8.1f} {us / n:8.2f} {mb:8.1f} {gbs:6.0f}")
    gbs = tot_mb / tot_us * 1e3 if tot_us > 0 else 0.0
    print(f"total: {len(launches)} launches, {tot_us:.1f} us of kernels, {tot_mb:.1f} MB read, {gbs:.0f} GB/s")


text = open(sys.argv[1], errors="replace").read()
parts = re.split(r"^### (.*)$", text, flags=re.M)
if len(parts) == 1:
    summarise("all", text)
else:
    for i in range(1, len(parts), 2):
        summarise(parts[i].strip(), parts[i + 1])

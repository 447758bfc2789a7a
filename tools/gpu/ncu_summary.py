#!/usr/bin/env python3
"""Per-kernel means from an `ncu --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,...`
log (tools/gpu/run_all.sh): kernel, launches, mean device µs, mean DRAM read MB, GB/s."""
import csv
import io
import sys
from collections import defaultdict

text = open(sys.argv[1], errors="replace").read()
start = text.find('"ID"')
if start < 0:
    print("no ncu rows")
    sys.exit(0)
rows = csv.DictReader(io.StringIO(text[start:]))
acc = defaultdict(lambda: defaultdict(list))
for r in rows:
    try:
        name = r["Kernel Name"].split("(")[0][:48]
        v = float(r["Metric Value"].replace(",", ""))
    except (KeyError, ValueError):
        continue
    unit = r.get("Metric Unit", "")
    metric = r["Metric Name"]
    if metric == "gpu__time_duration.sum":  # ncu writes "ns"/"us"/"ms" (older: "nsecond", ...)
        v = v * {"ns": 1e-3, "nsecond": 1e-3, "ms": 1e3, "msecond": 1e3}.get(unit, 1.0)
    elif metric == "dram__bytes_read.sum":
        scale = {"byte": 1e-6, "B": 1e-6, "Kbyte": 1e-3, "KB": 1e-3, "Mbyte": 1.0, "MB": 1.0,
                 "Gbyte": 1e3, "GB": 1e3}.get(unit, 1e-6)
        v = v * scale
    acc[name][metric].append(v)
print(f"{'kernel':48s} {'n':>4s} {'us':>8s} {'MB read':>9s} {'GB/s':>7s}")
for name, m in sorted(acc.items(), key=lambda kv: -sum(kv[1]["gpu__time_duration.sum"])):
    t = m["gpu__time_duration.sum"]
    b = m["dram__bytes_read.sum"]
    if not t:
        continue
    us = sum(t) / len(t)
    mb = sum(b) / len(b) if b else 0.0
    print(f"{name:48s} {len(t):4d} {us:8.2f} {mb:9.2f} {mb / us * 1e3:7.0f}")

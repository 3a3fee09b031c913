"""Sums an ncu CSV (--metrics gpu__time_duration.sum --csv) by kernel:
calls, total and mean device time, share of the whole, largest first.

    python3 ncusum.py PROFILE.csv [STEPS]

With STEPS (the decode steps profiled), also the device time per step."""
import csv
import sys
from collections import defaultdict


def main():
    rows = open(sys.argv[1], newline="").read().splitlines()
    start = next(i for i, r in enumerate(rows) if r.startswith('"ID"'))
    total, calls = defaultdict(float), defaultdict(int)
    for r in csv.DictReader(rows[start:]):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        v = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "nsecond")
        ns = v * {"nsecond": 1, "usecond": 1e3, "msecond": 1e6, "second": 1e9}.get(unit, 1)
        name = r["Kernel Name"][:90]
        total[name] += ns
        calls[name] += 1
    all_ns = sum(total.values())
    n = sum(calls.values())
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    print(f"{n} kernels, {all_ns / 1e6:.3f} ms of device time" +
          (f"; per step: {n / steps:.0f} kernels, {all_ns / 1e6 / steps:.3f} ms" if steps else ""))
    print("| kernel | calls | total ms | mean us | share |")
    print("|---|---|---|---|---|")
    for name, ns in sorted(total.items(), key=lambda kv: -kv[1])[:25]:
        print(f"| {name} | {calls[name]} | {ns / 1e6:.3f} | {ns / calls[name] / 1e3:.1f} | {100 * ns / all_ns:.1f}% |")


if __name__ == "__main__":
    main()

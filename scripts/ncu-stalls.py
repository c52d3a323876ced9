#!/usr/bin/env python3
"""Stall samples of one kernel by reason and its top instructions, from ncu's source page:
   ncu -i REPORT.ncu-rep --page source --csv --print-source sass > sass.csv
   python3 scripts/ncu-stalls.py sass.csv [TOP]
Offsets are from the kernel's first instruction, as scripts/sass.sh prints them (/*offset*/)."""
import csv
import sys


def main():
    rows = list(csv.reader(open(sys.argv[1])))
    top_n = int(sys.argv[2]) if len(sys.argv) > 2 else 25
    hdr = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    names, data = rows[hdr], [r for r in rows[hdr + 1:] if r and r[0].startswith("0x")]
    ix = {h: i for i, h in enumerate(names)}
    stalls = [h for h in names if h.startswith("stall_") and "Not Issued" not in h]
    samples = "Warp Stall Sampling (All Samples)"

    def num(r, k):
        try:
            return int(r[ix[k]])
        except (ValueError, KeyError):
            return 0

    total = sum(num(r, samples) for r in data) or 1
    print(f"total samples {total}")
    by_reason = {s: sum(num(r, s) for r in data) for s in stalls}
    for s, v in sorted(by_reason.items(), key=lambda x: -x[1])[:10]:
        print(f"{s:28s} {v:8d} {100 * v / total:5.1f}%")
    base = int(data[0][0], 16)
    for r in sorted(data, key=lambda r: -num(r, samples))[:top_n]:
        why = sorted(((num(r, s), s[6:]) for s in stalls if num(r, s)), reverse=True)[:3]
        print(f"{int(r[0], 16) - base:#7x} {num(r, samples):6d} {r[1].strip()[:58]:58s} {why}")


if __name__ == "__main__":
    main()

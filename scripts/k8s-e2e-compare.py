#!/usr/bin/env python3
"""Side by side, the specs of two scripts/k8s-e2e.sh reports (their results.tsv):

    scripts/k8s-e2e-compare.py REFERENCE-REPORT CORVID-REPORT

prints a Markdown table (spec, reference, corvid: passed/failed/skipped with seconds)
and a count per column, the table docs/kubernetes-e2e.md carries."""
import sys


def results(report):
    out = {}
    with open(f"{report}/results.tsv") as f:
        for line in f:
            status, name, secs = line.rstrip("\n").split("\t")
            out[name.removeprefix("[sig-network] ")] = (status, secs)
    return out


def cell(r):
    if r is None:
        return "not run"
    status, secs = r
    return status if status == "skipped" else f"{status} ({float(secs or 0):.0f} s)"


if len(sys.argv) != 3:
    sys.exit(__doc__)
ref, cv = results(sys.argv[1]), results(sys.argv[2])
print("| spec | reference | corvid |\n|---|---|---|")
for name in sorted(set(ref) | set(cv)):
    print(f"| {name.replace('|', '/')} | {cell(ref.get(name))} | {cell(cv.get(name))} |")
for label, r in (("reference", ref), ("corvid", cv)):
    counts = {s: sum(1 for v in r.values() if v[0] == s) for s in ("passed", "failed", "skipped")}
    print(f"\n{label}: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped", end="")
print()

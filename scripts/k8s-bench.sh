#!/usr/bin/env bash
# The real cluster's benchmarks, corvid against the reference stack in one run:
#
#   scripts/k8s-bench.sh [REPORT-DIR]
#
# Each stack in turn gets a fresh cluster from scripts/k8s-e2e.sh --bench (reference
# first, then corvid), which measures, as medians:
#   - pod startup: a Deployment of 100 replicas from apply to all Ready (3 rounds), beside
#     its floor, the same Deployment on the host's network (no CNI at all);
#   - service ready: a Service created until a pod's first connection through its
#     cluster IP (20 services).
# Then one table: both stacks, corvid/reference, and the floor.
set -euo pipefail

dir=$(cd "$(dirname "$0")" && pwd)
out=${1:-/tmp/cvbench-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"
for cni in reference corvid; do
    "$dir/k8s-e2e.sh" --cni "$cni" --bench --report "$out/$cni"
done
python3 - "$out" <<'EOF'
import sys

def read(stack):
    with open(f"{sys.argv[1]}/{stack}/bench.tsv") as f:
        return {k: float(v) for k, v in (line.split("\t") for line in f if line.strip())}

ref, cv = read("reference"), read("corvid")
floor = (ref["pod_startup_100_host_network_s"] + cv["pod_startup_100_host_network_s"]) / 2
print(f"{'':44} {'reference':>10} {'corvid':>10} {'corvid/ref':>11} {'floor':>10}")
print(f"{'100 pods, apply to all Ready (s, median of 3)':44} {ref['pod_startup_100_s']:10.2f} "
      f"{cv['pod_startup_100_s']:10.2f} {cv['pod_startup_100_s'] / ref['pod_startup_100_s']:11.3f} "
      f"{floor:10.2f}")
print(f"{'service created to connected (ms, p50 of 20)':44} {ref['service_ready_ms']:10.1f} "
      f"{cv['service_ready_ms']:10.1f} {cv['service_ready_ms'] / ref['service_ready_ms']:11.3f} "
      f"{'':>10}")
print("floor: the same 100 pods on the host's network (no CNI), mean of both runs")
EOF

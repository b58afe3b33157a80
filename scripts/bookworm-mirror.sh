#!/usr/bin/env bash
# Prints the Debian bookworm mirror this system's apt sources use (deb822 or one-line
# form), so the scripts that fetch from Debian use the same one; fails when there is none.
set -euo pipefail
mirror=""
if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    mirror=$(awk 'BEGIN{RS="";FS="\n"} /Suites:[^\n]*bookworm( |$|\n)/ && !/security/ {
        for (i = 1; i <= NF; i++) if ($i ~ /^URIs:/) { split($i, u, " "); print u[2]; exit } }' \
        /etc/apt/sources.list.d/debian.sources)
fi
if [ -z "$mirror" ] && [ -f /etc/apt/sources.list ]; then
    mirror=$(awk '$1 == "deb" && $3 == "bookworm" { print $2; exit }' /etc/apt/sources.list)
fi
[ -n "$mirror" ] || { echo "no bookworm mirror in the apt sources" >&2; exit 1; }
echo "$mirror"

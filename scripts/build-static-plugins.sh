#!/usr/bin/env bash
# Builds corvid's plugin binary as a static, fixed-address executable: the one that ships.
# Like the reference's Go plugins it needs no C library, so it runs when copied into any
# host's /opt/cni/bin whatever that host's glibc, and inside corvid's Kurma plugin image
# (`corvid kurma build-image --plugins PATH`), which has none. It also starts faster: no
# program interpreter loading libc, libm and libgcc_s before main, a third of the start
# of a dynamic build. Host names still resolve from /etc/hosts and DNS, which glibc
# builds into its static library, as the reference's Go resolver does. Prints its path.
#
# By default with the `image` profile (unoptimized, quick to build: what the tests use);
# `--release` for the package, a production image or the benchmarks.
set -euo pipefail
cd "$(dirname "$0")/.."
target=x86_64-unknown-linux-gnu
profile=image
[ "${1:-}" = --release ] && profile=release
# An explicit --target keeps these flags off build scripts and proc macros, which must
# stay dynamic.
RUSTFLAGS="-C target-feature=+crt-static -C relocation-model=static" \
    cargo build --profile "$profile" --quiet -p corvid-plugins --target "$target"
echo "$PWD/target/$target/$profile/corvid-plugins"

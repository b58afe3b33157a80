#!/usr/bin/env bash
# Builds corvid's plugin binary as a static, fixed-address executable: the one that ships.
# Like the reference's Go plugins it needs no C library, so it runs when copied into any
# host's /opt/cni/bin whatever that host's libc, and inside corvid's Kurma plugin image
# (`corvid kurma build-image --plugins PATH`), which has none. Prints its path.
#
# It links musl, not glibc: glibc's start-up reads the CPU's cache sizes with a few dozen
# CPUID instructions, each a trap to the hypervisor on a virtual machine, and every plugin
# run pays them (here 0.5 ms of a 1.2 ms start; musl's starts in 0.7 ms). Host names still
# resolve from /etc/hosts and DNS, as the reference's Go resolver does them. The musl
# target comes from rustup and ring's C from musl-gcc (Debian's musl-tools); without them
# the binary links glibc statically instead, and a line on stderr says so.
#
# By default with the `image` profile (unoptimized, quick to build: what the tests use);
# `--release` for the package, a production image or the benchmarks: the `plugins` profile,
# release optimized for size (see Cargo.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
profile=image
[ "${1:-}" = --release ] && profile=plugins
target=x86_64-unknown-linux-musl
if ! command -v musl-gcc >/dev/null \
    || ! { rustup target list --installed 2>/dev/null | grep -qx "$target" \
        || rustup target add "$target" >&2; }; then
    echo "build-static-plugins: no musl target or musl-gcc; linking glibc statically" >&2
    target=x86_64-unknown-linux-gnu
fi
# An explicit --target keeps these flags off build scripts and proc macros, which must
# stay dynamic.
CC_x86_64_unknown_linux_musl=musl-gcc \
    RUSTFLAGS="-C target-feature=+crt-static -C relocation-model=static" \
    cargo build --profile "$profile" --quiet -p corvid-plugins --target "$target"
echo "$PWD/target/$target/$profile/corvid-plugins"

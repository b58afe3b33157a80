#!/usr/bin/env bash
# Builds corvid's plugin binary as a static, fixed-address executable, which corvid's
# Kurma plugin image carries (`corvid kurma build-image --plugins PATH`): the image has no
# C library, so the program must need none. Prints its path.
#
# By default with the `image` profile (unoptimized, quick to build: what the tests use);
# `--release` for a production image or the benchmark.
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

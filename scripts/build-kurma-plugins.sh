#!/usr/bin/env bash
# Builds corvid's plugin binary as a static, fixed-address executable, which corvid's
# Kurma plugin image carries (`corvid kurma build-image --plugins PATH`): the image has no
# C library, so the program must need none. Prints its path.
set -euo pipefail
cd "$(dirname "$0")/.."
target=x86_64-unknown-linux-gnu
# An explicit --target keeps these flags off build scripts and proc macros, which must
# stay dynamic.
RUSTFLAGS="-C target-feature=+crt-static -C relocation-model=static" \
    cargo build --release --quiet -p corvid-plugins --target "$target"
echo "$PWD/target/$target/release/corvid-plugins"

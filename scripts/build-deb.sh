#!/usr/bin/env bash
# Builds corvid's Debian package from packaging/ and prints its path.
#   scripts/build-deb.sh [--bin-dir DIR] [--plugins PATH] [--out DIR]
# --bin-dir: where `corvid` is (by default the release build, made first); --plugins: the
# plugin binary (by default the static release build of scripts/build-static-plugins.sh,
# made first; with --bin-dir, the corvid-plugins there); --out: where the .deb goes
# (target/deb). CORVID_DEB_COMPRESSION: xz (the default), gzip or none (the tests, whose
# debug binaries are large). Only dpkg-deb is needed: the layout is assembled here rather
# than by cargo-deb, one more tool to build.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=""
plugin_bin=""
out=target/deb
while [ $# -gt 0 ]; do
    case "$1" in
        --bin-dir) bin=$2; shift 2 ;;
        --plugins) plugin_bin=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        *) echo "usage: $0 [--bin-dir DIR] [--plugins PATH] [--out DIR]" >&2; exit 2 ;;
    esac
done
if [ -z "$bin" ]; then
    cargo build --release -p corvid >&2
    bin=target/release
    [ -n "$plugin_bin" ] || plugin_bin=$(scripts/build-static-plugins.sh --release)
fi
[ -n "$plugin_bin" ] || plugin_bin=$bin/corvid-plugins

version=$("$bin/corvid" --version | awk '{print $2}')
arch=$(dpkg --print-architecture)
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
pkg=$root/corvid

install -D -m 0755 "$bin/corvid" "$pkg/usr/bin/corvid"
# The plugin binary and one link per plugin name; the postinst offers each at /opt/cni/bin.
"$bin/corvid" cni install --dir "$pkg/usr/lib/corvid/cni" --from "$plugin_bin" >/dev/null
plugins=$(cd "$pkg/usr/lib/corvid/cni" && find . -type l -printf '%f\n' | sort | tr '\n' ' ')

for unit in packaging/systemd/*; do
    install -D -m 0644 "$unit" "$pkg/lib/systemd/system/$(basename "$unit")"
done
for env in packaging/etc/*.env; do
    install -D -m 0644 "$env" "$pkg/etc/corvid/$(basename "$env")"
done

"$bin/corvid" generate-docs --out "$root/docs"
for page in "$root"/docs/man/*.1; do
    install -D -m 0644 "$page" "$pkg/usr/share/man/man1/$(basename "$page")"
    gzip -9n "$pkg/usr/share/man/man1/$(basename "$page")"
done
install -D -m 0644 "$root/docs/completions/corvid" "$pkg/usr/share/bash-completion/completions/corvid"
install -D -m 0644 "$root/docs/completions/_corvid" "$pkg/usr/share/zsh/vendor-completions/_corvid"
install -D -m 0644 "$root/docs/completions/corvid.fish" "$pkg/usr/share/fish/vendor_completions.d/corvid.fish"
install -d "$pkg/usr/share/doc/corvid"
printf 'corvid\n\nLicense: Apache-2.0\nOn Debian systems, see /usr/share/common-licenses/Apache-2.0.\n' \
    > "$pkg/usr/share/doc/corvid/copyright"

install -d "$pkg/DEBIAN"
sed -e "s/@VERSION@/$version/" -e "s/@ARCH@/$arch/" packaging/debian/control > "$pkg/DEBIAN/control"
echo "Installed-Size: $(du -sk --exclude=DEBIAN "$pkg" | cut -f1)" >> "$pkg/DEBIAN/control"
for script in postinst prerm postrm; do
    sed "s/@PLUGINS@/$plugins/" "packaging/debian/$script" > "$pkg/DEBIAN/$script"
    chmod 0755 "$pkg/DEBIAN/$script"
done
(cd "$pkg" && find etc -type f -printf '/%p\n' | sort) > "$pkg/DEBIAN/conffiles"

mkdir -p "$out"
deb="$out/corvid_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Z"${CORVID_DEB_COMPRESSION:-xz}" --build "$pkg" "$deb" >&2
realpath "$deb"

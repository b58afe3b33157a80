#!/usr/bin/env bash
# Runs every check and test of corvid, installing what they need first. Run as root:
# the tests create network namespaces (named cvt*) and remove them again.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
    echo "scripts/test.sh: run as root (the tests create network namespaces)" >&2
    exit 1
fi

# CI builds once from clean: incremental state would only take disk.
export CARGO_INCREMENTAL=0

need=()
command -v nft >/dev/null || need+=(nftables)
# The firewall and masquerade tests write Docker's rules with iptables-nft, and the
# reference plugins the tests run beside corvid's need iptables; nsenter (util-linux)
# reaches a CRI pod's namespace.
command -v iptables-nft >/dev/null || need+=(iptables)
command -v nsenter >/dev/null || need+=(util-linux)
[ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
command -v ping >/dev/null || need+=(iputils-ping)
{ command -v ip && command -v bridge; } >/dev/null || need+=(iproute2)
command -v podman >/dev/null || need+=(podman)
command -v runc >/dev/null || need+=(runc)
[ -x /usr/bin/busybox ] || need+=(busybox-static)
command -v etcd >/dev/null || need+=(etcd-server)
[ -x /usr/sbin/dockerd ] || need+=(docker.io)
command -v python3 >/dev/null || need+=(python3 python3-pip)
command -v openssl >/dev/null || need+=(openssl)
# containerd's CRI plugin and runc for the Kubernetes node tests; protoc builds the CRI protos.
command -v containerd >/dev/null || need+=(containerd)
command -v protoc >/dev/null || need+=(protobuf-compiler)
# The Kurma fetch tests pull from Debian's registry and sign images with gpg.
command -v docker-registry >/dev/null || need+=(docker-registry)
command -v gpg >/dev/null || need+=(gnupg)
# The package test installs corvid's .deb into a clean Debian root and checks its units
# with systemd-analyze; the Docker driver's socket activation runs under
# systemd-socket-activate.
command -v debootstrap >/dev/null || need+=(debootstrap)
# The dhcp plugin's tests get leases from dnsmasq in a namespace.
command -v dnsmasq >/dev/null || need+=(dnsmasq-base)
command -v cpio >/dev/null || need+=(cpio)
# The real cluster's stand-in DNS (scripts/testing/cluster_dns.py), tested on the API server.
/usr/bin/python3 -c 'import dnslib' 2>/dev/null || need+=(python3-dnslib)
# The static plugin binary links musl (scripts/build-static-plugins.sh); ring's C needs
# musl-gcc.
command -v musl-gcc >/dev/null || need+=(musl-tools)
command -v systemd-socket-activate >/dev/null || need+=(systemd)
# The routers benchmark's throughput (benches are not run here; installed for them).
command -v iperf3 >/dev/null || need+=(iperf3)
# The ipvlan, vlan, dummy and vrf tests run in a VM (this kernel lacks those modules);
# qemu's recommends (a desktop's worth) are not needed for a serial console.
if ! command -v qemu-system-x86_64 >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    apt-get install -y --no-install-recommends qemu-system-x86
fi
if [ ${#need[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    apt-get install -y "${need[@]}"
fi
# The API fuzz test (crates/corvid/tests/api_fuzz.rs) drives schemathesis, and
# crates/corvid/tests/openstack_clients.rs the real OpenStack clients.
if ! command -v schemathesis >/dev/null \
    || ! python3 -c 'import neutronclient, openstack' 2>/dev/null; then
    py=(schemathesis==4.32.5 python-neutronclient==14.0.0 openstacksdk==4.22.0)
    python3 -m pip install --quiet --break-system-packages "${py[@]}" 2>/dev/null \
        || python3 -m pip install --quiet "${py[@]}"
    hash -r
    command -v schemathesis >/dev/null || {
        echo "scripts/test.sh: schemathesis installed but not on PATH ($PATH)" >&2
        exit 1
    }
fi

# The Kubernetes tests (crates/corvid/tests/kubernetes/) run a real kube-apiserver and
# kube-controller-manager 1.20:
# built from Debian's source package once, cached outside the checkout.
scripts/build-kube.sh

# The package test (crates/corvid/tests/package.rs) installs into a clean root: Debian's
# minimal base with systemd, made once by debootstrap and cached outside the checkout.
debroot=/var/cache/corvid-debroot
if [ ! -e "$debroot/lib/systemd/system/sysinit.target" ]; then
    rm -rf "$debroot.tmp"
    debootstrap --variant=minbase --include=systemd bookworm "$debroot.tmp" \
        "$(scripts/bookworm-mirror.sh)"
    rm -rf "$debroot"
    mv "$debroot.tmp" "$debroot"
fi

# The VM of crates/corvid-plugins/tests/link_kinds.rs boots Debian's kernel with the
# modules of the link kinds it tests: taken from the linux-image package once, cached.
vmkernel=/var/cache/corvid-vmkernel
if [ ! -e "$vmkernel/modules/order" ]; then
    deb=$(mktemp -d)
    image=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-/ {print $2; exit}')
    (cd "$deb" && { apt-get download "$image" 2>/dev/null \
        || { apt-get update && apt-get download "$image"; }; })
    dpkg-deb -x "$deb"/*.deb "$deb/root"
    rm -rf "$vmkernel.tmp" && mkdir -p "$vmkernel.tmp/modules"
    cp "$deb"/root/boot/vmlinuz-* "$vmkernel.tmp/vmlinuz"
    # Dependencies first: 8021q needs mrp and garp, garp needs stp, stp needs llc.
    order="llc stp garp mrp 8021q ipvlan macvlan vrf veth dummy"
    for m in $order; do
        cp "$(find "$deb/root/lib/modules" -name "$m.ko" | head -1)" "$vmkernel.tmp/modules/"
    done
    echo "$order" > "$vmkernel.tmp/modules/order"
    rm -rf "$vmkernel" "$deb"
    mv "$vmkernel.tmp" "$vmkernel"
fi

# The Kurma tests check corvid's plugin image with appc's actool: Debian's appc-spec,
# unpacked (not installed: it depends on golang-go), cached outside the checkout.
actool=/var/cache/corvid-appc/usr/bin/actool
if [ ! -x "$actool" ]; then
    deb=$(mktemp -d)
    (cd "$deb" && { apt-get download appc-spec 2>/dev/null \
        || { apt-get update && apt-get download appc-spec; }; })
    dpkg-deb -x "$deb"/appc-spec_*.deb /var/cache/corvid-appc
    rm -rf "$deb"
fi
export CORVID_ACTOOL=$actool
# The static plugin binary, the one that ships: the plugins' tests run it, the Kurma
# tests (crates/corvid/tests/kurma.rs) put it in an image, the package test installs it.
CORVID_STATIC_PLUGINS=$(scripts/build-static-plugins.sh)
export CORVID_STATIC_PLUGINS

cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# A node-only `corvid`, without the Docker, Kubernetes and Kurma adapters, still builds.
cargo clippy -p corvid --no-default-features -- -D warnings
# The oldest Rust that Cargo.toml's rust-version promises, checked rather than assumed
# (kube's crates set the floor): its toolchain from rustup, where rustup can get it.
msrv=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
if rustup toolchain install "$msrv" --profile minimal >/dev/null 2>&1; then
    cargo +"$msrv" check --workspace --all-targets --locked
else
    echo "scripts/test.sh: rustup cannot install Rust $msrv here: rust-version not checked" >&2
fi
cargo test --workspace
# Kubernetes' own e2e suite on a real two-node cluster running corvid: a handful of its
# fastest networking specs (the full runs, both stacks: docs/kubernetes-e2e.md). It builds
# the nodes' and the suite's binaries (6 minutes cold on 2 cores, cached) and runs in
# about 2.
scripts/k8s-e2e.sh --cni corvid --smoke

#!/usr/bin/env bash
# A real Kubernetes 1.20 cluster on this machine, and Kubernetes' own e2e suite run on it.
#
#   scripts/k8s-e2e.sh --cni corvid|reference [--focus RE] [--skip RE] [--nodes N]
#                      [--parallel N] [--report DIR] [--keep] [--bench] [--smoke]
#
# The cluster: a control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler) in the network namespace cvte2e-lan, and N worker nodes (default 2),
# each a network namespace cvte2e-nK on the lan's bridge, with a real kubelet and its own
# containerd (CRI), runc, cgroup root, kubelet directory and CNI configuration. What the
# two modes add:
#   corvid     corvid's controller and `kube-watch` on the lan, an agent per node, the
#              `corvid-k8s` plugin; no kube-proxy (corvid's datapath serves services).
#   reference  Debian's bridge, host-local and portmap plugins, a pod /24 per node routed
#              between nodes, and kube-proxy (iptables mode) per node.
# Both have the same stand-in for the cluster's DNS (scripts/testing/cluster_dns.py).
# Then `e2e.test` runs from the lan with --focus (default: the sig-network conformance
# tests) and --skip (default: what needs what this machine cannot have; see DEFAULT_SKIP),
# and a table of the tests (passed, failed, skipped) is printed. --parallel N runs N specs
# at a time (ginkgo's -nodes, as upstream's CI does; [Serial] specs are then skipped). The JUnit file and every
# component's log stay in --report (default /tmp/cvte2e-<cni>-<time>). Everything started
# is stopped at the end, also when interrupted; --keep leaves the cluster up until Enter.
# --smoke runs SMOKE_FOCUS below, a handful of the fastest specs, two at a time: what
# scripts/test.sh runs against corvid. --bench measures instead of testing (see bench() below; scripts/k8s-bench.sh runs it on
# both stacks and compares).
#
# Nothing touches the machine's own network: every link, route, bridge and firewall rule
# lives in the cvte2e namespaces. Each node's processes run in a mount namespace of their
# own, where the kubelet's fixed paths (/var/lib/kubelet, /var/log/pods) are private
# directories and the kernel settings the kubelet insists on (vm.overcommit_memory,
# kernel.panic, kernel.panic_on_oops) read as it wants them, so it writes none of the
# machine's. Binaries: scripts/build-kube.sh all (cached; on 2 cores 8-10 minutes for the
# control plane, 11 more for the nodes' and the suite's), the offline images below
# (cached), and corvid's from this checkout (cargo build).
set -euo pipefail

# The whole script is one block, read before it runs: a run keeps going as it started
# when the file is edited meanwhile.
{
ROOT=$(cd "$(dirname "$0")/.." && pwd)
KUBE=${KUBE_CACHE:-/var/cache/kube-1.20}
IMAGES=${E2E_IMAGE_CACHE:-/var/cache/corvid-e2e-images}

# DNS needs CoreDNS, which no registry here offers; the rest need what a machine of
# this kind cannot have (a cloud's load balancers, features the cluster was not built
# with, tests that break nodes on purpose, IPv6 nodes).
DEFAULT_SKIP='\[sig-network\] DNS|\[Feature:|\[Disruptive\]|\[Flaky\]|LoadBalancer|load balancer|ESIPP|IPv6'
DEFAULT_FOCUS='\[sig-network\].*\[Conformance\]'
# Pod to pod across nodes, a cluster IP, a node port, a pod through its own service, the
# client's address kept, a NetworkPolicy, conntrack's CLOSE_WAIT: each passed in under
# 30 s on 2 cores.
SMOKE_FOCUS='Pods should function for intra-pod communication: http \[NodeConformance\] \[Conformance\]|'\
'Services should serve a basic endpoint from pods +\[Conformance\]|'\
'Services should be able to create a functioning NodePort service \[Conformance\]|'\
'Services should allow pods to hairpin back to themselves through services|'\
'Services should preserve source pod IP for traffic thru service cluster IP|'\
"should support a 'default-deny-ingress' policy|"\
'KubeProxy should set TCP CLOSE_WAIT timeout'

CNI=
FOCUS=$DEFAULT_FOCUS
SKIP=$DEFAULT_SKIP
NODES=2
PARALLEL=1
REPORT=
KEEP=
BENCH=
while [ $# -gt 0 ]; do
    case "$1" in
        --cni) CNI=$2; shift 2 ;;
        --focus) FOCUS=$2; shift 2 ;;
        --skip) SKIP=$2; shift 2 ;;
        --nodes) NODES=$2; shift 2 ;;
        --parallel) PARALLEL=$2; shift 2 ;;
        --report) REPORT=$2; shift 2 ;;
        --keep) KEEP=1; shift ;;
        --bench) BENCH=1; shift ;;
        --smoke) FOCUS=$SMOKE_FOCUS; SKIP='\[Disruptive\]|\[Flaky\]'; PARALLEL=2; shift ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "k8s-e2e: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
case "$CNI" in
    corvid | reference) ;;
    *) echo "k8s-e2e: --cni corvid or --cni reference (see --help)" >&2; exit 2 ;;
esac
[ "$(id -u)" = 0 ] || { echo "k8s-e2e: run as root (namespaces, cgroups, containerd)" >&2; exit 2; }

START=$(date +%s)
say() { echo "[k8s-e2e $(( $(date +%s) - START ))s] $*"; }
die() { echo "k8s-e2e: $*" >&2; exit 1; }

REPORT=${REPORT:-/tmp/cvte2e-$CNI-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$REPORT"
REPORT=$(cd "$REPORT" && pwd)

LAN_NS=cvte2e-lan
LAN_IP=10.97.0.254
SERVICE_CIDR=10.96.0.0/16
KUBERNETES_SVC=10.96.0.1
CLUSTER_DNS=10.96.0.10
node_ns() { echo "cvte2e-n$1"; }
node_ip() { echo "10.97.0.$1"; }
node_name() { echo "n$1"; }
# The reference stack's pods: a /24 per node.
node_pod_cidr() { echo "10.244.$1.0/24"; }
# corvid's namespaces' networks are carved from this pool, as kube-watch's --pod-pool.
CORVID_POD_POOL=10.128.0.0/9

PIDS=()
# ---------------------------------------------------------------------------------------
# Teardown: the workloads first (the kubelets' cgroups hold every container process),
# then the daemons by their PIDs, then namespaces, mounts and cgroups.
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    # A step that fails must not end the teardown: the rest still has to go.
    set +e
    if [ -n "$KEEP" ] && [ -t 0 ]; then
        echo "k8s-e2e: the cluster is up (kubeconfig $WORK/admin.conf, run kubectl in: nsenter --net=/run/netns/$LAN_NS); Enter stops it"
        read -r _ || true
    fi
    say "stopping everything"
    local i pid children=()
    # ginkgo's workers, which it may leave running when it is stopped.
    for pid in "${PIDS[@]}"; do
        children+=($(cat /proc/"$pid"/task/*/children 2>/dev/null))
    done
    for ((pid = ${#PIDS[@]} - 1; pid >= 0; pid--)); do
        kill -TERM "${PIDS[pid]}" 2>/dev/null || true
    done
    sleep 1
    for pid in "${PIDS[@]}" "${children[@]}" $(cat "$WORK"/n*/containerd.pid 2>/dev/null); do
        kill -KILL "$pid" 2>/dev/null || true
    done
    for i in $(seq 1 "$NODES"); do
        kill_shims "$WORK/n$i/containerd.sock"
        kill_cgroup "/cvte2e-n$i"
        remove_cgroup "/cvte2e-n$i"
    done
    local m
    for m in $(awk -v w="$WORK" 'index($2, w) == 1 { print $2 }' /proc/self/mounts | sort -r); do
        umount -l "$m" 2>/dev/null || true
    done
    for i in $(seq 1 "$NODES"); do ip netns del "$(node_ns "$i")" 2>/dev/null || true; done
    ip netns del "$LAN_NS" 2>/dev/null || true
    cp -f "$WORK"/*.log "$REPORT/" 2>/dev/null || true
    for i in $(seq 1 "$NODES"); do
        for f in "$WORK/n$i"/*.log; do
            [ -e "$f" ] && cp -f "$f" "$REPORT/n$i-$(basename "$f")"
        done
    done
    rm -rf "$WORK" 2>/dev/null || { sleep 2; rm -rf "$WORK" 2>/dev/null || true; }
    say "done; logs and JUnit in $REPORT"
    exit "$rc"
}
# Before the teardown is armed: it removes namespaces, cgroups and mounts by name, which
# would be another run's.
for i in $(seq 1 "$NODES"); do
    ip netns list | grep -qw "$(node_ns "$i")" && die "namespace $(node_ns "$i") exists: another run is going on"
done
ip netns list | grep -qw "$LAN_NS" && die "namespace $LAN_NS exists: another run is going on"
WORK=$(mktemp -d /tmp/cvte2e.XXXXXX)
trap cleanup EXIT
trap 'exit 130' INT TERM

# Every process left in a cgroup tree (container processes outlive a killed shim).
kill_cgroup() {
    local f pid
    for f in $(find /sys/fs/cgroup/pids"$1" -name cgroup.procs 2>/dev/null); do
        while read -r pid; do kill -KILL "$pid" 2>/dev/null || true; done <"$f"
    done
}
remove_cgroup() {
    local h
    for h in /sys/fs/cgroup/*/; do
        [ -d "$h${1#/}" ] && find "$h${1#/}" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    done
}
# The shims serving the containerd at socket $1, by the -address they were given.
kill_shims() {
    local p
    for p in /proc/[0-9]*; do
        { tr '\0' ' ' <"$p/cmdline" | grep -q "containerd-shim-runc-v2 .*-address $1 " \
            && kill -KILL "${p#/proc/}"; } 2>/dev/null || true
    done
}

# Runs "$2..." in the background with its output in the file $1, recording its PID for
# the teardown (nsenter and unshare exec what they run, so the PID is the daemon's).
spawn() {
    local log=$1
    shift
    "$@" >"$log" 2>&1 &
    PIDS+=($!)
    # The teardown kills it: no job report.
    disown $!
}
LAN=(nsenter --net="/run/netns/$LAN_NS")
in_lan() { "${LAN[@]}" "$@"; }
k() { in_lan kubectl "$@"; }
wait_for() {
    local what=$1 secs=$2
    shift 2
    local until=$(($(date +%s) + secs))
    until "$@" >/dev/null 2>&1; do
        [ "$(date +%s)" -lt "$until" ] || die "$what: not within ${secs}s (logs in $REPORT)"
        sleep 0.5
    done
}

# ---------------------------------------------------------------------------------------
# What the run needs.
need=()
for c in etcd:etcd-server containerd:containerd runc:runc kubectl:kubernetes-client \
    openssl:openssl conntrack:conntrack iptables:iptables bc:bc; do
    command -v "${c%%:*}" >/dev/null || need+=("${c#*:}")
done
[ -x /usr/bin/busybox ] || need+=(busybox-static)
[ -x /usr/bin/curl ] || need+=(curl)
[ -x /bin/nc.openbsd ] || need+=(netcat-openbsd)
[ -x /usr/bin/wget ] || need+=(wget)
/usr/bin/python3 -c 'import dnslib' 2>/dev/null || need+=(python3-dnslib)
[ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
if [ ${#need[@]} -gt 0 ]; then
    say "installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q "${need[@]}" >/dev/null
fi
"$ROOT/scripts/build-kube.sh" all
for b in kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubelet agnhost regression-issue-74839 e2e.test ginkgo; do
    [ -x "$KUBE/$b" ] || die "$KUBE/$b is missing"
done
if [ "$CNI" = corvid ]; then
    say "building corvid"
    (cd "$ROOT" && cargo build -q -p corvid -p corvid-plugins)
    CORVID=$ROOT/target/debug/corvid
fi

# ---------------------------------------------------------------------------------------
# Images, offline: OCI archives of one layer each, under the names the suite asks for
# (test/utils/image/manifest.go), cached by the builds they carry.

# oci_archive NAME ROOTFS ENTRYPOINT-JSON CMD-JSON OUT
oci_archive() {
    local name=$1 rootfs=$2 entry=$3 cmd=$4 out=$5 d
    d=$(mktemp -d "$WORK/oci.XXXXXX")
    mkdir -p "$d/layout/blobs/sha256"
    tar -C "$rootfs" -cf "$d/layer.tar" .
    blob() {
        local sum
        sum=$(sha256sum "$1" | cut -d' ' -f1)
        cp "$1" "$d/layout/blobs/sha256/$sum"
        echo "sha256:$sum $(stat -c %s "$1")"
    }
    local layer config manifest
    layer=$(blob "$d/layer.tar")
    printf '{"architecture":"amd64","os":"linux","config":{"Entrypoint":%s,"Cmd":%s,"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]},"rootfs":{"type":"layers","diff_ids":["%s"]}}' \
        "$entry" "$cmd" "${layer% *}" >"$d/config.json"
    config=$(blob "$d/config.json")
    printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"%s","size":%s}]}' \
        "${config% *}" "${config#* }" "${layer% *}" "${layer#* }" >"$d/manifest.json"
    manifest=$(blob "$d/manifest.json")
    printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"%s","size":%s,"annotations":{"io.containerd.image.name":"%s"}}]}' \
        "${manifest% *}" "${manifest#* }" "$name" >"$d/layout/index.json"
    echo '{"imageLayoutVersion":"1.0.0"}' >"$d/layout/oci-layout"
    tar -C "$d/layout" -cf "$out.new" .
    mv -f "$out.new" "$out"
    rm -rf "$d"
}

# A root with busybox's applets in /bin, and the programs named (PATH, or PATH:AS) with
# the libraries they load.
rootfs_with() {
    local root=$1 p lib
    shift
    mkdir -p "$root/bin" "$root/etc" "$root/tmp" "$root/usr/bin"
    cp /usr/bin/busybox "$root/bin/busybox"
    for p in $(/usr/bin/busybox --list); do
        [ -e "$root/bin/$p" ] || ln -s busybox "$root/bin/$p"
    done
    for p in "$@"; do
        rm -f "$root${p#*:}"
        cp -L "${p%%:*}" "$root${p#*:}"
        p=${p%%:*}
        for lib in $(ldd "$p" 2>/dev/null | grep -o '/[^ ]*'); do
            mkdir -p "$root$(dirname "$lib")"
            cp -L "$lib" "$root$lib"
        done
    done
    # curl's certificates are not needed: the suite's requests are plain HTTP.
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$root/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
    echo 'hosts: files dns' >"$root/etc/nsswitch.conf"
}

images() {
    local stamp want
    want="$(cat "$KUBE/agnhost" "$KUBE/regression-issue-74839" /usr/bin/busybox "$(command -v conntrack)" | sha256sum | cut -c1-16) 9"
    stamp=$IMAGES/.stamp
    if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then return; fi
    say "building the offline images in $IMAGES"
    mkdir -p "$IMAGES"
    local r=$WORK/rootfs
    rm -rf "$r" && mkdir -p "$r"
    rootfs_with "$r/pause"
    oci_archive k8s.gcr.io/pause:3.2 "$r/pause" '["/bin/sleep","2147483647"]' 'null' "$IMAGES/pause.tar"
    # Debian's static busybox crashes in its wget applet (a static glibc's name lookup):
    # GNU wget stands in for it, in this image and agnhost's.
    rootfs_with "$r/busybox" /usr/bin/wget:/bin/wget
    oci_archive docker.io/library/busybox:1.29 "$r/busybox" 'null' '["sh"]' "$IMAGES/busybox.tar"
    # agnhost as upstream's image has it (test/images/agnhost/Dockerfile): the binary at
    # /agnhost (and agnhost-2), curl, bash, ip, an nc that scans (-z), which busybox's
    # does not, a shell that runs it (Debian's busybox shell runs its own applets before
    # anything in PATH), /uploads, and the certificate porter serves TLS with; and a
    # date that tells nanoseconds, for --bench.
    rootfs_with "$r/agnhost" /usr/bin/curl /bin/nc.openbsd:/bin/nc /bin/dash:/bin/sh \
        /bin/bash /bin/ip /bin/date /usr/bin/wget:/bin/wget
    cp "$KUBE/agnhost" "$r/agnhost/agnhost"
    ln -s agnhost "$r/agnhost/agnhost-2"
    mkdir -p "$r/agnhost/uploads"
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj /CN=localhost \
        -keyout "$r/agnhost/localhost.key" -out "$r/agnhost/localhost.crt" >/dev/null 2>&1
    oci_archive k8s.gcr.io/e2e-test-images/agnhost:2.21 "$r/agnhost" '["/agnhost"]' '["pause"]' "$IMAGES/agnhost.tar"
    # A stand-in for nginx, whose pods the EndpointSlice specs only need running and
    # serving on 80: agnhost's HTTP server.
    oci_archive docker.io/library/nginx:1.14-alpine "$r/agnhost" '["/agnhost"]' '["netexec","--http-port=80"]' "$IMAGES/nginx.tar"
    # The server of the connection-reset regression spec, built from the same source.
    rootfs_with "$r/regression"
    cp "$KUBE/regression-issue-74839" "$r/regression/regression-issue-74839"
    # The source is that of the image's 1.2, which reads the pod's address from POD_IP;
    # the suite asks for 1.0, which found it itself, and sets no POD_IP. So the
    # entrypoint finds it and passes it on.
    oci_archive gcr.io/kubernetes-e2e-test-images/regression-issue-74839-amd64:1.0 "$r/regression" \
        '["/bin/sh","-c","POD_IP=$(ip -4 addr show dev eth0 | awk '"'"'/inet /{split($2,a,\"/\"); print a[1]}'"'"'); export POD_IP; exec /regression-issue-74839"]' \
        'null' "$IMAGES/regression-issue-74839.tar"
    # The KubeProxy CLOSE_WAIT spec reads the node's conntrack table from a host-network
    # pod of this image, with conntrack and grep: Debian's conntrack, busybox's grep.
    rootfs_with "$r/iptables" "$(command -v conntrack):/bin/conntrack"
    oci_archive k8s.gcr.io/build-image/debian-iptables:buster-v1.3.0 "$r/iptables" 'null' '["sh"]' \
        "$IMAGES/debian-iptables.tar"
    rm -rf "$r"
    echo "$want" >"$stamp"
}
images

# ---------------------------------------------------------------------------------------
# The network: the lan namespace with a bridge, each node's eth0 on it.
ip netns add "$LAN_NS"
in_lan ip link set lo up
in_lan ip link add cvtlan type bridge
in_lan ip addr add "$LAN_IP/24" dev cvtlan
in_lan ip link set cvtlan up
in_lan sysctl -qw net.ipv4.ip_forward=1
for i in $(seq 1 "$NODES"); do
    ns=$(node_ns "$i")
    ip netns add "$ns"
    in_lan ip link add "cvtn$i" type veth peer name eth0 netns "$ns"
    in_lan ip link set "cvtn$i" master cvtlan up
    ip -n "$ns" addr add "$(node_ip "$i")/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    ip -n "$ns" route add default via "$LAN_IP"
    ip netns exec "$ns" sysctl -qw net.ipv4.ip_forward=1
done

# ---------------------------------------------------------------------------------------
# Credentials: a CA, the API server's certificate, the service-account key pair, and a
# static token per user (each component is the user its RBAC bootstrap role binds).
cd "$WORK"
ossl() { openssl "$@" >/dev/null 2>&1 || die "openssl $*"; }
ossl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=cvte2e-ca -keyout ca.key -out ca.crt
ossl req -newkey rsa:2048 -nodes -subj /CN=kube-apiserver -keyout apiserver.key -out apiserver.csr
printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:%s,IP:127.0.0.1,IP:%s,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n' \
    "$LAN_IP" "$KUBERNETES_SVC" >apiserver.ext
ossl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile apiserver.ext -out apiserver.crt
ossl genrsa -out sa.key 2048
ossl rsa -in sa.key -pubout -out sa.pub

token() { head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n'; }
declare -A TOKENS
users=(admin kube-controller-manager kube-scheduler kube-proxy corvid)
for i in $(seq 1 "$NODES"); do users+=("node-$i"); done
: >tokens.csv
for u in "${users[@]}"; do
    TOKENS[$u]=$(token)
    case "$u" in
        admin) echo "${TOKENS[$u]},admin,admin,system:masters" ;;
        kube-controller-manager | kube-scheduler | kube-proxy) echo "${TOKENS[$u]},system:$u,$u" ;;
        corvid) echo "${TOKENS[$u]},corvid,corvid,system:masters" ;;
        node-*) echo "${TOKENS[$u]},system:node:n${u#node-},$u,system:nodes" ;;
    esac >>tokens.csv
done
kubeconfig() {
    cat >"$1.conf" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster: {server: "https://$LAN_IP:6443", certificate-authority: "$WORK/ca.crt"}
users:
- name: u
  user: {token: "${TOKENS[$1]}"}
contexts:
- name: e2e
  context: {cluster: e2e, user: u}
current-context: e2e
EOF
}
for u in "${users[@]}"; do kubeconfig "$u"; done
export KUBECONFIG=$WORK/admin.conf

# ---------------------------------------------------------------------------------------
# The control plane, on the lan.
say "control plane"
spawn "$WORK/etcd.log" "${LAN[@]}" etcd --data-dir "$WORK/etcd" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380
spawn "$WORK/kube-apiserver.log" "${LAN[@]}" "$KUBE/kube-apiserver" \
    --etcd-servers=http://127.0.0.1:2379 --bind-address="$LAN_IP" --advertise-address="$LAN_IP" \
    --secure-port=6443 --insecure-port=0 --service-cluster-ip-range="$SERVICE_CIDR" \
    --service-node-port-range=30000-32767 \
    --authorization-mode=Node,RBAC --token-auth-file="$WORK/tokens.csv" \
    --client-ca-file="$WORK/ca.crt" \
    --tls-cert-file="$WORK/apiserver.crt" --tls-private-key-file="$WORK/apiserver.key" \
    --service-account-key-file="$WORK/sa.pub" --service-account-signing-key-file="$WORK/sa.key" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --kubelet-preferred-address-types=InternalIP --allow-privileged=true \
    --enable-admission-plugins=NodeRestriction --profiling=false
wait_for "the API server" 60 k get --raw /readyz
spawn "$WORK/kube-controller-manager.log" "${LAN[@]}" "$KUBE/kube-controller-manager" \
    --kubeconfig="$WORK/kube-controller-manager.conf" --leader-elect=false \
    --service-account-private-key-file="$WORK/sa.key" --root-ca-file="$WORK/ca.crt" \
    --use-service-account-credentials=true --cluster-cidr=10.244.0.0/16 \
    --service-cluster-ip-range="$SERVICE_CIDR" --port=0 --secure-port=0
spawn "$WORK/kube-scheduler.log" "${LAN[@]}" "$KUBE/kube-scheduler" \
    --kubeconfig="$WORK/kube-scheduler.conf" --leader-elect=false --port=0 --secure-port=0
wait_for "the default service account" 60 k -n default get serviceaccount default

# The "[sig-network] Networking" specs first check that the internet answers
# (http://google.com, from e2e.test). Nothing may leave this machine, so the suite runs
# with its own /etc/hosts, where that name is the lan's address, and agnhost answers
# there.
printf '127.0.0.1 localhost\n%s google.com\n' "$LAN_IP" >"$WORK/hosts"
spawn "$WORK/internet.log" "${LAN[@]}" "$KUBE/agnhost" netexec --http-port=80 --udp-port=8082

# The cluster's DNS (scripts/testing/cluster_dns.py: CoreDNS cannot be had here) on the
# lan, behind the kube-dns service the kubelets name in pods' resolv.conf.
echo "${TOKENS[admin]}" >"$WORK/admin.token"
spawn "$WORK/cluster-dns.log" "${LAN[@]}" /usr/bin/python3 "$ROOT/scripts/testing/cluster_dns.py" \
    "https://$LAN_IP:6443" "$WORK/admin.token" "$WORK/ca.crt" "$LAN_IP"
k apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  clusterIP: $CLUSTER_DNS
  ports: [{name: dns, port: 53, protocol: UDP}, {name: dns-tcp, port: 53, protocol: TCP}]
---
apiVersion: v1
kind: Endpoints
metadata: {name: kube-dns, namespace: kube-system}
subsets:
- addresses: [{ip: $LAN_IP}]
  ports: [{name: dns, port: 53, protocol: UDP}, {name: dns-tcp, port: 53, protocol: TCP}]
EOF
wait_for "the cluster DNS" 30 grep -q ready "$WORK/cluster-dns.log"

# ---------------------------------------------------------------------------------------
# The network plugin's cluster side.
if [ "$CNI" = corvid ]; then
    say "corvid: controller and kube-watch"
    spawn "$WORK/corvid-controller.log" "${LAN[@]}" "$CORVID" controller \
        --listen "$LAN_IP:9696" --store "redb:$WORK/corvid.redb"
    wait_for "corvid's controller" 30 in_lan curl -sf "http://$LAN_IP:9696/"
    spawn "$WORK/corvid-kube-watch.log" "${LAN[@]}" "$CORVID" kube-watch \
        --kubeconfig "$WORK/corvid.conf" --controller "http://$LAN_IP:9696" \
        --service-cidr "$SERVICE_CIDR" --pod-pool "$CORVID_POD_POOL" --namespace-prefix 20
    # The lan (the API server's proxy, e2e.test) reaches pods through the first node,
    # which routes every namespace's network.
    in_lan ip route add "$CORVID_POD_POOL" via "$(node_ip 1)"
else
    for i in $(seq 1 "$NODES"); do
        in_lan ip route add "$(node_pod_cidr "$i")" via "$(node_ip "$i")"
        for j in $(seq 1 "$NODES"); do
            [ "$i" = "$j" ] || ip -n "$(node_ns "$i")" route add "$(node_pod_cidr "$j")" via "$(node_ip "$j")"
        done
    done
fi

# ---------------------------------------------------------------------------------------
# The nodes.
write_cni_conf() {
    local i=$1 dir=$2
    if [ "$CNI" = corvid ]; then
        "$CORVID" cni install --dir "$WORK/n$i/cni-bin" --from "$ROOT/target/debug/corvid-plugins" >/dev/null
        # portmap after it, for pods' hostPorts, as deploy/kubernetes/node.yaml has it.
        printf '{"cniVersion":"1.0.0","name":"k8s-pod-network","plugins":[{"type":"corvid-k8s","controller":"http://%s:9696","hostId":"%s","timeout":60},{"type":"portmap","capabilities":{"portMappings":true}}]}\n' \
            "$LAN_IP" "$(node_name "$i")" >"$dir/10-corvid.conflist"
    else
        mkdir -p "$WORK/n$i/cni-bin"
        cp /usr/lib/cni/* "$WORK/n$i/cni-bin/"
        cat >"$dir/10-bridge.conflist" <<EOF
{"cniVersion": "0.4.0", "name": "k8s-pod-network", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "dataDir": "$WORK/n$i/ipam",
            "ranges": [[{"subnet": "$(node_pod_cidr "$i")"}]],
            "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}
]}
EOF
    fi
}

start_node() {
    local i=$1 n=$WORK/n$1 ns
    ns=$(node_ns "$i")
    mkdir -p "$n/net.d" "$n/kubelet" "$n/pods-logs" "$n/containers-logs" "$n/sysctl" "$n/cni-state"
    write_cni_conf "$i" "$n/net.d"
    cat >"$n/containerd.toml" <<EOF
version = 2
root = "$n/containerd/root"
state = "$n/containerd/state"
[grpc]
  address = "$n/containerd.sock"
[ttrpc]
  address = "$n/containerd.sock.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "k8s.gcr.io/pause:3.2"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$n/cni-bin"
    conf_dir = "$n/net.d"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
EOF
    cat >"$n/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $(node_ip "$i")
port: 10250
readOnlyPort: 0
healthzPort: 0
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
cgroupRoot: /cvte2e-n$i
cgroupsPerQOS: true
enforceNodeAllocatable: [pods]
failSwapOn: false
clusterDomain: cluster.local
clusterDNS: [$CLUSTER_DNS]
resolvConf: /etc/resolv.conf
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
maxPods: 110
EOF
    # The node's mount namespace: the kubelet's fixed paths made private, and the
    # kernel settings it would otherwise write, read as it wants them.
    local kv k v
    local -a binds=()
    for kv in vm/overcommit_memory=1 vm/panic_on_oom=0 kernel/panic=10 kernel/panic_on_oops=1; do
        k=${kv%=*} v=${kv#*=}
        echo "$v" >"$n/sysctl/${k//\//.}"
        binds+=("mount --bind $n/sysctl/${k//\//.} /proc/sys/$k")
    done
    mkdir -p /var/lib/kubelet /var/log/pods /var/log/containers /var/lib/cni
    local script
    # The node's own hostname too (a UTS namespace): host-network pods answer with it.
    script="set -e
hostname $(node_name "$i")
mount --make-rslave /
mount --bind $n/kubelet /var/lib/kubelet
mount --bind $n/pods-logs /var/log/pods
mount --bind $n/containers-logs /var/log/containers
mount --bind $n/cni-state /var/lib/cni
$(printf '%s\n' "${binds[@]}")
for h in /sys/fs/cgroup/*/; do mkdir -p \"\$h\"cvte2e-n$i; done
containerd --config $n/containerd.toml >$n/containerd.log 2>&1 &
echo \$! >$n/containerd.pid
for t in \$(seq 100); do [ -S $n/containerd.sock ] && break; sleep 0.2; done
for img in $IMAGES/*.tar; do ctr --address $n/containerd.sock -n k8s.io images import \"\$img\" >/dev/null; done
exec $KUBE/kubelet --config=$n/kubelet.yaml --kubeconfig=$WORK/node-$i.conf \
  --container-runtime=remote --container-runtime-endpoint=unix://$n/containerd.sock \
  --hostname-override=$(node_name "$i") --node-ip=$(node_ip "$i") --root-dir=/var/lib/kubelet \
  --cert-dir=$n/pki --volume-plugin-dir=$n/volume-plugins --v=2"
    spawn "$n/kubelet.log" nsenter --net="/run/netns/$ns" unshare --mount --uts --propagation slave \
        bash -c "$script"
    if [ "$CNI" = corvid ]; then
        spawn "$n/corvid-agent.log" nsenter --net="/run/netns/$ns" "$CORVID" agent \
            --host-id "$(node_name "$i")" --controller "http://$LAN_IP:9696" \
            --underlay-ip "$(node_ip "$i")" --security-groups --all-routers --kube-proxy-listen 0.0.0.0
    else
        # conntrack's table size is the machine's (the initial namespace's): left alone.
        # Its TCP timeouts are the node namespace's own: kube-proxy's defaults.
        spawn "$n/kube-proxy.log" nsenter --net="/run/netns/$ns" "$KUBE/kube-proxy" \
            --kubeconfig="$WORK/kube-proxy.conf" --hostname-override="$(node_name "$i")" \
            --proxy-mode=iptables --cluster-cidr=10.244.0.0/16 \
            --conntrack-max-per-core=0 --conntrack-min=0 \
            --metrics-bind-address=0.0.0.0:10249 --healthz-bind-address=0.0.0.0:10256
    fi
}
for i in $(seq 1 "$NODES"); do
    say "node $(node_name "$i")"
    start_node "$i"
done
nodes_ready() {
    [ "$(k get nodes -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' | grep -c True)" = "$NODES" ]
}
wait_for "$NODES nodes Ready" 180 nodes_ready
k get nodes -o wide

# ---------------------------------------------------------------------------------------
# --bench instead of the suite: what a user of this stack waits for, each figure a
# median, written to $REPORT/bench.tsv (scripts/k8s-bench.sh runs both stacks and
# compares).
api() {
    in_lan curl -sf --cacert "$WORK/ca.crt" -H "Authorization: Bearer ${TOKENS[admin]}" \
        -H 'Content-Type: application/json' "$@"
}
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
# startup NAMESPACE HOST-NETWORK OUT LABEL: one round of 100 pods; seconds to OUT.
startup() {
    local ns=$1 t0 t1
    t0=$(date +%s.%N)
    k -n "$ns" apply -f - >/dev/null <<EOF
apiVersion: apps/v1
kind: Deployment
metadata: {name: start}
spec:
  replicas: 100
  selector: {matchLabels: {app: start}}
  template:
    metadata: {labels: {app: start}}
    spec:
      hostNetwork: $2
      terminationGracePeriodSeconds: 0
      containers: [{name: c, image: docker.io/library/busybox:1.29, command: [sleep, "3600"]}]
EOF
    until [ "$(in_lan kubectl -n "$ns" get deploy start -o jsonpath='{.status.readyReplicas}')" = 100 ]; do
        [ "$(echo "$(date +%s) - ${t0%.*} < 600" | bc)" = 1 ] || die "100 pods not Ready in 10 minutes"
        sleep 0.2
    done
    t1=$(date +%s.%N)
    echo "$t1 - $t0" | bc | tee -a "$3" | sed "s/^/[bench] 100 pods Ready, $4: /; s/$/ s/"
    k -n "$ns" delete deploy start --wait=false >/dev/null
    wait_for "the bench pods to go" 600 no_pods "$ns"
}
no_pods() { [ -z "$(in_lan kubectl -n "$1" get pods -o name)" ]; }
# ready_pods NAMESPACE N: whether N pods of the namespace are ready.
ready_pods() {
    [ "$(in_lan kubectl -n "$1" get pods -o jsonpath='{range .items[*]}{.status.containerStatuses[0].ready}{"\n"}{end}' | grep -c true)" = "$2" ]
}
bench() {
    local ns=cvbench round t0 i ip seen
    k create namespace "$ns" >/dev/null
    wait_for "the bench namespace's service account" 60 k -n "$ns" get serviceaccount default
    # Pod startup: a Deployment of 100 replicas, from apply to all Ready, three times;
    # each time beside the floor, the same pods on the host's network (no CNI at all).
    : >"$REPORT/startup.txt"
    : >"$REPORT/startup-host-network.txt"
    for round in 1 2 3; do
        startup "$ns" false "$REPORT/startup.txt" "round $round"
        startup "$ns" true "$REPORT/startup-host-network.txt" "round $round, host network"
    done
    # Service ready: a client polls 20 cluster IPs in turn; each service is made only
    # after the last was reached, and timed from just before the API call that made it
    # to the client's first connection through it (the client's clock is the node's).
    # A connection tried before the service is served may wait for its SYN's
    # retransmission, so a new one starts every 10 ms and the first to connect counts.
    k -n "$ns" apply -f - >/dev/null <<EOF
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: c, image: k8s.gcr.io/e2e-test-images/agnhost:2.21, args: [netexec, --http-port=8080]}]
---
apiVersion: v1
kind: Pod
metadata: {name: client}
spec:
  containers:
  - name: c
    image: k8s.gcr.io/e2e-test-images/agnhost:2.21
    command:
    - sh
    - -c
    - |
      for i in \$(seq 1 20); do
        while [ ! -e /tmp/ok\$i ]; do
          { nc -z -w 1 10.96.200.\$i 80 2>/dev/null && date +%s.%N >>/tmp/ok\$i; } &
          sleep 0.01
        done
        wait
        echo "\$i \$(sort /tmp/ok\$i | head -1)"
      done
      sleep 3600
EOF
    wait_for "the bench's servers and client" 300 ready_pods "$ns" 3
    : >"$REPORT/service.txt"
    for i in $(seq 1 20); do
        ip=10.96.200.$i
        t0=$(date +%s.%N)
        api -X POST "https://$LAN_IP:6443/api/v1/namespaces/$ns/services" -d @- \
            >/dev/null <<EOF || die "service $i not made"
{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s$i"},
 "spec": {"clusterIP": "$ip", "selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}}
EOF
        seen=
        for _ in $(seq 600); do
            seen=$(in_lan kubectl -n "$ns" logs client | awk -v i="$i" '$1 == i { print $2 }')
            [ -n "$seen" ] && break
            sleep 0.1
        done
        [ -n "$seen" ] || die "service $i never answered the client"
        echo "($seen - $t0) * 1000" | bc | tee -a "$REPORT/service.txt" | sed "s/^/[bench] service $i ready: /; s/$/ ms/"
    done
    {
        printf 'pod_startup_100_s\t%s\n' "$(median <"$REPORT/startup.txt")"
        printf 'pod_startup_100_host_network_s\t%s\n' "$(median <"$REPORT/startup-host-network.txt")"
        printf 'service_ready_ms\t%s\n' "$(median <"$REPORT/service.txt")"
    } | tee "$REPORT/bench.tsv"
}
if [ -n "$BENCH" ]; then
    bench
    exit 0
fi

# ---------------------------------------------------------------------------------------
# The suite.
# Specs that must run alone cannot share the cluster with others.
[ "$PARALLEL" -le 1 ] || SKIP="$SKIP|\[Serial\]"
say "e2e.test --ginkgo.focus='$FOCUS' ($PARALLEL at a time)"
suite=("$KUBE/e2e.test" --kubeconfig="$WORK/admin.conf" \
    --provider=skeleton --num-nodes="$NODES" --report-dir="$REPORT" \
    --disable-log-dump --kubectl-path="$(command -v kubectl)")
ginkgo=(--focus="$FOCUS" --skip="$SKIP" --noColor --flakeAttempts=1)
if [ "$PARALLEL" -gt 1 ]; then
    suite=("$KUBE/ginkgo" -nodes="$PARALLEL" "${ginkgo[@]}" "${suite[0]}" -- "${suite[@]:1}")
else
    suite+=("${ginkgo[@]/#--/--ginkgo.}")
fi
set +e
# In a mount namespace of its own, with the /etc/hosts above; unshare and sh exec, so
# the PID is the suite's.
"${LAN[@]}" unshare --mount --propagation private sh -c 'mount --bind "$0" /etc/hosts && exec "$@"' \
    "$WORK/hosts" env KUBECONFIG="$WORK/admin.conf" "${suite[@]}" >"$REPORT/e2e.log" 2>&1 &
# In the background, so that an interrupt reaches the teardown at once.
PIDS+=($!)
wait $!
e2e_rc=$?
set -e
say "e2e.test exited $e2e_rc"

# A table of the tests from the JUnit file(s).
python3 - "$REPORT" "$CNI" "$FOCUS" <<'EOF'
import glob, re, sys, xml.etree.ElementTree as ET
rows = []
for f in sorted(glob.glob(sys.argv[1] + "/junit*.xml")):
    for case in ET.parse(f).getroot().iter("testcase"):
        name = case.get("name", "")
        if case.find("skipped") is not None:
            status = "skipped"
        elif case.find("failure") is not None or case.find("error") is not None:
            status = "failed"
        else:
            status = "passed"
        # Ginkgo lists every spec the focus left out as skipped too.
        if status == "skipped" and not re.search(sys.argv[3], name):
            continue
        rows.append((status, name, case.get("time", "")))
with open(sys.argv[1] + "/results.tsv", "w") as out:
    for status, name, secs in rows:
        out.write(f"{status}\t{name}\t{secs}\n")
for status in ("passed", "failed"):
    for s, name, secs in rows:
        if s == status:
            print(f"{s:7} {float(secs or 0):7.1f}s  {name}")
counts = {s: sum(1 for r in rows if r[0] == s) for s in ("passed", "failed", "skipped")}
print(f"{sys.argv[2]}: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
EOF
exit "$e2e_rc"
}

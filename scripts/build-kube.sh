#!/usr/bin/env bash
# Builds Kubernetes v1.20.2 from Debian bookworm's `kubernetes` source package and caches
# the binaries outside the checkout ($KUBE_CACHE, default /var/cache/kube-1.20). Builds
# only what the cache lacks.
#
#   scripts/build-kube.sh              kube-apiserver and kube-controller-manager: the
#                                      control plane the Kubernetes tests run (the
#                                      controller manager for its endpoint and
#                                      EndpointSlice controllers). 8-10 minutes cold.
#   scripts/build-kube.sh all          those, and what scripts/k8s-e2e.sh runs: kubelet,
#                                      kube-scheduler, kube-proxy, agnhost (the e2e
#                                      suite's test server), regression-issue-74839 (a
#                                      test image's server), e2e.test (the suite) and
#                                      ginkgo (which runs the suite in parallel).
#   scripts/build-kube.sh NAME...      just those.
#
# Why each step: Debian ships the source (with vendor/) but no binary; Debian's Go (1.19)
# builds it in GOPATH mode as upstream's run-in-gopath.sh does; the vendored reflect2 1.0.1
# crashes on Go >= 1.18, so Debian's 1.0.2 replaces it; the generated OpenAPI definitions
# are not in the source package, so the vendored openapi-gen makes them. The deb-src line
# lives in a private apt state: the system's sources are not touched.
set -euo pipefail

CACHE=${KUBE_CACHE:-/var/cache/kube-1.20}
COMMANDS=(kube-apiserver kube-controller-manager)
case "${1:-}" in
    "") ;;
    all) COMMANDS+=(kube-scheduler kube-proxy kubelet agnhost regression-issue-74839 e2e.test ginkgo) ;;
    *) COMMANDS=("$@") ;;
esac
VERSION=v1.20.2
COMMIT=faecb196815e248d3ecfb03c680a4507229c2a56

# The test programs do not print Kubernetes' version: a stamp beside them says which
# source they were built from.
built() {
    case "$1" in
        agnhost | regression-issue-74839 | e2e.test | ginkgo) [ -x "$CACHE/$1" ] && [ "$(cat "$CACHE/$1.version" 2>/dev/null)" = "$VERSION" ] ;;
        *) [ -x "$CACHE/$1" ] && "$CACHE/$1" --version 2>/dev/null | grep -qx "Kubernetes $VERSION" ;;
    esac
}
missing_commands() {
    local c
    for c in "${COMMANDS[@]}"; do built "$c" || echo "$c"; done
}
[ -z "$(missing_commands)" ] && { echo "Kubernetes $VERSION: ${COMMANDS[*]} in $CACHE"; exit 0; }
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9
mapfile -t todo < <(missing_commands)
[ ${#todo[@]} -eq 0 ] && { echo "Kubernetes $VERSION: ${COMMANDS[*]} in $CACHE"; exit 0; }
start=$(date +%s)
say() { echo "[build-kube $(( $(date +%s) - start ))s] $*"; }

# The bookworm mirror the system already uses.
mirror=$("$(dirname "$0")/bookworm-mirror.sh")
APT=$CACHE/apt
mkdir -p "$APT/parts" "$APT/lists/partial"
printf 'Types: deb-src\nURIs: %s\nSuites: bookworm\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
    "$mirror" > "$APT/parts/kube-src.sources"
apt_private=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$APT/parts"
    -o "Dir::State::Lists=$APT/lists" -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache=)
say "source index from $mirror"
apt-get "${apt_private[@]}" -q update >/dev/null

missing=()
for p in golang-go golang-github-modern-go-reflect2-dev dpkg-dev; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q -o DPkg::Lock::Timeout=300 "${missing[@]}" >/dev/null \
        || { apt-get -q update >/dev/null; apt-get install -y -q -o DPkg::Lock::Timeout=300 "${missing[@]}" >/dev/null; }
fi
GO=/usr/lib/go/bin/go
[ -x "$GO" ] || GO=$(command -v go)
REFLECT2=/usr/share/gocode/src/github.com/modern-go/reflect2

WORK=$CACHE/build
rm -rf "$WORK"
mkdir -p "$WORK/src"
(cd "$WORK/src" && apt-get "${apt_private[@]}" -q source kubernetes >"$WORK/source.log" 2>&1) \
    || { cat "$WORK/source.log" >&2; exit 1; }
TREE=$(ls -d "$WORK"/src/kubernetes-*/ | head -1)
TREE=${TREE%/}
say "source: $(basename "$TREE")"

export GOPATH=$WORK/gopath GO111MODULE=off GOFLAGS= CGO_ENABLED=0 GOCACHE=$WORK/gocache GOTOOLCHAIN=local
mkdir -p "$GOPATH/src/k8s.io"
ln -s "$TREE" "$GOPATH/src/k8s.io/kubernetes"
cd "$GOPATH/src/k8s.io/kubernetes"
rm -rf vendor/github.com/modern-go/reflect2
mkdir -p vendor/github.com/modern-go/reflect2
cp "$REFLECT2"/*.go vendor/github.com/modern-go/reflect2/
cp "$REFLECT2"/*.s vendor/github.com/modern-go/reflect2/ 2>/dev/null || true
rm -f vendor/github.com/modern-go/reflect2/*_test.go

say "generating the OpenAPI definitions"
"$GO" build -o "$WORK/openapi-gen" ./vendor/k8s.io/kube-openapi/cmd/openapi-gen
# The packages upstream's Makefile.generated_files hands openapi-gen: those whose files
# carry a +k8s:openapi-gen= tag (staging named as vendor/), less the code generator's own.
packages=$(find -H . \( -path './_*' -o -path './.*' -o -path ./vendor \) -prune -o -type f -name '*.go' -print \
    | sed 's|^./staging/src|vendor|; s|^./||' \
    | xargs grep -l '^// *+k8s:' | xargs grep -l '+k8s:openapi-gen=' \
    | grep -v -e '^vendor/k8s.io/code-generator/' -e '^vendor/k8s.io/sample-apiserver/' \
    | xargs -n1 dirname | LC_ALL=C sort -u | sed 's|^|k8s.io/kubernetes/|' | paste -sd, -)
"$WORK/openapi-gen" --logtostderr -i "$packages" -p k8s.io/kubernetes/pkg/generated/openapi \
    -O zz_generated.openapi -h vendor/k8s.io/code-generator/hack/boilerplate.go.txt \
    -r "$WORK/openapi-violations.report" >"$WORK/openapi-gen.log" 2>&1 \
    || { tail -30 "$WORK/openapi-gen.log" >&2; exit 1; }

flags="-s -w"
for pkg in k8s.io/kubernetes/vendor/k8s.io/client-go/pkg/version k8s.io/kubernetes/vendor/k8s.io/component-base/version; do
    flags+=" -X '$pkg.gitVersion=$VERSION' -X '$pkg.gitMajor=1' -X '$pkg.gitMinor=20'"
    flags+=" -X '$pkg.gitCommit=$COMMIT' -X '$pkg.gitTreeState=archive'"
done
# The e2e suite embeds its manifests and fixtures, generated as upstream's
# hack/generate-bindata.sh does with the vendored go-bindata.
bindata() {
    "$GO" build -o "$WORK/go-bindata" ./vendor/github.com/go-bindata/go-bindata/go-bindata
    "$WORK/go-bindata" -nometadata -o test/e2e/generated/bindata.go -pkg generated \
        -ignore .jpg -ignore .png -ignore .md -ignore 'BUILD(\.bazel)?' \
        test/conformance/testdata/... test/e2e/testing-manifests/... \
        test/e2e_node/testing-manifests/... test/images/... test/fixtures/...
    "$WORK/go-bindata" -nometadata -nocompress -pkg generated \
        -o staging/src/k8s.io/kubectl/pkg/generated/bindata.go \
        -ignore .jpg -ignore .png -ignore .md -ignore 'BUILD(\.bazel)?' translations/...
}
for c in "${todo[@]}"; do
    case "$c" in
        e2e.test)
            say "go test -c ./test/e2e"
            bindata
            "$GO" test -c -trimpath -ldflags "$flags" -o "$WORK/$c" ./test/e2e
            ;;
        agnhost | regression-issue-74839)
            say "go build ./test/images/$c"
            "$GO" build -trimpath -ldflags "-s -w" -o "$WORK/$c" "./test/images/$c"
            ;;
        ginkgo)
            # The vendored CLI, of the same version as the suite's library.
            say "go build ./vendor/github.com/onsi/ginkgo/ginkgo"
            "$GO" build -trimpath -ldflags "-s -w" -o "$WORK/$c" ./vendor/github.com/onsi/ginkgo/ginkgo
            ;;
        kubelet)
            # Upstream links the kubelet with cgo (host lookups through the C library).
            say "go build ./cmd/$c (cgo)"
            CGO_ENABLED=1 "$GO" build -trimpath -ldflags "$flags" -o "$WORK/$c" "./cmd/$c"
            ;;
        *)
            say "go build ./cmd/$c"
            "$GO" build -trimpath -ldflags "$flags" -o "$WORK/$c" "./cmd/$c"
            ;;
    esac
    case "$c" in
        agnhost | regression-issue-74839 | e2e.test | ginkgo) echo "$VERSION" >"$CACHE/$c.version.new" ;;
        *) "$WORK/$c" --version | grep -qx "Kubernetes $VERSION" ;;
    esac
    install -m 0755 "$WORK/$c" "$CACHE/$c.new"
    mv -f "$CACHE/$c.new" "$CACHE/$c"
    [ ! -e "$CACHE/$c.version.new" ] || mv -f "$CACHE/$c.version.new" "$CACHE/$c.version"
done
cd /
rm -rf "$WORK"
say "built ${todo[*]} in $CACHE"

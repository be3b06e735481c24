#!/usr/bin/env bash
# Builds the real Kubernetes control plane, kube-apiserver and etcd, into <repo>/.tools/bin
# unless the pinned versions are already there.
#
# Where they come from: the Go module tools/control-plane (go.mod and go.sum committed),
# which names both as tools of the pinned releases, fetched from the Go module proxy:
#   kube-apiserver  k8s.io/kubernetes v1.35.4 (cmd/kube-apiserver), its staging modules at v0.35.4
#   etcd            go.etcd.io/etcd/server/v3 v3.6.5 (the release kubernetes v1.35.4 requires)
# The proxy does not serve every staging module at v0.35.2 (the release of our kubectl),
# hence v1.35.4: kubectl's supported skew is one minor, this is the same minor.
#
# The first build took 5 min on 2 shared cores (0.8 GB of modules in Go's module cache,
# 2.2 GB of Go build cache, 130 MB of binaries); the caches make later builds fast.
#
# Usage: export PATH="$(scripts/install-control-plane.sh | tail -n 1):$PATH"   (the last line of stdout is the bin dir)
#        scripts/install-control-plane.sh --regenerate   rewrites tools/control-plane/go.mod's
#                                                        replace block for KUBE_VERSION
set -euo pipefail

KUBE_VERSION=v1.35.4
STAGING_VERSION=v0.35.4
ETCD_VERSION=3.6.5

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
module="$repo/tools/control-plane"
bin="$repo/.tools/bin"
mkdir -p "$bin"

if ! command -v go >/dev/null; then
  echo "install-control-plane.sh: no 'go' on PATH; Go 1.25 or newer builds the control plane" >&2
  exit 1
fi

if [[ "${1:-}" == "--regenerate" ]]; then
  # k8s.io/kubernetes replaces each staging module with ./staging/src/<module>; outside its
  # repository each must be replaced with its published release.
  gomod="$(cd "$module" && go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" |
    sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
  replaces="$(sed -n '/^replace (/,/^)/p' "$gomod" | awk -v v="$STAGING_VERSION" \
    '$3 ~ /^\.\/staging\// { printf "\t%s => %s %s\n", $1, $1, v }')"
  awk -v r="$replaces" '
    /^replace \($/ { print; print r; skip = 1; next }
    skip && /^\)$/ { skip = 0 }
    !skip { print }' "$module/go.mod" >"$module/go.mod.tmp"
  mv "$module/go.mod.tmp" "$module/go.mod"
  (cd "$module" && go mod tidy)
  echo "regenerated $module/go.mod for k8s.io/kubernetes $KUBE_VERSION" >&2
  exit 0
fi

pinned() {
  [[ -x "$bin/kube-apiserver" && -x "$bin/etcd" ]] &&
    [[ "$("$bin/kube-apiserver" --version 2>/dev/null)" == "Kubernetes $KUBE_VERSION" ]] &&
    # Captured whole, not piped into grep -q: under pipefail grep's early exit made etcd
    # die of SIGPIPE now and then, and the pinned binaries were rebuilt for nothing.
    [[ "$("$bin/etcd" --version 2>/dev/null)" == "etcd Version: $ETCD_VERSION"$'\n'* ]]
}

if pinned; then
  "$bin/kube-apiserver" --version >&2
  "$bin/etcd" --version 2>/dev/null | sed -n 1p >&2
  echo "$bin"
  exit 0
fi

major="${KUBE_VERSION#v}"
minor="${major#*.}"
major="${major%%.*}"
minor="${minor%%.*}"
# /version tells which release this is. The commit is not known from the module proxy
# (tools/control-plane/go.sum's h1: hash identifies the source instead): gitCommit is
# left empty rather than at its "$Format:%H$" placeholder.
v=k8s.io/component-base/version
ldflags="-s -w -X $v.gitVersion=$KUBE_VERSION -X $v.gitMajor=$major -X $v.gitMinor=$minor -X $v.gitCommit="
ldflags+=" -X $v.gitTreeState=clean -X $v.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"

echo "building kube-apiserver $KUBE_VERSION and etcd $ETCD_VERSION (the first build takes minutes)..." >&2
cd "$module"
# Each binary is built beside its destination and moved in once whole.
nice -n 10 go build -buildvcs=false -trimpath -ldflags "$ldflags" \
  -o "$bin/kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver >&2
nice -n 10 go build -buildvcs=false -trimpath -ldflags "-s -w" \
  -o "$bin/etcd.tmp" go.etcd.io/etcd/server/v3 >&2
mv "$bin/kube-apiserver.tmp" "$bin/kube-apiserver"
mv "$bin/etcd.tmp" "$bin/etcd"

if ! pinned; then
  echo "install-control-plane.sh: the built binaries do not report $KUBE_VERSION and etcd $ETCD_VERSION:" >&2
  "$bin/kube-apiserver" --version >&2 || true
  "$bin/etcd" --version >&2 || true
  exit 1
fi
"$bin/kube-apiserver" --version >&2
# sed, not head: under pipefail, head closing the pipe early kills the script with SIGPIPE (141).
"$bin/etcd" --version | sed -n 1p >&2
echo "$bin"

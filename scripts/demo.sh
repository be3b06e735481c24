#!/usr/bin/env bash
# The project's main job in one command: `autoapproval-lab demo` runs three
# controller replicas against a throwaway PostgreSQL, the in-memory test API
# server and the external-system simulator, works a mixed workload to its
# end, prints a summary and exits 0 only when every request ended where it
# should. This script first makes sure what it needs exists on a fresh
# machine: PostgreSQL's binaries (Debian's package; the demo runs its own
# server from them), kubectl (to watch the CRs) and the build.
# Extra arguments go to `autoapproval-lab demo` (see `--help`), e.g. --keep-running.
# With `--control-plane real` it runs on kube-apiserver and etcd instead, built first
# by scripts/install-control-plane.sh when absent (Go; about 5 min the first time).
# The replicas run the shipped `autoapproval` binary, built beside the lab's.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null; then
  echo "installing Debian's postgresql package (the demo starts its own server from its binaries)..." >&2
  sudo=()
  [[ "$(id -u)" == 0 ]] || sudo=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -qq >&2
  "${sudo[@]}" apt-get install -y -qq postgresql >&2
fi
tools="$(scripts/install-tools.sh | tail -n 1)"
# Only the real control plane needs the Go build; the default demo never starts it.
control_plane="${AUTOAPPROVAL_LAB_CONTROL_PLANE:-memory}"
previous=""
for arg in "$@"; do
  case "$arg" in
    --control-plane=*) control_plane="${arg#*=}" ;;
  esac
  [[ "$previous" == --control-plane ]] && control_plane="$arg"
  previous="$arg"
done
if [[ "$control_plane" == real ]]; then
  bin="$(scripts/install-control-plane.sh | tail -n 1)"
  export KUBE_APISERVER="${KUBE_APISERVER:-$bin/kube-apiserver}" ETCD="${ETCD:-$bin/etcd}"
fi
cargo build --quiet -p autoapproval -p autoapproval-lab
exec target/debug/autoapproval-lab demo --kubectl "$tools/kubectl" "$@"

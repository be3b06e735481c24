#!/usr/bin/env bash
# The whole test suite on a fresh machine: starts PostgreSQL, MariaDB and
# Redis (installing each when absent), installs kubectl and helm when absent,
# builds kube-apiserver and etcd (Go) when absent, and installs promtool
# (Debian's prometheus package) for the alert rules' tests and cargo-deny (crates.io) for the
# dependency checks, then runs every test.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

DATABASE_URL="$(scripts/postgres.sh | tail -n 1)"
export DATABASE_URL
MYSQL_URL="$(scripts/mariadb.sh | tail -n 1)"
export MYSQL_URL
REDIS_URL="$(scripts/redis.sh | tail -n 1)"
export REDIS_URL
PATH="$(scripts/install-tools.sh | tail -n 1):$PATH"
export PATH KUBECTL="$(command -v kubectl)"
# The real kube-apiserver and etcd, built from Go modules when absent (minutes the first time).
control_plane="$(scripts/install-control-plane.sh | tail -n 1)"
export KUBE_APISERVER="$control_plane/kube-apiserver" ETCD="$control_plane/etcd"
if ! command -v promtool >/dev/null; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
export PROMTOOL="$(command -v promtool)"
# cargo-deny for the dependency checks below, built into .tools/ once (minutes the first time).
PATH="$(scripts/install-cargo-deny.sh | tail -n 1):$PATH"
echo "PostgreSQL: $DATABASE_URL; MariaDB: $MYSQL_URL; Redis: $REDIS_URL; kubectl: $KUBECTL; helm: $(command -v helm); kube-apiserver: $KUBE_APISERVER; etcd: $ETCD; promtool: $PROMTOOL" >&2

cargo fmt --all --check
# Both builds: without features (what `cargo build` gives) and with the span export.
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo clippy --workspace --all-targets --locked --features autoapproval/otlp -- -D warnings
# The dependency tree's licenses, banned or wildcard versions and sources (deny.toml): offline,
# from Cargo.lock as it is (`cargo tree -i <crate>` shows where a named crate comes from).
# cargo-deny reads `cargo metadata`, which wants every platform's crates in the local registry,
# not only the ones this machine's builds downloaded: fetch them all first (a fresh CARGO_HOME
# has none of e.g. android_system_properties, and --offline then fails).
cargo fetch --locked
cargo deny --locked --offline check --hide-inclusion-graph licenses bans sources
# With the span export, so that tests/it/traces.rs also checks the OTLP path;
# every package runs even after one fails, so a run names every failure.
cargo test --workspace --locked --no-fail-fast --features autoapproval/otlp "$@"

#!/usr/bin/env bash
# Installs cargo-deny (crates.io, pinned below) into <repo>/.tools/bin unless that version is
# already there. Built from source with its own Cargo.lock (--locked): minutes on two cores the
# first time (niced), a version check afterwards. To move to a new release, change the pin.
#
# Usage: export PATH="$(scripts/install-cargo-deny.sh | tail -n 1):$PATH"   (the last line of stdout is the bin dir)
set -euo pipefail

CARGO_DENY_VERSION=0.20.2

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
root="$repo/.tools"
bin="$root/bin"
mkdir -p "$bin"

if [[ "$("$bin/cargo-deny" --version 2>/dev/null)" != "cargo-deny $CARGO_DENY_VERSION" ]]; then
  echo "building cargo-deny $CARGO_DENY_VERSION from crates.io into $bin (minutes the first time)..." >&2
  nice -n 10 cargo install --quiet --locked --force --version "$CARGO_DENY_VERSION" --root "$root" cargo-deny >&2
fi
"$bin/cargo-deny" --version >&2
echo "$bin"

#!/usr/bin/env bash
# Makes a PostgreSQL server available for the tests and prints its URL on the
# last line of stdout. Order: $DATABASE_URL if it answers; the local server on
# 127.0.0.1:5432 if it answers; else a throwaway cluster of our own (Debian's
# postgresql package is installed when its binaries are absent), trust auth,
# on 127.0.0.1:$AUTOAPPROVAL_TEST_PG_PORT (default 55432), data under .tools/.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
answers() { psql "$1" -Atqc 'select 1' >/dev/null 2>&1; }

if [[ -n "${DATABASE_URL:-}" ]] && command -v psql >/dev/null && answers "$DATABASE_URL"; then
  echo "$DATABASE_URL"; exit 0
fi
local_url="postgres://postgres@127.0.0.1:5432/postgres"
# AUTOAPPROVAL_TEST_PG_OWN=1 skips the local server (to exercise the fallback).
if [[ -z "${AUTOAPPROVAL_TEST_PG_OWN:-}" ]] && command -v psql >/dev/null && answers "$local_url"; then
  echo "$local_url"; exit 0
fi

bindir="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
if [[ -z "$bindir" || ! -x "$bindir/initdb" ]]; then
  echo "installing Debian's postgresql package..." >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq postgresql postgresql-client >&2
  bindir="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)"
fi

port="${AUTOAPPROVAL_TEST_PG_PORT:-55432}"
url="postgres://postgres@127.0.0.1:$port/postgres"
data="$repo/.tools/pgdata"
if ! answers "$url"; then
  # initdb refuses to run as root: run the cluster as the postgres user when we are root.
  as_pg=()
  if [[ "$(id -u)" == 0 ]]; then
    id postgres >/dev/null 2>&1 || useradd --system --home-dir /var/lib/postgresql postgres
    as_pg=(runuser -u postgres --)
  fi
  mkdir -p "$data"
  [[ "$(id -u)" == 0 ]] && chown postgres "$data" && chmod 700 "$data"
  # The repository may sit under a folder the postgres user cannot enter.
  [[ "$(id -u)" == 0 ]] && chmod o+x "$repo" "$repo/.tools"
  if [[ ! -f "$data/PG_VERSION" ]]; then
    "${as_pg[@]}" "$bindir/initdb" -D "$data" -A trust -U postgres >&2
  fi
  "${as_pg[@]}" "$bindir/pg_ctl" -D "$data" -l "$data/server.log" -w \
    -o "-p $port -k $data -c listen_addresses=127.0.0.1 -c max_connections=300 -c fsync=off" start >&2
fi
answers "$url" || { echo "PostgreSQL did not come up on $url (see $data/server.log)" >&2; exit 1; }
echo "$url"

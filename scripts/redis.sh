#!/usr/bin/env bash
# Makes a Redis server available (for the seed's design in the MySQL
# comparison) and prints its URL on the last line of stdout. Order:
# $REDIS_URL if it answers; the local server on 127.0.0.1:6379 if it answers;
# else a throwaway server of our own (Debian's redis-server package is
# installed when absent), no persistence, on
# 127.0.0.1:$AUTOAPPROVAL_TEST_REDIS_PORT (default 56379), files under .tools/.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
answers() {
  command -v redis-cli >/dev/null &&
    [[ "$(timeout 5 redis-cli -u "$1" ping 2>/dev/null)" == PONG ]]
}

if [[ -n "${REDIS_URL:-}" ]] && answers "$REDIS_URL"; then
  echo "$REDIS_URL"; exit 0
fi
local_url="redis://127.0.0.1:6379"
# AUTOAPPROVAL_TEST_REDIS_OWN=1 skips the local server (to exercise the fallback).
if [[ -z "${AUTOAPPROVAL_TEST_REDIS_OWN:-}" ]] && answers "$local_url"; then
  echo "$local_url"; exit 0
fi

if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
  echo "installing Debian's redis-server package..." >&2
  sudo=""
  [[ "$(id -u)" == 0 ]] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq >&2
  $sudo apt-get install -y -qq --no-install-recommends redis-server redis-tools >&2
fi

port="${AUTOAPPROVAL_TEST_REDIS_PORT:-56379}"
url="redis://127.0.0.1:$port"
dir="$repo/.tools/redis-$port"
if ! answers "$url"; then
  mkdir -p "$dir"
  redis-server --port "$port" --bind 127.0.0.1 --daemonize yes --dir "$dir" \
    --pidfile "$dir/redis.pid" --logfile "$dir/server.log" --save '' --appendonly no >&2
  for _ in $(seq 1 100); do
    answers "$url" && break
    sleep 0.1
  done
fi
answers "$url" || { echo "Redis did not come up on $url (see $dir/server.log)" >&2; exit 1; }
echo "$url"

#!/usr/bin/env bash
# Makes a MariaDB (MySQL family) server available for the tests and prints its
# URL, a server URL without database (the tests create scratch databases of
# their own), on the last line of stdout. Order: $MYSQL_URL if it answers; the
# local server on 127.0.0.1:3306 if it answers (root, no password); else a
# throwaway server of our own (Debian's mariadb-server package is installed
# when its binaries are absent), root without password, on
# 127.0.0.1:$AUTOAPPROVAL_TEST_MYSQL_PORT (default 53306), data under .tools/.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
client() { command -v mariadb || command -v mysql || true; }
# answers URL: mysql://user[:password]@host[:port][/database]
answers() {
  local cli re='^mysql://([^:@/]+)(:([^@/]*))?@([^:/]+)(:([0-9]+))?(/.*)?$'
  cli="$(client)"
  [[ -n "$cli" && "$1" =~ $re ]] || return 1
  MYSQL_PWD="${BASH_REMATCH[3]}" "$cli" --protocol=tcp -h "${BASH_REMATCH[4]}" \
    -P "${BASH_REMATCH[6]:-3306}" -u "${BASH_REMATCH[1]}" --connect-timeout=2 \
    -e 'select 1' >/dev/null 2>&1
}

if [[ -n "${MYSQL_URL:-}" ]] && answers "$MYSQL_URL"; then
  echo "$MYSQL_URL"; exit 0
fi
local_url="mysql://root@127.0.0.1:3306/"
# AUTOAPPROVAL_TEST_MYSQL_OWN=1 skips the local server (to exercise the fallback).
if [[ -z "${AUTOAPPROVAL_TEST_MYSQL_OWN:-}" ]] && answers "$local_url"; then
  echo "$local_url"; exit 0
fi

server="$(command -v mariadbd || command -v mysqld || ls /usr/sbin/mariadbd /usr/sbin/mysqld 2>/dev/null | head -n 1 || true)"
if [[ -z "$server" || -z "$(client)" ]] || ! command -v mariadb-install-db >/dev/null; then
  echo "installing Debian's mariadb-server package..." >&2
  sudo=""
  [[ "$(id -u)" == 0 ]] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq >&2
  $sudo apt-get install -y -qq --no-install-recommends mariadb-server mariadb-client >&2
  server="$(command -v mariadbd || ls /usr/sbin/mariadbd /usr/sbin/mysqld 2>/dev/null | sed -n 1p)"
fi

port="${AUTOAPPROVAL_TEST_MYSQL_PORT:-53306}"
url="mysql://root@127.0.0.1:$port/"
dir="$repo/.tools/mariadb-$port"
if ! answers "$url"; then
  # A tmpdir of its own: a starting server removes every #sql* file in its
  # tmpdir, other servers' temporary tables included.
  mkdir -p "$dir/tmp"
  # mariadbd refuses to run as root unless told to; a throwaway server may.
  as_user=()
  [[ "$(id -u)" == 0 ]] && as_user=(--user=root)
  if [[ ! -d "$dir/data/mysql" ]]; then
    mariadb-install-db --no-defaults "${as_user[@]}" --datadir="$dir/data" \
      --tmpdir="$dir/tmp" --auth-root-authentication-method=normal --skip-test-db >"$dir/install.log" 2>&1 \
      || { cat "$dir/install.log" >&2; exit 1; }
  fi
  # root over TCP from 127.0.0.1 without a password, like the local server;
  # kept out of the binary log.
  cat >"$dir/init.sql" <<'SQL'
SET sql_log_bin = 0;
CREATE USER IF NOT EXISTS 'root'@'%';
GRANT ALL ON *.* TO 'root'@'%' WITH GRANT OPTION;
SQL
  # Started in the background; the server outlives this script, like
  # scripts/postgres.sh's cluster.
  nohup "$server" --no-defaults "${as_user[@]}" --datadir="$dir/data" --port="$port" \
    --tmpdir="$dir/tmp" \
    --bind-address=127.0.0.1 --socket="$dir/mysqld.sock" --pid-file="$dir/mysqld.pid" \
    --log-error="$dir/server.log" --skip-name-resolve --init-file="$dir/init.sql" \
    --max-connections=500 --innodb-flush-log-at-trx-commit=2 >/dev/null 2>&1 &
  for _ in $(seq 1 300); do
    answers "$url" && break
    sleep 0.1
  done
fi
answers "$url" || { echo "MariaDB did not come up on $url (see $dir/server.log)" >&2; exit 1; }
echo "$url"

#!/usr/bin/env bash
# What a business UPDATE pays for the wake trigger (docs/BENCHMARKS.md, issue 35):
# pgbench, one client, single-row UPDATEs of a watched and of an unwatched column
# of approval_request, side by side on three databases: no trigger, 0.2.0's
# trigger (its migrations, from git at $OLD) and this tree's binding.
# Usage: benches/trigger_cost.sh [seconds per run, default 10]; needs the
# server of scripts/postgres.sh (SERVER, default its URL without a database).
set -euo pipefail
cd "$(dirname "$0")/.."
SERVER=${SERVER:-postgres://postgres@127.0.0.1:55432}
OLD=${OLD:-d9f0131}
SECONDS_PER_RUN=${1:-10}
PGBENCH=$(command -v pgbench || ls /usr/lib/postgresql/*/bin/pgbench | tail -1)
for d in aa_trig_none aa_trig_old aa_trig_new; do
    psql -q "$SERVER/postgres" -c "DROP DATABASE IF EXISTS $d" -c "CREATE DATABASE $d"
done
for f in $(git ls-tree --name-only "$OLD" migrations/postgres/ | sort); do
    git show "$OLD:$f" | psql -q -v ON_ERROR_STOP=1 "$SERVER/aa_trig_old" >/dev/null
done
for f in migrations/postgres/controller/*.sql migrations/postgres/reference/*.sql; do
    psql -q -v ON_ERROR_STOP=1 -f "$f" "$SERVER/aa_trig_new" >/dev/null 2>&1
done
psql -q -v ON_ERROR_STOP=1 -f migrations/postgres/reference/0001_business_tables.sql "$SERVER/aa_trig_none" >/dev/null
for d in aa_trig_none aa_trig_old aa_trig_new; do
    psql -q "$SERVER/$d" \
        -c "INSERT INTO approval_request (request_type, status) SELECT 'OWNER_CONTRACT', 'PENDING' FROM generate_series(1, 10000)" \
        -c "VACUUM ANALYZE approval_request"
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf '%s\n' '\set id random(1, 10000)' \
    'UPDATE approval_request SET documents_released = NOT documents_released WHERE id = :id;' >"$work/watched.sql"
printf '%s\n' '\set id random(1, 10000)' \
    "UPDATE approval_request SET business_name = 'x' || :id WHERE id = :id;" >"$work/unwatched.sql"
for script in watched unwatched; do
    for round in 1 2 3; do
        for d in aa_trig_none aa_trig_old aa_trig_new; do
            latency=$("$PGBENCH" -n -c 1 -T "$SECONDS_PER_RUN" -f "$work/$script.sql" "$SERVER/$d" 2>/dev/null |
                sed -n 's/^latency average = //p')
            echo "$script round $round ${d#aa_trig_}: $latency"
        done
    done
done
for d in aa_trig_none aa_trig_old aa_trig_new; do
    psql -q "$SERVER/postgres" -c "DROP DATABASE $d"
done

#!/usr/bin/env bash
# Runs the controller on this machine against a throwaway stack, so its main
# job can be watched without a cluster: PostgreSQL (scripts/postgres.sh), the
# in-memory test API server, the external-system simulator, and three sample
# requests (one approvable at once, one waiting on its documents, one ad
# contract for a store that does not exist). Ctrl-C stops everything.
# Extra arguments go to `autoapproval run` (e.g. --poll-period 2s).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

base="$(scripts/postgres.sh | tail -n 1)"
PATH="$(scripts/install-tools.sh | tail -n 1):$PATH"
cargo build --quiet -p autoapproval -p autoapproval-sim -p kube-testserver

db=autoapproval_local
psql "$base" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
export AUTOAPPROVAL_DATABASE_URL="${base%/*}/$db"
target/debug/autoapproval migrate --reference-schema

tmp="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$tmp"' EXIT
target/debug/kube-testserver --kubeconfig "$tmp/kubeconfig" >"$tmp/apiserver.log" 2>&1 &
target/debug/autoapproval-sim --listen 127.0.0.1:0 >"$tmp/sim.log" 2>&1 &
for _ in $(seq 100); do
  [[ -s "$tmp/kubeconfig" ]] && grep -q "listening" "$tmp/sim.log" && break
  sleep 0.1
done
sim_url="http://$(grep -o '127\.0\.0\.1:[0-9]*' "$tmp/sim.log" | sed -n 1p)"
kubectl --kubeconfig "$tmp/kubeconfig" apply -f crds/autoapproval.yaml >/dev/null
for system in ESIGN OWNER STORE AD; do export "AUTOAPPROVAL_${system}_URL=$sim_url"; done

psql "$AUTOAPPROVAL_DATABASE_URL" -q <<'SQL'
INSERT INTO approval_request (id, request_type, status, sort_time, created_at, business_name,
    documents_released, operational_hold, menu_registered, logo_registered,
    previous_step_approved, econtract_ref, target_store_number)
VALUES (1, 'OWNER_CONTRACT', 'PENDING', now(), now(), 'Approvable', true,  false, true, true, true, 'EC-1', NULL),
       (2, 'OWNER_CONTRACT', 'PENDING', now(), now(), 'Waiting',    false, false, true, true, true, 'EC-2', NULL),
       (3, 'AD_CONTRACT',    'PENDING', now(), now(), 'No store',   true,  false, true, true, true, 'EC-3', 9999);
SQL
cat >&2 <<TXT

Watch it from another terminal:
  kubectl --kubeconfig $tmp/kubeconfig get autoapprovals -w
Release request 2's documents (it is approved within milliseconds):
  psql $AUTOAPPROVAL_DATABASE_URL -c "UPDATE approval_request SET documents_released = true WHERE id = 2"

TXT
target/debug/autoapproval run --kubeconfig "$tmp/kubeconfig" --namespace default \
  --listen 127.0.0.1:0 "$@"

#!/usr/bin/env bash
# Renders deploy/manifests/autoapproval.yaml, the plain manifests for `kubectl apply -f` without
# Helm, from the chart with its default values (release and namespace `autoapproval`). Run it
# after any change to the chart; a test (tests/it/deploy.rs) fails while the file is stale.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PATH="$(scripts/install-tools.sh | tail -n 1):$PATH"

out=deploy/manifests/autoapproval.yaml
mkdir -p "$(dirname "$out")"
{
  echo "# Rendered from deploy/helm/autoapproval with its default values by scripts/render-manifests.sh:"
  echo "# do not edit. Release and namespace: autoapproval. Apply crds/ and create the Secret first (README)."
  helm template autoapproval deploy/helm/autoapproval --namespace autoapproval
} >"$out.tmp"
mv "$out.tmp" "$out"
echo "$out" >&2

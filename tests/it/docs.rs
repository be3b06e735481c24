//! The documentation holds together: every relative link of README.md, docs/*.md and the
//! crates' and the chart's READMEs reaches a file that exists and, with a `#fragment`, a
//! heading of it (GitHub's anchor rules); and docs/INSTALL.md's install is the README's tested one.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::support::repo;

/// The Markdown files a reader follows links through, relative to the repository.
fn documents() -> Vec<PathBuf> {
    let mut files = vec![
        PathBuf::from("README.md"),
        PathBuf::from("deploy/helm/autoapproval/README.md"),
    ];
    for dir in ["docs", "crates"] {
        for entry in std::fs::read_dir(repo().join(dir)).expect(dir) {
            let path = entry.expect("entry").path();
            let readme = path.join("README.md");
            if path.extension().is_some_and(|e| e == "md") {
                files.push(path.strip_prefix(repo()).expect("in repo").to_owned());
            } else if readme.is_file() {
                files.push(readme.strip_prefix(repo()).expect("in repo").to_owned());
            }
        }
    }
    files.sort();
    files
}

/// The lines of a Markdown text outside fenced code blocks, with their numbers.
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut lines = vec![];
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            fenced = !fenced;
        } else if !fenced {
            lines.push((n + 1, line));
        }
    }
    lines
}

/// A line with its inline code spans removed (a link written in backticks is not a link).
fn without_code(line: &str) -> String {
    line.split('`')
        .enumerate()
        .filter(|(i, _)| i % 2 == 0)
        .map(|(_, part)| part)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The targets of a line's inline links and images, `[text](target)` and `![alt](target "title")`,
/// and of a reference definition, `[label]: target`.
fn link_targets(line: &str) -> Vec<String> {
    let line = without_code(line);
    let mut targets = vec![];
    if let Some(rest) = line.trim_start().strip_prefix('[')
        && let Some((_, target)) = rest.split_once("]: ")
    {
        targets.push(target.split_whitespace().next().unwrap_or("").to_owned());
    }
    let mut rest = line.as_str();
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else { break };
        let target = after[..end].split_whitespace().next().unwrap_or("");
        targets.push(target.trim_matches(['<', '>']).to_owned());
        rest = &after[end..];
    }
    targets
}

/// GitHub's anchor of a heading's text: inline markup dropped, lower case, every character but
/// letters, digits, `-`, `_` and spaces removed, spaces made `-` (github-slugger).
fn slug(heading: &str) -> String {
    let mut text = String::new();
    // A link in a heading contributes its text only.
    let mut rest = heading;
    while let Some(open) = rest.find('[') {
        match rest[open..].find("](").zip(rest[open..].find(')')) {
            Some((mid, close)) if mid < close => {
                text.push_str(&rest[..open]);
                text.push_str(&rest[open + 1..open + mid]);
                rest = &rest[open + close + 1..];
            }
            _ => break,
        }
    }
    text.push_str(rest);
    text.to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors a Markdown text offers: one per heading, a repeated one suffixed `-1`, `-2`, …
/// as GitHub does, plus explicit `<a name="…">` / `<a id="…">` anchors.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for (_, line) in prose(text) {
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if (1..=6).contains(&hashes) && line[hashes..].starts_with(' ') {
            let base = slug(line[hashes..].trim());
            let mut anchor = base.clone();
            let mut n = 0;
            while seen.contains(&anchor) {
                n += 1;
                anchor = format!("{base}-{n}");
            }
            seen.insert(anchor);
        }
        let html = without_code(line);
        for attr in ["<a name=\"", "<a id=\""] {
            let mut rest = html.as_str();
            while let Some(at) = rest.find(attr) {
                let value = &rest[at + attr.len()..];
                let end = value.find('"').unwrap_or(value.len());
                seen.insert(value[..end].to_owned());
                rest = &value[end..];
            }
        }
    }
    seen
}

/// Why a relative link of `from` does not resolve, or None when it does (or is not relative).
fn broken(from: &Path, target: &str) -> Option<String> {
    if target.is_empty() {
        return Some("an empty link".into());
    }
    if target.contains("://") || target.starts_with("mailto:") {
        return None;
    }
    let (path, fragment) = match target.split_once('#') {
        Some((path, fragment)) => (path, Some(fragment)),
        None => (target, None),
    };
    let file = if path.is_empty() {
        repo().join(from)
    } else if let Some(from_root) = path.strip_prefix('/') {
        repo().join(from_root)
    } else {
        repo()
            .join(from)
            .parent()
            .expect("a file's directory")
            .join(path)
    };
    if !file.exists() {
        return Some(format!("{} does not exist", file.display()));
    }
    let fragment = fragment?;
    if file.extension().is_none_or(|e| e != "md") {
        return None;
    }
    let offered = anchors(&std::fs::read_to_string(&file).expect("a Markdown file"));
    (!offered.contains(fragment)).then(|| {
        format!(
            "{} has no heading with the anchor #{fragment} (it has: {})",
            file.display(),
            offered.into_iter().collect::<Vec<_>>().join(", ")
        )
    })
}

#[test]
fn every_relative_link_of_the_readme_and_the_docs_resolves() {
    let mut failures = vec![];
    let mut checked = 0;
    for doc in documents() {
        let text = std::fs::read_to_string(repo().join(&doc)).expect("a document");
        for (n, line) in prose(&text) {
            for target in link_targets(line) {
                checked += 1;
                if let Some(why) = broken(&doc, &target) {
                    failures.push(format!("{}:{n}: ({target}): {why}", doc.display()));
                }
            }
        }
    }
    assert!(
        checked > 40,
        "only {checked} links found: is the parser blind?"
    );
    assert!(
        failures.is_empty(),
        "{} broken link(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The shell block after a `<!-- tested: install` marker.
fn install_block(text: &str) -> Option<&str> {
    let at = text.find("<!-- tested: install")?;
    let start = text[at..].find("```sh\n")? + at;
    let end = text[start + 6..].find("```")? + start + 6;
    Some(&text[start..end])
}

#[test]
fn the_install_guide_repeats_the_readmes_tested_install_verbatim() {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README");
    let guide = std::fs::read_to_string(repo().join("docs/INSTALL.md")).expect("INSTALL");
    let tested = install_block(&readme).expect("README.md's tested install block");
    assert!(
        guide.contains(tested),
        "docs/INSTALL.md does not show README.md's tested install:\n{tested}"
    );
}

#[test]
fn anchors_follow_githubs_rules() {
    assert_eq!(slug("Install into a cluster"), "install-into-a-cluster");
    assert_eq!(
        slug("Ours against the seed's two designs: `autoapproval-lab bench --compare`"),
        "ours-against-the-seeds-two-designs-autoapproval-lab-bench---compare"
    );
    assert_eq!(slug("Replicas — and Leases ×2"), "replicas--and-leases-2");
    assert_eq!(slug("See [the runbook](RUNBOOK.md)"), "see-the-runbook");
    let offered =
        anchors("# A\n## Same\n```\n## Not a heading\n```\n### Same\n<a name=\"x\"></a>\n");
    assert_eq!(
        offered,
        ["a", "same", "same-1", "x"].map(String::from).into()
    );
    assert_eq!(
        link_targets("[a](b.md#c) and ![i](d.svg \"t\") but not `[e](f)`"),
        ["b.md#c", "d.svg"]
    );
    assert_eq!(link_targets("[label]: docs/X.md#y"), ["docs/X.md#y"]);
}

/// The long flags a `--help` output lists.
fn flags_of(help: &str) -> BTreeSet<String> {
    help.lines()
        .filter_map(|line| {
            let line = line
                .trim_start()
                .trim_start_matches("-h, ")
                .trim_start_matches("-V, ");
            let flag = line.strip_prefix("--")?;
            let end = flag
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                .unwrap_or(flag.len());
            Some(format!("--{}", &flag[..end]))
        })
        .filter(|flag| flag != "--help" && flag != "--version")
        .collect()
}

#[test]
fn the_reference_lists_every_flag_of_every_command_of_the_binary() {
    let reference = std::fs::read_to_string(repo().join("docs/REFERENCE.md")).expect("REFERENCE");
    let mut missing = vec![];
    for command in [
        &[][..],
        &["run"],
        &["migrate"],
        &["crd"],
        &["request"],
        &["shadow-report"],
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_autoapproval"))
            .args(command)
            .arg("--help")
            .output()
            .expect("the binary runs");
        assert!(out.status.success(), "{command:?} --help");
        let help = String::from_utf8_lossy(&out.stdout);
        let flags = flags_of(&help);
        assert!(
            !flags.is_empty() || command.is_empty(),
            "{command:?}: {help}"
        );
        missing.extend(
            flags
                .into_iter()
                .filter(|flag| !reference.contains(&format!("`{flag}`")))
                .map(|flag| format!("autoapproval {} {flag}", command.join(" "))),
        );
    }
    assert!(
        missing.is_empty(),
        "docs/REFERENCE.md lacks a row (`--flag`) for: {missing:?}"
    );
}

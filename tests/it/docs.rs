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
        &["check"],
        &["crd"],
        &["request"],
        &["pause"],
        &["resume"],
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

/// The command lines and the inline code of a Markdown text: each fenced block's lines (a
/// `# comment` cut off, continuation lines joined) and each inline code span (a paragraph's lines
/// joined, so a span may wrap).
fn code_of(text: &str) -> Vec<String> {
    let mut code = vec![];
    let mut fenced = false;
    let mut paragraph = String::new();
    let mut line_so_far = String::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            let line = match line.find(" #") {
                Some(at) => &line[..at],
                None => line,
            };
            match line.strip_suffix('\\') {
                Some(head) => line_so_far.push_str(head),
                None => {
                    line_so_far.push_str(line);
                    code.push(std::mem::take(&mut line_so_far));
                }
            }
        } else if trimmed.is_empty() {
            code.extend(spans(&std::mem::take(&mut paragraph)));
        } else {
            paragraph.push_str(line);
            paragraph.push(' ');
        }
    }
    code.extend(spans(&paragraph));
    code
}

/// The inline code spans of a paragraph.
fn spans(paragraph: &str) -> Vec<String> {
    paragraph
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// `autoapproval <path…> --help`: what it prints, or None when that is no command.
fn help(path: &[&str]) -> Option<String> {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_autoapproval"))
        .args(path)
        .arg("--help")
        .output()
        .expect("the binary runs");
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The subcommands a `--help` output lists under `Commands:`.
fn subcommands_of(help: &str) -> BTreeSet<String> {
    help.lines()
        .skip_while(|line| !line.starts_with("Commands:"))
        .skip(1)
        .take_while(|line| !line.trim().is_empty())
        .filter_map(|line| line.split_whitespace().next().map(str::to_owned))
        .collect()
}

/// What is wrong with one `autoapproval …` command line: a word that should be a subcommand and
/// is not, a flag no command on its path has.
fn unknown_in(command: &str) -> Vec<String> {
    let words: Vec<&str> = command
        .split_whitespace()
        .skip_while(|w| *w != "autoapproval")
        .skip(1)
        .collect();
    let mut path: Vec<&str> = vec![];
    let mut helps = vec![help(&[]).expect("autoapproval --help")];
    let mut positional = false;
    let mut value_next = false;
    let mut wrong = vec![];
    for word in words {
        if std::mem::take(&mut value_next) {
            continue;
        }
        if let Some(flag) = word.strip_prefix("--") {
            let (name, inline) = match flag.split_once('=') {
                Some((name, _)) => (name, true),
                None => (flag, false),
            };
            let flag = format!("--{name}");
            if !helps.iter().any(|h| flags_of(h).contains(&flag)) {
                wrong.push(format!("`autoapproval {}` has no {flag}", path.join(" ")));
            }
            // `--flag <VALUE>` in the help: the next word is its value.
            value_next = !inline
                && helps.iter().any(|h| {
                    h.lines().any(|l| {
                        l.contains(&format!("{flag} <")) || l.contains(&format!("{flag}=<"))
                    })
                });
        } else if !positional && !word.starts_with('-') {
            let known = subcommands_of(helps.last().expect("a help"));
            if known.contains(word) {
                path.push(word);
                helps.push(help(&path).expect("a listed subcommand's help"));
            } else if path.is_empty() || !known.is_empty() {
                wrong.push(format!(
                    "`autoapproval {}` has no subcommand {word:?} (it has {known:?})",
                    path.join(" ")
                ));
                positional = true;
            } else {
                positional = true;
            }
        }
    }
    wrong
}

/// A chart value's dotted path (`config.pollPeriod`) is in values.yaml.
fn is_chart_value(values: &serde_yaml::Value, path: &str) -> bool {
    path.split('.')
        .try_fold(values, |at, key| at.get(key))
        .is_some()
}

#[test]
fn the_troubleshooting_pages_commands_and_values_exist() {
    let page = std::fs::read_to_string(repo().join("docs/TROUBLESHOOTING.md")).expect("page");
    let values: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo().join("deploy/helm/autoapproval/values.yaml"))
            .expect("values.yaml"),
    )
    .expect("values YAML");
    let job = crate::support::renders()[0].one("Job");
    let pod = &job["spec"]["template"]["spec"];
    let containers: BTreeSet<&str> = ["initContainers", "containers"]
        .iter()
        .flat_map(|k| pod[*k].as_array().into_iter().flatten())
        .filter_map(|c| c["name"].as_str())
        .collect();
    let mut wrong = vec![];
    let (mut commands, mut settings) = (0, 0);
    for code in code_of(&page) {
        let code = code.trim().trim_start_matches("$ ");
        if code.starts_with("autoapproval ") {
            commands += 1;
            wrong.extend(unknown_in(code));
        }
        // A chart value: `--set key=…`, or a dotted path whose head is a top-level value.
        let mut named: Vec<&str> = code
            .split("--set ")
            .skip(1)
            .filter_map(|rest| rest.split('=').next())
            .collect();
        let key = code.split('=').next().unwrap_or("");
        let head = key.split('.').next().unwrap_or("");
        if key.contains('.')
            && values.get(head).is_some()
            && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '.')
        {
            named.push(key);
        }
        for value in named {
            settings += 1;
            if !is_chart_value(&values, value) {
                wrong.push(format!("the chart has no value {value}"));
            }
        }
        // The container a `kubectl logs job/<release>-migrate -c NAME` reads.
        if code.contains("job/autoapproval-migrate")
            && let Some(name) = code.split(" -c ").nth(1)
        {
            let name = name.split_whitespace().next().unwrap_or("");
            if !containers.contains(name) {
                wrong.push(format!("the migration Job has no container {name}"));
            }
        }
    }
    assert!(
        commands >= 4 && settings >= 10,
        "only {commands} autoapproval commands and {settings} chart values found: is the parser blind?"
    );
    assert!(wrong.is_empty(), "docs/TROUBLESHOOTING.md: {wrong:#?}");
}

#[test]
fn command_checks_catch_a_wrong_subcommand_or_flag() {
    assert!(unknown_in("autoapproval check --database-url \"$URL\"").is_empty());
    assert!(unknown_in("autoapproval request --database-url \"$URL\" retry 7").is_empty());
    assert!(unknown_in("autoapproval migrate --print-sql --database-url=x").is_empty());
    assert_eq!(unknown_in("autoapproval chek").len(), 1);
    assert_eq!(unknown_in("autoapproval check --databse-url x").len(), 1);
    assert_eq!(
        unknown_in("autoapproval request --database-url x shw 7").len(),
        1
    );
    assert_eq!(
        code_of("a `wrapped\nspan` and\n```sh\nx \\\n  y # note\n```\n"),
        ["x   y", "wrapped span"]
    );
}

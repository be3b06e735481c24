//! The documentation holds together: every relative link of README.md, docs/*.md and the
//! crates' and the chart's READMEs reaches a file that exists and, with a `#fragment`, a
//! heading of it (GitHub's anchor rules); docs/INSTALL.md's install is the README's tested one;
//! the integration guide's request types are the code's; and every flag a string of src/ names
//! is one the binary has.

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

/// The string literals of a Rust source, comments left out: what its messages can say. Plain
/// and raw strings; char literals (`'"'`) and lifetimes do not open one.
fn string_literals(source: &str) -> Vec<String> {
    let mut found = vec![];
    let mut rest = source;
    while let Some(at) = rest.find(['/', '"', '\'', 'r']) {
        let (before, from) = rest.split_at(at);
        let after_ident = before
            .chars()
            .last()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        if let Some(comment) = from.strip_prefix("//") {
            rest = comment.find('\n').map_or("", |end| &comment[end..]);
        } else if let Some(comment) = from.strip_prefix("/*") {
            rest = comment.find("*/").map_or("", |end| &comment[end + 2..]);
        } else if from.starts_with('r') && !after_ident {
            let hashes = from[1..].chars().take_while(|c| *c == '#').count();
            let open = format!("{}\"", "#".repeat(hashes));
            if from[1..].starts_with(&open) {
                let body = &from[1 + open.len()..];
                let close = format!("\"{}", "#".repeat(hashes));
                let end = body.find(&close).unwrap_or(body.len());
                found.push(body[..end].to_owned());
                rest = body.get(end + close.len()..).unwrap_or("");
            } else {
                rest = &from[1..];
            }
        } else if let Some(body) = from.strip_prefix('"') {
            let mut text = String::new();
            let mut chars = body.char_indices();
            let mut end = body.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        chars.next();
                    }
                    '"' => {
                        end = i;
                        break;
                    }
                    c => text.push(c),
                }
            }
            found.push(text);
            rest = body.get(end + 1..).unwrap_or("");
        } else if let Some(body) = from.strip_prefix('\'') {
            // A char literal ('x', '\n', '\u{..}') is skipped whole; a lifetime is not one.
            let len = if body.starts_with('\\') {
                body.find('\'').map_or(0, |end| end + 1)
            } else {
                let mut chars = body.chars();
                match (chars.next(), chars.next()) {
                    (Some(c), Some('\'')) => c.len_utf8() + 1,
                    _ => 0,
                }
            };
            rest = &body[len..];
        } else {
            rest = &from[1..];
        }
    }
    found
}

/// The `--flag` words in `text`.
fn flag_words(text: &str) -> Vec<String> {
    let mut words = vec![];
    let mut rest = text;
    while let Some(at) = rest.find("--") {
        let before = rest[..at].chars().last();
        let after = &rest[at + 2..];
        let len = after
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'))
            .unwrap_or(after.len());
        let word = after[..len].trim_end_matches('-');
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            && word.starts_with(|c: char| c.is_ascii_lowercase())
        {
            words.push(format!("--{word}"));
        }
        rest = &after[len..];
    }
    words
}

#[test]
fn string_literals_and_their_flags_are_read_as_rust_has_them() {
    let source = r####"
        // "--in-a-comment"
        let c = '"'; let l: &'a str = "a message names (--poll-interval) and --x-y";
        /* "--in-a-block" */ let raw = r#"raw "--raw-flag""#; let e = "say \"--quoted\" -- not";
    "####;
    let literals = string_literals(source);
    let flags: Vec<String> = literals.iter().flat_map(|l| flag_words(l)).collect();
    assert_eq!(
        flags,
        ["--poll-interval", "--x-y", "--raw-flag", "--quoted"],
        "{literals:?}"
    );
}

/// Issue 44: the MySQL wake warning named `--poll-interval`, a flag no command has (it is
/// `--poll-period`). Every `--flag` a string of src/ names (a message, an error, a help text;
/// not its unit tests) is a flag of some command of the binary.
#[test]
fn every_flag_a_message_of_the_binary_names_is_one_of_its_flags() {
    let mut known = BTreeSet::new();
    let mut commands: Vec<Vec<String>> = vec![vec![]];
    while let Some(path) = commands.pop() {
        let words: Vec<&str> = path.iter().map(String::as_str).collect();
        let Some(text) = help(&words) else { continue };
        known.extend(flags_of(&text));
        for sub in subcommands_of(&text).into_iter().filter(|s| s != "help") {
            commands.push([path.clone(), vec![sub]].concat());
        }
    }
    assert!(known.contains("--poll-period"), "{known:?}");
    let mut files = vec![repo().join("src")];
    let mut unknown = BTreeSet::new();
    while let Some(path) = files.pop() {
        if path.is_dir() {
            files.extend(
                std::fs::read_dir(&path)
                    .expect("a source directory")
                    .map(|e| e.expect("an entry").path()),
            );
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let source = std::fs::read_to_string(&path).expect("a source file");
        // Unit tests make up flags of their own.
        let source = source.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
        for literal in string_literals(source) {
            for flag in flag_words(&literal) {
                if !known.contains(&flag) {
                    unknown.insert(format!(
                        "{flag} in {}",
                        path.strip_prefix(repo()).unwrap_or(&path).display()
                    ));
                }
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "strings of src/ name flags no command has: {unknown:?}"
    );
}

/// docs/INTEGRATING.md's table of request types: every type the code knows, in its order,
/// and "yes" exactly for the two it approves.
#[test]
fn the_integration_guide_lists_the_request_types_the_code_knows() {
    use autoapproval::domain::RequestType;

    let guide = std::fs::read_to_string(repo().join("docs/INTEGRATING.md")).expect("the guide");
    let section = guide
        .split("\n### Request types\n")
        .nth(1)
        .expect("a section `### Request types`");
    let listed: Vec<(String, bool)> = section
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|row| {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            (
                cells[1].trim_matches('`').to_owned(),
                cells[2].starts_with("yes"),
            )
        })
        .collect();
    let known: Vec<(String, bool)> = RequestType::ALL
        .iter()
        .map(|t| (t.as_str().to_owned(), t.is_auto_approvable()))
        .collect();
    assert_eq!(listed, known);
}

//! The Dockerfile: one build stage, and the binary run non-root in a minimal runtime stage.

use crate::support::repo;

#[test]
fn the_dockerfile_builds_in_one_stage_and_runs_the_binary_non_root_in_a_minimal_one() {
    use dockerfile_parser::{Dockerfile, Instruction, ShellOrExecExpr};

    let text = std::fs::read_to_string(repo().join("Dockerfile")).expect("Dockerfile");
    let dockerfile = Dockerfile::parse(&text).expect("a Dockerfile the parser reads");
    let stages = dockerfile.stages();
    assert!(stages.stages.len() >= 2, "a multi-stage build");
    let builder = &stages.stages[0];
    let runtime = stages.stages.last().unwrap();

    let from = |stage: &dockerfile_parser::Stage| match &stage.instructions[0] {
        Instruction::From(f) => f.image.content.clone(),
        other => panic!("a stage starts with FROM, not {other:?}"),
    };
    assert!(from(builder).starts_with("rust:"), "{}", from(builder));
    let builds = builder.instructions.iter().any(|i| match i {
        Instruction::Run(run) => run
            .expr
            .as_shell()
            .is_some_and(|shell| shell.to_string().contains("cargo build --release --locked")),
        _ => false,
    });
    assert!(builds, "the builder runs cargo build --release --locked");
    // The context has no .git: the revision comes in as a build argument, which build.rs reads
    // from the environment the RUN after it sees.
    let position =
        |wanted: &dyn Fn(&Instruction) -> bool| builder.instructions.iter().position(|i| wanted(i));
    let revision_arg = position(
        &|i| matches!(i, Instruction::Arg(arg) if arg.name.content == "AUTOAPPROVAL_GIT_REVISION"),
    );
    let build = position(
        &|i| matches!(i, Instruction::Run(run) if run.expr.as_shell().is_some_and(|s| s.to_string().contains("cargo build"))),
    );
    assert!(
        revision_arg.is_some() && revision_arg < build,
        "the builder declares ARG AUTOAPPROVAL_GIT_REVISION before cargo build"
    );

    let base = from(runtime);
    assert!(
        base.starts_with("gcr.io/distroless/") || base == "scratch",
        "the runtime image is minimal: {base}"
    );
    let mut copies = vec![];
    let mut user = None;
    let mut entrypoint = None;
    let mut cmd = None;
    let exec = |expr: &ShellOrExecExpr| match expr {
        ShellOrExecExpr::Exec(args) => args.as_str_vec().join(" "),
        ShellOrExecExpr::Shell(_) => panic!("exec form expected: no shell in the runtime image"),
    };
    for i in &runtime.instructions[1..] {
        match i {
            Instruction::Copy(c) => copies.push(c),
            Instruction::Entrypoint(e) => entrypoint = Some(exec(&e.expr)),
            Instruction::Cmd(c) => cmd = Some(exec(&c.expr)),
            Instruction::Misc(m) if m.instruction.content.eq_ignore_ascii_case("USER") => {
                user = Some(m.arguments.to_string().trim().to_owned())
            }
            Instruction::Misc(m) => {
                let name = m.instruction.content.to_uppercase();
                assert!(
                    ["EXPOSE", "LABEL"].contains(&name.as_str()),
                    "unexpected {name} in the runtime stage"
                );
            }
            other => panic!("unexpected instruction in the runtime stage: {other:?}"),
        }
    }
    // Only the binary comes over from the builder.
    assert_eq!(copies.len(), 1, "one COPY in the runtime stage");
    let copy = copies[0];
    let from_flag: Vec<&str> = copy
        .flags
        .iter()
        .filter(|f| f.name.content == "from")
        .map(|f| f.value.content.as_str())
        .collect();
    assert_eq!(
        from_flag,
        [builder.name.as_deref().expect("the builder stage is named")]
    );
    assert_eq!(copy.sources.len(), 1);
    assert!(copy.sources[0].content.ends_with("/autoapproval"));
    assert_eq!(copy.destination.content, "/autoapproval");

    // A numeric, non-root user, so the kubelet can verify runAsNonRoot.
    let user = user.expect("a USER in the runtime stage");
    let ids: Vec<Result<u32, _>> = user.split(':').map(str::parse::<u32>).collect();
    assert!(
        ids.iter().all(|id| id.as_ref().is_ok_and(|id| *id != 0)),
        "USER {user}: numeric and not root"
    );
    assert_eq!(entrypoint.expect("ENTRYPOINT"), "/autoapproval");
    assert_eq!(cmd.expect("CMD"), "run");

    let ignored = std::fs::read_to_string(repo().join(".dockerignore")).expect(".dockerignore");
    for entry in ["target/", ".tools/", ".git"] {
        assert!(
            ignored.lines().any(|l| l.trim() == entry),
            ".dockerignore lacks {entry}"
        );
    }
}

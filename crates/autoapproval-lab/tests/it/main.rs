//! The lab's tests, one binary: the real `autoapproval-lab` as a user runs
//! it. Its replicas run the `autoapproval` binary beside it, which
//! `cargo test --workspace` builds (the product's own tests need it).

mod demo;
mod outages;
mod seed_redis;
mod shadow_run;

/// Sends `SIG<name>` to `pid`.
pub fn signal(pid: u32, name: &str) {
    let sent = std::process::Command::new("kill")
        .args([format!("-{name}"), pid.to_string()])
        .status()
        .expect("kill");
    assert!(sent.success(), "kill -{name} {pid}");
}

/// Fails with the fix when the controller binary the stack starts is missing.
pub fn assert_controller_built() {
    let lab = std::path::Path::new(env!("CARGO_BIN_EXE_autoapproval-lab"));
    let controller = lab.with_file_name("autoapproval");
    assert!(
        controller.is_file(),
        "{} is missing: run the lab's tests with `cargo test --workspace` (or `cargo build -p autoapproval` first)",
        controller.display()
    );
}

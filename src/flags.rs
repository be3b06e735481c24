//! What every group of clap flags shares: defaults written once, in the
//! `#[arg(default_value…)]` attributes that `--help` shows.

/// The values a group of flags takes when none is given: their clap
/// defaults, with every environment variable ignored, so that defaults are
/// written once, in the `#[arg(default_value…)]` that `--help` shows.
pub fn defaults_of<A: clap::Args + clap::FromArgMatches>() -> Result<A, clap::Error> {
    let command = A::augment_args(clap::Command::new("defaults"))
        .mut_args(|arg| arg.env(None::<&'static str>));
    A::from_arg_matches(&command.try_get_matches_from(["defaults"])?)
}

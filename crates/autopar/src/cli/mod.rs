//! One module per subcommand. Each exposes its clap `Args` and a `run` returning the exit code.

pub mod calibrate;
pub mod ckpt;
pub mod common;
pub mod launch;
pub mod layout;
pub mod plan;
pub mod train;

/// Print an error as `autopar: <first line>` followed by indented facts and causes; the error
/// of a failed rank as `autopar[RANK]: ...`.
pub fn report_error(err: &anyhow::Error) {
    let (prefix, text) = match err.downcast_ref::<autopar_runtime::TrainError>() {
        Some(autopar_runtime::TrainError::Rank { rank, source }) => (format!("autopar[{rank}]"), source.to_string()),
        _ => ("autopar".to_string(), format!("{err}")),
    };
    let mut lines = text.lines();
    if let Some(first) = lines.next() {
        eprintln!("{prefix}: {first}");
    }
    for line in lines {
        let line = line.trim_start();
        if line.starts_with("hint:") {
            eprintln!("{line}");
        } else {
            eprintln!("  {line}");
        }
    }
    for cause in err.chain().skip(1) {
        eprintln!("  caused by: {cause}");
    }
}

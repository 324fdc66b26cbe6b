//! Logs through `tracing`, on stderr: what was planned, what each rank does (its thread is
//! named `rank-N`), and timings. `-v` shows autopar's `info` events, `-vv` `debug` (every
//! step of every rank), `-vvv` `trace`; `AUTOPAR_LOG` takes a full filter instead
//! (`AUTOPAR_LOG=autopar_runtime=debug,autopar_checkpoint=info`) and wins over the flags.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// The crates whose events `-v` turns on.
const CRATES: [&str; 8] = [
    "autopar",
    "autopar_runtime",
    "autopar_parallel",
    "autopar_checkpoint",
    "autopar_comm",
    "autopar_data",
    "autopar_models",
    "autopar_tensor",
];

/// The filter for `verbosity` (the count of `-v`) when `AUTOPAR_LOG` is not set.
pub fn filter_for(verbosity: u8) -> String {
    let level = match verbosity {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    std::iter::once("warn".to_string()).chain(CRATES.iter().map(|c| format!("{c}={level}"))).collect::<Vec<_>>().join(",")
}

/// Install the stderr subscriber once per process (later calls do nothing). A malformed
/// `AUTOPAR_LOG` is an error naming it.
pub fn init(verbosity: u8) -> Result<(), String> {
    let directives = match std::env::var("AUTOPAR_LOG") {
        Ok(v) if !v.trim().is_empty() => v,
        _ => filter_for(verbosity),
    };
    let filter = EnvFilter::builder().parse(&directives).map_err(|e| {
        format!("invalid AUTOPAR_LOG {directives:?}: {e}\nhint: AUTOPAR_LOG=info, or autopar_runtime=debug,autopar_checkpoint=info")
    })?;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_thread_names(true)
        .with_target(true)
        .with_timer(tracing_subscriber::fmt::time::uptime())
        .try_init();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_v_lowers_the_level_of_autopars_crates_only() {
        assert!(filter_for(0).contains("autopar_runtime=warn"));
        assert!(filter_for(1).contains("autopar_runtime=info") && filter_for(1).starts_with("warn,"));
        assert!(filter_for(2).contains("autopar_checkpoint=debug"));
        assert!(filter_for(5).contains("autopar=trace"));
        for v in 0..4 {
            assert!(EnvFilter::builder().parse(filter_for(v)).is_ok());
        }
    }
}

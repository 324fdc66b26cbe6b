//! The `autopar` binary: parses the command line and runs it (`autopar::cli`). Results go to
//! stdout, progress and errors to stderr. Exit codes: 0 success, 1 a "no" answer (e.g. a
//! verification found a mismatch), 2 an error.

use std::process::ExitCode;

use autopar::cli::{self, Cli, Command};
use clap::Parser;

/// Commands whose output is read through pipes (`autopar ckpt inspect F | head`) end quietly
/// when the reader goes away, as other Unix tools do, instead of failing on the broken pipe.
fn quiet_on_closed_pipe() {
    #[cfg(unix)]
    // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() -> ExitCode {
    autopar::keep_freed_memory();
    let cli = Cli::parse();
    if matches!(cli.command, Command::Layout(_) | Command::Ckpt(_) | Command::Plan(_)) {
        quiet_on_closed_pipe();
    }
    // Not a held lock: rank threads print step lines to stdout while the command runs.
    let result = cli::run(cli, &mut std::io::stdout());
    match result {
        Ok(code) => code,
        Err(err) => {
            cli::report_error(&err);
            ExitCode::from(2)
        }
    }
}

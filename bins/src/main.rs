//! The `flowforge` binary: parses the command line, runs the command, and maps
//! its outcome to an exit code (docs/design/cli.md#exit-codes). Everything else
//! lives in [`cli`], one module per command.

// Printing reports and errors is this binary's job: the workspace-wide
// print lints do not apply here.
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod cli;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // Usage errors exit 2 (clap's default, and "invalid input or usage" in
    // docs/design/cli.md#exit-codes); --help and --version exit 0.
    let args = cli::Cli::parse();
    if let Err(usage) = args.check() {
        usage.exit();
    }
    // The OTLP exporter's HTTP client shares reqwest with the `http` task
    // type, whose TLS setup leaves the default crypto provider unchosen.
    flowforge_adapters_http::task::install_default_tls_provider();
    match cli::run(args) {
        Ok(exit) => exit.into(),
        Err(error) => {
            eprintln!("error: {error:#}");
            cli::Exit::Infrastructure.into()
        }
    }
}

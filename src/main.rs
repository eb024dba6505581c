//! tbbench: the binary. Parses flags (cli.rs), picks the suite, hands it to the runner's
//! driver. Suites are registered here and nowhere else.

mod cli;

use clap::Parser;
use cli::{Cli, Command};
use tbbench_reports::Tool;
use tbbench_runners::driver;

fn tool() -> Tool {
    Tool {
        name: "tbbench".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        git_commit: env!("TBBENCH_GIT_COMMIT").into(),
    }
}

fn main() {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                e.exit();
            }
            // One line naming the cause; `--help` has the rest.
            let text = e.render().to_string();
            let first = text
                .lines()
                .next()
                .unwrap_or("bad arguments")
                .trim_start_matches("error: ");
            eprintln!("tbbench: error: {first} (see tbbench --help)");
            std::process::exit(2);
        }
    };
    let result = match &cli.command {
        Command::Link(args) => {
            driver::run::<tbbench_link::LinkSuite>(&args.config(), &args.run.options(), &tool())
        }
        Command::Hpl(args) => args.config().and_then(|config| {
            driver::run::<tbbench_hpl::HplSuite>(&config, &args.run.options(), &tool())
        }),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("tbbench: error: {e:#}");
            std::process::exit(1);
        }
    }
}

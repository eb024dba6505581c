//! tbbench: the binary. Parses flags (cli.rs), picks the suite, hands it to the runner's
//! driver. Suites are registered here and nowhere else.

mod cli;
mod env;
mod quick;

use clap::Parser;
use cli::{Cli, Command};
use tbbench_reports::commands;
use tbbench_runners::driver;
use tbbench_schema::Tool;

fn tool() -> Tool {
    Tool {
        name: "tbbench".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        git_commit: env!("TBBENCH_GIT_COMMIT").into(),
    }
}

fn generator() -> String {
    let t = tool();
    format!(
        "{} {} ({})",
        t.name,
        t.version,
        t.git_commit.chars().take(10).collect::<String>()
    )
}

/// An error is one line, also when it quotes input that has line breaks or other control
/// characters in it (they are shown escaped).
fn one_line(message: &str) -> String {
    message
        .chars()
        .flat_map(|c| {
            if c.is_control() {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect()
}

fn main() {
    // Before any thread starts (see the function).
    tbbench_hpl::kernels::before_threads();
    tbbench_runners::launch::set_side_by_side(tbbench_reports::report::network_table);
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
            // clap's message, without the usage and tips it appends after a blank line (the
            // message itself may quote a value with line breaks: those are shown escaped).
            let text = e.render().to_string();
            let end = ["\n\nUsage:", "\n\nFor more information", "\n\n  tip:"]
                .iter()
                .filter_map(|m| text.find(m))
                .min()
                .unwrap_or(text.len());
            // clap lists missing arguments on indented lines: one line, comma-separated.
            let message = text[..end]
                .trim()
                .trim_start_matches("error: ")
                .replace(":\n  ", ": ")
                .replace("\n  ", ", ");
            eprintln!(
                "tbbench: error: {} (see tbbench --help)",
                one_line(&message)
            );
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
        Command::Report(a) => commands::run_report(&commands::ReportOptions {
            inputs: a.inputs.clone(),
            html: a.out.clone(),
            json: a.json.clone(),
            strict: a.strict,
            threshold_pct: a.threshold,
            exports: a.export.clone(),
            export_dir: a.export_dir.clone(),
            generator: generator(),
        }),
        Command::Compare(a) => commands::run_compare(&commands::CompareOptions {
            base: a.base.clone(),
            new: a.new.clone(),
            threshold_pct: a.threshold,
            json: a.json.clone(),
            strict: a.strict,
        }),
        Command::Run(a) => quick::run(a, &generator()),
        Command::Env(a) => env::run(a.json),
        Command::Infer(a) if a.gguf.is_some() || a.shape.is_some() => {
            a.decode_config().and_then(|config| {
                driver::run::<tbbench_infer::decode::DecodeSuite>(
                    &config,
                    &a.run.options(),
                    &tool(),
                )
            })
        }
        Command::Infer(a) => tbbench_infer::endpoint::run(&a.config(), &tool()),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            tbbench_runners::gate::say(&format!("tbbench: error: {}", one_line(&format!("{e:#}"))));
            std::process::exit(1);
        }
    }
}

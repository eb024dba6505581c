//! tbbench: the binary. Builds the command line from the commands that are not suites
//! (cli.rs) and the suites' registrations (registry.rs), installs the suites' report views,
//! then runs what was asked for.

mod cli;
mod env;
mod predict;
mod quick;
mod registry;

use cli::{Cli, Command};
use tbbench_reports::commands;
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

/// A usage error: clap's message on one line, exit 2 (help and version print as clap does).
fn usage_error(e: clap::Error) -> ! {
    use clap::error::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        e.exit();
    }
    // clap's message, without the usage and tips it appends after a blank line (the message
    // itself may quote a value with line breaks: those are shown escaped).
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

/// The commands that are not suites.
fn run_command(cli: &Cli, suites: &[tbbench_runners::cli::Registration]) -> anyhow::Result<i32> {
    match &cli.command {
        Command::Report(a) => commands::run_report(&a.options(generator())),
        Command::Compare(a) => commands::run_compare(&a.options()),
        Command::Run(a) => quick::run(a, suites, &generator()),
        Command::Env(a) => env::run(a.json),
        Command::Predict(a) => predict::run(&a.options()?, &tool()),
    }
}

/// Ends the process quietly, as SIGPIPE ends any Unix tool, when what reads its output is gone
/// (`tbbench link | head`): Rust's println! panics on a closed stdout. SIGPIPE itself stays
/// ignored, so a write to a rank that died is an error the launcher reports. The launcher's
/// exit closes its ranks' stdin, which ends them and removes what they share.
fn quiet_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        // EPIPE is 32 on Linux and macOS; the text is strerror's, in the C locale.
        let epipe = msg.contains("Broken pipe") || msg.contains("(os error 32)");
        if msg.starts_with("failed printing to stdout") && epipe {
            std::process::exit(141);
        }
        default(info);
    }));
}

fn main() {
    quiet_on_closed_stdout();
    // Before any thread starts (see the function).
    let reads_files_only = matches!(
        std::env::args().nth(1).as_deref(),
        Some("report" | "compare" | "predict")
    );
    tbbench_hpl::kernels::before_threads(!reads_files_only);
    // Suites that report a host's BLAS (doctor) read it through the runner, from the hpl
    // suite's loader.
    tbbench_runners::hostcheck::set_blas_probe(|| {
        use tbbench_hpl::kernels;
        let blas = kernels::record();
        let problem = kernels::kernel_problem(&blas);
        (blas, problem)
    });
    // `--over` prints the networks side by side with the report's own key figures.
    tbbench_runners::launch::set_side_by_side(tbbench_reports::report::network_table);
    use clap::{CommandFactory, FromArgMatches};
    // The report, compare, `run --quick`'s report and `--over`'s table read results through
    // the suites' views: installed before any command runs.
    let mut suites = Vec::new();
    let mut views = Vec::new();
    for entry in registry::suites() {
        suites.push(entry.registration);
        views.extend(entry.views);
    }
    // Predictions are not a suite (they run nothing) but the report shows them.
    views.push(Box::new(predict::view::PredictView));
    tbbench_reports::views::install(views);
    // Suites first in help, in the registry's order; then the other commands.
    let others: Vec<String> = Cli::command()
        .get_subcommands()
        .map(|c| c.get_name().to_string())
        .collect();
    let command = others.iter().fold(
        suites.iter().enumerate().fold(Cli::command(), |c, (i, s)| {
            c.subcommand((s.command)().display_order(i))
        }),
        |c, name| c.mut_subcommand(name, |sub| sub.display_order(100)),
    );
    let matches = match command.try_get_matches() {
        Ok(m) => m,
        Err(e) => usage_error(e),
    };
    let result = match matches.subcommand() {
        Some((name, m)) if suites.iter().any(|s| s.name == name) => {
            let suite = suites.iter().find(|s| s.name == name).expect("listed");
            (suite.run)(m, &tool())
        }
        _ => match Cli::from_arg_matches(&matches) {
            Ok(cli) => run_command(&cli, &suites),
            Err(e) => usage_error(e),
        },
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            tbbench_runners::gate::say(&format!("tbbench: error: {}", one_line(&format!("{e:#}"))));
            // A mistake in the flags (as clap's own) exits 2; a run that failed, 1.
            let usage = e
                .downcast_ref::<tbbench_runners::cli::UsageError>()
                .is_some();
            std::process::exit(if usage { 2 } else { 1 });
        }
    }
}

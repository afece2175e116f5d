//! The man page, `man/lockrun.1`: NAME, SYNOPSIS, DESCRIPTION, OPTIONS and COMMANDS
//! rendered from the clap definitions in lockrun's `src/cli.rs` with `clap_mangen`, then
//! the hand-written sections of `man/sections.roff` (with one ENVIRONMENT entry for each
//! option that reads a variable in place of its `@OPTION-VARIABLES@` line), then VERSION.

use clap::CommandFactory;
use clap_mangen::roff::{bold, roman, Roff};
use clap_mangen::Man;
use lockrun::cli::Cli;

use crate::MAN_SECTIONS;

/// The built clap command (subcommands get their bin names, `lockrun run` and so on).
fn built_cli() -> clap::Command {
    let mut cmd = Cli::command();
    cmd.build();
    cmd
}

fn subcommand(cli: &clap::Command, name: &str) -> clap::Command {
    cli.find_subcommand(name)
        .unwrap_or_else(|| panic!("no subcommand {name} in src/cli.rs"))
        .clone()
}

/// The apostrophe preamble that `roff` puts at the start of every rendering.
const ROFF_PREAMBLE: &str = ".ie \\n(.g .ds Aq \\(aq\n.el .ds Aq '\n";

/// Renders roff without the preamble.
fn roff_text(render: impl FnOnce(&mut Vec<u8>) -> std::io::Result<()>) -> String {
    let mut buf = Vec::new();
    render(&mut buf).expect("render roff");
    let text = String::from_utf8(buf).expect("roff is UTF-8");
    match text.strip_prefix(ROFF_PREAMBLE) {
        Some(rest) => rest.to_owned(),
        None => text,
    }
}

/// Appends one part of the page; the preamble goes only at the start of the page.
fn part(out: &mut String, render: impl FnOnce(&mut Vec<u8>) -> std::io::Result<()>) {
    if out.is_empty() {
        out.push_str(ROFF_PREAMBLE);
    }
    out.push_str(&roff_text(render));
}

/// The usage line of a subcommand without "Usage: "; `run` is shown as optional.
fn usage(sub: &clap::Command) -> String {
    let usage = sub.clone().render_usage().to_string();
    let usage = usage
        .strip_prefix("Usage: ")
        .unwrap_or(&usage)
        .trim()
        .to_owned();
    match usage.strip_prefix("lockrun run ") {
        Some(rest) => format!("lockrun [run] {rest}"),
        None => usage,
    }
}

/// The usage line as roff: the program name in bold.
fn usage_inline(usage: &str) -> Vec<clap_mangen::roff::Inline> {
    let rest = usage
        .strip_prefix("lockrun")
        .expect("usage starts with lockrun");
    vec![bold("lockrun"), roman(rest)]
}

/// SYNOPSIS: one line a subcommand, from clap's own usage strings.
fn synopsis(subs: &[clap::Command]) -> Roff {
    let mut roff = Roff::new();
    roff.control("SH", ["SYNOPSIS"]);
    for (i, sub) in subs.iter().enumerate() {
        if i > 0 {
            roff.control("br", []);
        }
        roff.text(usage_inline(&usage(sub)));
    }
    roff
}

/// The ids of `sub`'s arguments that `run` has too (backend and logging options, NAME,
/// help).
fn shared_with_run(run: &clap::Command, sub: &clap::Command) -> Vec<String> {
    sub.get_arguments()
        .filter(|a| run.get_arguments().any(|r| r.get_id() == a.get_id()))
        .map(|a| a.get_id().to_string())
        .collect()
}

/// COMMANDS: each subcommand's usage, description and the options `run` does not have.
fn commands_section(out: &mut String, run: &clap::Command, others: &[clap::Command]) {
    let mut roff = Roff::new();
    roff.control("SH", ["COMMANDS"]);
    for sub in std::iter::once(run).chain(others) {
        roff.control("TP", []);
        roff.text(usage_inline(&usage(sub)));
        let about = sub
            .get_long_about()
            .or(sub.get_about())
            .map(|a| a.to_string());
        roff.text([roman(about.unwrap_or_default())]);
    }
    roff.control("PP", []);
    part(out, |w| roff.to_writer(w));
    for sub in others {
        let shared = shared_with_run(run, sub);
        let own = shared
            .iter()
            .fold(sub.clone(), |c, id| c.mut_arg(id, |a| a.hide(true)));
        let rendered = roff_text(|w| Man::new(own).render_options_section(w));
        let options = rendered
            .strip_prefix(".SH OPTIONS\n")
            .expect("clap_mangen starts the options with .SH OPTIONS");
        let mut head = Roff::new();
        head.text([
            roman("Options of "),
            bold(format!("lockrun {}", sub.get_name())),
            roman(" besides those it shares with "),
            bold("run"),
            roman(format!(
                " ({}):",
                shared_long_names(sub, &shared).join(", ")
            )),
        ]);
        part(out, |w| head.to_writer(w));
        out.push_str(options);
        out.push_str(".PP\n");
    }
}

/// The shared options as the user types them (`--url`, `-q`), NAME and help left out.
fn shared_long_names(sub: &clap::Command, shared: &[String]) -> Vec<String> {
    sub.get_arguments()
        .filter(|a| shared.iter().any(|id| id == a.get_id().as_str()))
        .filter(|a| !a.is_positional() && a.get_id() != "help")
        .filter_map(|a| match (a.get_long(), a.get_short()) {
            (Some(long), _) => Some(format!("--{long}")),
            (None, Some(short)) => Some(format!("-{short}")),
            (None, None) => None,
        })
        .collect()
}

/// The marker in `man/sections.roff` that the option variables replace.
const OPTION_VARIABLES: &str = ".\\\" @OPTION-VARIABLES@";

/// One ENVIRONMENT entry for every option that reads a variable, in the order of
/// `run`'s options, then those of the other subcommands.
fn option_variables(subs: &[clap::Command]) -> String {
    let mut seen: Vec<String> = Vec::new();
    let mut roff = Roff::new();
    for arg in subs.iter().flat_map(|s| s.get_arguments()) {
        let (Some(env), Some(long)) = (arg.get_env(), arg.get_long()) else {
            continue;
        };
        let env = env.to_string_lossy().into_owned();
        if seen.contains(&env) {
            continue;
        }
        let help = arg
            .get_long_help()
            .or(arg.get_help())
            .map(|h| h.to_string());
        let help = help
            .unwrap_or_default()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        let end = if help.ends_with('.') { "" } else { "." };
        roff.control("TP", []);
        roff.text([
            bold(env.as_str()),
            roman(" ("),
            bold(format!("--{long}")),
            roman(")"),
        ]);
        roff.text([roman(format!("{help}{end}"))]);
        seen.push(env);
    }
    roff_text(|w| roff.to_writer(w))
}

/// The hand-written sections with the option variables in place of their marker.
fn hand_written_sections(text: &str, subs: &[clap::Command]) -> String {
    let marker = text
        .lines()
        .find(|l| l.starts_with(OPTION_VARIABLES))
        .unwrap_or_else(|| panic!("{MAN_SECTIONS} lost its {OPTION_VARIABLES} line"))
        .to_owned();
    text.replace(&format!("{marker}\n"), &option_variables(subs))
}

/// The whole man page: the sections generated from the clap definitions, then
/// `sections` (the text of `man/sections.roff`), then VERSION.
pub fn man_page(sections: &str) -> String {
    let cli = built_cli();
    let run = subcommand(&cli, "run");
    let others = [subcommand(&cli, "status"), subcommand(&cli, "release")];
    let man = Man::new(cli.clone());
    let mut out = String::new();
    part(&mut out, |_| Ok(()));
    // Written by hand: clap_mangen leaves out an empty date, which shifts the source
    // and manual into the wrong fields. No date, so that the page only changes with
    // the code.
    let version = cli.get_version().expect("the clap command has a version");
    out.push_str(&format!(
        ".TH LOCKRUN 1 \"\" \"lockrun {version}\" \"User Commands\"\n"
    ));
    // No hyphenation and a ragged right margin: option names stay whole, long URLs do
    // not stretch lines. groff 1.23's man macros set the margin anew at each paragraph
    // from string AD (`b` unless set: "cannot adjust line" on the long URL lines).
    out.push_str(".nh\n.ad l\n.ds AD l\n");
    part(&mut out, |w| man.render_name_section(w));
    let subs = [run.clone(), others[0].clone(), others[1].clone()];
    part(&mut out, |w| synopsis(&subs).to_writer(w));
    part(&mut out, |w| man.render_description_section(w));
    part(&mut out, |w| {
        Man::new(run.clone()).render_options_section(w)
    });
    commands_section(&mut out, &run, &others);
    out.push_str(&hand_written_sections(sections, &subs));
    part(&mut out, |w| man.render_version_section(w));
    out
}

//! The documentation stays in sync with the code.
//!
//! - `man/lockrun.1` is generated from the clap definitions in `src/cli.rs` (with
//!   `clap_mangen`) plus the hand-written sections in `man/sections.roff`; the bash, zsh
//!   and fish completions under `packaging/completions/` are generated with
//!   `clap_complete`. Each test regenerates one file in memory and fails when the
//!   committed file differs. `LOCKRUN_REGENERATE=1 cargo test --test docs` writes them.
//! - The page passes `groff -ww` without a warning; its ENVIRONMENT and EXIT STATUS
//!   sections name every variable and status the code knows.
//! - Every `lockrun` command line in the man page's EXAMPLES, the README, the Kubernetes
//!   CronJob and the systemd unit parses with the current options.
//! - The fencing examples (`packaging/examples/`) run under lockrun against a real Redis
//!   and the machine's PostgreSQL, and refuse a stale token; the README shows them as
//!   they are.
//!
//! Depends on the library's `cli`, `config` and `outcome` modules and on `support`.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::*;
use clap::{CommandFactory, Parser};
use clap_complete::Shell;
use clap_mangen::roff::{bold, roman, Roff};
use clap_mangen::Man;
use lockrun::cli::{self, Cli};
use lockrun::config::{LockName, RunConfig};
use lockrun::outcome::{Outcome, DEFAULT_CONFLICT_EXIT_CODE};

/// Set to `1` to write the generated files instead of comparing them.
const REGENERATE: &str = "LOCKRUN_REGENERATE";

/// The man page, relative to the crate root.
const MAN_PAGE: &str = "man/lockrun.1";

/// The hand-written sections appended to the generated part of the man page.
const MAN_SECTIONS: &str = "man/sections.roff";

/// Where each shell's completion script lives.
const COMPLETIONS: [(Shell, &str); 3] = [
    (Shell::Bash, "packaging/completions/lockrun.bash"),
    (Shell::Zsh, "packaging/completions/_lockrun"),
    (Shell::Fish, "packaging/completions/lockrun.fish"),
];

/// Files whose `sh` code blocks may run lockrun.
const MARKDOWN: [&str; 1] = ["README.md"];

/// The fencing examples that the README shows and a test runs.
const FENCING_EXAMPLES: [&str; 2] = [
    "packaging/examples/fenced-write-postgres.sh",
    "packaging/examples/fenced-write-redis.sh",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("cannot read {rel}: {e}"))
}

// ---------------------------------------------------------------------------------------
// Generating
// ---------------------------------------------------------------------------------------

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

/// `man/sections.roff` with the option variables in place of their marker.
fn hand_written_sections(subs: &[clap::Command]) -> String {
    let text = read(MAN_SECTIONS);
    let marker = text
        .lines()
        .find(|l| l.starts_with(OPTION_VARIABLES))
        .unwrap_or_else(|| panic!("{MAN_SECTIONS} lost its {OPTION_VARIABLES} line"))
        .to_owned();
    text.replace(&format!("{marker}\n"), &option_variables(subs))
}

/// The whole man page: generated sections, then `man/sections.roff`, then VERSION.
fn man_page() -> String {
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
    // not stretch lines.
    out.push_str(".nh\n.ad l\n");
    part(&mut out, |w| man.render_name_section(w));
    let subs = [run.clone(), others[0].clone(), others[1].clone()];
    part(&mut out, |w| synopsis(&subs).to_writer(w));
    part(&mut out, |w| man.render_description_section(w));
    part(&mut out, |w| {
        Man::new(run.clone()).render_options_section(w)
    });
    commands_section(&mut out, &run, &others);
    out.push_str(&hand_written_sections(&subs));
    part(&mut out, |w| man.render_version_section(w));
    out
}

/// One shell's completion script.
fn completion(shell: Shell) -> String {
    let mut buf = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "lockrun", &mut buf);
    String::from_utf8(buf).expect("completion is UTF-8")
}

// ---------------------------------------------------------------------------------------
// Comparing
// ---------------------------------------------------------------------------------------

/// Compares `generated` with the committed file `rel`, or writes it when
/// `LOCKRUN_REGENERATE=1`.
fn check_or_write(rel: &str, generated: &str) {
    let path = root().join(rel);
    if std::env::var(REGENERATE).as_deref() == Ok("1") {
        fs::create_dir_all(path.parent().expect("a file in a folder")).expect("create folder");
        fs::write(&path, generated).unwrap_or_else(|e| panic!("cannot write {rel}: {e}"));
        eprintln!("wrote {rel}");
        return;
    }
    let how_to_fix = format!(
        "run `{REGENERATE}=1 cargo test --test docs` and commit {rel} \
         (it is generated from src/cli.rs and {MAN_SECTIONS}; do not edit it by hand)"
    );
    let committed = fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{rel} cannot be read ({e}): {how_to_fix}"));
    if committed == generated {
        return;
    }
    let (committed_lines, generated_lines): (Vec<_>, Vec<_>) =
        (committed.lines().collect(), generated.lines().collect());
    let line = committed_lines
        .iter()
        .zip(&generated_lines)
        .position(|(c, g)| c != g)
        .unwrap_or(committed_lines.len().min(generated_lines.len()));
    panic!(
        "{rel} is out of date with the clap definitions: first difference at line {}\n\
         committed: {:?}\ngenerated: {:?}\n{how_to_fix}",
        line + 1,
        committed_lines
            .get(line)
            .copied()
            .unwrap_or("<end of file>"),
        generated_lines
            .get(line)
            .copied()
            .unwrap_or("<end of file>"),
    );
}

#[test]
fn man_page_is_up_to_date() {
    check_or_write(MAN_PAGE, &man_page());
}

#[test]
fn bash_completion_is_up_to_date() {
    let (shell, rel) = COMPLETIONS[0];
    check_or_write(rel, &completion(shell));
}

#[test]
fn zsh_completion_is_up_to_date() {
    let (shell, rel) = COMPLETIONS[1];
    check_or_write(rel, &completion(shell));
}

#[test]
fn fish_completion_is_up_to_date() {
    let (shell, rel) = COMPLETIONS[2];
    check_or_write(rel, &completion(shell));
}

// ---------------------------------------------------------------------------------------
// The page itself
// ---------------------------------------------------------------------------------------

#[test]
fn man_page_renders_without_groff_warnings() {
    use std::io::Write;
    use std::process::Stdio;
    let mut groff = Command::new("groff")
        .args(["-man", "-Tutf8", "-ww", "-z"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot run groff ({e}): install Debian's groff-base (.ci/run does)")
        });
    let page = man_page();
    groff
        .stdin
        .take()
        .expect("stdin")
        .write_all(page.as_bytes())
        .expect("write to groff");
    let out = groff.wait_with_output().expect("wait for groff");
    let warnings = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && warnings.trim().is_empty(),
        "groff -man -ww finds problems in the man page ({}):\n{warnings}",
        out.status
    );
}

/// The text of section `name` of the page (from `.SH name` to the next `.SH`).
fn section<'a>(page: &'a str, name: &str) -> &'a str {
    let heading = if name.contains(' ') {
        format!(".SH \"{name}\"\n")
    } else {
        format!(".SH {name}\n")
    };
    let start = page
        .find(&heading)
        .unwrap_or_else(|| panic!("the man page has no section {name}"))
        + heading.len();
    let end = page[start..]
        .find("\n.SH ")
        .map_or(page.len(), |i| start + i);
    &page[start..end]
}

#[test]
fn man_page_has_every_section_issue_7_asks_for() {
    let page = man_page();
    for name in [
        "NAME",
        "SYNOPSIS",
        "DESCRIPTION",
        "OPTIONS",
        "COMMANDS",
        "EXIT STATUS",
        "ENVIRONMENT",
        "SIGNALS",
        "GUARANTEES",
        "EXAMPLES",
        "CAVEATS",
    ] {
        assert!(!section(&page, name).trim().is_empty(), "{name} is empty");
    }
    let caveats = section(&page, "CAVEATS");
    for needle in ["SIGTTIN", "own session", "backend's data"] {
        assert!(
            caveats.contains(needle),
            "CAVEATS does not mention {needle:?}"
        );
    }
}

/// Every `LOCKRUN_*` name in `text`.
fn lockrun_variables(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (i, _) in text.match_indices("LOCKRUN_") {
        let name: String = text[i..]
            .chars()
            .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        if !found.contains(&name) {
            found.push(name);
        }
    }
    found
}

fn rust_sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("read src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn environment_section_names_every_variable_lockrun_reads_or_sets() {
    let page = man_page();
    let environment = section(&page, "ENVIRONMENT");
    let mut wanted = Vec::new();
    let cli = built_cli();
    for sub in cli.get_subcommands() {
        for arg in sub.get_arguments() {
            if let Some(env) = arg.get_env() {
                wanted.push(env.to_string_lossy().into_owned());
            }
        }
    }
    let mut sources = Vec::new();
    rust_sources(&root().join("src"), &mut sources);
    for path in sources {
        // Unit tests may use LOCKRUN_ strings that are not variables: read only the
        // code above a file's test module, and no file of tests.
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if name.ends_with("tests.rs") {
            continue;
        }
        let text = fs::read_to_string(&path).expect("read");
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        wanted.extend(lockrun_variables(code));
    }
    let documented = lockrun_variables(environment);
    let missing: Vec<_> = wanted.iter().filter(|v| !documented.contains(v)).collect();
    assert!(
        missing.is_empty(),
        "ENVIRONMENT in {MAN_SECTIONS} does not name {missing:?}, which the code uses"
    );
    let unknown: Vec<_> = documented.iter().filter(|v| !wanted.contains(v)).collect();
    assert!(
        unknown.is_empty(),
        "ENVIRONMENT in {MAN_SECTIONS} names {unknown:?}, which the code does not use"
    );
}

#[test]
fn exit_status_section_names_every_status_lockrun_chooses() {
    let page = man_page();
    let exit_status = section(&page, "EXIT STATUS");
    let chosen = [
        Outcome::Busy(DEFAULT_CONFLICT_EXIT_CODE),
        Outcome::LockLost,
        Outcome::MaxRuntime,
        Outcome::Failed,
        Outcome::CannotExecute,
        Outcome::NotFound,
    ];
    for outcome in chosen {
        let code = outcome.exit_code();
        assert!(
            exit_status.contains(&format!(".B {code}\n"))
                || exit_status.contains(&format!(".BR {code} ")),
            "EXIT STATUS in {MAN_SECTIONS} has no entry for {code} ({outcome:?})"
        );
    }
    assert!(exit_status.contains("128 + N"), "no entry for 128+N");
}

// ---------------------------------------------------------------------------------------
// Examples parse
// ---------------------------------------------------------------------------------------

/// A shell token: a word, or an unquoted operator that ends a simple command.
#[derive(Debug, PartialEq)]
enum Token {
    Word(String),
    Operator,
}

/// Splits one shell line the way `sh` would for the simple lines of examples: single and
/// double quotes, backslashes, `#` comments, and `; & | ( ) < >` as operators. Nothing is
/// expanded (`$VAR` stays as it is).
fn shell_tokens(line: &str) -> Vec<Token> {
    let mut tokens = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                w.extend(chars.by_ref().take_while(|&c| c != '\''));
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => w.extend(chars.next()),
                        c => w.push(c),
                    }
                }
            }
            '\\' => word.get_or_insert_with(String::new).extend(chars.next()),
            '#' if word.is_none() => break,
            c if c.is_whitespace() => tokens.extend(word.take().map(Token::Word)),
            ';' | '&' | '|' | '(' | ')' | '<' | '>' => {
                tokens.extend(word.take().map(Token::Word));
                tokens.push(Token::Operator);
            }
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    tokens.extend(word.map(Token::Word));
    tokens
}

/// The arguments of the first `lockrun` command on a shell line (after the program name,
/// up to the first operator), if there is one.
fn lockrun_invocation(line: &str) -> Option<Vec<String>> {
    let tokens = shell_tokens(line);
    let is_lockrun =
        |t: &Token| matches!(t, Token::Word(w) if w == "lockrun" || w.ends_with("/lockrun"));
    let start = tokens.iter().position(is_lockrun)?;
    let args = tokens[start + 1..]
        .iter()
        .map_while(|t| match t {
            Token::Word(w) => Some(w.clone()),
            Token::Operator => None,
        })
        .collect();
    Some(args)
}

/// Joins lines that end in a backslash with the next one.
fn join_continuations(text: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        match line.strip_suffix('\\') {
            Some(head) => current.push_str(head),
            None => {
                current.push_str(line);
                lines.push(std::mem::take(&mut current));
            }
        }
    }
    if !current.is_empty() {
        lines.push(current);
    }
    lines
}

/// The command lines in the `.EX` blocks of the page's EXAMPLES, unescaped.
fn man_examples(page: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut in_example = false;
    for line in section(page, "EXAMPLES").lines() {
        match line {
            ".EX" => in_example = true,
            ".EE" => in_example = false,
            _ if in_example => lines.push(
                line.replace("\\-", "-")
                    .replace("\\(aq", "'")
                    .replace("\\(dq", "\"")
                    .replace("\\&", "")
                    .replace("\\e", "\\"),
            ),
            _ => {}
        }
    }
    join_continuations(&lines.join("\n"))
}

/// The lines of the Markdown code blocks tagged as shell.
fn markdown_shell_lines(markdown: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut in_shell = false;
    let mut block = String::new();
    for line in markdown.lines() {
        let trimmed = line.trim_start();
        if let Some(info) = trimmed.strip_prefix("```") {
            if in_shell {
                lines.extend(join_continuations(&block));
                block.clear();
                in_shell = false;
            } else {
                in_shell = matches!(info.trim(), "sh" | "bash" | "shell" | "console" | "crontab");
            }
        } else if in_shell {
            block.push_str(line);
            block.push('\n');
        }
    }
    lines
}

/// The `command:` and `args:` of the container in the CronJob (block lists of plain or
/// double-quoted scalars, as the example writes them).
fn cronjob_invocation(yaml: &str) -> Vec<String> {
    let mut argv = Vec::new();
    let mut in_list = false;
    for line in yaml.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') {
            continue;
        }
        if matches!(trimmed, "command:" | "args:") {
            in_list = true;
        } else if let Some(item) = trimmed.strip_prefix("- ").filter(|_| in_list) {
            let item = item.split(" #").next().unwrap_or(item).trim();
            let item = item
                .strip_prefix('"')
                .and_then(|i| i.strip_suffix('"'))
                .unwrap_or(item);
            argv.push(item.to_owned());
        } else {
            in_list = false;
        }
    }
    argv
}

/// Checks that `args` (after the program name) parse, and for `run` that the checked
/// configuration accepts them (unless they depend on the environment or on files).
fn check_invocation(source: &str, args: &[String]) -> Result<(), String> {
    let shown = format!("{source}: `lockrun {}`", args.join(" "));
    let argv: Vec<OsString> = std::iter::once("lockrun".into())
        .chain(args.iter().map(OsString::from))
        .collect();
    let parsed = match Cli::try_parse_from(cli::with_default_subcommand(argv)) {
        Ok(parsed) => parsed,
        Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelp => return Ok(()),
        Err(e) => {
            let first = e.to_string().lines().next().unwrap_or_default().to_owned();
            return Err(format!("{shown} does not parse: {first}"));
        }
    };
    let name = match &parsed.command {
        cli::Command::Run(run) => &run.name,
        cli::Command::Status(status) => &status.name,
        cli::Command::Release(release) => &release.name,
    };
    LockName::parse(name).map_err(|e| format!("{shown}: {e}"))?;
    if let cli::Command::Run(run) = &parsed.command {
        let before_command = args.iter().take_while(|a| *a != "--");
        let from_environment = before_command.clone().any(|a| a.contains('$'));
        if !from_environment && run.backend.password_file.is_none() {
            RunConfig::from_args(run, None).map_err(|e| format!("{shown}: {e}"))?;
        }
    }
    Ok(())
}

/// Every lockrun command line in the docs and examples, with where it comes from.
fn documented_invocations() -> Vec<(String, Vec<String>)> {
    let mut found = Vec::new();
    let mut from_lines = |source: &str, lines: Vec<String>| {
        let before = found.len();
        for line in lines {
            if let Some(args) = lockrun_invocation(&line) {
                found.push((source.to_owned(), args));
            }
        }
        found.len() - before
    };
    let man = from_lines("man page EXAMPLES", man_examples(&man_page()));
    assert!(
        man >= 4,
        "found only {man} lockrun lines in the man page's EXAMPLES"
    );
    for rel in MARKDOWN {
        from_lines(rel, markdown_shell_lines(&read(rel)));
    }
    let service = "packaging/systemd/lockrun-example.service";
    let exec_start = read(service)
        .lines()
        .filter_map(|l| l.strip_prefix("ExecStart="))
        .map(str::to_owned)
        .collect();
    assert_eq!(
        from_lines(service, exec_start),
        1,
        "{service}: no ExecStart with lockrun"
    );
    let cronjob = "packaging/kubernetes/cronjob.yaml";
    let argv = cronjob_invocation(&read(cronjob));
    assert_eq!(
        argv.first().map(String::as_str),
        Some("lockrun"),
        "{cronjob}: {argv:?}"
    );
    found.push((cronjob.to_owned(), argv[1..].to_vec()));
    found
}

#[test]
fn every_documented_command_line_parses_with_the_current_options() {
    let invocations = documented_invocations();
    let errors: Vec<String> = invocations
        .iter()
        .filter_map(|(source, args)| check_invocation(source, args).err())
        .collect();
    assert!(
        errors.is_empty(),
        "documented lockrun command lines that the current options reject:\n{}",
        errors.join("\n")
    );
}

#[test]
fn the_example_checker_rejects_what_lockrun_rejects() {
    // The checker must be able to fail: an unknown option, a bad duration, a renewal
    // period as long as the TTL, a bad lock name.
    let line = |l: &str| lockrun_invocation(l).expect("a lockrun line");
    for bad in [
        "lockrun --no-such-option job -- true",
        "*/5 * * * * lockrun --ttl 5 job -- true",
        "lockrun --ttl 5s --renew-every 5s job -- true",
        "x && lockrun 'bad name' -- true # comment",
    ] {
        assert!(check_invocation("test", &line(bad)).is_err(), "{bad}");
    }
    assert_eq!(
        line("exec /usr/bin/lockrun -q job -- sh -c 'a; b' >> log 2>&1"),
        ["-q", "job", "--", "sh", "-c", "a; b"]
    );
    assert_eq!(lockrun_invocation("# lockrun job -- true"), None);
}

// ---------------------------------------------------------------------------------------
// Fencing examples run
// ---------------------------------------------------------------------------------------

#[test]
fn the_readme_shows_the_fencing_examples_as_they_are() {
    let readmes: Vec<String> = MARKDOWN
        .iter()
        .filter_map(|rel| fs::read_to_string(root().join(rel)).ok())
        .collect();
    for rel in FENCING_EXAMPLES {
        let script = read(rel);
        assert!(
            readmes.iter().any(|text| text.contains(&script)),
            "neither of {MARKDOWN:?} shows {rel} verbatim: copy the file into its code block"
        );
    }
}

/// Runs a fencing example under lockrun and returns lockrun's result.
fn run_fenced(url: &str, script: &str, env: &[(&str, &str)]) -> Finished {
    let path = root().join(script);
    let mut cmd = lockrun_run(url, "report", &[], &["sh", path.to_str().expect("utf-8")]);
    cmd.envs(env.iter().copied());
    run(cmd)
}

/// Runs a fencing example as a holder that lost the lock long ago would: with a stale
/// token, and no lockrun around it.
fn run_stale(script: &str, token: u64, env: &[(&str, &str)]) -> Finished {
    let mut cmd = Command::new("sh");
    cmd.arg(root().join(script))
        .env("LOCKRUN_FENCING_TOKEN", token.to_string())
        .envs(env.iter().copied());
    run(cmd)
}

#[test]
fn the_redis_fencing_example_refuses_a_stale_token() {
    let redis = RedisServer::start();
    let url = redis.url();
    let env = [("DATA_REDIS_URL", url.as_str())];
    let script = FENCING_EXAMPLES[1];
    let fence = || -> u64 {
        let fence = redis
            .hget("report:result", "fence")
            .expect("no result written");
        fence.parse().expect("a numeric fence")
    };
    run_fenced(&url, script, &env).assert_code(0);
    let first = fence();
    let body = redis.hget("report:result", "body");
    let stale = run_stale(script, first - 1, &env);
    stale.assert_code(1);
    assert!(
        stale.stderr.contains("stale fencing token"),
        "{}",
        stale.stderr
    );
    assert_eq!(
        (fence(), redis.hget("report:result", "body")),
        (first, body)
    );
    run_fenced(&url, script, &env).assert_code(0);
    assert!(fence() > first, "the next holder's write did not land");
}

/// A schema of the machine's PostgreSQL for one test, dropped at the end.
struct PgSchema {
    url: String,
    name: String,
}

impl PgSchema {
    fn create() -> PgSchema {
        let url = std::env::var("LOCKRUN_TEST_DATABASE_URL")
            .unwrap_or_else(|_| "postgresql://127.0.0.1:5432/test".to_owned());
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_nanos();
        let name = format!("lockrun_docs_{}_{nanos}", std::process::id());
        let schema = PgSchema { url, name };
        schema.psql(&format!("CREATE SCHEMA {}", schema.name));
        schema
    }

    /// The environment that makes the example's unqualified table land in this schema.
    fn env(&self) -> [(&'static str, String); 2] {
        [
            ("DATABASE_URL", self.url.clone()),
            ("PGOPTIONS", format!("-c search_path={}", self.name)),
        ]
    }

    fn psql(&self, sql: &str) -> String {
        let out = Command::new("psql")
            .args([
                self.url.as_str(),
                "-X",
                "-q",
                "-t",
                "-A",
                "-v",
                "ON_ERROR_STOP=1",
            ])
            .args(["-c", sql])
            .output()
            .unwrap_or_else(|e| panic!("cannot run psql ({e}): install postgresql-client"));
        assert!(
            out.status.success(),
            "psql {} -c {sql:?} failed (this test needs the machine's PostgreSQL; \
             LOCKRUN_TEST_DATABASE_URL overrides the URL): {}",
            self.url,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }
}

impl Drop for PgSchema {
    fn drop(&mut self) {
        let _ = Command::new("psql")
            .args([self.url.as_str(), "-X", "-q", "-c"])
            .arg(format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name))
            .output();
    }
}

#[test]
fn the_postgres_fencing_example_refuses_a_stale_token() {
    let redis = RedisServer::start();
    let schema = PgSchema::create();
    let env = schema.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let script = FENCING_EXAMPLES[0];
    let row = || schema.psql(&format!("SELECT fence, body FROM {}.report", schema.name));
    let fence = |row: &str| -> u64 {
        let fence = row.split('|').next().expect("a row");
        fence.parse().expect("a numeric fence")
    };
    run_fenced(&redis.url(), script, &env).assert_code(0);
    let first = row();
    let stale = run_stale(script, fence(&first) - 1, &env);
    stale.assert_code(1);
    assert!(
        stale.stderr.contains("stale fencing token"),
        "{}",
        stale.stderr
    );
    assert_eq!(row(), first, "a stale token changed the row");
    run_fenced(&redis.url(), script, &env).assert_code(0);
    assert!(
        fence(&row()) > fence(&first),
        "the next holder's write did not land"
    );
}

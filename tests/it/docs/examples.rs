//! Every `lockrun` command line in the docs and examples parses with the current
//! options: the man page's EXAMPLES, the shell blocks of README and the other Markdown
//! pages (`docs/`), the systemd unit's `ExecStart` and the Kubernetes CronJob's
//! container command.

use std::ffi::OsString;

use clap::Parser;
use lockrun::cli::{self, Cli};
use lockrun::config::{LockName, RunConfig};

use super::{man_page, markdown_pages, read, section};

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
        cli::Command::List(_) => "any",
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
    let mut markdown = 0;
    for rel in markdown_pages() {
        markdown += from_lines(&rel, markdown_shell_lines(&read(&rel)));
    }
    assert!(
        markdown >= 10,
        "found only {markdown} lockrun lines in the Markdown pages"
    );
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

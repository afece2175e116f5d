//! The Markdown pages hold together: every relative link points to a file that exists,
//! and an `#anchor` to a heading of that page (GitHub's heading ids), so moving a page
//! or renaming a heading cannot leave a dead link; and every test that
//! `docs/guarantees.md` names for a property exists.

use std::collections::HashMap;
use std::fs;
use std::path::{Component, Path, PathBuf};

use super::{markdown_pages, read, root, rust_sources};

/// The page that names a test for each safety property.
const GUARANTEES: &str = "docs/guarantees.md";

/// The lines of `markdown` outside fenced code blocks.
fn prose_lines(markdown: &str) -> Vec<&str> {
    let mut lines = Vec::new();
    let mut fenced = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            lines.push(line);
        }
    }
    lines
}

/// The targets of the inline links (`[text](target)`) of `markdown`, outside code blocks
/// and code spans.
fn link_targets(markdown: &str) -> Vec<String> {
    let mut targets = Vec::new();
    for line in prose_lines(markdown) {
        let mut in_code = false;
        let text: String = line
            .chars()
            .filter(|&c| {
                if c == '`' {
                    in_code = !in_code;
                }
                c != '`' && !in_code
            })
            .collect();
        let mut rest = text.as_str();
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            targets.push(after[..end].to_owned());
            rest = &after[end..];
        }
    }
    targets
}

/// The ids GitHub gives the headings of `markdown`: lower case, punctuation dropped,
/// spaces made hyphens, and `-1`, `-2`, ... after a repeated one.
fn heading_ids(markdown: &str) -> Vec<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut ids = Vec::new();
    for line in prose_lines(markdown) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        let Some(title) = line[hashes..].strip_prefix(' ').filter(|_| hashes > 0) else {
            continue;
        };
        let id: String = title
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let n = seen.entry(id.clone()).or_insert(0);
        ids.push(if *n == 0 { id } else { format!("{id}-{n}") });
        *n += 1;
    }
    ids
}

/// `path` with its `.` and `..` parts resolved (without looking at the file system).
fn normalise(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// What is wrong with the link `target` of page `page` (relative to the crate root),
/// if anything.
fn dead_link(page: &str, target: &str) -> Option<String> {
    if target.contains("://") || target.starts_with("mailto:") {
        return None;
    }
    let (file, anchor) = target.split_once('#').unwrap_or((target, ""));
    let rel = if file.is_empty() {
        PathBuf::from(page)
    } else {
        normalise(&Path::new(page).parent().unwrap_or(Path::new("")).join(file))
    };
    let path = root().join(&rel);
    if !path.exists() {
        return Some(format!(
            "{page}: ({target}) points to {}, which does not exist",
            rel.display()
        ));
    }
    if anchor.is_empty() || path.extension().is_none_or(|e| e != "md") {
        return None;
    }
    let ids = heading_ids(&fs::read_to_string(&path).expect("read a linked page"));
    (!ids.iter().any(|id| id == anchor)).then(|| {
        format!(
            "{page}: ({target}): {} has no heading #{anchor}",
            rel.display()
        )
    })
}

#[test]
fn every_relative_link_points_to_a_file_and_heading_that_exist() {
    let mut dead = Vec::new();
    let mut checked = 0;
    for page in markdown_pages() {
        for target in link_targets(&read(&page)) {
            checked += 1;
            dead.extend(dead_link(&page, &target));
        }
    }
    assert!(
        checked >= 50,
        "found only {checked} links in the Markdown pages"
    );
    assert!(dead.is_empty(), "dead links:\n{}", dead.join("\n"));
}

#[test]
fn the_link_checker_finds_dead_links() {
    // It must be able to fail: a missing file, a missing heading, and a link hidden in
    // code is no link.
    assert!(dead_link("README.md", "docs/no-such-page.md").is_some());
    assert!(dead_link("docs/backends.md", "../README.md#no-such-heading").is_some());
    assert!(dead_link("docs/backends.md", "../README.md#install").is_none());
    assert!(dead_link("docs/backends.md", "#redis-keys").is_none());
    assert!(dead_link("README.md", "https://example.invalid/x.md").is_none());
    assert_eq!(
        link_targets("[a](b.md) `[c](d.md)`\n```\n[e](f.md)\n```\n[g](h.md#i)"),
        ["b.md", "h.md#i"]
    );
    assert_eq!(
        heading_ids("# A b\n## `c` and `d --e`\n```\n# not a heading\n```\n### A b\n"),
        ["a-b", "c-and-d---e", "a-b-1"]
    );
}

/// Whether the file or module a "Checked by" line names exists: a path below the crate
/// root or `tests/it/`, or a module of the test binary.
fn test_path_exists(path: &str) -> bool {
    let it = root().join("tests/it");
    if path.ends_with(".rs") {
        root().join(path).is_file() || it.join(path).is_file()
    } else {
        it.join(path).is_dir() || it.join(format!("{path}.rs")).is_file()
    }
}

#[test]
fn every_test_the_guarantees_page_names_exists() {
    let page = read(GUARANTEES);
    let mut sources = Vec::new();
    rust_sources(&root().join("src"), &mut sources);
    rust_sources(&root().join("tests"), &mut sources);
    let code: String = sources
        .iter()
        .map(|p| fs::read_to_string(p).expect("read a source file"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut named = 0;
    let mut missing = Vec::new();
    for paragraph in page
        .split("\n\n")
        .filter(|p| p.starts_with("*Checked by:*"))
    {
        // The odd pieces between backticks are the code spans.
        for span in paragraph.split('`').skip(1).step_by(2) {
            let (path, name) = match span.rsplit_once("::") {
                Some((path, name)) => (Some(path), name),
                None if span.ends_with(".rs") || span.ends_with('/') => (Some(span), ""),
                None => (None, span),
            };
            if let Some(path) = path.map(|p| p.trim_end_matches('/')) {
                if !test_path_exists(path) {
                    missing.push(format!("{span} (no file or module {path})"));
                }
            }
            let is_test_name = name.contains('_')
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            if is_test_name {
                named += 1;
                if !code.contains(&format!("fn {name}(")) {
                    missing.push(format!("{span} (no fn {name} in src/ or tests/)"));
                }
            }
        }
    }
    assert!(named >= 30, "{GUARANTEES} names only {named} tests");
    assert!(
        missing.is_empty(),
        "{GUARANTEES} names tests that do not exist:\n{}",
        missing.join("\n")
    );
}

//! `docs/backends.md` ("Redis keys") and the man page state the least-privilege ACL
//! rule exactly as the code has it (`lockrun::backend::redis::acl`), the rule
//! `redis_acl` proves enough.

use lockrun::backend::redis::acl;

use super::{read, MAN_SECTIONS};

/// The page whose "Redis keys" section states the rule.
const PAGE: &str = "docs/backends.md";

#[test]
fn the_backends_page_and_the_man_page_state_the_acl_rule_as_the_code_has_it() {
    let line = acl::setuser_line("lockrun", "lockrun:");
    let page = read(PAGE);
    let keys = page
        .split("\n## Redis keys\n")
        .nth(1)
        .unwrap_or_else(|| panic!("{PAGE} has no \"Redis keys\" section"));
    let keys = keys.split("\n## ").next().unwrap_or(keys);
    assert!(
        keys.contains(&line),
        "{PAGE}'s \"Redis keys\" does not state the rule; it should show:\n{line}"
    );
    assert!(
        read(MAN_SECTIONS).contains(&line),
        "{MAN_SECTIONS} does not state the rule; it should show:\n{line}"
    );
}

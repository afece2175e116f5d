//! The README's "Redis keys" section and the man page state the least-privilege ACL rule
//! exactly as the code has it (`lockrun::backend::redis::acl`), the rule
//! `redis_acl` proves enough.

use lockrun::backend::redis::acl;

use super::{read, MAN_SECTIONS};

#[test]
fn the_readme_and_the_man_page_state_the_acl_rule_as_the_code_has_it() {
    let line = acl::setuser_line("lockrun", "lockrun:");
    let readme = read("README.md");
    let keys = readme
        .split("\n## Redis keys\n")
        .nth(1)
        .expect("the README has a \"Redis keys\" section");
    let keys = keys.split("\n## ").next().unwrap_or(keys);
    assert!(
        keys.contains(&line),
        "README's \"Redis keys\" does not state the rule; it should show:\n{line}"
    );
    assert!(
        read(MAN_SECTIONS).contains(&line),
        "{MAN_SECTIONS} does not state the rule; it should show:\n{line}"
    );
}

//! Unit tests of [`super`] (`backend::redis`).

use super::requests::shown;
use super::*;
use crate::backend::Holder;
use replies::SlotHolder;

fn holder(slot: u32, slots: u32) -> SlotHolder {
    SlotHolder {
        holder: Holder {
            slot,
            slots,
            ..Holder::default()
        },
        token: "t".into(),
    }
}

#[test]
fn the_eviction_lines_name_the_policy_and_both_ways_out() {
    let e = evicting("h:1", "volatile-lru", 10_485_760);
    let BackendError::Refused(line) = &e else {
        panic!("{e:?} is not a refusal (exit 125)")
    };
    for part in [
        "Redis at h:1",
        "volatile-lru",
        "10485760",
        "noeviction",
        "--allow-eviction",
        "LOCKRUN_ALLOW_EVICTION=1",
        "fencing",
    ] {
        assert!(line.contains(part), "{part} missing: {line}");
    }
    assert!(!line.contains('\n') && !line.contains("  "), "{line}");
    let v = unchecked_line("h:1", Some("locker"), " ERR can't run this command\n");
    assert!(
        v.contains("user \"locker\" run INFO")
            && v.contains("ACL SETUSER locker +info ")
            && v.contains("(ERR can't run this command)"),
        "{v}"
    );
    assert!(unchecked_line("h:1", None, "x").contains("ACL SETUSER default +info"));
    assert!(!v.contains('\n') && !v.contains("  "), "{v}");
}

#[test]
fn a_limit_key_of_another_n_is_refused_unless_a_holder_shows_it() {
    let reply = |theirs, holders| HoldersReply { theirs, holders };
    assert_eq!(shown(reply(0, vec![holder(1, 3)]), 3).unwrap().len(), 1);
    // Holders of 3 in slots a --slots 2 does not see: only the limit key tells.
    let e = shown(reply(3, vec![]), 2).unwrap_err();
    assert_eq!(e, slots_conflict(3, 2));
    // A holder that shows the other N is listed: `status` names it and refuses.
    let h = shown(reply(3, vec![holder(0, 3)]), 1).unwrap();
    assert_eq!((h[0].slot, h[0].slots), (0, 3));
}

use super::*;

const KEY: &str = "lockrun:{job}";

fn row(key: &str, token: &str, expires_ms: u64, slots: u32) -> Row {
    Row {
        key: key.as_bytes().to_vec(),
        token: token.to_owned(),
        fence: 7,
        expires_ms,
        slots,
        ..Row::default()
    }
}

fn waiter(id: &str, ticket: u64, expires_ms: u64) -> Row {
    Row {
        key: waiter_key(KEY, id).into_bytes(),
        fence: ticket,
        expires_ms,
        ..Row::default()
    }
}

#[test]
fn row_keys_say_what_they_are() {
    assert_eq!(part(KEY, b"lockrun:{job}"), Part::Slot(0));
    assert_eq!(part(KEY, b"lockrun:{job}#3"), Part::Slot(3));
    assert_eq!(part(KEY, b"lockrun:{job}#w:ab"), Part::Waiter("ab".into()));
    for other in [
        "lockrun:{job}#0",
        "lockrun:{job}#03",
        "lockrun:{job}#x",
        "lockrun:{jobs}",
    ] {
        assert_eq!(part(KEY, other.as_bytes()), Part::Other, "{other}");
    }
    assert_eq!(part(KEY, b"lockrun:{job}#1000"), Part::Other);
    assert_eq!(slot_key(KEY, 0), KEY);
    assert_eq!(slot_key(KEY, 2), "lockrun:{job}#2");
}

#[test]
fn a_free_lock_is_taken_and_a_live_one_is_busy() {
    let name = Name::new(KEY, vec![row(KEY, "", 0, 1)], 100);
    assert_eq!(name.free_slot(1, ""), Some(0));
    let name = Name::new(KEY, vec![row(KEY, "t", 101, 1)], 100);
    assert_eq!(name.free_slot(1, ""), None);
    assert_eq!(name.first_to_end().ttl_left, Duration::from_millis(1));
    assert_eq!(name.find("t").map(|(s, _)| s), Some(0));
    // An expired lease is free, and its token no longer ours.
    let name = Name::new(KEY, vec![row(KEY, "t", 100, 1)], 100);
    assert_eq!((name.free_slot(1, ""), name.find("t")), (Some(0), None));
}

#[test]
fn semaphores_take_the_lowest_free_slot_and_refuse_another_n() {
    let rows = vec![row(KEY, "a", 200, 3), row(&slot_key(KEY, 2), "b", 200, 3)];
    let name = Name::new(KEY, rows, 100);
    assert_eq!(name.conflict(3), None);
    assert_eq!(name.free_slot(3, ""), Some(1));
    assert_eq!(name.conflict(1), Some(3));
    assert_eq!(name.conflict(2), Some(3));
    assert_eq!(name.holders().len(), 2);
    // A semaphore held in slot 2 only still refuses a plain lock.
    let name = Name::new(KEY, vec![row(&slot_key(KEY, 2), "b", 200, 3)], 100);
    assert_eq!(name.conflict(1), Some(3));
}

#[test]
fn waiters_are_served_in_ticket_order() {
    let rows = vec![
        row(KEY, "", 0, 1),
        waiter("late", 9, 500),
        waiter("early", 4, 500),
        waiter("gone", 1, 50),
    ];
    let name = Name::new(KEY, rows, 100);
    assert_eq!(name.lapsed, vec!["gone".to_owned()]);
    assert_eq!(
        (name.ahead("early"), name.ahead("late"), name.ahead("new")),
        (0, 1, 2)
    );
    assert_eq!(name.free_slot(1, "early"), Some(0));
    assert_eq!(name.free_slot(1, "late"), None);
    assert_eq!(name.free_slot(1, ""), None);
    // Two free slots let the second waiter in too, not a third caller.
    assert_eq!(name.free_slot(2, "late"), Some(0));
    assert_eq!(name.free_slot(2, "new"), None);
    assert_eq!(name.ticket("late"), Some(9));
}

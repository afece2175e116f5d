//! What a queue node does next, decided from one listing of the lock's directory (and,
//! when they matter, its hold nodes judged by the server's clock): take a slot, wait
//! (and watch what), or refuse. Pure: no I/O. Part of [`super`], whose documentation
//! describes the nodes.
//!
//! **Admission.** With `p` queue nodes ahead of ours and `h` holds on, ours is
//! admitted when `p + h < N`: first come, first served by construction. A node's
//! place only drops, when a node ahead of it goes or a hold ends; admitted, it takes
//! the lowest slot with neither a slot node nor a hold on. Claimed slots belong to
//! nodes among the first N, so one is free unless claims race ours (the loser tries
//! the next, and with none left waits for a slot node to go).
//!
//! **Waking without a herd.** N = 1 is the plain lock's queue: each waiter watches
//! the node just ahead of it. With N > 1:
//! - the waiter exactly at the boundary (`p + h = N`) watches every occupant ahead of
//!   it: the `p` nodes and the `h` holds (N watches), with a timer for the earliest
//!   hold's end. Any of them going admits it, and it is woken;
//! - a waiter further back watches only the node just ahead of it (one watch). It
//!   reaches the boundary either because that node went (its watch fires) or because
//!   that node, then at the boundary, was admitted: its claim writes its queue node
//!   (a data watch fires), so the waiter looks again and watches the N occupants.
//!
//! So: a waiter that gives up deletes its node and wakes only the one behind it, which
//! takes its place. A holder that leaves (or crashes: its session's end deletes its
//! nodes) wakes only the waiter at the boundary, as waiters further back watch
//! waiters; that one claims the slot, which wakes the next, now at the boundary, which
//! watches again: one waiter woken per slot freed. A node admitted at its first look
//! writes its node too, so a waiter that listed it at the boundary and watched it as
//! its predecessor looks again. A hold that ends wakes the boundary waiter by its
//! timer; one left by a holder ahead replaces that holder's node as an occupant (the
//! node's deletion wakes the boundary waiter, which watches the hold next). The
//! boundary waiter is also woken by the claims of the admitted nodes ahead of it
//! (their writes): one more look each, no more. Watches fire or end with the session,
//! so none is lost; the backend's watch slice is only a safety net.

use super::layout::{self, hold_name, slot_name, QueueNode};

/// A listing of a lock's directory, sorted out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing {
    /// The queue nodes, first in line first.
    pub queue: Vec<QueueNode>,
    /// The slots that have a slot node (held), lowest first.
    pub slot_nodes: Vec<u32>,
    /// The slots that have a hold node (on or over: judging needs the server's
    /// clock), lowest first.
    pub holds: Vec<u32>,
}

impl Listing {
    /// The listing of `children`, the names in the directory.
    pub fn of(children: &[String]) -> Listing {
        let sorted = |of: fn(&str) -> Option<u32>| {
            let mut slots: Vec<u32> = children.iter().filter_map(|c| of(c)).collect();
            slots.sort_unstable();
            slots
        };
        Listing {
            queue: layout::queue(children),
            slot_nodes: sorted(layout::slot_of),
            holds: sorted(layout::hold_of),
        }
    }

    /// Whether anything in it belongs to a semaphore (N > 1).
    pub fn has_semaphore(&self) -> bool {
        !self.slot_nodes.is_empty()
            || self.holds.iter().any(|&h| h > 0)
            || self.queue.iter().any(|n| n.slots > 1)
    }
}

/// A hold node judged by the server's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Judged {
    /// The slot it keeps.
    pub slot: u32,
    /// The N its holder was taken with.
    pub slots: u32,
    /// Whether it still keeps the slot.
    pub on: bool,
}

/// What our queue node does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Our node is not in the queue (deleted under us).
    Gone,
    /// A node ahead of ours, or a hold that is on, was taken with this other N.
    Conflict(u32),
    /// The hold nodes must be judged first (read, with the server's "now").
    JudgeHolds,
    /// Take this slot: the lowest free one.
    Take(u32),
    /// Wait until one of these children of the directory changes or goes (or a hold
    /// among them ends).
    Wait(Vec<String>),
}

/// The next step of the node of `token`, for a lock of `slots` slots, in `listing`.
/// `holds` is the listing's hold nodes once judged (`None`: not read yet).
///
/// With `p` nodes ahead of ours and `h` holds on, our node is admitted when
/// `p + h < N` and takes the lowest slot without a slot node or a hold on; if none is
/// free (claims racing ours), it waits for any of those to go. Not admitted, the
/// waiter exactly at the boundary (`p + h = N`) watches all N occupants ahead (the
/// `p` nodes and the `h` holds: one of them going admits it); one further back
/// watches only the node just ahead of it.
pub fn step(listing: &Listing, token: &str, slots: u32, holds: Option<&[Judged]>) -> Step {
    let Some(p) = listing.queue.iter().position(|n| n.token == token) else {
        return Step::Gone;
    };
    let ahead = &listing.queue[..p];
    if let Some(other) = ahead.iter().find(|n| n.slots != slots) {
        return Step::Conflict(other.slots);
    }
    let n = slots as usize;
    // Holds change nothing for a node at p > N (it waits for the node ahead of it
    // whatever they are), nor at p = N = 1 (all N ahead is the node ahead).
    let matter = !listing.holds.is_empty() && (p < n || (p == n && n > 1));
    let judged = match holds {
        Some(judged) => judged,
        None if matter => return Step::JudgeHolds,
        None => &[],
    };
    if let Some(other) = judged.iter().find(|h| h.on && h.slots != slots) {
        return Step::Conflict(other.slots);
    }
    let on: Vec<u32> = judged.iter().filter(|h| h.on).map(|h| h.slot).collect();
    let holds_on = on.iter().map(|&s| hold_name(s));
    let occupants = p + on.len();
    if occupants < n {
        return match lowest_free(slots, &listing.slot_nodes, &on) {
            Some(slot) => Step::Take(slot),
            None => Step::Wait(
                listing
                    .slot_nodes
                    .iter()
                    .filter(|&&s| s < slots)
                    .map(|&s| slot_name(s))
                    .chain(holds_on)
                    .collect(),
            ),
        };
    }
    if occupants == n {
        return Step::Wait(
            ahead
                .iter()
                .map(|a| a.name.clone())
                .chain(holds_on)
                .collect(),
        );
    }
    // occupants > N with every hold's slot below N: p >= 1.
    Step::Wait(vec![listing.queue[p - 1].name.clone()])
}

/// The lowest of slots 0..`slots` with neither a slot node nor a hold on.
pub fn lowest_free(slots: u32, slot_nodes: &[u32], holds_on: &[u32]) -> Option<u32> {
    (0..slots).find(|s| !slot_nodes.contains(s) && !holds_on.contains(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A listing of queue nodes `q` (token and N each, in order), slot nodes and holds.
    fn listing(q: &[(&str, u32)], slot_nodes: &[u32], holds: &[u32]) -> Listing {
        let mut children: Vec<String> = q
            .iter()
            .enumerate()
            .map(|(i, (t, n))| match n {
                1 => format!("lock-{t}-{i:010}"),
                n => format!("lock-{t}-n{n}-{i:010}"),
            })
            .collect();
        children.extend(slot_nodes.iter().map(|&s| slot_name(s)));
        children.extend(holds.iter().map(|&s| hold_name(s)));
        children.reverse();
        Listing::of(&children)
    }

    fn names(l: &Listing, tokens: &[&str]) -> Vec<String> {
        tokens
            .iter()
            .map(|t| l.queue.iter().find(|n| n.token == *t).unwrap().name.clone())
            .collect()
    }

    fn on(slot: u32, slots: u32) -> Judged {
        Judged {
            slot,
            slots,
            on: true,
        }
    }

    #[test]
    fn a_listing_sorts_queue_slot_and_hold_nodes_apart() {
        let l = listing(&[("a", 3), ("b", 3)], &[0, 2], &[0, 1]);
        assert_eq!(l.queue.len(), 2);
        assert_eq!((l.slot_nodes.len(), l.holds.len()), (2, 2));
        assert!(l.slot_nodes.contains(&2) && l.holds.contains(&1));
        assert!(l.has_semaphore());
        assert!(!listing(&[("a", 1)], &[], &[0]).has_semaphore());
        assert!(listing(&[], &[], &[1]).has_semaphore());
    }

    #[test]
    fn fewer_than_n_ahead_take_the_lowest_free_slot() {
        let l = listing(&[("a", 3), ("b", 3), ("c", 3)], &[0], &[]);
        assert_eq!(step(&l, "b", 3, None), Step::Take(1));
        assert_eq!(step(&l, "c", 3, None), Step::Take(1));
        let l = listing(&[("a", 3), ("b", 3), ("c", 3)], &[1], &[]);
        assert_eq!(step(&l, "a", 3, None), Step::Take(0));
        assert_eq!(lowest_free(3, &[0, 2], &[1]), None);
        assert_eq!(lowest_free(3, &[2], &[0]), Some(1));
        assert_eq!(lowest_free(2, &[5], &[]), Some(0));
    }

    #[test]
    fn the_waiter_at_n_watches_every_holder_ahead_and_the_others_their_predecessor() {
        let q = [("a", 2), ("b", 2), ("c", 2), ("d", 2), ("e", 2)];
        let l = listing(&q, &[0, 1], &[]);
        assert_eq!(step(&l, "c", 2, None), Step::Wait(names(&l, &["a", "b"])));
        assert_eq!(step(&l, "d", 2, None), Step::Wait(names(&l, &["c"])));
        assert_eq!(step(&l, "e", 2, None), Step::Wait(names(&l, &["d"])));
        // N = 1 is the plain lock's queue: each waiter watches the node ahead of it.
        let q1 = [("a", 1), ("b", 1), ("c", 1)];
        let l1 = listing(&q1, &[], &[]);
        assert_eq!(step(&l1, "a", 1, None), Step::Take(0));
        assert_eq!(step(&l1, "b", 1, None), Step::Wait(names(&l1, &["a"])));
        assert_eq!(step(&l1, "c", 1, None), Step::Wait(names(&l1, &["b"])));
    }

    #[test]
    fn a_node_ahead_or_a_hold_with_another_n_is_a_conflict() {
        let l = listing(&[("a", 3), ("b", 2)], &[], &[]);
        assert_eq!(step(&l, "b", 2, None), Step::Conflict(3));
        // Only nodes ahead count: the node behind sees ours and refuses itself.
        assert_eq!(step(&l, "a", 3, None), Step::Take(0));
        let l = listing(&[("a", 1), ("b", 2)], &[], &[]);
        assert_eq!(step(&l, "b", 2, None), Step::Conflict(1));
        let l = listing(&[("a", 2), ("b", 1)], &[], &[]);
        assert_eq!(step(&l, "b", 1, None), Step::Conflict(2));
        let l = listing(&[("a", 2)], &[], &[1]);
        assert_eq!(step(&l, "a", 2, Some(&[on(1, 3)])), Step::Conflict(3));
        let over = Judged {
            slot: 1,
            slots: 3,
            on: false,
        };
        assert_eq!(step(&l, "a", 2, Some(&[over])), Step::Take(0));
        assert_eq!(step(&listing(&[], &[], &[]), "a", 2, None), Step::Gone);
    }

    #[test]
    fn holds_are_judged_only_where_they_change_the_step() {
        let q = [("a", 2), ("b", 2), ("c", 2), ("d", 2)];
        let l = listing(&q, &[0], &[1]);
        assert_eq!(step(&l, "b", 2, None), Step::JudgeHolds);
        assert_eq!(step(&l, "c", 2, None), Step::JudgeHolds);
        assert_eq!(step(&l, "d", 2, None), Step::Wait(names(&l, &["c"])));
        // A plain lock reads its hold only when first in line, as before semaphores.
        let l1 = listing(&[("a", 1), ("b", 1)], &[], &[0]);
        assert_eq!(step(&l1, "a", 1, None), Step::JudgeHolds);
        assert_eq!(step(&l1, "b", 1, None), Step::Wait(names(&l1, &["a"])));
        assert_eq!(
            step(&l1, "a", 1, Some(&[on(0, 1)])),
            Step::Wait(vec!["hold".into()])
        );
    }

    #[test]
    fn a_hold_on_takes_a_place_and_the_waiter_at_the_boundary_watches_it() {
        // Slot 0 held by a, slot 1 kept by a hold: b waits at the boundary, watching
        // a and the hold; c watches b.
        let q = [("a", 2), ("b", 2), ("c", 2)];
        let l = listing(&q, &[0], &[1]);
        let holds = [on(1, 2)];
        let mut at_boundary = names(&l, &["a"]);
        at_boundary.push("hold-1".into());
        assert_eq!(step(&l, "b", 2, Some(&holds)), Step::Wait(at_boundary));
        assert_eq!(
            step(&l, "c", 2, Some(&holds)),
            Step::Wait(names(&l, &["b"]))
        );
        // Over, the hold frees its slot; the claim checks it is still the one judged.
        let over = [Judged {
            slot: 1,
            slots: 2,
            on: false,
        }];
        assert_eq!(step(&l, "b", 2, Some(&over)), Step::Take(1));
    }

    #[test]
    fn an_admitted_node_without_a_free_slot_waits_for_any_slot() {
        // Claims raced ours and won every slot: wait for a slot node or hold to go.
        let l = listing(&[("a", 2), ("b", 2)], &[0, 1], &[]);
        assert_eq!(
            step(&l, "b", 2, None),
            Step::Wait(vec!["slot-0".into(), "slot-1".into()])
        );
    }
}

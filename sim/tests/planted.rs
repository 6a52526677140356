//! The simulator can fail: each planted bug (feature `planted-bugs`) must be
//! caught within a stated number of seeds.
#![cfg(feature = "planted-bugs")]

use seatboard::planted::{plant, Bug};

/// The first seed in `0..within` whose run breaks an invariant with `bug` planted.
fn caught(bug: Bug, within: u64) -> Option<(u64, sim::Failure)> {
    plant(Some(bug));
    let found = (0..within).find_map(|seed| sim::run_seed(seed, false).failure.map(|f| (seed, f)));
    plant(None);
    found
}

#[test]
fn a_read_taking_a_section_backwards_is_caught() {
    // Viewers already watching are shielded by the shard core's own version
    // rule: the node's own board is what shows it.
    let (seed, f) = caught(Bug::ReadBackwards, 200).expect("caught within 200 seeds");
    assert_eq!(f.invariant, "a node's board never goes backwards", "{f}");
    println!("seed {seed}: {f}");
}

#[test]
fn a_read_before_the_subscription_is_confirmed_is_caught() {
    let (seed, f) = caught(Bug::ReadBeforeConfirmed, 200).expect("caught within 200 seeds");
    assert_eq!(
        f.invariant, "a state read waits for its subscription's confirmation",
        "{f}"
    );
    println!("seed {seed}: {f}");
}

#[test]
fn no_reread_after_a_reconnect_is_caught() {
    let (seed, f) = caught(Bug::NoRereadAfterReconnect, 200).expect("caught within 200 seeds");
    println!("seed {seed}: {f}");
}

#[test]
fn presence_refreshed_without_the_key_ttl_is_caught() {
    // The re-score leaves the key's TTL where the last single add put it:
    // the key then expires before its members (or, made by a re-score, has
    // no TTL at all and outlives a dead node's viewers).
    let (seed, f) = caught(Bug::RefreshWithoutTtl, 200).expect("caught within 200 seeds");
    assert_eq!(
        f.invariant, "a presence key's TTL outlasts its members",
        "{f}"
    );
    println!("seed {seed}: {f}");
}

#[test]
fn the_firehose_without_dropping_the_course_channels_is_caught() {
    // The pattern comes on for an admin while the course channels stay: the
    // node holds both, and Redis delivers every publish on them twice.
    let (seed, f) = caught(Bug::FirehoseKeepsNarrow, 200).expect("caught within 200 seeds");
    assert_eq!(
        f.invariant, "the pattern only with an admin, and then no course channel",
        "{f}"
    );
    println!("seed {seed}: {f}");
}

#[test]
fn an_admin_rate_counting_a_duplicate_is_caught() {
    // A publish reaches a node twice while its connection holds a course's
    // channel and the pattern at once (the firehose turning on or off), and
    // when the reconciler publishes again a section the node already holds.
    let (seed, f) = caught(Bug::AdminCountsDuplicates, 200).expect("caught within 200 seeds");
    assert_eq!(
        f.invariant, "the admin aggregate counts each publish once",
        "{f}"
    );
    println!("seed {seed}: {f}");
}

#[test]
fn a_reread_that_ignores_a_replaced_field_is_caught() {
    // A node whose connection was down when the reconciler's replacement of
    // a forged version went out reads the field at its reread; taking it
    // only if newer, it keeps the forged version for good.
    let (seed, f) = caught(Bug::ReadIgnoresReplace, 200).expect("caught within 200 seeds");
    assert_eq!(f.invariant, "every open board equals the database", "{f}");
    println!("seed {seed}: {f}");
}

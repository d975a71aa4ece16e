//! The track's bookkeeping, without a server.

use super::*;

fn rec(key: Option<&str>) -> Record {
    Record {
        envelope: Envelope {
            id: "m".into(),
            handler: "h".into(),
            headers: vec![],
            payload: vec![],
        },
        refused: None,
        key: key.map(|k| k.as_bytes().to_vec()),
        not_before: None,
    }
}

fn p0() -> PartId {
    ("t".to_string(), 0)
}

fn offsets(ds: &[Delivery]) -> Vec<i64> {
    ds.iter().map(|d| parse(&d.receipt).unwrap().1).collect()
}

/// The offsets of commits.
fn at(commits: &[Commit]) -> Vec<i64> {
    commits.iter().map(|c| c.offset).collect()
}

fn track(ordering: KafkaOrdering, keys: &[Option<&str>]) -> Track {
    let mut t = Track::new(ordering);
    t.assign(vec![(p0(), Seed::default())]);
    for (i, k) in keys.iter().enumerate() {
        assert!(t.insert(&p0(), 10 + i as i64, rec(*k)));
    }
    t
}

#[test]
fn key_order_runs_other_keys_and_holds_a_key_behind_its_retry() {
    let mut t = track(KafkaOrdering::Key, &[Some("a"), Some("b"), Some("a"), None]);
    let first = t.take(10, 0);
    assert_eq!(offsets(&first), vec![10, 11, 13], "the second 'a' waits for the first");
    t.give_back(&first[0].receipt, 100).unwrap();
    assert!(t.take(10, 50).is_empty(), "the retry is not due, and 'a' waits behind it");
    t.settle(&first[1].receipt).unwrap();
    t.settle(&first[2].receipt).unwrap();
    let c = t.commits([&p0()]);
    assert_eq!(at(&c), vec![10], "nothing below the retry's offset is settled");
    assert_eq!(c[0].metadata, "idem1;s=11-11,13-13;d=10:1", "what is settled above it, and counts");
    let again = t.take(10, 101);
    assert_eq!(offsets(&again), vec![10]);
    assert_eq!(again[0].delivery_count, 2);
    t.settle(&again[0].receipt).unwrap();
    let next = t.take(10, 101);
    assert_eq!(offsets(&next), vec![12]);
    t.settle(&next[0].receipt).unwrap();
    let c = t.commits([&p0()]);
    assert_eq!(at(&c), vec![14], "all settled: the next offset to read");
    assert_eq!(c[0].metadata, "idem1");
    assert!(t.commits([&p0()]).is_empty(), "committed once");
}

#[test]
fn partition_order_runs_one_at_a_time_and_none_runs_all() {
    let mut t = track(KafkaOrdering::Partition, &[Some("a"), Some("b")]);
    let first = t.take(10, 0);
    assert_eq!(offsets(&first), vec![10]);
    t.settle(&first[0].receipt).unwrap();
    assert_eq!(offsets(&t.take(10, 0)), vec![11]);
    let mut t = track(KafkaOrdering::None, &[Some("a"), Some("a")]);
    assert_eq!(offsets(&t.take(10, 0)), vec![10, 11]);
}

#[test]
fn the_watermark_stays_below_the_lowest_unsettled_offset() {
    let mut t = track(KafkaOrdering::None, &[None, None, None]);
    let d = t.take(10, 0);
    t.settle(&d[1].receipt).unwrap();
    t.settle(&d[2].receipt).unwrap();
    assert_eq!(at(&t.commits([&p0()])), vec![10]);
    t.settle(&d[0].receipt).unwrap();
    assert_eq!(at(&t.commits([&p0()])), vec![13]);
    assert_eq!(t.settle(&d[0].receipt), Err(Stale::Revoked), "settled once");
    assert_eq!(t.settle("nonsense"), Err(Stale::Malformed));
}

#[test]
fn an_earlier_deliverys_receipt_does_nothing() {
    let mut t = track(KafkaOrdering::None, &[None]);
    let first = t.take(10, 0);
    t.give_back(&first[0].receipt, 0).unwrap();
    let second = t.take(10, 1);
    assert_ne!(first[0].receipt, second[0].receipt);
    assert_eq!(t.give_back(&first[0].receipt, 0), Err(Stale::Revoked));
    assert_eq!(t.settle(&first[0].receipt), Err(Stale::Revoked));
    t.settle(&second[0].receipt).unwrap();
}

#[test]
fn a_revoked_partition_commits_only_what_is_settled_and_ignores_late_receipts() {
    let mut t = track(KafkaOrdering::None, &[None, None, None, None]);
    let d = t.take(2, 0);
    assert_eq!(t.buffered(), (2, 4), "each record's id and handler");
    t.settle(&d[0].receipt).unwrap();
    t.revoke_begin(&[p0()]);
    assert_eq!(t.buffered(), (0, 0), "what the worker has not taken is dropped");
    assert!(t.take(10, 0).is_empty(), "nothing more is handed out");
    assert_eq!(t.out(&[p0()]), 1);
    let c = t.revoke_end(&[p0()]);
    assert_eq!(at(&c), vec![11], "below the delivery still out");
    assert_eq!(c[0].metadata, "idem1;d=11:1", "12 and 13 were dropped unrun: not settled");
    assert_eq!(t.settle(&d[1].receipt), Err(Stale::Revoked));
    assert!(t.commits([&p0()]).is_empty(), "never for a partition not owned");
    // Assigned again: a new epoch, and the old receipt stays stale.
    t.assign(vec![(p0(), Seed::decode(&c[0].metadata))]);
    assert!(t.insert(&p0(), 11, rec(None)));
    let again = t.take(10, 0);
    assert_eq!(again[0].delivery_count, 2, "counted on from the commit's metadata");
    assert_ne!(again[0].receipt, d[1].receipt);
    assert_eq!(t.settle(&d[1].receipt), Err(Stale::Revoked));
    t.settle(&again[0].receipt).unwrap();
    assert_eq!(at(&t.commits([&p0()])), vec![12]);
}

#[test]
fn a_retry_during_a_revocation_is_not_waited_for_and_a_failed_commit_is_sent_again() {
    let mut t = track(KafkaOrdering::None, &[None, None, None]);
    let d = t.take(10, 0);
    t.give_back(&d[2].receipt, 1_000).unwrap();
    t.revoke_begin(&[p0()]);
    t.give_back(&d[0].receipt, 1_000).unwrap();
    assert_eq!(t.out(&[p0()]), 1, "a record given back is not running");
    t.settle(&d[1].receipt).unwrap();
    let c = t.revoke_end(&[p0()]);
    assert_eq!(at(&c), vec![10]);
    assert_eq!(c[0].metadata, "idem1;s=11-11;d=10:1,12:1", "the dropped retry's count goes on");
    let mut t = track(KafkaOrdering::None, &[None]);
    let d = t.take(10, 0);
    t.settle(&d[0].receipt).unwrap();
    let c = t.commits([&p0()]);
    assert_eq!(at(&c), vec![11]);
    t.uncommit(&c);
    assert_eq!(t.commits([&p0()]), c, "the failed commit is sent again");
}

#[test]
fn a_revocation_never_commits_past_a_record_it_dropped_unrun() {
    let mut t = track(KafkaOrdering::Key, &[Some("a"), Some("b"), Some("a")]);
    let d = t.take(10, 0);
    assert_eq!(offsets(&d), vec![10, 11]);
    t.settle(&d[0].receipt).unwrap();
    t.settle(&d[1].receipt).unwrap();
    // Offset 12 was read but never ran: the next owner must read it.
    t.revoke_begin(&[p0()]);
    assert_eq!(at(&t.revoke_end(&[p0()])), vec![12]);
    let mut t = track(KafkaOrdering::Key, &[Some("a"), Some("a"), Some("b")]);
    let d = t.take(10, 0);
    assert_eq!(offsets(&d), vec![10, 12]);
    t.settle(&d[1].receipt).unwrap();
    t.revoke_begin(&[p0()]);
    let c = t.revoke_end(&[p0()]);
    assert_eq!(at(&c), vec![10], "10 still out, 11 dropped");
    assert_eq!(c[0].metadata, "idem1;d=10:1", "12's settling is not claimed past a dropped 11");
}

#[test]
fn the_next_owner_skips_what_the_last_commit_settled() {
    let seed = Seed::decode("idem1;s=11-12,15-20;d=13:3");
    assert_eq!(seed.settled, vec![(11, 12), (15, 20)]);
    let mut t = Track::new(KafkaOrdering::None);
    t.assign(vec![(p0(), seed)]);
    let mut taken = Vec::new();
    for o in 10..22 {
        if t.insert(&p0(), o, rec(None)) {
            taken.push(o);
        }
    }
    assert_eq!(taken, vec![10, 13, 14, 21]);
    let d = t.take(10, 0);
    assert_eq!(d.iter().map(|d| d.delivery_count).collect::<Vec<_>>(), vec![1, 4, 1, 1]);
    t.settle(&d[0].receipt).unwrap();
    t.settle(&d[3].receipt).unwrap();
    let c = t.commits([&p0()]);
    assert_eq!(at(&c), vec![13]);
    assert_eq!(c[0].metadata, "idem1;s=15-21;d=13:4,14:1");
    assert_eq!(Seed::decode("someone else's"), Seed::default());
    // Seeded ranges not yet read are carried on.
    let mut t = Track::new(KafkaOrdering::None);
    t.assign(vec![(p0(), Seed::decode("idem1;s=12-14"))]);
    assert!(t.insert(&p0(), 10, rec(None)));
    let d = t.take(1, 0);
    assert!(t.insert(&p0(), 11, rec(None)));
    t.settle(&d[0].receipt).unwrap();
    assert_eq!(t.commits([&p0()])[0].metadata, "idem1;s=12-14");
}

#[test]
fn delayed_records_wait_until_due_and_records_are_read_once() {
    let mut t = Track::new(KafkaOrdering::Key);
    t.assign(vec![(p0(), Seed::default())]);
    let mut r = rec(Some("k"));
    r.not_before = Some(500);
    assert!(t.insert(&p0(), 0, r));
    assert!(t.insert(&p0(), 1, rec(Some("k"))));
    assert!(!t.insert(&p0(), 1, rec(Some("k"))), "read before");
    assert!(!t.insert(&("t".into(), 9), 0, rec(None)), "not owned");
    assert!(
        t.take(10, 500).is_empty(),
        "the delayed one is not due and the other waits behind it"
    );
    assert_eq!(t.next_due(), Some(500), "runs after 500");
    assert_eq!(offsets(&t.take(10, 501)), vec![0]);
}

#[test]
fn receipts_round_trip_topics_with_dots_and_dashes() {
    let id = ("orders.v1-eu".to_string(), 3);
    assert_eq!(parse(&receipt(&id, 42, 7, 2)), Some((id, 42, 7, 2)));
}

/// The read-ahead counts its records' bytes as well as their number: a
/// record the worker holds counts nothing; one given back, or read and not
/// taken, counts what it holds; a revocation drops what it drops.
#[test]
fn the_read_ahead_counts_the_bytes_it_holds() {
    let mut t = Track::new(KafkaOrdering::None);
    t.assign(vec![(p0(), Seed::default())]);
    // Each record's id and handler ("m", "h") count 2 bytes.
    for (i, size) in [1 << 20, 1 << 20, 5].into_iter().enumerate() {
        let mut r = rec(None);
        r.envelope.payload = vec![0; size];
        assert!(t.insert(&p0(), 10 + i as i64, r));
    }
    assert_eq!(t.buffered(), (3, (2 << 20) + 5 + 6));
    let d = t.take(2, 0);
    assert_eq!(t.buffered(), (1, 5 + 2), "taken: held by the worker, not read ahead");
    t.give_back(&d[0].receipt, 100).unwrap();
    assert_eq!(t.buffered(), (2, (1 << 20) + 5 + 4));
    t.settle(&d[1].receipt).unwrap();
    assert_eq!(t.buffered(), (2, (1 << 20) + 5 + 4));
    t.revoke_begin(&[p0()]);
    assert_eq!(t.buffered(), (0, 0));
}

/// Records of an empty payload still hold their headers and key: those
/// count too (before, a record of a megabyte key or of thousands of
/// headers counted nothing, and the read-ahead paused only at its count).
#[test]
fn the_read_ahead_counts_headers_and_keys() {
    let mut t = Track::new(KafkaOrdering::Key);
    t.assign(vec![(p0(), Seed::default())]);
    let mut r = rec(Some("k"));
    r.key = Some(vec![b'k'; 1 << 20]);
    r.envelope.headers = vec![(String::new(), String::new()); 1_000];
    assert!(t.insert(&p0(), 10, r));
    let header_bytes = 1_000 * crate::envelope::HEADER_OVERHEAD;
    assert_eq!(t.buffered(), (1, 2 + header_bytes + 2 * (1 << 20)));
}

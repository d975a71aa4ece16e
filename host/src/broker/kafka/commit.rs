//! What a commit says: the offset to read next, and in its metadata what
//! Kafka's offset alone cannot say: which offsets above it are settled
//! already, and how many times each unsettled one was handed out
//! (`idem1;s=5-6,9-9;d=4:2`).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;

/// An offset to commit: the next to read, and what is known above it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Commit {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub metadata: String,
}

/// What a partition's last commit says beyond its offset.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Seed {
    /// Settled offsets above the committed one, as inclusive ranges.
    pub settled: Vec<(i64, i64)>,
    /// How many times open offsets were handed out.
    pub counts: HashMap<i64, u32>,
}

/// The longest metadata written (Kafka's default limit is 4096 bytes).
const MAX_METADATA: usize = 3_000;
const METADATA_TAG: &str = "idem1";

impl Seed {
    /// Read a commit's metadata; anything else (another consumer's, or
    /// none) is an empty seed.
    pub fn decode(text: &str) -> Seed {
        let mut seed = Seed::default();
        let mut parts = text.split(';');
        if parts.next() != Some(METADATA_TAG) {
            return seed;
        }
        for part in parts {
            if let Some(list) = part.strip_prefix("s=") {
                seed.settled = pairs(list, '-').collect();
            } else if let Some(list) = part.strip_prefix("d=") {
                seed.counts = pairs(list, ':').collect();
            }
        }
        seed
    }

    pub(super) fn settles(&self, offset: i64) -> bool {
        self.settled.iter().any(|(a, b)| (*a..=*b).contains(&offset))
    }
}

/// `a<sep>b` pairs of a comma-separated list; unreadable ones are skipped.
fn pairs<A: std::str::FromStr, B: std::str::FromStr>(list: &str, sep: char) -> impl Iterator<Item = (A, B)> + '_ {
    list.split(',').filter_map(move |r| {
        let (a, b) = r.split_once(sep)?;
        Some((a.parse().ok()?, b.parse().ok()?))
    })
}

/// The metadata of a commit: settled ranges above it, and delivery counts
/// of unsettled offsets, cut to fit Kafka's limit (what is cut only means
/// more records re-read, or counts started again, after a handover).
pub(super) fn encode(settled: &[(i64, i64)], counts: &BTreeMap<i64, u32>) -> String {
    let mut out = String::from(METADATA_TAG);
    let mut sep = ";s=";
    for (a, b) in settled {
        if out.len() > MAX_METADATA / 2 {
            break;
        }
        let _ = write!(out, "{sep}{a}-{b}");
        sep = ",";
    }
    let mut sep = ";d=";
    for (o, n) in counts {
        if out.len() > MAX_METADATA {
            break;
        }
        let _ = write!(out, "{sep}{o}:{n}");
        sep = ",";
    }
    out
}

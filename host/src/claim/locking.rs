//! The statements that lock several claim rows, completed with the one
//! locking pass they share (`queries/postgres/claims_locked.sql`, the body
//! of each one's `locked` CTE): the running claims they name, locked one key
//! at a time through the primary key, in byte order of (plugin, key). The
//! claim transaction and the dead-letter transaction take their rows in the
//! same order (in Rust), so no two of them wait for each other at once.

use std::sync::LazyLock;

/// The line of a statement that the locking pass replaces.
const MARK: &str = "    -- claims_locked.sql\n";

fn complete(name: &str, sql: &str) -> String {
    assert!(sql.contains(MARK), "{name} has no `{}` line to complete", MARK.trim());
    sql.replacen(MARK, include_str!("../../queries/postgres/claims_locked.sql"), 1)
}

macro_rules! statement {
    ($(#[$doc:meta])* $name:ident = $file:literal) => {
        $(#[$doc])*
        pub static $name: LazyLock<String> =
            LazyLock::new(|| complete($file, include_str!(concat!("../../queries/postgres/", $file))));
    };
}

statement!(
    /// Confirm a batch of claims (`claim_confirm.sql`).
    CONFIRM = "claim_confirm.sql"
);
statement!(
    /// Extend a batch of leases (`claim_extend.sql`).
    EXTEND = "claim_extend.sql"
);
statement!(
    /// Check and lock the fences of a group commit of mixed writes, and
    /// lock the claims it confirms (`fence_batch_claim_row.sql`).
    FENCE_BATCH = "fence_batch_claim_row.sql"
);
statement!(
    /// A group commit of upserts with confirms (`kv_upsert_batch_claim_row.sql`).
    UPSERT_BATCH = "kv_upsert_batch_claim_row.sql"
);
statement!(
    /// Withdraw a claim batch's new claims when the rest of it failed
    /// (`claim_withdraw.sql`).
    WITHDRAW = "claim_withdraw.sql"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_statement_is_completed_with_the_locking_pass() {
        for (name, sql) in [
            ("confirm", &CONFIRM),
            ("extend", &EXTEND),
            ("fence", &FENCE_BATCH),
            ("upsert", &UPSERT_BATCH),
            ("withdraw", &WITHDRAW),
        ] {
            let sql = sql.as_str();
            assert!(!sql.contains(MARK), "{name}");
            assert_eq!(sql.matches("FOR NO KEY UPDATE").count(), 1, "{name}: {sql}");
            assert!(sql.contains("FROM lock_keys"), "{name}");
        }
    }
}

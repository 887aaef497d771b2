//! What `brain store copy` needs of PostgreSQL beyond what a running brain does: whether a
//! database holds anything, records written as they were (no lease: the first replica to
//! load a task claims it: its lease row has lapsed), every key-value row, and the blobs'
//! hashes.

use super::postgres::{Db, Error, EventRow};

impl Db {
    /// How many task records, key-value rows and blobs the database holds.
    pub async fn held(&self) -> Result<(i64, i64, i64), Error> {
        let r = self
            .query_one(
                "SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM kv),
                        (SELECT count(*) FROM blobs)",
                &[],
            )
            .await?;
        Ok((r.get(0), r.get(1), r.get(2)))
    }

    /// Stores `rows` of `task` as they are, and keeps new task ids above it.
    pub async fn import_records(&self, task: i64, rows: &[EventRow]) -> Result<(), Error> {
        let seqs: Vec<i64> = rows.iter().map(|r| r.seq).collect();
        let vs: Vec<i32> = rows.iter().map(|r| r.v).collect();
        let ats: Vec<i64> = rows.iter().map(|r| r.at_ms).collect();
        let events: Vec<&[u8]> = rows.iter().map(|r| r.event.as_slice()).collect();
        self.execute(
            "INSERT INTO events (task, seq, v, at_ms, event)
             SELECT $1, s, v, a, e FROM unnest($2::bigint[], $3::int[], $4::bigint[], $5::bytea[])
                 AS r(s, v, a, e)",
            &[&task, &seqs, &vs, &ats, &events],
        )
        .await?;
        // A task is listed by its lease row: one that has lapsed, for the first replica to
        // claim.
        self.execute(
            "INSERT INTO leases (task, holder, epoch, expires_at)
             VALUES ($1, $2, 0, '-infinity') ON CONFLICT (task) DO NOTHING",
            &[&task, &self.replica()],
        )
        .await?;
        self.query_one(
            "SELECT setval('task_ids', greatest($1, (SELECT last_value FROM task_ids)))",
            &[&task],
        )
        .await?;
        Ok(())
    }

    /// Every key-value row: (tree, key, value), in order.
    pub async fn all_kv(&self) -> Result<Vec<(String, Vec<u8>, Vec<u8>)>, Error> {
        Ok(self
            .query("SELECT tree, key, value FROM kv ORDER BY tree, key", &[])
            .await?
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect())
    }

    /// Every blob's hash, in order.
    pub async fn blob_hashes(&self) -> Result<Vec<String>, Error> {
        Ok(self
            .query("SELECT hash FROM blobs ORDER BY hash", &[])
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect())
    }
}

//! The mirror's content blobs on PostgreSQL: table `blobs`, one row per hash (stored once
//! however many tasks and replicas upload it), as the mirror keeps them (compressed). A row
//! is durable when the statement that wrote it returns.

use super::postgres::{Db, Error};

impl Db {
    /// Whether the blob is stored.
    pub async fn has_blob(&self, hash: &str) -> Result<bool, Error> {
        Ok(self
            .query_opt("SELECT 1 FROM blobs WHERE hash = $1", &[&hash])
            .await?
            .is_some())
    }

    /// Those of `hashes` not stored, in their order.
    pub async fn missing_blobs(&self, hashes: &[String]) -> Result<Vec<String>, Error> {
        if hashes.is_empty() {
            return Ok(Vec::new());
        }
        let have: std::collections::HashSet<String> = self
            .query("SELECT hash FROM blobs WHERE hash = ANY($1)", &[&hashes])
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        Ok(hashes
            .iter()
            .filter(|h| !have.contains(*h))
            .cloned()
            .collect())
    }

    /// Stores a blob unless it is stored; whether it was new.
    pub async fn put_blob(&self, hash: &str, data: &[u8]) -> Result<bool, Error> {
        Ok(self
            .execute(
                "INSERT INTO blobs (hash, data) VALUES ($1, $2) ON CONFLICT (hash) DO NOTHING",
                &[&hash, &data],
            )
            .await?
            == 1)
    }

    /// A blob as stored.
    pub async fn blob(&self, hash: &str) -> Result<Option<Vec<u8>>, Error> {
        Ok(self
            .query_opt("SELECT data FROM blobs WHERE hash = $1", &[&hash])
            .await?
            .map(|r| r.get(0)))
    }

    /// Removes the blobs older than `grace` (by the database's clock) that `live` does not
    /// name: (how many, their bytes).
    pub async fn collect_blobs(
        &self,
        live: &[String],
        grace: std::time::Duration,
    ) -> Result<(u64, u64), Error> {
        let grace_ms = i64::try_from(grace.as_millis()).unwrap_or(i64::MAX);
        let row = self
            .query_one(
                "WITH gone AS (
                     DELETE FROM blobs
                     WHERE stored_at < now() - $2::bigint * interval '1 millisecond'
                       AND NOT (hash = ANY($1))
                     RETURNING length(data) AS n)
                 SELECT count(*), coalesce(sum(n), 0)::bigint FROM gone",
                &[&live, &grace_ms],
            )
            .await?;
        let (n, bytes): (i64, i64) = (row.get(0), row.get(1));
        Ok((n as u64, bytes as u64))
    }
}

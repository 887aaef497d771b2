//! Named leader leases on PostgreSQL: which replica runs the work there must be only one of.
//! A replica holds `name` while it renews it within `ttl` (by the database's clock); when
//! it stops renewing, another takes it once it lapses, under a higher epoch.

use std::time::Duration;

use super::postgres::{Db, Error};

impl Db {
    /// Takes or renews the lease `name` for `ttl`: its epoch when this replica holds it now,
    /// `None` when another replica does.
    pub async fn lead(&self, name: &str, ttl: Duration) -> Result<Option<i64>, Error> {
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        Ok(self
            .query_opt(
                "INSERT INTO leaders AS l (name, holder, epoch, expires_at)
                 VALUES ($1, $2, 1, now() + $3::bigint * interval '1 millisecond')
                 ON CONFLICT (name) DO UPDATE
                   SET holder = excluded.holder,
                       epoch = CASE WHEN l.holder = excluded.holder AND l.expires_at > now()
                                    THEN l.epoch ELSE l.epoch + 1 END,
                       expires_at = excluded.expires_at
                   WHERE l.holder = excluded.holder OR l.expires_at <= now()
                 RETURNING epoch",
                &[&name, &self.replica(), &ttl_ms],
            )
            .await?
            .map(|r| r.get(0)))
    }

    /// Whether this replica still holds the lease `name` under `epoch`, unexpired by the
    /// database's clock: the check right before acting on what only the leader may do, so a
    /// leader paused past its lease does not act on waking.
    pub async fn holds(&self, name: &str, epoch: i64) -> Result<bool, Error> {
        Ok(self
            .query_opt(
                "SELECT 1 FROM leaders
                 WHERE name = $1 AND holder = $2 AND epoch = $3 AND expires_at > now()",
                &[&name, &self.replica(), &epoch],
            )
            .await?
            .is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_replica_leads_and_another_takes_over_when_it_stops_renewing() {
        let Some(pg) = testkit::postgres::start_or_skip() else {
            return;
        };
        let a = Db::open(&pg.url(), "a").await.unwrap();
        let b = Db::open(&pg.url(), "b").await.unwrap();
        let ttl = Duration::from_millis(600);
        assert_eq!(a.lead("x", ttl).await.unwrap(), Some(1));
        assert_eq!(b.lead("x", ttl).await.unwrap(), None, "a holds it");
        assert_eq!(
            a.lead("x", ttl).await.unwrap(),
            Some(1),
            "renewed, same epoch"
        );
        // Another name is another lease.
        assert_eq!(b.lead("y", ttl).await.unwrap(), Some(1));
        // a stops renewing: b takes it once it lapses, under a new epoch, and a cannot.
        assert!(
            testkit::wait_until_async(Duration::from_secs(10), || async {
                b.lead("x", ttl).await.unwrap().is_some()
            })
            .await
        );
        assert_eq!(b.lead("x", ttl).await.unwrap(), Some(2));
        assert_eq!(a.lead("x", ttl).await.unwrap(), None);
        // Only the holder, under its epoch, holds it.
        assert!(b.holds("x", 2).await.unwrap());
        assert!(!b.holds("x", 1).await.unwrap(), "an old epoch");
        assert!(!a.holds("x", 2).await.unwrap(), "not a's");
        assert!(!a.holds("x", 1).await.unwrap(), "a's lapsed term");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lease_not_renewed_stops_holding_when_it_lapses_though_nobody_took_it() {
        let Some(pg) = testkit::postgres::start_or_skip() else {
            return;
        };
        let a = Db::open(&pg.url(), "a").await.unwrap();
        let epoch = a
            .lead("x", Duration::from_millis(300))
            .await
            .unwrap()
            .unwrap();
        assert!(a.holds("x", epoch).await.unwrap());
        // Paused past its lease: on waking it holds nothing, though nobody else leads.
        assert!(
            testkit::wait_until_async(Duration::from_secs(10), || async {
                !a.holds("x", epoch).await.unwrap()
            })
            .await
        );
    }
}

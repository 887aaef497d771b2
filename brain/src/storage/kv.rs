//! Named key-value trees: what the registry, the web's credentials, the sealed secrets, the
//! machines and the manifests are kept in, on either store. A [`Tree`] is the few operations
//! they need (get, insert, remove, compare-and-swap, a prefix scan, flush); keys and values
//! are bytes, keys ordered bytewise. On sled a tree is a sled tree, durable at `flush`; on
//! PostgreSQL it is the rows of one name in table `kv`, durable when each call returns.

use std::sync::Arc;

use super::postgres;

/// Errors of a tree.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("store: {0}")]
    Sled(#[from] sled::Error),
    #[error("{0}")]
    Postgres(#[from] postgres::Error),
}

/// One named tree.
#[async_trait::async_trait]
pub trait Tree: Send + Sync + 'static {
    async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Error>;
    /// Stores `value` under `key`; the value it replaced.
    async fn insert(&self, key: &[u8], value: &[u8]) -> Result<Option<Vec<u8>>, Error>;
    /// Removes `key`; the value it had.
    async fn remove(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Error>;
    /// Sets `key` to `new` (`None`: removes it) if its value is `old` (`None`: absent), in one
    /// step. Whether it did.
    async fn compare_and_swap(
        &self,
        key: &[u8],
        old: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<bool, Error>;
    /// Every (key, value) whose key starts with `prefix`, in key order.
    async fn scan_prefix(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>, Error>;
    /// How many keys it holds (counted: not for hot paths).
    async fn count(&self) -> Result<usize, Error>;
    /// Makes everything written so far durable.
    async fn flush(&self) -> Result<(), Error>;
}

/// Applies `f` to `key`'s value until it lands without a concurrent change in between (a
/// compare-and-swap loop); `f` answers the new value, `None` to leave it as it is. The value
/// written, if any.
pub async fn update(
    tree: &dyn Tree,
    key: &[u8],
    mut f: impl FnMut(Option<&[u8]>) -> Option<Vec<u8>>,
) -> Result<Option<Vec<u8>>, Error> {
    loop {
        let old = tree.get(key).await?;
        let Some(new) = f(old.as_deref()) else {
            return Ok(None);
        };
        if tree
            .compare_and_swap(key, old.as_deref(), Some(&new))
            .await?
        {
            return Ok(Some(new));
        }
    }
}

/// The store the brain keeps its trees in.
#[derive(Clone)]
pub enum Store {
    Sled(sled::Db),
    Postgres(postgres::Db),
}

impl Store {
    /// The tree called `name`.
    pub fn tree(&self, name: &str) -> Result<Arc<dyn Tree>, Error> {
        Ok(match self {
            Self::Sled(db) => Arc::new(SledTree {
                db: db.clone(),
                tree: db.open_tree(name)?,
            }),
            Self::Postgres(db) => Arc::new(PgTree::new(db.clone(), name)),
        })
    }

    /// Makes everything written so far durable.
    pub async fn flush(&self) -> Result<(), Error> {
        match self {
            Self::Sled(db) => {
                super::flush(db).await?;
            }
            Self::Postgres(_) => {}
        }
        Ok(())
    }
}

/// A sled tree.
struct SledTree {
    db: sled::Db,
    tree: sled::Tree,
}

#[async_trait::async_trait]
impl Tree for SledTree {
    async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        Ok(self.tree.get(key)?.map(|v| v.to_vec()))
    }

    async fn insert(&self, key: &[u8], value: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        Ok(self.tree.insert(key, value)?.map(|v| v.to_vec()))
    }

    async fn remove(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        Ok(self.tree.remove(key)?.map(|v| v.to_vec()))
    }

    async fn compare_and_swap(
        &self,
        key: &[u8],
        old: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<bool, Error> {
        Ok(self.tree.compare_and_swap(key, old, new)?.is_ok())
    }

    async fn scan_prefix(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>, Error> {
        self.tree
            .scan_prefix(prefix)
            .map(|kv| {
                let (k, v) = kv?;
                Ok((k.to_vec(), v.to_vec()))
            })
            .collect()
    }

    async fn count(&self) -> Result<usize, Error> {
        Ok(self.tree.len())
    }

    async fn flush(&self) -> Result<(), Error> {
        super::flush(&self.db).await?;
        Ok(())
    }
}

// ---------------------------------------------------------------------------- PostgreSQL

/// One named tree: the rows of table `kv` with that name.
struct PgTree {
    db: postgres::Db,
    name: String,
}

impl PgTree {
    fn new(db: postgres::Db, name: &str) -> Self {
        Self {
            db,
            name: name.to_string(),
        }
    }

    /// The value one statement returns in its first column, if it returns a row.
    async fn value(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Option<Vec<u8>>, Error> {
        Ok(self.db.query_opt(sql, params).await?.map(|r| r.get(0)))
    }
}

/// The smallest key above every key that starts with `prefix` (`None`: there is none, the
/// prefix is all 0xff bytes).
fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

#[async_trait::async_trait]
impl Tree for PgTree {
    async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        self.value(
            "SELECT value FROM kv WHERE tree = $1 AND key = $2",
            &[&self.name, &key],
        )
        .await
    }

    async fn insert(&self, key: &[u8], value: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        self.value(
            "WITH old AS (SELECT value FROM kv WHERE tree = $1 AND key = $2 FOR UPDATE),
                      new AS (INSERT INTO kv (tree, key, value) VALUES ($1, $2, $3)
                              ON CONFLICT (tree, key) DO UPDATE SET value = excluded.value)
                 SELECT value FROM old",
            &[&self.name, &key, &value],
        )
        .await
    }

    async fn remove(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        self.value(
            "DELETE FROM kv WHERE tree = $1 AND key = $2 RETURNING value",
            &[&self.name, &key],
        )
        .await
    }

    async fn compare_and_swap(
        &self,
        key: &[u8],
        old: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<bool, Error> {
        let changed = match (old, new) {
            (Some(old), Some(new)) => {
                self.db
                    .execute(
                        "UPDATE kv SET value = $4 WHERE tree = $1 AND key = $2 AND value = $3",
                        &[&self.name, &key, &old, &new],
                    )
                    .await?
            }
            (None, Some(new)) => {
                self.db
                    .execute(
                        "INSERT INTO kv (tree, key, value) VALUES ($1, $2, $3)
                         ON CONFLICT (tree, key) DO NOTHING",
                        &[&self.name, &key, &new],
                    )
                    .await?
            }
            (Some(old), None) => {
                self.db
                    .execute(
                        "DELETE FROM kv WHERE tree = $1 AND key = $2 AND value = $3",
                        &[&self.name, &key, &old],
                    )
                    .await?
            }
            (None, None) => {
                let present: bool = self
                    .db
                    .query_one(
                        "SELECT EXISTS (SELECT 1 FROM kv WHERE tree = $1 AND key = $2)",
                        &[&self.name, &key],
                    )
                    .await?
                    .get(0);
                u64::from(!present)
            }
        };
        Ok(changed == 1)
    }

    async fn scan_prefix(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>, Error> {
        let rows = match prefix_end(prefix) {
            Some(end) => {
                self.db
                    .query(
                        "SELECT key, value FROM kv
                         WHERE tree = $1 AND key >= $2 AND key < $3 ORDER BY key",
                        &[&self.name, &prefix, &end],
                    )
                    .await?
            }
            None => {
                self.db
                    .query(
                        "SELECT key, value FROM kv WHERE tree = $1 AND key >= $2 ORDER BY key",
                        &[&self.name, &prefix],
                    )
                    .await?
            }
        };
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    async fn count(&self) -> Result<usize, Error> {
        let n: i64 = self
            .db
            .query_one("SELECT count(*) FROM kv WHERE tree = $1", &[&self.name])
            .await?
            .get(0);
        Ok(usize::try_from(n).unwrap_or(0))
    }

    /// Every call has committed by the time it returns.
    async fn flush(&self) -> Result<(), Error> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What every tree must do.
    async fn conformance(store: Store) {
        let t = store.tree("things").unwrap();
        let other = store.tree("others").unwrap();
        assert_eq!(t.get(b"a").await.unwrap(), None);
        assert_eq!(t.insert(b"a", b"1").await.unwrap(), None);
        assert_eq!(
            t.insert(b"a", b"2").await.unwrap().as_deref(),
            Some(&b"1"[..])
        );
        assert_eq!(t.get(b"a").await.unwrap().as_deref(), Some(&b"2"[..]));
        assert_eq!(other.get(b"a").await.unwrap(), None, "trees are apart");
        // Bytewise order, prefixes, and a key of 0xff bytes at the end of the range.
        for k in [&b"b\x00"[..], b"b\xff\xff", b"b\x01", b"c", b"ba"] {
            t.insert(k, k).await.unwrap();
        }
        let keys = |v: Vec<(Vec<u8>, Vec<u8>)>| v.into_iter().map(|(k, _)| k).collect::<Vec<_>>();
        assert_eq!(
            keys(t.scan_prefix(b"b").await.unwrap()),
            vec![
                b"b\x00".to_vec(),
                b"b\x01".to_vec(),
                b"ba".to_vec(),
                b"b\xff\xff".to_vec()
            ]
        );
        assert_eq!(
            keys(t.scan_prefix(b"b\xff").await.unwrap()),
            vec![b"b\xff\xff".to_vec()]
        );
        assert_eq!(t.scan_prefix(b"").await.unwrap().len(), 6);
        assert_eq!(t.count().await.unwrap(), 6);
        // Compare-and-swap in each of its forms.
        assert!(
            !t.compare_and_swap(b"a", Some(b"1"), Some(b"3"))
                .await
                .unwrap()
        );
        assert!(
            t.compare_and_swap(b"a", Some(b"2"), Some(b"3"))
                .await
                .unwrap()
        );
        assert!(!t.compare_and_swap(b"a", None, Some(b"4")).await.unwrap());
        assert!(t.compare_and_swap(b"new", None, Some(b"x")).await.unwrap());
        assert!(t.compare_and_swap(b"new", Some(b"x"), None).await.unwrap());
        assert_eq!(t.get(b"new").await.unwrap(), None);
        assert!(t.compare_and_swap(b"new", None, None).await.unwrap());
        assert!(!t.compare_and_swap(b"a", None, None).await.unwrap());
        assert_eq!(t.remove(b"a").await.unwrap().as_deref(), Some(&b"3"[..]));
        assert_eq!(t.remove(b"a").await.unwrap(), None);
        // Updates from many tasks at once: none is lost.
        t.insert(b"n", b"0").await.unwrap();
        let hs: Vec<_> = (0..20)
            .map(|_| {
                let t = store.tree("things").unwrap();
                tokio::spawn(async move {
                    for _ in 0..10 {
                        update(t.as_ref(), b"n", |v| {
                            let n: u64 = std::str::from_utf8(v?).ok()?.parse().ok()?;
                            Some((n + 1).to_string().into_bytes())
                        })
                        .await
                        .unwrap();
                    }
                })
            })
            .collect();
        for h in hs {
            h.await.unwrap();
        }
        assert_eq!(t.get(b"n").await.unwrap().as_deref(), Some(&b"200"[..]));
        t.flush().await.unwrap();
        store.flush().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sled_trees_conform() {
        let db = sled::Config::new().temporary(true).open().unwrap();
        conformance(Store::Sled(db)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_trees_conform() {
        let Some(pg) = testkit::postgres::start_or_skip() else {
            return;
        };
        let db = postgres::Db::open(&pg.url(), "r").await.unwrap();
        conformance(Store::Postgres(db)).await;
    }
}

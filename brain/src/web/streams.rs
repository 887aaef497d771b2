//! What a credential may hold open: at most `[web] max_streams_per_credential` event streams
//! at once (one more is answered 429), and none past the credential itself. A stream ends at
//! its credential's expiry, and at its revocation (or logout) as soon as that is stored: the
//! credential store says when one happens, and each stream checks its own credential again
//! then. Before it ends, a stream says why in one last item.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::StatusCode;
use futures_util::{Stream, StreamExt};
use shared::locks::Lock;

use super::ApiError;
use super::auth::Authed;
use crate::trust::web::{Refused, WebAuth};

/// Open streams per credential id.
#[derive(Default)]
pub struct Streams {
    /// Why a lock: slots are taken by handlers and given back by streams being dropped, on
    /// any thread; held only to count.
    open: Mutex<HashMap<String, usize>>,
}

/// One open stream of a credential; given back when dropped (the stream ended, or its
/// client went away).
pub struct Slot {
    streams: Arc<Streams>,
    id: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.streams.open.locked();
        if let Some(n) = open.get_mut(&self.id) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.id);
            }
        }
    }
}

impl Streams {
    /// A slot for one more stream of `a`'s credential, or 429 when it holds `max` already.
    pub fn take(self: &Arc<Self>, a: &Authed, max: usize) -> Result<Slot, ApiError> {
        let mut open = self.open.locked();
        let n = open.entry(a.caller.id.clone()).or_default();
        if *n >= max {
            tracing::warn!(credential = %a.caller.id, max, "event stream refused: too many open");
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_streams",
                format!(
                    "{} already has {max} event streams open, the most one credential may hold ([web] max_streams_per_credential): close one first",
                    a.caller.name
                ),
            ));
        }
        *n += 1;
        Ok(Slot {
            streams: self.clone(),
            id: a.caller.id.clone(),
        })
    }

    #[cfg(test)]
    fn open(&self, id: &str) -> usize {
        self.open.locked().get(id).copied().unwrap_or(0)
    }
}

/// Resolves, with the reason, when the credential stored under `key` (expiring at
/// `expires_ms`) is no longer live: at once if it is not now, at its expiry, or when a
/// revocation leaves it revoked.
pub fn credential_end(
    auth: WebAuth,
    key: String,
    expires_ms: i64,
) -> impl Future<Output = String> + Send + 'static {
    // Subscribed before the first check, so no revocation falls between them.
    let mut revocations = auth.revocations();
    async move {
        let left = u64::try_from(expires_ms - shared::now_unix_ms()).unwrap_or(0);
        let expiry = tokio::time::sleep(Duration::from_millis(left));
        tokio::pin!(expiry);
        loop {
            match auth.check_key(&key).await {
                Ok(Ok(_)) => {}
                Ok(Err(why)) => return why.to_string(),
                Err(e) => return format!("this credential cannot be checked now ({e}): try again"),
            }
            tokio::select! {
                _ = &mut expiry => return Refused::Expired.to_string(),
                changed = revocations.changed() => {
                    if changed.is_err() {
                        // The store is going away; the expiry still holds.
                        (&mut expiry).await;
                        return Refused::Expired.to_string();
                    }
                }
            }
        }
    }
}

/// `items` until `end` resolves; then `last(reason)` and nothing more. The end is looked at
/// before each item, so nothing that comes after it is sent.
pub fn until_end<T: Send + 'static>(
    items: impl Stream<Item = T> + Send + 'static,
    end: impl Future<Output = String> + Send + 'static,
    last: impl Fn(&str) -> T + Send + 'static,
    slot: Slot,
) -> impl Stream<Item = T> + Send + 'static {
    struct State<S, E, L> {
        items: S,
        end: E,
        last: L,
        done: bool,
        /// Held for as long as the stream is.
        _slot: Slot,
    }
    let state = State {
        items: items.boxed(),
        end: Box::pin(end),
        last,
        done: false,
        _slot: slot,
    };
    futures_util::stream::unfold(state, |mut st| async move {
        if st.done {
            return None;
        }
        tokio::select! {
            biased;
            why = &mut st.end => {
                st.done = true;
                let item = (st.last)(&why);
                Some((item, st))
            }
            item = st.items.next() => item.map(|i| (i, st)),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trust::web::{Caller, Kind, WebRole, key_of};

    fn authed(id: &str) -> Authed {
        Authed {
            caller: Caller {
                id: id.into(),
                name: id.into(),
                role: WebRole::Viewer,
                kind: Kind::Token,
                expires_ms: i64::MAX,
            },
            session: None,
            key: String::new(),
        }
    }

    #[test]
    fn a_credential_holds_at_most_its_streams_and_a_dropped_one_makes_room() {
        let s = Arc::new(Streams::default());
        let a = authed("a");
        let held: Vec<Slot> = (0..2).map(|_| s.take(&a, 2).unwrap()).collect();
        let e = s.take(&a, 2).err().unwrap();
        assert_eq!(
            (e.status, e.code),
            (StatusCode::TOO_MANY_REQUESTS, "too_many_streams")
        );
        assert!(
            e.message.contains("max_streams_per_credential"),
            "{}",
            e.message
        );
        assert!(
            s.take(&authed("b"), 2).is_ok(),
            "another credential has its own"
        );
        drop(held);
        assert_eq!(s.open("a"), 0);
        assert!(s.take(&a, 2).is_ok());
    }

    #[tokio::test]
    async fn a_stream_ends_at_revocation_and_sends_nothing_after() {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let auth = WebAuth::open(&db).unwrap();
        let (secret, c) = auth
            .create_token("v", WebRole::Viewer, 3_600_000)
            .await
            .unwrap();
        let (tx, rx) = tokio::sync::mpsc::channel::<String>(8);
        let slot = Arc::new(Streams::default())
            .take(&authed(&c.id), 1)
            .unwrap();
        let end = credential_end(auth.clone(), key_of(&secret), c.expires_ms);
        let mut s = Box::pin(until_end(
            tokio_stream::wrappers::ReceiverStream::new(rx),
            end,
            |why| format!("closed: {why}"),
            slot,
        ));
        tx.send("one".into()).await.unwrap();
        assert_eq!(s.next().await.as_deref(), Some("one"));
        auth.revoke(&c.id).await.unwrap();
        tx.send("after".into()).await.unwrap();
        let last = s.next().await.unwrap();
        assert!(
            last.starts_with("closed:") && last.contains("revoked"),
            "{last}"
        );
        assert_eq!(s.next().await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_ends_at_expiry() {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let auth = WebAuth::open(&db).unwrap();
        let (secret, c) = auth
            .create_token("v", WebRole::Viewer, 5_000)
            .await
            .unwrap();
        let end = credential_end(auth, key_of(&secret), c.expires_ms);
        let why = tokio::time::timeout(Duration::from_secs(6), end)
            .await
            .expect("ends at expiry");
        assert!(why.contains("expired"), "{why}");
    }
}

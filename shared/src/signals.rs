//! Process shutdown signals, the same for both binaries.

/// Resolves on the first SIGINT (Ctrl-C) or SIGTERM.
pub async fn terminated() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let on_term = async {
        match term.as_mut() {
            Some(t) => {
                t.recv().await;
            }
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = on_term => {}
    }
    tracing::info!("shutting down");
}

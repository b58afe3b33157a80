//! How the long-running commands learn that they should stop.

/// Resolves when the process gets SIGINT or SIGTERM; never, if it cannot listen for them.
pub async fn stop_requested() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

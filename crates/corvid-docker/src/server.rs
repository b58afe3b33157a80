//! Docker's plugin protocol: HTTP POST with JSON on a unix socket, answered in
//! `application/vnd.docker.plugins.v1.2+json`; errors are `{"Err": "..."}` with status 500.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use serde_json::json;

use crate::Driver;

/// The content type of every answer.
pub const CONTENT_TYPE: &str = "application/vnd.docker.plugins.v1.2+json";

/// Where Docker discovers a plugin named `name`.
pub fn default_socket(name: &str) -> PathBuf {
    PathBuf::from(format!("/run/docker/plugins/{name}.sock"))
}

async fn handle(
    State(d): State<Arc<Driver>>,
    UrlPath(method): UrlPath<String>,
    body: Bytes,
) -> Response {
    let answer = tokio::task::spawn_blocking(move || d.call(&method, &body))
        .await
        .unwrap_or_else(|e| Err(crate::DriverError::new(format!("driver failed: {e}"))));
    let (status, v) = match answer {
        Ok(v) => (StatusCode::OK, v),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({"Err": e.to_string()}),
        ),
    };
    (
        status,
        [(header::CONTENT_TYPE, CONTENT_TYPE)],
        v.to_string(),
    )
        .into_response()
}

/// The router: every `POST /<Method>` goes to the driver.
pub fn router(driver: Arc<Driver>) -> Router {
    Router::new()
        .route("/{method}", post(handle))
        .with_state(driver)
}

/// Serves the driver on a unix socket until SIGINT or SIGTERM; a stale socket file is
/// replaced, and the socket is removed on the way out.
pub fn serve(driver: Driver, socket: &Path) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("starting the runtime: {e}"))?;
    rt.block_on(async {
        if let Some(dir) = socket.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        }
        let _ = std::fs::remove_file(socket);
        let listener = tokio::net::UnixListener::bind(socket)
            .map_err(|e| format!("listen on {}: {e}", socket.display()))?;
        eprintln!("corvid docker-plugin: listening on {}", socket.display());
        let served = axum::serve(listener, router(Arc::new(driver)))
            .with_graceful_shutdown(stopped())
            .await
            .map_err(|e| e.to_string());
        let _ = std::fs::remove_file(socket);
        served
    })
}

async fn stopped() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

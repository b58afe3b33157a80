//! Docker's plugin protocol: HTTP POST with JSON on a unix socket, answered in
//! `application/vnd.docker.plugins.v1.2+json`; errors are `{"Err": "..."}` with status 500.

use std::future::Future;
use std::net::SocketAddr;
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

/// Where Docker reaches the driver.
#[derive(Debug, Clone)]
pub enum Listen {
    /// A unix socket; Docker finds `/run/docker/plugins/<name>.sock` by itself.
    Unix(PathBuf),
    /// A TCP address, announced to Docker by a spec file (`/etc/docker/plugins/<name>.spec`)
    /// holding `tcp://<addr>`.
    Tcp {
        /// The address to listen on.
        addr: SocketAddr,
        /// The spec file to write while serving.
        spec: PathBuf,
    },
}

/// Serves the driver until `shutdown` resolves. A stale socket file is replaced; the socket
/// or spec file is removed on the way out, so Docker stops finding a driver that is gone.
pub fn serve(
    driver: Driver,
    listen: &Listen,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("starting the runtime: {e}"))?;
    let app = router(Arc::new(driver));
    rt.block_on(async {
        let (announced, served) = match listen {
            Listen::Unix(socket) => {
                make_parent(socket)?;
                let _ = std::fs::remove_file(socket);
                let listener = tokio::net::UnixListener::bind(socket)
                    .map_err(|e| format!("listen on {}: {e}", socket.display()))?;
                tracing::info!(socket = %socket.display(), "docker plugin listening");
                let served = axum::serve(listener, app)
                    .with_graceful_shutdown(shutdown)
                    .await;
                (socket, served)
            }
            Listen::Tcp { addr, spec } => {
                let listener = tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|e| format!("listen on {addr}: {e}"))?;
                let bound = listener.local_addr().map_err(|e| e.to_string())?;
                make_parent(spec)?;
                std::fs::write(spec, format!("tcp://{bound}\n"))
                    .map_err(|e| format!("write {}: {e}", spec.display()))?;
                tracing::info!(listen = %bound, spec = %spec.display(), "docker plugin listening");
                let served = axum::serve(listener, app)
                    .with_graceful_shutdown(shutdown)
                    .await;
                (spec, served)
            }
        };
        let _ = std::fs::remove_file(announced);
        served.map_err(|e| e.to_string())
    })
}

fn make_parent(path: &Path) -> Result<(), String> {
    match path.parent() {
        Some(dir) => {
            std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))
        }
        None => Ok(()),
    }
}

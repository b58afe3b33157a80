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
    let started = std::time::Instant::now();
    let called = method.clone();
    let answer = tokio::task::spawn_blocking(move || d.call(&called, &body))
        .await
        .unwrap_or_else(|e| Err(crate::DriverError::new(format!("driver failed: {e}"))));
    crate::metrics::called(&method, answer.is_ok(), started.elapsed().as_secs_f64());
    match &answer {
        Ok(_) => tracing::info!(%method, "answered"),
        Err(e) => tracing::warn!(%method, "{e}"),
    }
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
    Unix {
        /// The socket's path.
        path: PathBuf,
        /// The group that may connect (the socket is then 0660), or none (0600: root,
        /// as dockerd runs, only).
        group: Option<u32>,
    },
    /// The unix socket systemd passed (socket activation: `LISTEN_FDS`), which systemd
    /// made with the unit's `SocketMode` and keeps while the driver restarts.
    Activated,
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
) -> Result<(), ServeError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(io("starting the runtime"))?;
    let app = router(Arc::new(driver));
    rt.block_on(async {
        let (announced, served) = match listen {
            Listen::Unix { path, group } => {
                make_parent(path)?;
                let _ = std::fs::remove_file(path);
                let listener = bind_private(path, *group)?;
                tracing::info!(socket = %path.display(), "docker plugin listening");
                let served = axum::serve(listener, app)
                    .with_graceful_shutdown(shutdown)
                    .await;
                (Some(path), served)
            }
            Listen::Activated => {
                let listener = activated()?;
                tracing::info!("docker plugin listening on the socket systemd passed");
                let served = axum::serve(listener, app)
                    .with_graceful_shutdown(shutdown)
                    .await;
                // systemd owns the socket file and keeps it for the next start.
                (None, served)
            }
            Listen::Tcp { addr, spec } => {
                let listener = tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(io(format!("listen on {addr}")))?;
                let bound = listener
                    .local_addr()
                    .map_err(io(format!("listen on {addr}")))?;
                make_parent(spec)?;
                std::fs::write(spec, format!("tcp://{bound}\n"))
                    .map_err(io(format!("write {}", spec.display())))?;
                tracing::info!(listen = %bound, spec = %spec.display(), "docker plugin listening");
                let served = axum::serve(listener, app)
                    .with_graceful_shutdown(shutdown)
                    .await;
                (Some(spec), served)
            }
        };
        if let Some(file) = announced {
            let _ = std::fs::remove_file(file);
        }
        served.map_err(io("serving"))
    })
}

/// Binds `path` with no access for others at any moment: the socket is made under a
/// umask of 0177 (so 0600), then given to `group` and opened to it (0660).
fn bind_private(path: &Path, group: Option<u32>) -> Result<tokio::net::UnixListener, ServeError> {
    use rustix::fs::{Mode, RawMode};
    let old = rustix::process::umask(Mode::from_raw_mode(0o177 as RawMode));
    let bound = tokio::net::UnixListener::bind(path);
    rustix::process::umask(old);
    let listener = bound.map_err(io(format!("listen on {}", path.display())))?;
    if let Some(gid) = group {
        let gid = rustix::fs::Gid::from_raw(gid);
        rustix::fs::chown(path, None, Some(gid))
            .and_then(|_| rustix::fs::chmod(path, Mode::from_raw_mode(0o660 as RawMode)))
            .map_err(|e| {
                io(format!("give {} to group {}", path.display(), gid.as_raw()))(e.into())
            })?;
    }
    Ok(listener)
}

/// The unix socket systemd passed as the first of `LISTEN_FDS`.
fn activated() -> Result<tokio::net::UnixListener, ServeError> {
    let mut fds = listenfd::ListenFd::from_env();
    let std = fds
        .take_unix_listener(0)
        .map_err(io("the socket systemd passed"))?
        .ok_or(ServeError::NotActivated)?;
    std.set_nonblocking(true)
        .and_then(|_| tokio::net::UnixListener::from_std(std))
        .map_err(io("the socket systemd passed"))
}

fn make_parent(path: &Path) -> Result<(), ServeError> {
    match path.parent() {
        Some(dir) => std::fs::create_dir_all(dir).map_err(io(format!("create {}", dir.display()))),
        None => Ok(()),
    }
}

/// Why the driver could not serve.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A step of setting up or serving the socket failed.
    #[error("{step}: {source}")]
    Io {
        /// The step, naming its file or address.
        step: String,
        /// Why.
        source: std::io::Error,
    },
    /// Started for socket activation, but given no socket.
    #[error(
        "no socket was passed (LISTEN_FDS is not set for this process): start the driver \
         through its .socket unit, or give --socket"
    )]
    NotActivated,
}

/// The failure of `step`.
fn io(step: impl Into<String>) -> impl FnOnce(std::io::Error) -> ServeError {
    let step = step.into();
    move |source| ServeError::Io { step, source }
}

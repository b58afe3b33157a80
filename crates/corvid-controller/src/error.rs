//! Errors in Neutron's wire shape: `{"NeutronError": {"type", "message", "detail"}}` with
//! the HTTP status Neutron uses for each.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::store::StoreError;

/// An error answer of the API.
#[derive(Debug, Clone, PartialEq)]
pub struct NeutronError {
    /// HTTP status.
    pub status: StatusCode,
    /// Neutron's error type name.
    pub kind: String,
    /// What went wrong, for a person.
    pub message: String,
}

impl NeutronError {
    /// The error's body, in Neutron's shape.
    pub fn body(&self) -> serde_json::Value {
        json!({"NeutronError": {"type": self.kind, "message": self.message, "detail": ""}})
    }

    /// Any error.
    pub fn new(status: StatusCode, kind: &str, message: impl Into<String>) -> NeutronError {
        NeutronError {
            status,
            kind: kind.to_string(),
            message: message.into(),
        }
    }

    /// 400 for a body or query the API cannot take.
    pub fn bad_request(message: impl Into<String>) -> NeutronError {
        NeutronError::new(StatusCode::BAD_REQUEST, "HTTPBadRequest", message)
    }

    /// 400 for a value that is well-formed but not acceptable.
    pub fn invalid_input(message: impl Into<String>) -> NeutronError {
        NeutronError::new(
            StatusCode::BAD_REQUEST,
            "InvalidInput",
            format!("Invalid input for operation: {}.", message.into()),
        )
    }

    /// 404 for an unknown ID of a resource (`Port`, `Network`, ...).
    pub fn not_found(what: &str, id: &str) -> NeutronError {
        NeutronError::new(
            StatusCode::NOT_FOUND,
            &format!("{what}NotFound"),
            format!("{what} {id} could not be found."),
        )
    }

    /// 409 when a write kept losing compare-and-swap races.
    pub fn busy() -> NeutronError {
        NeutronError::conflict(
            "Conflict",
            "The resource changed concurrently too often; retry.",
        )
    }

    /// 409 with a Neutron conflict type.
    pub fn conflict(kind: &str, message: impl Into<String>) -> NeutronError {
        NeutronError::new(StatusCode::CONFLICT, kind, message)
    }
}

impl From<StoreError> for NeutronError {
    fn from(e: StoreError) -> NeutronError {
        match e {
            StoreError::TooLarge(why) if why.contains("too many operations") => {
                NeutronError::invalid_input(format!(
                    "the request is too large for one store transaction ({why}); etcd takes at \
                     most --max-txn-ops compares and writes (128 unless raised), about 24 new \
                     ports with security groups, 32 without: \
                     send smaller bulk requests or raise etcd's --max-txn-ops"
                ))
            }
            StoreError::TooLarge(why) => NeutronError::invalid_input(format!(
                "the request is too large for one store transaction ({why}); etcd takes at most \
                 --max-request-bytes in one request (1.5 MiB unless raised): \
                 send smaller bulk requests or raise etcd's --max-request-bytes"
            )),
            e => NeutronError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "StoreUnavailable",
                e.to_string(),
            ),
        }
    }
}

impl IntoResponse for NeutronError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::error!(status = self.status.as_u16(), kind = %self.kind, "{}", self.message);
        }
        (self.status, Json(self.body())).into_response()
    }
}

/// Why the controller could not start, or stopped serving.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The async runtime could not be started.
    #[error("starting the runtime: {0}")]
    Runtime(std::io::Error),
    /// The TLS files could not be used.
    #[error("TLS: {0}")]
    Tls(#[from] corvid_api::TlsError),
    /// The store could not be opened or read.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// The address could not be listened on.
    #[error("listening on {addr}: {source}")]
    Listen {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// Serving stopped with an error.
    #[error("serving: {0}")]
    Serve(std::io::Error),
}

//! Datapath and allocation failures as CNI errors.

use corvid_cni::{Error, ErrorCode};

/// A corvid-net failure as a CNI error: a missing namespace is "container unknown", a
/// CNI_NETNS that is no namespace an invalid environment, a file problem I/O, the rest
/// the kernel refusing.
pub fn net(e: corvid_net::Error) -> Error {
    let code = match &e {
        corvid_net::Error::Netns { .. } if e.errno() == Some(libc::ENOENT) => {
            ErrorCode::UnknownContainer
        }
        corvid_net::Error::Netns { .. } => ErrorCode::InvalidEnvironment,
        corvid_net::Error::Io { .. } => ErrorCode::Io,
        _ => ErrorCode::Kernel,
    };
    Error::new(code, e.to_string())
}

/// A corvid-ipam failure as a CNI error.
pub fn ipam(e: corvid_ipam::Error) -> Error {
    let code = match &e {
        corvid_ipam::Error::InvalidRange(_) => ErrorCode::InvalidNetworkConfig,
        corvid_ipam::Error::Exhausted(_) => ErrorCode::AddressExhausted,
        corvid_ipam::Error::Unavailable(_) => ErrorCode::AddressUnavailable,
        corvid_ipam::Error::Io { .. } => ErrorCode::Io,
    };
    Error::new(code, e.to_string())
}

/// A plugin configuration that does not deserialize.
pub fn config(e: serde_json::Error) -> Error {
    Error::new(
        ErrorCode::InvalidNetworkConfig,
        "invalid network configuration",
    )
    .with_details(e.to_string())
}

//! The host datapath: network namespaces, links, addresses, routes, sysctls and
//! nftables rules in corvid's own table. Synchronous on purpose: CNI plugins are
//! short-lived processes and a namespace switch must stay on the thread that asked.

#![deny(missing_docs)]

pub mod announce;
pub mod binding;
pub mod conntrack;
pub mod iptables;
pub mod link;
pub mod names;
pub mod netlink;
pub mod netns;
pub mod nftables;
pub mod overlay;
pub mod route;
pub mod router_advert;
pub mod rule;
pub mod shaping;
pub mod sysctl;

mod addr;

pub use netlink::Netlink;
pub use netns::{Netns, NetnsGuard};

/// This host's name (`localhost` when it has none): the default host ID of the agent's
/// and the plugins' ports.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

use std::io;
use std::path::PathBuf;

/// A datapath failure with the operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kernel refused a netlink request.
    #[error("{op}: {source}")]
    Netlink {
        /// What was asked, e.g. "create veth veth1a2b3c4d".
        op: String,
        /// The errno the kernel answered.
        source: io::Error,
    },
    /// A network namespace could not be opened or entered.
    #[error("network namespace {}: {source}", path.display())]
    Netns {
        /// The namespace path.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The kernel refused a change to corvid's nftables table.
    #[error("nftables: {op}: {source}")]
    Nftables {
        /// The step refused, e.g. "add an element to masq4".
        op: String,
        /// The errno the kernel answered.
        source: io::Error,
    },
    /// A file (sysctl, namespace mount point) could not be read or written.
    #[error("{what}: {source}")]
    Io {
        /// The file or operation.
        what: String,
        /// Why.
        source: io::Error,
    },
    /// A command corvid drives (`iptables`) refused.
    #[error("{command}: {message}")]
    Command {
        /// The command line.
        command: String,
        /// What it said on stderr.
        message: String,
    },
}

impl Error {
    /// The errno behind the error, if there is one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Netlink { source, .. }
            | Error::Netns { source, .. }
            | Error::Nftables { source, .. }
            | Error::Io { source, .. } => source.raw_os_error(),
            Error::Command { .. } => None,
        }
    }
}

/// Results of datapath operations.
pub type Result<T> = std::result::Result<T, Error>;

pub(crate) fn netlink_err(op: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
    let op = op.into();
    move |source| Error::Netlink { op, source }
}

pub(crate) fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}

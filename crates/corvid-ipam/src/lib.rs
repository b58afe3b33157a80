//! Address allocation as pure logic (ranges, range sets, next free address with rotation)
//! and the host-local on-disk store, in the layout the reference plugin uses so that
//! both can share one lease directory.

#![deny(missing_docs)]

pub mod leases;
pub mod range;

pub use leases::{Lease, LeaseDir, LeaseLock, PreparedLease};
pub use range::{Range, RangeConf, RangeSet};

/// Why an allocation or a range could not be made.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The range configuration is invalid.
    #[error("invalid range: {0}")]
    InvalidRange(String),
    /// No free address is left.
    #[error("no IP addresses available in range set {0}")]
    Exhausted(String),
    /// A requested address cannot be given out.
    #[error("{0}")]
    Unavailable(String),
    /// The store could not be read or written.
    #[error("{what}: {source}")]
    Io {
        /// The file or operation.
        what: String,
        /// Why.
        source: std::io::Error,
    },
}

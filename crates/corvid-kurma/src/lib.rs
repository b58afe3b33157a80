//! Kurma's network plugins (the protocol of apcera/kurma's `network/` plugins): plugin images
//! and the runtime that runs them.

#![deny(missing_docs)]

#[cfg(feature = "runtime")]
pub mod aci;
pub mod config;
#[cfg(feature = "runtime")]
pub mod image;
pub mod invoke;
#[cfg(feature = "runtime")]
pub mod runtime;
#[cfg(feature = "runtime")]
pub mod source;

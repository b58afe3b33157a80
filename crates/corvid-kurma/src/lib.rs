//! Kurma's network plugins (`../shared/specs/kurma-network-plugins.md`): plugin images
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

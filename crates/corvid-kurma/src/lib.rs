//! Kurma's network plugins (`../shared/specs/kurma-network-plugins.md`): plugin images
//! and the runtime that runs them.

#![deny(missing_docs)]

pub mod aci;
pub mod config;
pub mod image;
pub mod invoke;
pub mod runtime;
pub mod source;

//! Kurma's network plugins (`../shared/specs/kurma-network-plugins.md`): plugin images
//! and, in time, the runtime that runs them and corvid's own plugin image (issue 20).

#![deny(missing_docs)]

pub mod aci;
pub mod config;
pub mod invoke;
pub mod source;

//! The CNI specification as a library: network configurations, results of every spec
//! version with conversion between them, the well-known errors, and `skel`, the entry
//! point that turns a plugin process's environment and stdin into a command.

#![deny(missing_docs)]

pub mod args;
pub mod command;
pub mod config;
pub mod conflist;
pub mod error;
pub mod exec;
pub mod result;
pub mod skel;
pub mod version;

pub use command::Command;
pub use config::NetConf;
pub use conflist::NetConfList;
pub use error::{Error, ErrorCode};
pub use result::CniResult;
pub use version::Version;

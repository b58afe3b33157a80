//! dhcp: IPAM from a DHCP server. Leases outlive the plugin's process, so a daemon
//! (`dhcp daemon`, as the reference's, or `corvid-plugins dhcp daemon`) holds them: it
//! acquires each in the container's namespace, renews it, and releases it on DEL. The
//! plugin asks the daemon over a unix socket, one JSON request and reply per connection.

pub mod daemon;
mod lease;
mod wire;

use crate::errors;
use corvid_cni::skel::{CmdArgs, Plugin};
use corvid_cni::{CniResult, Error, ErrorCode, Version};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

/// Where the daemon listens unless the configuration says otherwise, as the reference's.
pub const DEFAULT_SOCKET: &str = "/run/cni/dhcp.sock";

/// The dhcp IPAM plugin.
pub struct Dhcp;

/// A request from the plugin to the daemon.
#[derive(Serialize, Deserialize, Debug)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Request {
    command: Asked,
    container_id: String,
    netns: Option<PathBuf>,
    ifname: String,
    /// CNI_ARGS as given: `provide` options may take values from it.
    args: String,
    /// The network configuration.
    conf: serde_json::Value,
}

/// What the plugin asks of the daemon.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Asked {
    /// A lease: the one held, or a new one.
    Allocate,
    /// Fails unless the lease is held and kept.
    Check,
    /// Release the lease.
    Release,
    /// Release every lease of the network not in `cni.dev/valid-attachments`.
    Gc,
    /// Answer, to show the daemon is there.
    Status,
}

/// The daemon's answer.
#[derive(Serialize, Deserialize, Debug)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Reply {
    /// The lease as a result, in the current version.
    Result(serde_json::Value),
    /// Done, nothing to return.
    Done,
    /// Refused, in the spec's error shape.
    Error(Error),
}

/// The plugin's part of the IPAM section.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Ipam {
    #[serde(default)]
    daemon_socket_path: Option<PathBuf>,
}

#[derive(Deserialize)]
struct Conf {
    #[serde(default)]
    ipam: Ipam,
}

fn ask(args: &CmdArgs, command: Asked) -> Result<Reply, Error> {
    let raw: serde_json::Value = serde_json::from_slice(&args.stdin).map_err(errors::config)?;
    let conf = Conf::deserialize(&raw).map_err(errors::config)?;
    let socket = conf
        .ipam
        .daemon_socket_path
        .unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET));
    let netns = match &args.netns {
        Some(p) => Some(std::path::absolute(p).map_err(|e| {
            Error::new(
                ErrorCode::InvalidEnvironment,
                format!("failed to make {} an absolute path: {e}", p.display()),
            )
        })?),
        None => None,
    };
    let request = Request {
        command,
        container_id: args.container_id.clone(),
        netns,
        ifname: args.ifname.clone(),
        args: args
            .args
            .0
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(";"),
        conf: raw,
    };
    let unreachable = |e: std::io::Error| {
        // STATUS says the plugin cannot serve ADDs; the others may work once it runs.
        let code = if command == Asked::Status {
            ErrorCode::PluginNotAvailable
        } else {
            ErrorCode::TryAgainLater
        };
        Error::new(
            code,
            format!(
                "error dialing DHCP daemon at {}: {e} (is `dhcp daemon` running?)",
                socket.display()
            ),
        )
    };
    let mut stream = match UnixStream::connect(&socket) {
        // The daemon holds leases in memory: with no daemon there is none to release.
        Err(e) if command == Asked::Release && gone(&e) => {
            tracing::warn!(
                "no DHCP daemon at {} ({e}): no lease to release",
                socket.display()
            );
            return Ok(Reply::Done);
        }
        r => r.map_err(unreachable)?,
    };
    let mut line = serde_json::to_vec(&request).expect("a request serializes");
    line.push(b'\n');
    stream.write_all(&line).map_err(unreachable)?;
    let mut answer = String::new();
    BufReader::new(&stream)
        .read_line(&mut answer)
        .map_err(unreachable)?;
    serde_json::from_str(&answer).map_err(|e| {
        Error::new(
            ErrorCode::Internal,
            format!("the DHCP daemon's answer is not understood: {e}"),
        )
    })
}

fn gone(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
    )
}

fn done(reply: Reply) -> Result<(), Error> {
    match reply {
        Reply::Error(e) => Err(e),
        Reply::Done | Reply::Result(_) => Ok(()),
    }
}

impl Plugin for Dhcp {
    fn add(&self, args: &CmdArgs) -> Result<CniResult, Error> {
        match ask(args, Asked::Allocate)? {
            Reply::Result(r) => CniResult::parse(&r, Version::CURRENT).map(|(r, _)| r),
            Reply::Error(e) => Err(e),
            Reply::Done => Err(Error::new(
                ErrorCode::Internal,
                "the DHCP daemon returned no lease",
            )),
        }
    }

    fn del(&self, args: &CmdArgs) -> Result<(), Error> {
        done(ask(args, Asked::Release)?)
    }

    fn check(&self, args: &CmdArgs) -> Result<(), Error> {
        done(ask(args, Asked::Check)?)
    }

    fn gc(&self, args: &CmdArgs) -> Result<(), Error> {
        done(ask(args, Asked::Gc)?)
    }

    fn status(&self, args: &CmdArgs) -> Result<(), Error> {
        done(ask(args, Asked::Status)?)
    }
}

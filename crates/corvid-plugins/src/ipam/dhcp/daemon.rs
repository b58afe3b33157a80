//! The DHCP daemon: serves the plugin's requests on a unix socket (its own, or the one
//! systemd passes), one thread per connection, and keeps a lease per container
//! interface. Flags are the reference's: `-socketpath`, `-pidfile`, `-hostprefix`,
//! `-broadcast`, `-timeout`, `-resendmax`, `-resendtimeout`.

use super::lease::{Asking, Lease, Timing};
use super::{Asked, Reply, Request, DEFAULT_SOCKET};
use corvid_cni::result::IpConfig;
use corvid_cni::{CniResult, Error, ErrorCode, Version};
use ipnet::IpNet;
use serde::Deserialize;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::IpAddr;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The daemon's settings, from its flags.
#[derive(Debug)]
struct Flags {
    socket: PathBuf,
    pidfile: Option<PathBuf>,
    host_prefix: String,
    timing: Timing,
}

/// Why the daemon's flags were refused; the messages are Go's flag package's.
#[derive(Debug, thiserror::Error)]
enum FlagError {
    /// An argument that is no flag.
    #[error("unexpected argument {0:?}")]
    Unexpected(String),
    /// A flag given last, without its value.
    #[error("flag needs an argument: -{0}")]
    NoValue(String),
    /// A flag the daemon does not have.
    #[error("flag provided but not defined: -{0}")]
    Unknown(String),
    /// A duration flag's value is no duration.
    #[error("-{flag} {value:?}: {source}")]
    Duration {
        flag: String,
        value: String,
        source: humantime::DurationError,
    },
    /// The pid file must not depend on the daemon's working directory.
    #[error("Error writing pidfile {}: path not absolute", .0.display())]
    RelativePidfile(PathBuf),
}

/// Why the daemon has no socket to serve on.
#[derive(Debug, thiserror::Error)]
enum ListenError {
    /// The socket systemd passed could not be taken.
    #[error("LISTEN_FDS=1: {0}")]
    Activation(#[source] std::io::Error),
    /// systemd said it passed a socket, and passed something else.
    #[error("LISTEN_FDS=1 but no socket found")]
    NotASocket,
    /// More than the one socket the daemon serves on.
    #[error("Too many ({0}) FDs passed through socket activation")]
    TooMany(usize),
    /// The socket's directory could not be made.
    #[error("making the socket's directory {}: {source}", dir.display())]
    Directory {
        dir: PathBuf,
        source: std::io::Error,
    },
    /// The socket could not be bound.
    #[error("Error getting listener: {}: {source}", path.display())]
    Bind {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The socket could not be kept to its owner, root, alone.
    #[error("restricting {} to its owner (0600): {source}", path.display())]
    Permissions {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn duration(flag: &str, v: &str) -> Result<Duration, FlagError> {
    humantime::parse_duration(v).map_err(|source| FlagError::Duration {
        flag: flag.to_string(),
        value: v.to_string(),
        source,
    })
}

/// Reads Go-style flags: `-name value`, `--name value`, `-name=value`.
fn parse(args: &[String]) -> Result<Flags, FlagError> {
    let mut f = Flags {
        socket: PathBuf::from(DEFAULT_SOCKET),
        pidfile: None,
        host_prefix: String::new(),
        timing: Timing {
            reply: Duration::from_secs(10),
            resend_max: Duration::from_secs(62),
            give_up: Duration::from_secs(208),
            broadcast: false,
        },
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let name = arg.trim_start_matches('-');
        if name.len() == arg.len() {
            return Err(FlagError::Unexpected(arg.clone()));
        }
        let (name, inline) = match name.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (name, None),
        };
        if name == "broadcast" {
            f.timing.broadcast = inline.as_deref().is_none_or(|v| v == "true");
            continue;
        }
        let value = match inline {
            Some(v) => v,
            None => it
                .next()
                .cloned()
                .ok_or_else(|| FlagError::NoValue(name.to_string()))?,
        };
        match name {
            "socketpath" if !value.is_empty() => f.socket = PathBuf::from(value),
            "socketpath" => {}
            "pidfile" if !value.is_empty() => f.pidfile = Some(PathBuf::from(value)),
            "pidfile" => {}
            "hostprefix" => f.host_prefix = value,
            "timeout" => f.timing.reply = duration(name, &value)?,
            "resendmax" => f.timing.resend_max = duration(name, &value)?,
            "resendtimeout" => f.timing.give_up = duration(name, &value)?,
            _ => return Err(FlagError::Unknown(name.to_string())),
        }
    }
    if let Some(p) = &f.pidfile {
        if !p.is_absolute() {
            return Err(FlagError::RelativePidfile(p.clone()));
        }
    }
    Ok(f)
}

/// The network configuration's parts the daemon reads.
#[derive(Deserialize)]
struct Conf {
    #[serde(default)]
    name: String,
    #[serde(default)]
    ipam: Ipam,
    #[serde(default, rename = "cni.dev/valid-attachments")]
    valid_attachments: Vec<Attachment>,
}

#[derive(Deserialize, Default)]
struct Ipam {
    #[serde(default)]
    provide: Vec<Provide>,
    #[serde(default)]
    request: Vec<RequestOption>,
    #[serde(default)]
    priority: u32,
}

#[derive(Deserialize)]
struct Provide {
    option: String,
    #[serde(default)]
    value: String,
    #[serde(default, rename = "fromArg")]
    from_arg: String,
}

#[derive(Deserialize)]
struct RequestOption {
    #[serde(default, rename = "skipDefault")]
    skip_default: bool,
    #[serde(default)]
    option: String,
}

#[derive(Deserialize, PartialEq, Eq)]
struct Attachment {
    #[serde(rename = "containerID")]
    container_id: String,
    ifname: String,
}

/// The option names the reference knows; others are given by number.
fn option_code(name: &str) -> Result<u8, Error> {
    let code = match name {
        "dhcp-client-identifier" => 61,
        "subnet-mask" => 1,
        "routers" => 3,
        "host-name" => 12,
        "user-class" => 77,
        "vendor-class-identifier" => 60,
        n => n.parse().map_err(|_| {
            Error::new(
                ErrorCode::InvalidNetworkConfig,
                format!("can not parse option {n:?}: not a known name or a number below 256"),
            )
        })?,
    };
    Ok(code)
}

/// Routers and subnet mask, asked for unless a request option says `skipDefault`.
const REQUEST_DEFAULT: [u8; 2] = [3, 1];

/// The client identifier, the reference's: `containerID/network/ifname`, at most 254
/// bytes.
fn client_id(container_id: &str, network: &str, ifname: &str) -> String {
    let mut id = format!("{container_id}/{network}/{ifname}");
    let mut end = id.len().min(254);
    while !id.is_char_boundary(end) {
        end -= 1;
    }
    id.truncate(end);
    id
}

fn asking(req: &Request, conf: &Conf) -> Result<Asking, Error> {
    let cni_args: HashMap<&str, &str> = req
        .args
        .split(';')
        .filter_map(|kv| kv.split_once('='))
        .collect();
    let too_long = |option: &str| {
        Error::new(
            ErrorCode::InvalidNetworkConfig,
            format!("value too long for option {option:?}: at most 255 bytes"),
        )
    };
    let mut provide = Vec::new();
    for p in &conf.ipam.provide {
        let code = option_code(&p.option)?;
        let from_arg = cni_args
            .get(p.from_arg.as_str())
            .filter(|_| !p.from_arg.is_empty());
        for value in [
            Some(p.value.as_str()).filter(|v| !v.is_empty()),
            from_arg.copied(),
        ]
        .into_iter()
        .flatten()
        {
            if value.len() > 255 {
                return Err(too_long(&p.option));
            }
            provide.push((code, value.as_bytes().to_vec()));
        }
    }
    let mut request: Vec<u8> = Vec::new();
    let mut skip_default = false;
    for r in &conf.ipam.request {
        skip_default |= r.skip_default;
        if !r.option.is_empty() {
            let code = option_code(&r.option)?;
            if !request.contains(&code) {
                request.push(code);
            }
        }
    }
    if !skip_default {
        for code in REQUEST_DEFAULT {
            if !request.contains(&code) {
                request.push(code);
            }
        }
    }
    Ok(Asking {
        client_id: client_id(&req.container_id, &conf.name, &req.ifname),
        provide,
        request,
    })
}

/// A lease held for one container interface, with who it is for.
struct Held {
    container_id: String,
    network: String,
    ifname: String,
    lease: Option<Lease>,
}

/// Every lease, each behind its own lock so one slow server holds up only its clients.
#[derive(Default)]
struct Leases(Mutex<HashMap<String, Arc<Mutex<Held>>>>);

impl Leases {
    fn slot(&self, id: &str, req: &Request, network: &str) -> Arc<Mutex<Held>> {
        let mut all = self.0.lock().expect("lease table lock");
        Arc::clone(all.entry(id.to_string()).or_insert_with(|| {
            Arc::new(Mutex::new(Held {
                container_id: req.container_id.clone(),
                network: network.to_string(),
                ifname: req.ifname.clone(),
                lease: None,
            }))
        }))
    }

    fn existing(&self, id: &str) -> Option<Arc<Mutex<Held>>> {
        self.0.lock().expect("lease table lock").get(id).cloned()
    }

    fn release(&self, id: &str) {
        let slot = self.0.lock().expect("lease table lock").remove(id);
        if let Some(slot) = slot {
            let lease = slot.lock().expect("lease lock").lease.take();
            if let Some(l) = lease {
                l.stop();
            }
        }
    }
}

/// What the daemon serves with.
struct Daemon {
    leases: Leases,
    host_prefix: String,
    timing: Timing,
}

fn result(lease: &Lease, priority: u32) -> CniResult {
    let b = lease.bound();
    let mut routes = b.routes.clone();
    if priority != 0 {
        for r in &mut routes {
            r.priority = Some(priority);
        }
    }
    CniResult {
        ips: vec![IpConfig {
            address: IpNet::V4(b.address),
            gateway: b.gateway.map(IpAddr::V4),
            interface: None,
        }],
        routes,
        ..CniResult::default()
    }
}

impl Daemon {
    fn serve(&self, req: Request) -> Reply {
        let conf: Conf = match serde_json::from_value(req.conf.clone()) {
            Ok(c) => c,
            Err(e) => {
                return Reply::Error(Error::new(
                    ErrorCode::Decoding,
                    format!("error parsing netconf: {e}"),
                ))
            }
        };
        let id = client_id(&req.container_id, &conf.name, &req.ifname);
        match req.command {
            Asked::Status => Reply::Done,
            Asked::Release => {
                self.leases.release(&id);
                Reply::Done
            }
            Asked::Check => {
                let kept = self.leases.existing(&id).is_some_and(|s| {
                    s.lock()
                        .expect("lease lock")
                        .lease
                        .as_ref()
                        .is_some_and(Lease::kept)
                });
                if kept {
                    Reply::Done
                } else {
                    Reply::Error(Error::new(
                        ErrorCode::CheckFailed,
                        format!("{id}: no DHCP lease is held"),
                    ))
                }
            }
            Asked::Gc => {
                let stale: Vec<String> = {
                    let all = self.leases.0.lock().expect("lease table lock");
                    all.iter()
                        .filter(|(_, s)| {
                            let h = s.lock().expect("lease lock");
                            h.network == conf.name
                                && !conf.valid_attachments.iter().any(|a| {
                                    a.container_id == h.container_id && a.ifname == h.ifname
                                })
                        })
                        .map(|(id, _)| id.clone())
                        .collect()
                };
                for id in stale {
                    self.leases.release(&id);
                }
                Reply::Done
            }
            Asked::Allocate => match self
                .allocate(&req, &conf, &id)
                .and_then(|r| r.to_value(Version::CURRENT))
            {
                Ok(r) => Reply::Result(r),
                Err(e) => Reply::Error(e),
            },
        }
    }

    fn allocate(&self, req: &Request, conf: &Conf, id: &str) -> Result<CniResult, Error> {
        let asking = asking(req, conf)?;
        let Some(netns) = &req.netns else {
            return Err(Error::new(
                ErrorCode::InvalidEnvironment,
                "CNI_NETNS is required to acquire a lease",
            ));
        };
        let slot = self.leases.slot(id, req, &conf.name);
        let mut held = slot.lock().expect("lease lock");
        if let Some(l) = held.lease.as_ref().filter(|l| l.kept()) {
            return Ok(result(l, conf.ipam.priority));
        }
        if let Some(l) = held.lease.take() {
            l.stop();
        }
        let path = PathBuf::from(format!("{}{}", self.host_prefix, netns.display()));
        match Lease::acquire(&path, &req.ifname, asking, self.timing.clone()) {
            Ok(l) => {
                let r = result(&l, conf.ipam.priority);
                held.lease = Some(l);
                Ok(r)
            }
            Err(e) => {
                drop(held);
                self.leases.release(id);
                Err(Error::new(ErrorCode::Internal, e.to_string()))
            }
        }
    }

    fn connection(&self, stream: UnixStream) {
        let mut line = String::new();
        if BufReader::new(&stream).read_line(&mut line).is_err() {
            return;
        }
        let reply = match serde_json::from_str::<Request>(&line) {
            Ok(req) => self.serve(req),
            Err(e) => Reply::Error(Error::new(
                ErrorCode::Decoding,
                format!("the request is not understood: {e}"),
            )),
        };
        let mut out = serde_json::to_vec(&reply).expect("a reply serializes");
        out.push(b'\n');
        let _ = (&stream).write_all(&out);
    }
}

/// The socket systemd passes, or a new one at `path` (its directory made 0700); true
/// when the daemon made it, and so removes it when it stops.
fn listener(path: &Path) -> Result<(UnixListener, bool), ListenError> {
    let mut fds = listenfd::ListenFd::from_env();
    match fds.len() {
        0 => {}
        1 => {
            return fds
                .take_unix_listener(0)
                .map_err(ListenError::Activation)?
                .map(|l| (l, false))
                .ok_or(ListenError::NotASocket)
        }
        n => return Err(ListenError::TooMany(n)),
    }
    if let Some(dir) = path.parent() {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|source| ListenError::Directory {
                dir: dir.to_path_buf(),
                source,
            })?;
    }
    // A socket left by a daemon that died: nobody answers on it.
    if UnixStream::connect(path).is_err() {
        let _ = std::fs::remove_file(path);
    }
    let l = UnixListener::bind(path).map_err(|source| ListenError::Bind {
        path: path.to_path_buf(),
        source,
    })?;
    // Only root's plugins may ask for leases in other namespaces.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(|source| {
        ListenError::Permissions {
            path: path.to_path_buf(),
            source,
        }
    })?;
    Ok((l, true))
}

/// Blocks SIGTERM and SIGINT in every thread and waits for one on its own, so the
/// socket and pid file go when the daemon is stopped.
fn on_stop(cleanup: impl FnOnce() + Send + 'static) {
    // SAFETY: sigset operations on a local set, then the calling thread's mask.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };
    std::thread::spawn(move || {
        let mut sig = 0;
        // SAFETY: waits on the set blocked above.
        unsafe { libc::sigwait(&set, &mut sig) };
        cleanup();
        std::process::exit(0);
    });
}

/// `dhcp daemon [flags]`: serves until SIGTERM or SIGINT; the exit code.
pub fn main(args: &[String]) -> i32 {
    let flags = match parse(args) {
        Ok(f) => f,
        Err(e) => {
            tracing::error!("dhcp daemon: {e}");
            return 2;
        }
    };
    let socket = PathBuf::from(format!("{}{}", flags.host_prefix, flags.socket.display()));
    let (listener, made) = match listener(&socket) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("dhcp daemon: {e}");
            return 1;
        }
    };
    if let Some(p) = &flags.pidfile {
        if let Err(e) = std::fs::write(p, std::process::id().to_string()) {
            tracing::error!("dhcp daemon: writing the pidfile {}: {e}", p.display());
            return 1;
        }
    }
    let pidfile = flags.pidfile.clone();
    let cleanup_socket = socket.clone();
    on_stop(move || {
        if made {
            let _ = std::fs::remove_file(&cleanup_socket);
        }
        if let Some(p) = pidfile {
            let _ = std::fs::remove_file(p);
        }
    });
    tracing::info!("dhcp daemon: serving on {}", socket.display());
    let daemon = Arc::new(Daemon {
        leases: Leases::default(),
        host_prefix: flags.host_prefix,
        timing: flags.timing,
    });
    for stream in listener.incoming() {
        match stream {
            Ok(s) => {
                let d = Arc::clone(&daemon);
                std::thread::spawn(move || d.connection(s));
            }
            Err(e) => tracing::warn!("dhcp daemon: accept: {e}"),
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn flags_read_as_go_reads_them() {
        let f = parse(&args(
            "-socketpath /tmp/x.sock --timeout=2s -resendtimeout 1m -broadcast",
        ))
        .unwrap();
        assert_eq!(f.socket, PathBuf::from("/tmp/x.sock"));
        assert_eq!(f.timing.reply, Duration::from_secs(2));
        assert_eq!(f.timing.give_up, Duration::from_secs(60));
        assert!(f.timing.broadcast);
        assert!(parse(&args("-pidfile relative.pid")).is_err());
        assert!(parse(&args("-nosuch 1")).is_err());
        assert!(parse(&args("-timeout")).is_err());
    }

    #[test]
    fn client_ids_are_the_references() {
        assert_eq!(client_id("c1", "net", "eth0"), "c1/net/eth0");
        assert_eq!(client_id(&"x".repeat(300), "n", "i").len(), 254);
    }

    #[test]
    fn options_are_provided_and_requested_as_the_reference_does() {
        let req = Request {
            command: Asked::Allocate,
            container_id: "c".into(),
            netns: None,
            ifname: "eth0".into(),
            args: "K8S_POD_NAME=web;IgnoreUnknown=1".into(),
            conf: serde_json::Value::Null,
        };
        let conf: Conf = serde_json::from_value(serde_json::json!({"name": "n", "ipam": {
            "provide": [{"option": "host-name", "fromArg": "K8S_POD_NAME"},
                        {"option": "60", "value": "corvid"}],
            "request": [{"option": "121"}]}}))
        .unwrap();
        let a = asking(&req, &conf).unwrap();
        assert_eq!(
            a.provide,
            vec![(12, b"web".to_vec()), (60, b"corvid".to_vec())]
        );
        assert_eq!(a.request, vec![121, 3, 1]);
        let skip: Conf = serde_json::from_value(serde_json::json!({"ipam": {
            "request": [{"skipDefault": true, "option": "routers"}]}}))
        .unwrap();
        assert_eq!(asking(&req, &skip).unwrap().request, vec![3]);
        let bad: Conf =
            serde_json::from_value(serde_json::json!({"ipam": {"request": [{"option": "nope"}]}}))
                .unwrap();
        assert!(asking(&req, &bad).is_err());
    }
}

//! Test support: namespaces that remove themselves, a plugin directory, and running a
//! plugin inside a private "host" namespace.
#![allow(dead_code)]

#[path = "../../../corvid-net/tests/support/nft.rs"]
mod nft;

use corvid_net::{Netlink, Netns};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A named namespace `cvt<pid>-<n>` under /run/netns, deleted on drop.
pub struct TestNs {
    pub name: String,
    pub path: PathBuf,
}

impl TestNs {
    pub fn new() -> TestNs {
        assert!(
            unsafe { libc::geteuid() } == 0,
            "these tests create network namespaces and must run as root"
        );
        let name = format!(
            "cvt{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        );
        let path = Netns::create_named(&name).expect("create test namespace");
        TestNs { name, path }
    }

    pub fn path_str(&self) -> String {
        self.path.display().to_string()
    }

    pub fn open(&self) -> Netns {
        Netns::open(&self.path).unwrap()
    }

    /// Runs `f` inside this namespace on the calling thread.
    pub fn run<T>(&self, f: impl FnOnce() -> T) -> T {
        self.open().run(f).unwrap()
    }

    pub fn netlink(&self) -> Netlink {
        Netlink::open_in(&self.open()).unwrap()
    }

    /// Names of the links in this namespace but loopback.
    pub fn links(&self) -> Vec<String> {
        self.netlink()
            .links()
            .unwrap()
            .into_iter()
            .map(|l| l.name)
            .filter(|n| n != "lo")
            .collect()
    }

    /// Names of the veth links in this namespace.
    pub fn veths(&self) -> Vec<String> {
        self.netlink()
            .links()
            .unwrap()
            .into_iter()
            .filter(|l| l.kind == corvid_net::link::LinkKind::Veth)
            .map(|l| l.name)
            .collect()
    }

    /// The attachment tags of corvid's masqueraded addresses in this namespace.
    pub fn masquerade_rules(&self) -> Vec<String> {
        self.run(corvid_net::nftables::masquerade::masquerade_tags)
            .unwrap()
    }

    /// Runs a command with this namespace as its network namespace.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new(program);
        self.open().apply_to(&mut cmd).unwrap();
        cmd
    }

    /// Runs `ip ARGS` here; it must succeed.
    pub fn ip(&self, args: &str) {
        let ok = self
            .command("ip")
            .args(args.split_whitespace())
            .status()
            .unwrap()
            .success();
        assert!(ok, "ip {args}");
    }

    /// True when one ping to `addr` from this namespace is answered.
    pub fn ping(&self, addr: &str) -> bool {
        self.command("ping")
            .args(["-c", "1", "-W", "2", addr])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    }
}

impl Drop for TestNs {
    fn drop(&mut self) {
        let problem = nft::ruleset_problem(&self.path);
        let _ = Netns::delete_path(&self.path);
        if let Some(p) = problem {
            panic!("{p}");
        }
    }
}

/// The plugin binary the tests run: the static one that ships when CORVID_STATIC_PLUGINS
/// names it (scripts/test.sh does), else the one cargo built for these tests.
pub fn plugin_binary() -> PathBuf {
    std::env::var_os("CORVID_STATIC_PLUGINS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_corvid-plugins")))
}

/// A directory holding the plugins under their names (links to [`plugin_binary`]).
pub struct PluginDir {
    pub dir: tempfile::TempDir,
}

impl PluginDir {
    pub fn new() -> PluginDir {
        let dir = tempfile::tempdir().unwrap();
        let binary = plugin_binary();
        for name in corvid_plugins::PLUGIN_NAMES {
            std::os::unix::fs::symlink(&binary, dir.path().join(name)).unwrap();
        }
        PluginDir { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn plugin(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// corvid's plugin `name`, or the reference's: its path and the CNI_PATH to run it
    /// with.
    pub fn pick(&self, name: &str, reference: bool) -> (PathBuf, String) {
        if reference {
            (
                PathBuf::from(REFERENCE_DIR).join(name),
                REFERENCE_DIR.into(),
            )
        } else {
            (self.plugin(name), self.path().display().to_string())
        }
    }
}

/// The reference plugins' directory, from Debian's containernetworking-plugins.
pub const REFERENCE_DIR: &str = "/usr/lib/cni";

/// One plugin invocation.
pub struct Call<'a> {
    pub host: &'a TestNs,
    pub plugin: PathBuf,
    pub env: Vec<(String, String)>,
    pub stdin: String,
}

/// What a plugin answered.
#[derive(Debug)]
pub struct Outcome {
    pub success: bool,
    pub stdout: String,
    pub json: Value,
}

impl Outcome {
    pub fn code(&self) -> u64 {
        self.json["code"].as_u64().unwrap_or(0)
    }
}

impl<'a> Call<'a> {
    /// A call with CNI_COMMAND, container ID, netns, ifname and CNI_PATH set.
    pub fn new(
        host: &'a TestNs,
        plugin: PathBuf,
        command: &str,
        id: &str,
        netns: &str,
        cni_path: &str,
        stdin: &str,
    ) -> Call<'a> {
        Call {
            host,
            plugin,
            env: vec![
                ("CNI_COMMAND".into(), command.into()),
                ("CNI_CONTAINERID".into(), id.into()),
                ("CNI_NETNS".into(), netns.into()),
                ("CNI_IFNAME".into(), "eth0".into()),
                ("CNI_PATH".into(), cni_path.into()),
            ],
            stdin: stdin.into(),
        }
    }

    pub fn set(mut self, key: &str, value: &str) -> Self {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.into(), value.into()));
        self
    }

    pub fn unset(mut self, key: &str) -> Self {
        self.env.retain(|(k, _)| k != key);
        self
    }

    pub fn spawn(&self) -> Child {
        use std::io::Write;
        let mut cmd = self.host.command(&self.plugin);
        cmd.env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn plugin");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(self.stdin.as_bytes())
            .unwrap();
        child
    }

    pub fn run(&self) -> Outcome {
        let out = self.spawn().wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "plugin panicked: {stderr}");
        assert!(
            !stderr.contains("RUST_BACKTRACE"),
            "plugin printed a backtrace: {stderr}"
        );
        Outcome {
            success: out.status.success(),
            json: serde_json::from_str(stdout.trim()).unwrap_or(Value::Null),
            stdout,
        }
    }

    pub fn ok(&self) -> Value {
        let o = self.run();
        assert!(
            o.success,
            "{} {:?} failed: {}",
            self.plugin.display(),
            self.env,
            o.stdout
        );
        o.json
    }
}

/// The lease files (addresses) in a host-local data directory.
pub fn leases(data_dir: &Path, network: &str) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(data_dir.join(network))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// "10.1.0.5" of "10.1.0.5/24".
pub fn address_part(cidr: &Value) -> String {
    cidr.as_str()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_string()
}

/// The address part of the first IP of family `v4` in a result.
pub fn result_ip(result: &Value, v4: bool) -> String {
    result["ips"]
        .as_array()
        .unwrap()
        .iter()
        .map(|ip| address_part(&ip["address"]))
        .find(|a| a.contains('.') == v4)
        .unwrap()
}

/// A bridge + host-local configuration.
pub fn bridge_conf(
    version: &str,
    network: &str,
    bridge: &str,
    subnet: &str,
    data_dir: &Path,
    extra: &str,
) -> String {
    format!(
        r#"{{"cniVersion":"{version}","name":"{network}","type":"bridge","bridge":"{bridge}",
            "isGateway":true,"ipMasq":true{extra},
            "ipam":{{"type":"host-local","subnet":"{subnet}","dataDir":"{}"}}}}"#,
        data_dir.display()
    )
}

/// A host namespace with an uplink to an "outside" namespace: host 10.251.0.1/24 and
/// fd51::1/64, outside .2 and ::2, and no route back from the outside to containers.
pub fn uplink() -> (TestNs, TestNs) {
    let (host, outside) = (TestNs::new(), TestNs::new());
    let ip = |ns: &TestNs, args: &str| {
        let status = ns
            .command("ip")
            .args(args.split_whitespace())
            .status()
            .unwrap();
        assert!(status.success(), "ip {args}");
    };
    ip(
        &host,
        &format!(
            "link add cvtup type veth peer name cvtout netns {}",
            outside.name
        ),
    );
    for (ns, dev, v4, v6) in [
        (&host, "cvtup", "10.251.0.1/24", "fd51::1/64"),
        (&outside, "cvtout", "10.251.0.2/24", "fd51::2/64"),
    ] {
        ip(ns, &format!("addr add {v4} dev {dev}"));
        ip(ns, &format!("addr add {v6} dev {dev} nodad"));
        ip(ns, &format!("link set {dev} up"));
    }
    // The host reaches its own published ports on 127.0.0.1.
    ip(&host, "link set lo up");
    (host, outside)
}

/// A TCP or UDP server in a namespace that answers every client with the address it
/// saw the client come from; stopped on drop.
pub struct EchoServer(Child);

impl EchoServer {
    /// Listens on `port` of every address of `ns`, IPv4 and IPv6.
    pub fn start(ns: &TestNs, port: u16, udp: bool) -> EchoServer {
        let kind = if udp { "SOCK_DGRAM" } else { "SOCK_STREAM" };
        let script = format!(
            "import socket\n\
             s = socket.socket(socket.AF_INET6, socket.{kind})\n\
             s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)\n\
             s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
             s.bind(('::', {port}))\n\
             udp = {udp}\n\
             if not udp: s.listen(16)\n\
             print('ready', flush=True)\n\
             while True:\n\
             \x20   if udp:\n\
             \x20       d, a = s.recvfrom(100); s.sendto(a[0].replace('::ffff:', '').encode(), a)\n\
             \x20   else:\n\
             \x20       c, a = s.accept(); c.sendall(a[0].replace('::ffff:', '').encode()); c.close()\n",
            udp = if udp { "True" } else { "False" }
        );
        let mut child = ns
            .command("python3")
            .args(["-c", &script])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
            &mut line,
        )
        .unwrap();
        assert_eq!(line.trim(), "ready");
        EchoServer(child)
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Asks an [`EchoServer`] at addr:port from `ns`: the address the server saw, or None
/// when nothing answered within two seconds.
pub fn echo(ns: &TestNs, addr: &str, port: u16, udp: bool) -> Option<String> {
    let family = if addr.contains(':') {
        "AF_INET6"
    } else {
        "AF_INET"
    };
    let script = if udp {
        format!(
            "import socket\ns = socket.socket(socket.{family}, socket.SOCK_DGRAM); s.settimeout(2)\n\
             s.sendto(b'x', ('{addr}', {port})); print(s.recvfrom(100)[0].decode())"
        )
    } else {
        format!(
            "import socket\ns = socket.socket(socket.{family}); s.settimeout(2)\n\
             s.connect(('{addr}', {port})); print(s.recv(100).decode())"
        )
    };
    let out = ns
        .command("python3")
        .args(["-c", &script])
        .output()
        .unwrap();
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// A host namespace behind an [`uplink`], corvid's plugins and a lease directory: what
/// the masquerade and portmap tests run in.
pub struct Site {
    pub host: TestNs,
    pub outside: TestNs,
    pub plugins: PluginDir,
    pub data: tempfile::TempDir,
}

impl Site {
    pub fn new() -> Site {
        let (host, outside) = uplink();
        Site {
            host,
            outside,
            plugins: PluginDir::new(),
            data: tempfile::tempdir().unwrap(),
        }
    }

    /// Runs `plugin` (a path) in the host namespace with `cni_path` as CNI_PATH.
    pub fn call_with<'a>(
        &'a self,
        plugin: PathBuf,
        cni_path: &str,
        command: &str,
        id: &str,
        netns: &str,
        conf: &str,
    ) -> Call<'a> {
        Call::new(&self.host, plugin, command, id, netns, cni_path, conf)
            .set("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
    }

    /// corvid's plugin `name`, or the reference's: its path and the CNI_PATH to run it
    /// with.
    pub fn plugin(&self, name: &str, reference: bool) -> (PathBuf, String) {
        self.plugins.pick(name, reference)
    }

    /// Runs corvid's plugin `name`.
    pub fn ours<'a>(
        &'a self,
        name: &str,
        command: &str,
        id: &str,
        netns: &str,
        conf: &str,
    ) -> Call<'a> {
        let dir = self.plugins.path().display().to_string();
        self.call_with(self.plugins.plugin(name), &dir, command, id, netns, conf)
    }
}

/// host-local ranges of one address each, `(subnet, address)` per family: every container
/// on them gets the same addresses, the next one once the last let them go.
pub fn single_address_ranges(ranges: &[(&str, &str)]) -> Value {
    ranges
        .iter()
        .map(|(subnet, a)| json!([{"subnet": subnet, "rangeStart": a, "rangeEnd": a}]))
        .collect()
}

/// `conf` with `prev` as its prevResult, or with none.
pub fn with_prev_result(conf: &str, prev: Option<&Value>) -> String {
    let mut conf: Value = serde_json::from_str(conf).unwrap();
    match prev {
        Some(p) => conf["prevResult"] = p.clone(),
        None => {
            conf.as_object_mut().unwrap().remove("prevResult");
        }
    }
    conf.to_string()
}

/// A stale DEL, as runtimes send them: container `a` added and deleted, `b` added in its
/// place with `a`'s addresses (which the caller's configuration gives out again), then
/// `a`'s DEL sent again after its namespace went: with `a`'s cached result as prevResult,
/// as a runtime retrying it does, and without. `del` gets the container ID, the netns
/// path and the prevResult. Returns `b` and its result, for the caller to check that
/// nothing of `b` went.
pub fn repeat_a_stale_del(
    add: impl Fn(&str, &TestNs) -> Value,
    del: impl Fn(&str, &str, Option<&Value>),
) -> (TestNs, Value) {
    let a = TestNs::new();
    let ra = add("a", &a);
    del("a", &a.path_str(), Some(&ra));
    let gone = a.path_str();
    drop(a);
    let b = TestNs::new();
    let rb = add("b", &b);
    assert_eq!(rb["ips"], ra["ips"], "b got a's addresses");
    del("a", &gone, Some(&ra));
    del("a", &gone, None);
    (b, rb)
}

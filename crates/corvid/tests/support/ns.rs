//! Test support: namespaces and processes that clean up after themselves.
#![allow(dead_code)]

#[path = "../../../corvid-net/tests/support/nft.rs"]
pub mod nft;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use corvid_net::{Netlink, Netns};

/// A namespace `cvt<pid>-<name>`, deleted on drop.
const BRIDGE_NF_CALL: [&str; 2] = [
    "net/bridge/bridge-nf-call-iptables",
    "net/bridge/bridge-nf-call-ip6tables",
];

pub struct Ns {
    pub path: PathBuf,
}

impl Ns {
    pub fn new(tag: &str, name: &str) -> Ns {
        Ns {
            path: Netns::create_named(&format!("{tag}-{name}")).expect("create namespace"),
        }
    }

    pub fn name(&self) -> String {
        self.path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned()
    }

    pub fn open(&self) -> Netns {
        Netns::open(&self.path).unwrap()
    }

    /// The namespace's `bridge-nf-call-iptables` and `-ip6tables`.
    pub fn bridge_nf_call(&self) -> [String; 2] {
        self.open()
            .run(|| BRIDGE_NF_CALL.map(|k| corvid_net::sysctl::get(k).unwrap().trim().to_string()))
            .unwrap()
    }

    /// Sets both of the namespace's `bridge-nf-call-*` settings to `value`.
    pub fn set_bridge_nf_call(&self, value: &str) {
        self.open()
            .run(|| BRIDGE_NF_CALL.map(|k| corvid_net::sysctl::set(k, value).unwrap()))
            .unwrap();
    }

    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new(program);
        self.open().apply_to(&mut cmd).unwrap();
        cmd
    }

    pub fn ip(&self, args: &str) {
        let out = Command::new("ip")
            .arg("-n")
            .arg(self.name())
            .args(args.split_whitespace())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ip -n {} {args}: {out:?}",
            self.name()
        );
    }

    pub fn ping(&self, addr: &str) -> bool {
        self.command("ping")
            .args(["-c", "1", "-W", "2", addr])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success()
    }

    /// A ping sent from the namespace's address `source`.
    pub fn ping_from(&self, source: &str, addr: &str) -> bool {
        self.command("ping")
            .args(["-c", "1", "-W", "2", "-I", source, addr])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success()
    }

    /// The MAC the namespace has for `ip` (either family) in its neighbour table, if any.
    pub fn neighbour_mac(&self, ip: &str) -> Option<String> {
        let out = self
            .command("ip")
            .args(["neigh", "show", ip])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let words: Vec<&str> = text.split_whitespace().collect();
        let at = words.iter().position(|w| *w == "lladdr")?;
        words.get(at + 1).map(|m| m.to_string())
    }

    pub fn netlink(&self) -> Netlink {
        Netlink::open_in(&self.open()).unwrap()
    }

    /// Answers every TCP connection and UDP datagram on `port` with `name`, until
    /// dropped.
    pub fn serve_name(&self, name: &str, port: u16) -> Proc {
        serve_name_with(self.command("python3"), name, port)
    }

    /// `n` TCP connections (or UDP exchanges) to addr:port, one after the other: what
    /// each answered, or `refused`, `timeout`, `error`.
    pub fn connect(&self, addr: &str, port: u16, n: usize, udp: bool) -> Vec<String> {
        self.connect_with(addr, port, n, if udp { &["udp"] } else { &[] })
    }

    /// `n` UDP exchanges with addr:port, all from local port `sport` (one flow): what
    /// each answered, or `refused`, `timeout`, `error`.
    pub fn udp_flow(&self, addr: &str, port: u16, n: usize, sport: u16) -> Vec<String> {
        self.connect_with(addr, port, n, &["udp", &sport.to_string()])
    }

    fn connect_with(&self, addr: &str, port: u16, n: usize, extra: &[&str]) -> Vec<String> {
        let mut cmd = self.command("python3");
        cmd.arg(testing_script("connect.py"))
            .args([addr, &port.to_string(), &n.to_string()])
            .args(extra);
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout)
            .unwrap()
            .split_whitespace()
            .map(str::to_string)
            .collect()
    }

    /// The namespace's links, addresses, FDB and neighbours, as `ip` and `bridge` print
    /// them: for a failed assertion to say what the datapath held.
    pub fn overlay_state(&self) -> String {
        let name = self.name();
        let mut out = format!("--- {name}\n");
        for (tool, args) in [
            ("ip", "-br link"),
            ("ip", "-br addr"),
            ("ip", "neigh show"),
            ("bridge", "fdb show"),
        ] {
            let o = Command::new(tool)
                .arg("-n")
                .arg(&name)
                .args(args.split_whitespace())
                .output()
                .unwrap();
            out += &format!("$ {tool} {args}\n{}", String::from_utf8_lossy(&o.stdout));
        }
        out
    }

    /// A Python `script` run in the namespace, once it printed `ready`: the process and
    /// what it prints next.
    pub fn python_ready(&self, script: &str) -> (Proc, BufReader<ChildStdout>) {
        let mut child = self
            .command("python3")
            .args(["-c", script])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready");
        (Proc(child), out)
    }

    /// One TCP connection to addr:port held open (`scripts/testing/hold.py`): what it
    /// answered first, and the connection, which echoes each line [`Held::echo`] sends.
    pub fn hold(&self, addr: &str, port: u16) -> (String, Held) {
        let mut child = self
            .command("python3")
            .arg(testing_script("hold.py"))
            .args([addr, &port.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut first = String::new();
        out.read_line(&mut first).unwrap();
        (
            first.trim().to_string(),
            Held {
                proc: Proc(child),
                out,
            },
        )
    }

    /// An iperf3 server, until dropped.
    pub fn serve_iperf(&self) -> Proc {
        let iperf = self
            .command("iperf3")
            .args(["-s"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        Proc(iperf)
    }

    /// iperf3 to `to` for two seconds (an iperf3 server listening there): received
    /// Gbit/s.
    pub fn iperf(&self, to: &str) -> f64 {
        let out = self
            .command("iperf3")
            .args(["-c", to, "-t", "2", "-J"])
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["end"]["sum_received"]["bits_per_second"]
            .as_f64()
            .unwrap_or_else(|| panic!("iperf3 to {to}: {v}"))
            / 1e9
    }

    /// TCP connections per second to `to`:8080 ([`Ns::serve_name`] there), 200 one
    /// after the other.
    pub fn connection_rate(&self, to: &str) -> f64 {
        let start = Instant::now();
        let answers = self.connect(to, 8080, 200, false);
        assert!(answers.iter().all(|a| a != "timeout"), "{answers:?}");
        200.0 / start.elapsed().as_secs_f64()
    }

    /// Names of the links in the namespace that start with `prefix`.
    pub fn links(&self, prefix: &str) -> Vec<String> {
        self.netlink()
            .links()
            .unwrap()
            .into_iter()
            .map(|l| l.name)
            .filter(|n| n.starts_with(prefix))
            .collect()
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        let problem = nft::ruleset_problem(&self.path);
        let _ = Netns::delete_path(&self.path);
        if let Some(p) = problem {
            panic!("{p}");
        }
    }
}

/// The median of `v` (the upper one of an even count).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A TCP connection [`Ns::hold`] keeps open, closed when dropped.
pub struct Held {
    proc: Proc,
    out: BufReader<ChildStdout>,
}

impl Held {
    /// Sends `line` on the connection: what came back.
    pub fn echo(&mut self, line: &str) -> String {
        use std::io::Write;
        writeln!(self.proc.0.stdin.as_mut().unwrap(), "{line}").unwrap();
        let mut back = String::new();
        self.out.read_line(&mut back).unwrap();
        back.trim().to_string()
    }
}

/// `scripts/testing/serve_name.py` run by `python3` (a command already placed in its
/// namespace), once it says it listens.
pub fn serve_name_with(mut python3: Command, name: &str, port: u16) -> Proc {
    let mut child = python3
        .arg(testing_script("serve_name.py"))
        .args([name, &port.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    use std::io::BufRead;
    std::io::BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    Proc(child)
}

/// A helper script of the workspace's `scripts/testing`.
pub fn testing_script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scripts/testing")
        .join(name)
}

/// A child process killed on drop.
pub struct Proc(pub Child);

impl Proc {
    pub fn kill9(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Spawns `cmd` with `input` written to its stdin (which must be piped).
pub fn spawn_with_input(cmd: &mut Command, input: &str) -> Child {
    use std::io::Write;
    let mut child = cmd.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child
}

pub fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

//! Processes the controller tests start, each stopped by PID when dropped: a real etcd
//! (Debian's etcd-server) with its own data dir, and `corvid controller`.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::{IpAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use corvid_api::{Client, Port};
use corvid_controller::keys::{self, Parsed};

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// The sum of the series of metric `name` in a Prometheus scrape whose labels include
/// `labels`.
pub fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, rest) = series.split_once('{').unwrap_or((series, ""));
            let wanted = n == name
                && labels
                    .iter()
                    .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")));
            wanted.then(|| value.parse::<f64>().ok()).flatten()
        })
        .sum()
}

fn wait_until(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ready() {
        assert!(Instant::now() < deadline, "{what} did not come up");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An etcd server on loopback with a private data dir.
pub struct Etcd {
    child: Child,
    _dir: tempfile::TempDir,
    /// Its client URL.
    pub url: String,
}

impl Etcd {
    /// The etcd process's ID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Starts etcd and waits until it answers.
    pub fn start() -> Etcd {
        Etcd::start_with(&[])
    }

    /// Starts etcd with extra arguments (e.g. `--max-txn-ops 24`) and waits until it
    /// answers.
    pub fn start_with(extra: &[&str]) -> Etcd {
        let dir = tempfile::Builder::new()
            .prefix("cvt-etcd")
            .tempdir()
            .expect("tempdir");
        let (client, peer) = (free_port(), free_port());
        let url = format!("http://127.0.0.1:{client}");
        let child = Command::new("etcd")
            .arg("--data-dir")
            .arg(dir.path())
            .args([
                "--name",
                "cvt",
                "--listen-client-urls",
                &url,
                "--advertise-client-urls",
                &url,
            ])
            .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
            .args([
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{peer}"),
            ])
            .args(["--initial-cluster", &format!("cvt=http://127.0.0.1:{peer}")])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcd (Debian's etcd-server) is installed");
        let health = format!("{url}/health");
        wait_until("etcd", || ureq::get(&health).call().is_ok());
        Etcd {
            child,
            _dir: dir,
            url,
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A cluster of etcd members on loopback, each with its own data directory; members can
/// be killed, restarted, stopped and continued by the test.
pub struct EtcdCluster {
    members: Vec<Option<Child>>,
    clients: Vec<u16>,
    peers: Vec<u16>,
    dir: tempfile::TempDir,
}

impl EtcdCluster {
    /// Starts `n` members and waits until the cluster answers.
    pub fn start(n: usize) -> EtcdCluster {
        let dir = tempfile::Builder::new()
            .prefix("cvt-etcd-cluster")
            .tempdir()
            .expect("tempdir");
        let mut cluster = EtcdCluster {
            members: (0..n).map(|_| None).collect(),
            clients: (0..n).map(|_| free_port()).collect(),
            peers: (0..n).map(|_| free_port()).collect(),
            dir,
        };
        for i in 0..n {
            cluster.restart(i);
        }
        let urls = cluster.urls();
        wait_until("the etcd cluster", || {
            urls.iter()
                .all(|u| ureq::get(&format!("{u}/health")).call().is_ok())
        });
        cluster
    }

    /// The client URLs of every member.
    pub fn urls(&self) -> Vec<String> {
        self.clients
            .iter()
            .map(|p| format!("http://127.0.0.1:{p}"))
            .collect()
    }

    /// `etcd:` and every client URL, for `--store`.
    pub fn store(&self) -> String {
        format!("etcd:{}", self.urls().join(","))
    }

    /// Starts member `i` (again), on its data directory.
    pub fn restart(&mut self, i: usize) {
        self.kill9(i);
        let cluster: Vec<String> = self
            .peers
            .iter()
            .enumerate()
            .map(|(k, p)| format!("m{k}=http://127.0.0.1:{p}"))
            .collect();
        let client = format!("http://127.0.0.1:{}", self.clients[i]);
        let peer = format!("http://127.0.0.1:{}", self.peers[i]);
        let child = Command::new("etcd")
            .args(["--name", &format!("m{i}")])
            .arg("--data-dir")
            .arg(self.dir.path().join(format!("m{i}")))
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &cluster.join(",")])
            .args([
                "--initial-cluster-token",
                "cvt",
                "--initial-cluster-state",
                "new",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcd (Debian's etcd-server) is installed");
        self.members[i] = Some(child);
    }

    /// SIGKILL member `i`.
    pub fn kill9(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGSTOP (`true`) or SIGCONT member `i`: cut off from everyone, then back.
    pub fn freeze(&self, i: usize, stop: bool) {
        if let Some(c) = &self.members[i] {
            let signal = if stop { "-STOP" } else { "-CONT" };
            let _ = Command::new("kill")
                .args([signal, &c.id().to_string()])
                .status();
        }
    }

    /// The index of the current leader, as the members that answer see it.
    pub fn leader(&self) -> Option<usize> {
        let mut ids = Vec::new();
        let mut leader = None;
        for url in self.urls() {
            let status: Option<serde_json::Value> =
                ureq::post(&format!("{url}/v3/maintenance/status"))
                    .timeout(Duration::from_secs(2))
                    .send_string("{}")
                    .ok()
                    .and_then(|r| r.into_json().ok());
            let status = status.unwrap_or_default();
            ids.push(status["header"]["member_id"].as_str().map(str::to_string));
            leader = status["leader"].as_str().map(str::to_string).or(leader);
        }
        ids.iter().position(|id| id.is_some() && *id == leader)
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.freeze(i, false);
            self.kill9(i);
        }
    }
}

/// A running `corvid controller`.
pub struct ControllerProcess {
    child: Child,
    /// Its base URL.
    pub url: String,
    store: String,
    token: Option<String>,
    /// Where its log goes.
    log: tempfile::NamedTempFile,
}

impl ControllerProcess {
    /// Starts a controller on `store` and waits until it answers.
    pub fn start(store: &str, token: Option<&str>) -> ControllerProcess {
        let started = ControllerProcess::spawn(store, token);
        let probe = format!("{}/", started.url);
        wait_until("the controller", || match ureq::get(&probe).call() {
            Ok(_) => true,
            Err(ureq::Error::Status(..)) => true,
            Err(_) => false,
        });
        started
    }

    /// Starts a controller on `store` without waiting for it. It is killed when dropped,
    /// so one that never answers is not left running when the test's wait unwinds.
    pub fn spawn(store: &str, token: Option<&str>) -> ControllerProcess {
        let port = free_port();
        let url = format!("http://127.0.0.1:{port}");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_corvid"));
        cmd.args([
            "controller",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--store",
            store,
        ])
        .stdout(Stdio::null());
        let log = tempfile::Builder::new()
            .prefix("cvt-controller-log")
            .tempfile()
            .expect("a log file");
        cmd.stderr(log.reopen().expect("the log file"));
        if let Some(t) = token {
            cmd.args(["--token", t]);
        }
        ControllerProcess {
            child: cmd.spawn().expect("corvid controller starts"),
            url,
            store: store.to_string(),
            token: token.map(str::to_string),
            log,
        }
    }

    /// What it has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    /// Whether the process has ended.
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// A client of this controller.
    pub fn client(&self) -> Client {
        let c = Client::new(&self.url);
        match &self.token {
            Some(t) => c.with_token(t),
            None => c,
        }
    }

    /// The controller's process ID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, as a crash would.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts a new controller process on the same store.
    pub fn restart(&mut self) {
        self.kill9();
        let token = self.token.clone();
        *self = ControllerProcess::start(&self.store.clone(), token.as_deref());
    }
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A redb store path in a fresh temp dir (the dir lives as long as the returned guard).
pub fn redb_store() -> (tempfile::TempDir, String) {
    let dir = tempfile::Builder::new()
        .prefix("cvt-redb")
        .tempdir()
        .expect("tempdir");
    let spec = format!(
        "redb:{}",
        PathBuf::from(dir.path()).join("state.redb").display()
    );
    (dir, spec)
}

/// A number from the environment (a benchmark's setting), or `default`.
pub fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A process's resident memory, in MiB.
pub fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// CPU time (user + system) a process has used so far.
pub fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i).and_then(|v| v.parse::<u64>().ok()))
        .sum();
    // SAFETY: sysconf only reads a configuration value.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_micros(ticks * 1_000_000 / hz)
}

/// What a store holds, read from its keys rather than through a controller's API: the
/// ports, and every MAC and address reserved with the ID of its holder. The API shows
/// only objects, so a reservation left without its port is seen only here.
pub struct Stored {
    /// Every key under corvid's prefix.
    pub keys: Vec<String>,
    pub ports: Vec<Port>,
    /// MAC to holder.
    pub macs: BTreeMap<String, String>,
    /// (subnet, address) to holder.
    pub ips: BTreeMap<(String, IpAddr), String>,
}

impl Stored {
    /// Reads the store `spec` names (as `--store` takes it). redb lets one process open a
    /// store at a time: stop the controller of a redb store first.
    pub fn read(spec: &str) -> Stored {
        let store = corvid_controller::store::open(spec).expect("the store opens");
        let (kvs, _) = store.range(keys::ROOT).expect("the store reads");
        let mut s = Stored {
            keys: Vec::new(),
            ports: Vec::new(),
            macs: BTreeMap::new(),
            ips: BTreeMap::new(),
        };
        for kv in kvs {
            let holder = String::from_utf8_lossy(&kv.value).into_owned();
            match keys::parse(&kv.key) {
                Parsed::Resource("ports", _) => s
                    .ports
                    .push(serde_json::from_slice(&kv.value).expect("a stored port")),
                Parsed::Mac(mac) => {
                    s.macs.insert(mac.to_string(), holder);
                }
                Parsed::Ip(subnet, ip) => {
                    s.ips.insert((subnet.to_string(), ip), holder);
                }
                _ => {}
            }
            s.keys.push(kv.key);
        }
        s
    }

    /// What disagrees between the ports and the reservations: a MAC or address reserved
    /// for no port that has it, or a port whose MAC or address is not reserved for it.
    /// Empty when they agree.
    pub fn mismatches(&self) -> Vec<String> {
        let mut wrong = Vec::new();
        let mut macs = self.macs.clone();
        let mut ips = self.ips.clone();
        for p in &self.ports {
            match macs.remove(&p.mac_address) {
                Some(holder) if holder == p.id => {}
                other => wrong.push(format!(
                    "port {}'s MAC {} is reserved for {other:?}",
                    p.id, p.mac_address
                )),
            }
            for f in &p.fixed_ips {
                match ips.remove(&(f.subnet_id.clone(), f.ip_address)) {
                    Some(holder) if holder == p.id => {}
                    other => wrong.push(format!(
                        "port {}'s address {} is reserved for {other:?}",
                        p.id, f.ip_address
                    )),
                }
            }
        }
        wrong.extend(
            macs.iter()
                .map(|(mac, holder)| format!("MAC {mac} is reserved for {holder}, no port of it")),
        );
        wrong.extend(ips.iter().map(|((subnet, ip), holder)| {
            format!("address {ip} of subnet {subnet} is reserved for {holder}, no port of it")
        }));
        wrong
    }
}

//! The processes the harness starts and measures: `corvid controller` on a fixed
//! loopback port (a restart comes back where its hosts look for it), the etcd members'
//! CPU and space, and the machine's CPU.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// A `corvid controller` process, killed by its PID when dropped.
pub struct Ctl {
    child: Option<Child>,
    /// Its base URL.
    pub url: String,
    port: u16,
    store: String,
    log: PathBuf,
}

impl Ctl {
    /// Starts a controller on `store` listening on loopback `port`, its log in `log`.
    pub fn start(store: &str, port: u16, log: PathBuf) -> Ctl {
        let mut c = Ctl {
            child: None,
            url: format!("http://127.0.0.1:{port}"),
            port,
            store: store.to_string(),
            log,
        };
        c.spawn();
        c
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("the controller's log");
        // `CORVID_SCALE_BIN` runs another build (one with symbols, for `perf`).
        let bin = std::env::var("CORVID_SCALE_BIN")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_corvid").to_string());
        let child = Command::new(bin)
            .args(["controller", "--listen"])
            .arg(format!("127.0.0.1:{}", self.port))
            .args(["--store", &self.store])
            .env("CORVID_LOG_LEVEL", "warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("corvid controller starts");
        self.child = Some(child);
    }

    /// Waits until it answers; how long that took.
    pub fn wait_ready(&self, within: Duration) -> Duration {
        let start = Instant::now();
        let agent = ureq::AgentBuilder::new()
            .timeout(Duration::from_secs(2))
            .build();
        loop {
            match agent.get(&format!("{}/version", self.url)).call() {
                Ok(_) | Err(ureq::Error::Status(..)) => return start.elapsed(),
                Err(_) => {}
            }
            assert!(
                start.elapsed() < within,
                "the controller did not answer within {within:?} (log: {})",
                self.log.display()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Its process ID.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// SIGKILL, as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port and store.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// The long polls it holds now (`corvid_controller_watch_subscribers`).
    pub fn watchers(&self) -> Option<u64> {
        let text = ureq::get(&format!("{}/metrics", self.url))
            .timeout(Duration::from_secs(2))
            .call()
            .ok()?
            .into_string()
            .ok()?;
        text.lines()
            .find(|l| l.starts_with("corvid_controller_watch_subscribers "))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .map(|v| v as u64)
    }
}

impl Drop for Ctl {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The children of this process whose command is `comm` (the etcd members the support
/// code started).
pub fn children(comm: &str) -> Vec<u32> {
    let me = std::process::id().to_string();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let Some((head, rest)) = stat.rsplit_once(')') else {
                return false;
            };
            let name = head.split_once('(').map_or("", |(_, n)| n);
            name == comm && rest.split_whitespace().nth(1) == Some(me.as_str())
        })
        .collect()
}

/// The machine's busy and total CPU time so far, in clock ticks (`/proc/stat`).
pub fn machine_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let nums: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let total: u64 = nums.iter().take(8).sum();
    // idle and iowait
    let idle = nums.get(3).copied().unwrap_or(0) + nums.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

/// The machine's cores and CPU model.
pub fn cores() -> (usize, String) {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|m| m.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_default();
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    (n, model)
}

fn post(url: &str, path: &str, body: &Value, timeout: Duration) -> Result<Value, String> {
    ureq::post(&format!("{url}{path}"))
        .timeout(timeout)
        .send_json(body)
        .map_err(|e| e.to_string())?
        .into_json()
        .map_err(|e| e.to_string())
}

fn int(v: &Value) -> i64 {
    v.as_i64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
        .unwrap_or(0)
}

/// One member's space as etcd reports it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Space {
    /// The backend file's size, bytes.
    pub db_size: i64,
    /// Of it, what holds live data (the rest is free pages a defragment returns).
    pub in_use: i64,
    /// The store's revision.
    pub revision: i64,
}

/// Member `url`'s space.
pub fn space(url: &str) -> Space {
    let v = post(
        url,
        "/v3/maintenance/status",
        &json!({}),
        Duration::from_secs(10),
    )
    .unwrap_or_default();
    Space {
        db_size: int(&v["dbSize"]),
        in_use: int(&v["dbSizeInUse"]),
        revision: int(&v["header"]["revision"]),
    }
}

/// Compacts the history before `revision` (waiting for it to be applied physically).
pub fn compact(url: &str, revision: i64) -> Result<(), String> {
    post(
        url,
        "/v3/kv/compaction",
        &json!({"revision": revision, "physical": true}),
        Duration::from_secs(120),
    )
    .map(drop)
}

/// Defragments member `url`: its file shrinks to what is in use.
pub fn defragment(url: &str) -> Result<(), String> {
    post(
        url,
        "/v3/maintenance/defragment",
        &json!({}),
        Duration::from_secs(300),
    )
    .map(drop)
}

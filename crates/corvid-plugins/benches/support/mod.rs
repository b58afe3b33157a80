//! What the CNI benches share: namespaces that remove themselves, the two plugin
//! directories side by side, one timed plugin run, and the samples of a phase.
#![allow(dead_code)]

use corvid_net::Netns;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The number of containers a bench runs: CORVID_BENCH_N, 64 by default.
pub fn containers() -> usize {
    std::env::var("CORVID_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

/// A named namespace, deleted on drop.
pub struct Ns(pub PathBuf);

impl Ns {
    /// Creates /run/netns/NAME; with CORVID_BENCH_IPV6=0, without IPv6.
    ///
    /// Every interface that comes up with IPv6 sends duplicate address detection and
    /// MLD reports, which a bridge floods to all its ports: kernel work that grows with
    /// the ports on the bridge and lands on whatever runs next. Turning IPv6 off shows
    /// what an ADD costs without that flood.
    pub fn new(name: String) -> Ns {
        let ns = Ns(Netns::create_named(&name).expect("create namespace (run as root)"));
        if std::env::var("CORVID_BENCH_IPV6").is_ok_and(|v| v == "0") {
            Netns::open(&ns.0)
                .unwrap()
                .run(|| {
                    for scope in ["all", "default"] {
                        let key = format!("net/ipv6/conf/{scope}/disable_ipv6");
                        corvid_net::sysctl::set(&key, "1").unwrap();
                    }
                })
                .unwrap();
        }
        ns
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Netns::delete_path(&self.0);
    }
}

/// One implementation of the plugins: a directory holding them under their names.
pub struct Impl {
    /// "corvid" or "reference".
    pub label: &'static str,
    /// The plugin directory, also CNI_PATH.
    pub cni_path: PathBuf,
}

/// The corvid plugin binary benched: the one that ships, static with musl
/// (scripts/build-static-plugins.sh --release), or the one CORVID_STATIC_PLUGINS names. The
/// binary `cargo bench` builds for this package links glibc dynamically and takes three
/// times as long to start; the figures are for what a host runs.
pub fn corvid_binary() -> PathBuf {
    let binary = match std::env::var_os("CORVID_STATIC_PLUGINS") {
        Some(path) => PathBuf::from(path),
        None => {
            let script =
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/build-static-plugins.sh");
            eprintln!("building the static plugin binary ({})", script.display());
            let out = Command::new(&script)
                .arg("--release")
                .stderr(Stdio::inherit())
                .output()
                .expect("run scripts/build-static-plugins.sh");
            assert!(out.status.success(), "{} failed", script.display());
            PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
        }
    };
    println!("corvid: {}", binary.display());
    binary
}

impl Impl {
    /// corvid's multi-call binary ([`corvid_binary`]) linked under every plugin name in
    /// `dir`, and Debian's reference plugins.
    pub fn both(dir: &Path) -> [Impl; 2] {
        let binary = corvid_binary();
        let reference = Path::new("/usr/lib/cni");
        assert!(
            reference.join("bridge").exists(),
            "install Debian's containernetworking-plugins"
        );
        for name in corvid_plugins::PLUGIN_NAMES {
            std::os::unix::fs::symlink(&binary, dir.join(name)).unwrap();
        }
        [
            Impl {
                label: "corvid",
                cni_path: dir.to_path_buf(),
            },
            Impl {
                label: "reference",
                cni_path: reference.to_path_buf(),
            },
        ]
    }
}

/// One run of `imp`'s plugin `plugin`: wall time, the peak RSS of the plugin and its
/// IPAM child in KiB, and what it printed.
pub fn invoke(
    host: &Netns,
    imp: &Impl,
    plugin: &str,
    cmd: &str,
    id: &str,
    netns: &Path,
    conf: &str,
) -> (Duration, i64, String) {
    let mut command = Command::new(imp.cni_path.join(plugin));
    command
        .env_clear()
        .env("CNI_COMMAND", cmd)
        .env("CNI_CONTAINERID", id)
        .env("CNI_NETNS", netns)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", &imp.cni_path)
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    host.apply_to(&mut command).unwrap();
    let start = Instant::now();
    // Reaped by wait4 below: std's wait cannot report the child's rusage.
    #[allow(clippy::zombie_processes)]
    let mut child = command.spawn().expect("spawn plugin");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(conf.as_bytes())
        .unwrap();
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let mut status = 0;
    // SAFETY: rusage is plain data; wait4 reaps exactly our child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    let took = start.elapsed();
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{} {cmd} {id} failed: {out}",
        imp.label
    );
    (took, usage.ru_maxrss, out)
}

/// The samples of one operation, in the order taken.
#[derive(Default)]
pub struct Phase {
    /// Each operation's wall time.
    pub samples: Vec<Duration>,
    /// The wall time of them all.
    pub wall: Duration,
    /// The largest peak RSS seen.
    pub max_rss_kib: i64,
}

impl Phase {
    /// Adds another phase's samples after these.
    pub fn absorb(&mut self, other: Phase) {
        self.samples.extend(other.samples);
        self.wall += other.wall;
        self.max_rss_kib = self.max_rss_kib.max(other.max_rss_kib);
    }
    /// The `p` quantile in ms.
    pub fn pct(&self, p: f64) -> f64 {
        let mut s = self.samples.clone();
        s.sort();
        let i = ((s.len() as f64 - 1.0) * p).round() as usize;
        s[i].as_secs_f64() * 1e3
    }
    /// The median of `len` samples starting at `from`, in order taken.
    pub fn window_p50(&self, from: usize, len: usize) -> f64 {
        let mut s: Vec<Duration> = self.samples.iter().skip(from).take(len).copied().collect();
        s.sort();
        s[s.len() / 2].as_secs_f64() * 1e3
    }
    /// Operations per second.
    pub fn rate(&self) -> f64 {
        self.samples.len() as f64 / self.wall.as_secs_f64()
    }
}

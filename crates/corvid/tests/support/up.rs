//! `corvid up` in a private "host" namespace, as the README runs it, with its state,
//! configuration and plugin directories in a temporary directory, and `corvid cni`
//! run beside it.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::ns::{wait_until, Ns, Proc};
use super::plugins;

/// The directories of one `corvid up` stack; it runs while its [`Proc`] lives.
pub struct Up {
    pub state: tempfile::TempDir,
}

impl Up {
    pub fn new() -> Up {
        Up {
            state: tempfile::Builder::new().prefix("cvt-up").tempdir().unwrap(),
        }
    }

    pub fn conf(&self) -> PathBuf {
        self.state.path().join("net.d")
    }

    pub fn bin(&self) -> PathBuf {
        self.state.path().join("bin")
    }

    /// Starts `corvid up --host-id demo` with `extra` arguments in `host`, and waits
    /// for its CNI configuration; the plugins are installed the first time.
    pub fn start(&self, host: &Ns, extra: &[&str]) -> Proc {
        let up = Proc(
            host.command(env!("CARGO_BIN_EXE_corvid"))
                .args(["up", "--host-id", "demo", "--state-dir"])
                .arg(self.state.path().join("lib"))
                .arg("--conf-dir")
                .arg(self.conf())
                .args(extra)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let conflist = self.conf().join("corvid.conflist");
        wait_until("corvid up", Duration::from_secs(30), || conflist.exists());
        if !self.bin().exists() {
            let plugins = plugins::binary();
            let bin = self.bin();
            let out = self.cni(
                host,
                &[
                    "install",
                    "--dir",
                    bin.to_str().unwrap(),
                    "--from",
                    plugins.to_str().unwrap(),
                ],
            );
            assert!(out.status.success(), "install: {out:?}");
        }
        up
    }

    /// `corvid cni ARGS` in `host` against this stack's configuration.
    pub fn cni(&self, host: &Ns, args: &[&str]) -> Output {
        host.command(env!("CARGO_BIN_EXE_corvid"))
            .args(["cni", "--json", "--conf-dir"])
            .arg(self.conf())
            .arg("--cni-path")
            .arg(self.bin())
            .arg("--cache-dir")
            .arg(self.state.path().join("cache"))
            .args(args)
            .output()
            .unwrap()
    }

    /// ADD of `pod` to the `corvid` network: the IPv4 address it got, without its length.
    pub fn add(&self, host: &Ns, pod: &Ns) -> String {
        let result = self.add_result(host, pod);
        let addr = result["ips"][0]["address"].as_str().unwrap();
        addr.split('/').next().unwrap().to_string()
    }

    /// ADD of `pod` to the `corvid` network: its CNI result.
    pub fn add_result(&self, host: &Ns, pod: &Ns) -> Value {
        let out = self.cni(host, &["add", "corvid", pod.path.to_str().unwrap()]);
        assert!(out.status.success(), "ADD: {out:?}");
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// DEL of `pod` from the `corvid` network; it must succeed.
    pub fn del(&self, host: &Ns, pod: &Ns) {
        let out = self.cni(host, &["del", "corvid", pod.path.to_str().unwrap()]);
        assert!(out.status.success(), "DEL: {out:?}");
    }
}

/// Sends `signal` to `p` and waits for it to exit; panics after `timeout`.
pub fn stop(p: &mut Proc, signal: i32, timeout: Duration) {
    unsafe { libc::kill(p.0.id() as i32, signal) };
    let asked = Instant::now();
    while p.0.try_wait().unwrap().is_none() {
        assert!(
            asked.elapsed() < timeout,
            "still running {timeout:?} after signal {signal}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

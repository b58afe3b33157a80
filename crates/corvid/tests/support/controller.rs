//! Processes the controller tests start, each stopped by PID when dropped: a real etcd
//! (Debian's etcd-server) with its own data dir, and `corvid controller`.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use corvid_api::Client;

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
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
    /// Starts etcd and waits until it answers.
    pub fn start() -> Etcd {
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

/// A running `corvid controller`.
pub struct ControllerProcess {
    child: Child,
    /// Its base URL.
    pub url: String,
    store: String,
    token: Option<String>,
}

impl ControllerProcess {
    /// Starts a controller on `store` and waits until it answers.
    pub fn start(store: &str, token: Option<&str>) -> ControllerProcess {
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
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        if let Some(t) = token {
            cmd.args(["--token", t]);
        }
        let child = cmd.spawn().expect("corvid controller starts");
        let probe = format!("{url}/");
        wait_until("the controller", || match ureq::get(&probe).call() {
            Ok(_) => true,
            Err(ureq::Error::Status(..)) => true,
            Err(_) => false,
        });
        ControllerProcess {
            child,
            url,
            store: store.to_string(),
            token: token.map(str::to_string),
        }
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
    #[allow(dead_code)]
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, as a crash would.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts a new controller process on the same store.
    #[allow(dead_code)]
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

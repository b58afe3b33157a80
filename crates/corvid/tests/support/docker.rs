//! A real Docker daemon for tests and benchmarks: Debian's `dockerd` started inside a host
//! namespace of the test with its own data root, exec root, socket and config, so it never
//! sees the machine's Docker, and stopped (containers removed first) on drop. The image is
//! Debian's busybox-static imported as `cvt-busybox`; no registry is needed.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::ns::{wait_until, Ns, Proc};

/// The daemon Debian's docker.io installs; the CLI beside it speaks its API version.
const DOCKERD: &str = "/usr/sbin/dockerd";
const DOCKER: &str = "/usr/bin/docker";

/// The image every test container runs.
pub const IMAGE: &str = "cvt-busybox";

/// One driver call over its socket, as Docker sends it; returns the status and the JSON answer.
pub fn post(socket: &Path, method: &str, body: &str) -> (u16, Value) {
    try_post(socket, method, body).expect("the plugin answers")
}

/// `post`, or None when the connection fails or closes without an answer (the plugin
/// died mid-call).
pub fn try_post(socket: &Path, method: &str, body: &str) -> Option<(u16, Value)> {
    let mut s = UnixStream::connect(socket).ok()?;
    write!(
        s,
        "POST /{method} HTTP/1.1\r\nHost: plugin\r\nAccept: application/vnd.docker.plugins.v1.2+json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    let status = raw.get(9..12)?.parse().ok()?;
    let (head, body) = raw.split_once("\r\n\r\n")?;
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/vnd.docker.plugins.v1.2+json"),
        "{head}"
    );
    Some((status, serde_json::from_str(body).unwrap_or(Value::Null)))
}

/// One private dockerd, stopped on drop.
pub struct Dockerd {
    pub dir: tempfile::TempDir,
    proc: Option<Proc>,
}

impl Dockerd {
    /// Starts dockerd inside `ns` and imports the busybox image.
    pub fn start(ns: &Ns) -> Dockerd {
        assert!(
            Path::new(DOCKERD).exists(),
            "{DOCKERD} is missing: install docker.io (scripts/test.sh does)"
        );
        let dir = tempfile::Builder::new().prefix("cvtd").tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("daemon.json"), "{}").unwrap();
        let log = std::fs::File::create(root.join("dockerd.log")).unwrap();
        let child = ns
            .command(DOCKERD)
            .arg("--config-file")
            .arg(root.join("daemon.json"))
            .arg("--data-root")
            .arg(root.join("data"))
            .arg("--exec-root")
            .arg(root.join("exec"))
            .arg("--pidfile")
            .arg(root.join("dockerd.pid"))
            .arg("--host")
            .arg(format!("unix://{}", root.join("docker.sock").display()))
            .args(["--storage-driver", "overlay2", "--log-level", "warn"])
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut d = Dockerd {
            dir,
            proc: Some(Proc(child)),
        };
        let start = Instant::now();
        while !d.docker(&["version"]).status.success() {
            if start.elapsed() > Duration::from_secs(60)
                || d.proc.as_mut().unwrap().0.try_wait().unwrap().is_some()
            {
                panic!("dockerd did not start:\n{}", d.log());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        d.import_image();
        d
    }

    fn import_image(&self) {
        let rootfs = self.dir.path().join("rootfs");
        std::fs::create_dir_all(rootfs.join("bin")).unwrap();
        std::fs::copy("/usr/bin/busybox", rootfs.join("bin/busybox")).unwrap();
        for applet in ["sh", "ip", "ping", "sleep", "cat", "true"] {
            std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet)).unwrap();
        }
        let mut tar = Command::new("tar")
            .arg("-C")
            .arg(&rootfs)
            .args(["-c", "."])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = self
            .command(&["import", "-", IMAGE])
            .stdin(tar.stdout.take().unwrap())
            .output()
            .unwrap();
        assert!(tar.wait().unwrap().success(), "tar of the image rootfs");
        assert!(out.status.success(), "docker import: {out:?}");
    }

    /// The daemon's log, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("dockerd.log")).unwrap_or_default()
    }

    /// The Docker CLI pointed at this daemon, with a private client config.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(DOCKER);
        cmd.env("DOCKER_CONFIG", self.dir.path().join("cli"))
            .arg("--host")
            .arg(format!(
                "unix://{}",
                self.dir.path().join("docker.sock").display()
            ))
            .args(args);
        cmd
    }

    pub fn docker(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    /// Runs a Docker command that must succeed; returns its trimmed stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.docker(args);
        assert!(
            out.status.success(),
            "docker {}: {}\n{}\n--- dockerd's log ---\n{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout),
            self.log()
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// `docker network create` on `driver` (network and IPAM) with extra arguments;
    /// returns Docker's network ID.
    pub fn create_network(&self, driver: &str, name: &str, extra: &[&str]) -> String {
        let mut args = vec!["network", "create", "-d", driver, "--ipam-driver", driver];
        args.extend(extra);
        args.push(name);
        self.ok(&args)
    }

    /// A container's address on one network, as Docker reports it.
    pub fn ip(&self, container: &str, network: &str) -> String {
        let format = format!("{{{{(index .NetworkSettings.Networks \"{network}\").IPAddress}}}}");
        self.ok(&["inspect", "--format", &format, container])
    }

    /// Whether `container` gets an answer from `addr`.
    pub fn ping(&self, container: &str, addr: &str) -> bool {
        self.docker(&["exec", container, "ping", "-c", "1", "-W", "2", addr])
            .status
            .success()
    }

    /// Pings until an answer comes (a just-joined port needs the agent's FDB entries).
    pub fn ping_eventually(&self, container: &str, addr: &str) -> bool {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(15) {
            if self.ping(container, addr) {
                return true;
            }
        }
        false
    }

    fn stop(&mut self) {
        let ids = self.docker(&["ps", "-aq"]);
        let ids = String::from_utf8_lossy(&ids.stdout).to_string();
        let ids: Vec<&str> = ids.split_whitespace().collect();
        if !ids.is_empty() {
            let mut args = vec!["rm", "-f"];
            args.extend(ids);
            let _ = self.docker(&args);
        }
        let Some(mut p) = self.proc.take() else {
            return;
        };
        unsafe { libc::kill(p.0.id() as i32, libc::SIGTERM) };
        let start = Instant::now();
        while p.0.try_wait().unwrap().is_none() && start.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Dockerd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `corvid docker-plugin` in a host namespace, announced where Docker discovers it: the
/// driver's name is the socket's or spec file's, unique per test.
pub struct DockerPlugin {
    pub name: String,
    /// The unix socket, or the spec file of a TCP listener.
    pub socket: PathBuf,
    tcp: bool,
    proc: Option<Proc>,
}

impl DockerPlugin {
    /// The plugin on `/run/docker/plugins/<name>.sock`.
    pub fn start(ns: &Ns, name: &str, host_id: &str, controller: &str) -> DockerPlugin {
        Self::launch(ns, name, host_id, controller, false)
    }

    /// The plugin on a TCP port of the namespace's loopback, announced in
    /// `/etc/docker/plugins/<name>.spec`.
    pub fn start_tcp(ns: &Ns, name: &str, host_id: &str, controller: &str) -> DockerPlugin {
        Self::launch(ns, name, host_id, controller, true)
    }

    fn launch(ns: &Ns, name: &str, host_id: &str, controller: &str, tcp: bool) -> DockerPlugin {
        let socket = match tcp {
            true => PathBuf::from(format!("/etc/docker/plugins/{name}.spec")),
            false => PathBuf::from(format!("/run/docker/plugins/{name}.sock")),
        };
        let mut p = DockerPlugin {
            name: name.to_string(),
            socket,
            tcp,
            proc: None,
        };
        p.restart(ns, host_id, controller);
        p
    }

    /// Kills the plugin (if running) and starts it again.
    pub fn restart(&mut self, ns: &Ns, host_id: &str, controller: &str) {
        self.kill9();
        let mut cmd = ns.command(env!("CARGO_BIN_EXE_corvid"));
        cmd.args(["docker-plugin", "--host-id", host_id])
            .args(["--controller", controller]);
        match self.tcp {
            true => cmd.args(["--listen", "127.0.0.1:0", "--spec"]),
            false => cmd.arg("--socket"),
        };
        let child = cmd
            .arg(&self.socket)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        self.proc = Some(Proc(child));
        wait_until(
            "the plugin to listen",
            Duration::from_secs(20),
            || match self.tcp {
                true => self.socket.exists(),
                false => UnixStream::connect(&self.socket).is_ok(),
            },
        );
    }

    pub fn kill9(&mut self) {
        self.proc = None;
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl Drop for DockerPlugin {
    fn drop(&mut self) {
        self.kill9();
    }
}

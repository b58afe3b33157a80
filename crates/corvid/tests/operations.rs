//! Operating corvid: each daemon's /metrics moves with the work it does, /healthz and
//! /readyz answer as Kubernetes probes expect, the controller serves https and checks
//! client certificates, refuses an oversized body with 413, and no token reaches a log or
//! a command line. The Docker driver's socket is private (or its group's) and can come
//! from systemd. Runs as root; the agent's part runs in `cvt*` namespaces.

#[path = "support/controller.rs"]
mod support;

#[path = "support/cluster.rs"]
mod cluster;

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cluster::ns::{wait_until, Proc};
use cluster::Cluster;
use corvid_api::{Client, Credentials, Network, Port, Subnet, Tls};
use serde_json::json;
use support::{free_port, redb_store, sample, ControllerProcess, Etcd};

/// GET `url`: the status and the body, whatever the status.
fn get(url: &str) -> (u16, String) {
    match ureq::get(url).timeout(Duration::from_secs(10)).call() {
        Ok(r) => (r.status(), r.into_string().unwrap()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap()),
        Err(e) => panic!("GET {url}: {e}"),
    }
}

#[test]
fn controller_metrics_move_with_the_work_and_probes_answer() {
    let (_dir, store) = redb_store();
    let ctl = ControllerProcess::start(&store, Some("cvt-token"));
    assert_eq!(get(&format!("{}/healthz", ctl.url)), (200, "ok\n".into()));
    assert_eq!(get(&format!("{}/readyz", ctl.url)), (200, "ok\n".into()));
    // Probes and scrapers carry no token.
    let (status, version) = get(&format!("{}/version", ctl.url));
    assert_eq!(status, 200);
    let version: serde_json::Value = serde_json::from_str(&version).unwrap();
    assert_eq!(version["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(ctl.client().version().unwrap(), env!("CARGO_PKG_VERSION"));

    let scrape = || {
        let (status, text) = get(&format!("{}/metrics", ctl.url));
        assert_eq!(status, 200);
        text
    };
    let client = ctl.client();
    let net: Network = client.create(json!({"name": "cvt-metrics"})).unwrap();
    let subnet: Subnet = client
        .create(json!({"network_id": net.id, "cidr": "10.77.0.0/24", "ip_version": 4}))
        .unwrap();
    let before = scrape();
    let port: Port = client
        .create(json!({"network_id": net.id, "fixed_ips": [{"subnet_id": subnet.id}]}))
        .unwrap();
    let _: Port = client.get(&port.id).unwrap();
    let refused = Client::new(&ctl.url).with_token("wrong");
    assert_eq!(
        refused.get::<Port>(&port.id).unwrap_err().status(),
        Some(401)
    );
    let after = scrape();

    let created = [
        ("route", "/v2.0/ports"),
        ("method", "POST"),
        ("code", "201"),
    ];
    let name = "corvid_controller_requests_total";
    assert_eq!(
        sample(&after, name, &created) - sample(&before, name, &created),
        1.0,
        "{after}"
    );
    let shown = [("route", "/v2.0/ports/{id}"), ("method", "GET")];
    assert_eq!(
        sample(&after, name, &[shown[0], shown[1], ("code", "200")]),
        1.0
    );
    assert_eq!(
        sample(&after, name, &[shown[0], shown[1], ("code", "401")]),
        1.0
    );
    assert!(
        !after.contains(&port.id),
        "a port's ID made a series: {after}"
    );
    let ports = [("kind", "ports")];
    assert_eq!(
        sample(&after, "corvid_controller_objects", &ports)
            - sample(&before, "corvid_controller_objects", &ports),
        1.0
    );
    let commits = "corvid_controller_store_commit_duration_seconds_count";
    assert!(sample(&after, commits, &[]) > sample(&before, commits, &[]));
    assert!(
        sample(
            &after,
            "corvid_controller_store_commit_batch_size_count",
            &[]
        ) >= 3.0
    );
    let latency = "corvid_controller_request_duration_seconds_count";
    assert_eq!(
        sample(&after, latency, &[created[0], created[1]])
            - sample(&before, latency, &[created[0], created[1]]),
        1.0
    );
    assert!(sample(&after, "corvid_controller_view_revision", &[]) >= 3.0);
}

#[test]
fn controller_readyz_fails_while_its_store_is_gone() {
    let etcd = Etcd::start();
    let ctl = ControllerProcess::start(&format!("etcd:{}", etcd.url), None);
    let readyz = format!("{}/readyz", ctl.url);
    assert_eq!(get(&readyz).0, 200);
    drop(etcd);
    let deadline = Instant::now() + Duration::from_secs(20);
    let (status, body) = loop {
        let (status, body) = get(&readyz);
        if status != 200 || Instant::now() > deadline {
            break (status, body);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("not been confirmed current"), "{body}");
    // Alive all the same: a liveness probe must not restart it for its store's outage.
    assert_eq!(get(&format!("{}/healthz", ctl.url)).0, 200);
}

/// A CA and certificates it signs, written as PEM files.
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Pki {
        Pki {
            dir: tempfile::Builder::new()
                .prefix("cvt-pki")
                .tempdir()
                .unwrap(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A CA named `name` (`<name>.pem`), and a certificate it signs for each of
    /// `leaves` (`<leaf>.pem`, `<leaf>.key`), valid for 127.0.0.1.
    fn ca(&self, name: &str, leaves: &[&str]) {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
        let ca_key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("cvt {name}"));
        let ca = params.self_signed(&ca_key).unwrap();
        std::fs::write(self.path(&format!("{name}.pem")), ca.pem()).unwrap();
        let issuer = Issuer::new(params, ca_key);
        for leaf in leaves {
            let key = KeyPair::generate().unwrap();
            let mut p = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
            p.distinguished_name
                .push(rcgen::DnType::CommonName, leaf.to_string());
            let cert = p.signed_by(&key, &issuer).unwrap();
            std::fs::write(self.path(&format!("{leaf}.pem")), cert.pem()).unwrap();
            std::fs::write(self.path(&format!("{leaf}.key")), key.serialize_pem()).unwrap();
        }
    }

    fn tls(&self, ca: &str, client: Option<&str>) -> Tls {
        Tls {
            ca: Some(self.path(&format!("{ca}.pem"))),
            cert: client.map(|c| self.path(&format!("{c}.pem"))),
            key: client.map(|c| self.path(&format!("{c}.key"))),
        }
    }
}

/// A process whose stderr goes to a file, killed when dropped.
struct Logged {
    proc: Proc,
    log: PathBuf,
}

impl Logged {
    fn spawn(cmd: &mut Command, log: PathBuf) -> Logged {
        let file = std::fs::File::create(&log).unwrap();
        let child = cmd
            .stdout(Stdio::null())
            .stderr(file)
            .env_remove("RUST_LOG")
            .spawn()
            .unwrap();
        Logged {
            proc: Proc(child),
            log,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap()
    }

    fn cmdline(&self) -> String {
        std::fs::read_to_string(format!("/proc/{}/cmdline", self.proc.0.id())).unwrap()
    }
}

#[test]
fn tls_client_certificates_body_limit_and_tokens_kept_out_of_logs() {
    let pki = Pki::new();
    pki.ca("ca", &["server", "client"]);
    pki.ca("other", &["stranger"]);
    const TOKEN: &str = "cvt-s3cret-7f3a9c";
    std::fs::write(pki.path("token"), format!("{TOKEN}\n")).unwrap();
    let (_dir, store) = redb_store();
    let port = free_port();
    let url = format!("https://127.0.0.1:{port}");
    let controller = Logged::spawn(
        Command::new(env!("CARGO_BIN_EXE_corvid"))
            .args(["--log-level", "trace", "controller", "--store", &store])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .arg("--token-file")
            .arg(pki.path("token"))
            .arg("--tls-cert")
            .arg(pki.path("server.pem"))
            .arg("--tls-key")
            .arg(pki.path("server.key"))
            .arg("--tls-client-ca")
            .arg(pki.path("ca.pem"))
            .args(["--max-body", "65536"]),
        pki.path("controller.log"),
    );
    let client = |tls: Tls| {
        Credentials {
            token: Some(TOKEN.into()),
            tls,
        }
        .client(&url)
        .unwrap()
    };
    let good = client(pki.tls("ca", Some("client")));
    wait_until("the https controller", Duration::from_secs(20), || {
        good.version().is_ok()
    });
    let net: Network = good.create(json!({"name": "cvt-tls"})).unwrap();

    // The server's certificate does not chain to the CA this client trusts.
    let e = client(pki.tls("other", Some("client")))
        .version()
        .unwrap_err();
    assert!(e.to_string().contains("unreachable"), "{e}");
    // No client certificate, or one from another CA: refused in the handshake.
    for tls in [pki.tls("ca", None), pki.tls("ca", Some("stranger"))] {
        let e = client(tls).get::<Network>(&net.id).unwrap_err();
        assert!(matches!(e, corvid_api::ApiError::Transport(_)), "{e}");
    }
    // Plain http to the https port gets no answer.
    let plain = Client::new(&format!("http://127.0.0.1:{port}"));
    assert!(plain.version().is_err());

    // A body over --max-body: 413, in Neutron's error shape, and nothing made.
    let big = json!({"network": {"name": "x".repeat(70_000)}});
    let (status, body, _) = good.request("POST", "/v2.0/networks", Some(&big)).unwrap();
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["NeutronError"]["type"], "HTTPRequestEntityTooLarge");
    let (nets, _) = good.list::<Network>(&[]).unwrap();
    assert_eq!(nets.len(), 1);

    // The Docker driver, a client with the same token file, logging everything.
    let sock_dir = tempfile::Builder::new()
        .prefix("cvt-sock")
        .tempdir()
        .unwrap();
    let metrics = free_port();
    let driver = Logged::spawn(
        Command::new(env!("CARGO_BIN_EXE_corvid"))
            .args(["--log-level", "trace", "docker-plugin", "--host-id", "cvt"])
            .args(["--controller", &url])
            .arg("--token-file")
            .arg(pki.path("token"))
            .arg("--ca")
            .arg(pki.path("ca.pem"))
            .arg("--cert")
            .arg(pki.path("client.pem"))
            .arg("--key")
            .arg(pki.path("client.key"))
            .arg("--socket")
            .arg(sock_dir.path().join("corvid.sock"))
            .args(["--metrics-listen", &format!("127.0.0.1:{metrics}")]),
        pki.path("driver.log"),
    );
    let readyz = format!("http://127.0.0.1:{metrics}/readyz");
    wait_until("the driver's readiness", Duration::from_secs(20), || {
        ureq::get(&readyz).call().is_ok()
    });
    let pool = docker_call(
        &sock_dir.path().join("corvid.sock"),
        "IpamDriver.RequestPool",
        &json!({"AddressSpace": "corvid-local", "Pool": "10.78.0.0/24"}),
    );
    assert!(pool.contains("PoolID"), "{pool}");

    // The `corvid` plugin reaches the https controller with the same files from its
    // configuration; without the CA it cannot, and a bad token setting is refused.
    let subnet: Subnet = good
        .create(json!({"network_id": net.id, "cidr": "10.79.0.0/24", "ip_version": 4}))
        .unwrap();
    let plugin_conf = |extra: serde_json::Value| {
        let mut conf = json!({"cniVersion": "1.1.0", "name": "cvt-tls", "type": "corvid",
            "mpurl": url, "project": subnet.project_id, "subnet": subnet.id, "hostId": "cvt",
            "tokenFile": pki.path("token")});
        conf.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        conf
    };
    let files = json!({"ca": pki.path("ca.pem"), "cert": pki.path("client.pem"),
        "key": pki.path("client.key")});
    let nowhere = Path::new("/nonexistent");
    let out = run_plugin("corvid", "STATUS", nowhere, &plugin_conf(files.clone()));
    assert!(out.status.success(), "{out:?}");
    let out = run_plugin("corvid", "STATUS", nowhere, &plugin_conf(json!({})));
    assert!(!out.status.success());
    let e: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(e["code"], 50, "{e}");
    let mut both = files.clone();
    both["token"] = json!("inline");
    let out = run_plugin("corvid", "STATUS", nowhere, &plugin_conf(both));
    let e: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(e["code"], 7, "{e}");
    let mut missing = files;
    missing["tokenFile"] = json!("/nonexistent/token");
    let out = run_plugin("corvid", "STATUS", nowhere, &plugin_conf(missing));
    let e: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(e["code"], 7, "{e}");
    assert!(
        e["msg"].as_str().unwrap().contains("/nonexistent/token"),
        "{e}"
    );

    for p in [&controller, &driver] {
        let log = p.log();
        assert!(!log.is_empty());
        assert!(!log.contains(TOKEN), "the token is in {}", p.log.display());
        assert!(!p.cmdline().contains(TOKEN));
    }
}

/// One call of Docker's plugin protocol over the driver's unix socket: the answer's body.
fn docker_call(socket: &Path, method: &str, body: &serde_json::Value) -> String {
    let mut s = std::os::unix::net::UnixStream::connect(socket).unwrap();
    let body = body.to_string();
    write!(
        s,
        "POST /{method} HTTP/1.1\r\nHost: plugin\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or(answer)
}

/// `corvid docker-plugin` on a socket in a fresh directory, with `extra` arguments.
fn driver(dir: &Path, controller: &str, metrics: u16, extra: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_corvid"))
        .args([
            "docker-plugin",
            "--host-id",
            "cvt",
            "--controller",
            controller,
        ])
        .arg("--socket")
        .arg(dir.join("corvid.sock"))
        .args(["--metrics-listen", &format!("127.0.0.1:{metrics}")])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn docker_driver_counts_calls_and_keeps_its_socket_private() {
    let (_dir, store) = redb_store();
    let ctl = ControllerProcess::start(&store, None);
    let dir = tempfile::Builder::new()
        .prefix("cvt-sock")
        .tempdir()
        .unwrap();
    let sock = dir.path().join("corvid.sock");
    let metrics = free_port();
    let _driver = Proc(driver(dir.path(), &ctl.url, metrics, &[]));
    wait_until("the driver's socket", Duration::from_secs(20), || {
        sock.exists()
    });
    let meta = std::fs::metadata(&sock).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);

    assert!(docker_call(&sock, "Plugin.Activate", &json!({})).contains("NetworkDriver"));
    assert!(docker_call(&sock, "Plugin.Activate", &json!({})).contains("IpamDriver"));
    assert!(docker_call(&sock, "NetworkDriver.Nonsense", &json!({})).contains("unknown method"));
    assert!(docker_call(&sock, "NetworkDriver.Join", &json!([])).contains("Err"));
    let (_, text) = get(&format!("http://127.0.0.1:{metrics}/metrics"));
    let calls = "corvid_docker_calls_total";
    let activate = ("method", "Plugin.Activate");
    assert_eq!(sample(&text, calls, &[activate, ("outcome", "ok")]), 2.0);
    assert_eq!(
        sample(&text, calls, &[("method", "unknown"), ("outcome", "error")]),
        1.0
    );
    assert_eq!(
        sample(
            &text,
            calls,
            &[("method", "NetworkDriver.Join"), ("outcome", "error")]
        ),
        1.0
    );
    assert!(!text.contains("Nonsense"));
    assert_eq!(
        sample(
            &text,
            "corvid_docker_call_duration_seconds_count",
            &[activate]
        ),
        2.0
    );
    assert_eq!(get(&format!("http://127.0.0.1:{metrics}/readyz")).0, 200);
    drop(ctl);
    let (status, body) = get(&format!("http://127.0.0.1:{metrics}/readyz"));
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("controller"), "{body}");

    // A group given: the socket is that group's, 0660.
    let dir = tempfile::Builder::new()
        .prefix("cvt-sock")
        .tempdir()
        .unwrap();
    let sock = dir.path().join("corvid.sock");
    let _grouped = Proc(driver(
        dir.path(),
        "http://127.0.0.1:1",
        free_port(),
        &["--socket-group", "daemon"],
    ));
    wait_until("the group's socket", Duration::from_secs(20), || {
        sock.exists()
    });
    let meta = std::fs::metadata(&sock).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o660);
    let daemon = nix_gid("daemon");
    assert_eq!(meta.gid(), daemon);
}

/// The ID of a group from /etc/group.
fn nix_gid(name: &str) -> u32 {
    std::fs::read_to_string("/etc/group")
        .unwrap()
        .lines()
        .find_map(|l| {
            let mut f = l.split(':');
            (f.next() == Some(name)).then(|| f.nth(1).unwrap().parse().unwrap())
        })
        .unwrap_or_else(|| panic!("no group {name}"))
}

#[test]
fn docker_driver_serves_the_socket_systemd_passes() {
    let Ok(activate) = which("systemd-socket-activate") else {
        panic!("systemd-socket-activate (package systemd) is needed");
    };
    let dir = tempfile::Builder::new()
        .prefix("cvt-sock")
        .tempdir()
        .unwrap();
    let sock = dir.path().join("corvid.sock");
    // systemd-socket-activate holds the socket and starts the driver at the first
    // connection, passing it as fd 3, as corvid-docker-plugin.socket does.
    let _held = Proc(
        Command::new(activate)
            .arg("-l")
            .arg(&sock)
            .arg(env!("CARGO_BIN_EXE_corvid"))
            .args(["docker-plugin", "--host-id", "cvt", "--socket-activated"])
            .args(["--controller", "http://127.0.0.1:1"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_until("the held socket", Duration::from_secs(20), || sock.exists());
    assert!(docker_call(&sock, "Plugin.Activate", &json!({})).contains("NetworkDriver"));

    // Without a passed socket the driver says what to do instead.
    let out = Command::new(env!("CARGO_BIN_EXE_corvid"))
        .args(["docker-plugin", "--host-id", "cvt", "--socket-activated"])
        .env_remove("LISTEN_FDS")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("LISTEN_FDS"), "{err}");
}

fn which(program: &str) -> Result<PathBuf, ()> {
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .map(|d| Path::new(d).join(program))
        .find(|p| p.exists())
        .ok_or(())
}

#[test]
fn agent_metrics_count_plugs_and_readyz_follows_registration() {
    let mut c = Cluster::new("ops");
    // Started while the controller is away: alive, not ready until it registers.
    c.controller = None;
    let metrics = free_port();
    let listen = format!("127.0.0.1:{metrics}");
    c.start_agent_with(0, &["--metrics-listen", &listen]);
    let h1 = c.hosts[0].open();
    let fetch = |path: &str| {
        let url = format!("http://{listen}{path}");
        h1.run(|| {
            ureq::get(&url)
                .timeout(Duration::from_secs(5))
                .call()
                .map(|r| (r.status(), r.into_string().unwrap()))
                .or_else(|e| match e {
                    ureq::Error::Status(code, r) => Ok((code, r.into_string().unwrap())),
                    e => Err(e.to_string()),
                })
        })
        .unwrap()
    };
    wait_until("the agent's endpoints", Duration::from_secs(20), || {
        fetch("/healthz").is_ok_and(|(s, _)| s == 200)
    });
    let (status, body) = fetch("/readyz").unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("not yet registered"), "{body}");
    c.start_controller();
    wait_until("the agent's readiness", Duration::from_secs(20), || {
        fetch("/readyz").is_ok_and(|(s, _)| s == 200)
    });
    c.network("opsnet", "10.88.0.0/24", false);
    let before = fetch("/metrics").unwrap().1;
    let pod = c.pod("p1");
    cluster::cni_result(&c.add(0, "opsnet", &pod));
    let after = fetch("/metrics").unwrap().1;
    let plugged = "corvid_agent_ports_plugged_total";
    assert_eq!(
        sample(&after, plugged, &[]) - sample(&before, plugged, &[]),
        1.0,
        "{after}"
    );
    let objects = "corvid_agent_datapath_objects";
    assert_eq!(sample(&after, objects, &[("kind", "ports")]), 1.0);
    assert_eq!(sample(&after, objects, &[("kind", "networks")]), 1.0);
    let passes = "corvid_agent_reconcile_passes_total";
    assert!(
        sample(&after, passes, &[("kind", "changes")])
            > sample(&before, passes, &[("kind", "changes")])
    );
    assert!(sample(&after, passes, &[("kind", "full")]) >= 1.0);
    // The registrations tried while the controller was away count; nothing else failed.
    let errors = "corvid_agent_errors_total";
    let away = sample(&after, errors, &[("kind", "controller")]);
    assert!(away >= 1.0, "{after}");
    assert_eq!(sample(&after, errors, &[]), away, "{after}");

    let out = c.del(0, "opsnet", &pod);
    assert!(out.status.success(), "{out:?}");
    wait_until("the port's veth to go", Duration::from_secs(20), || {
        fetch("/metrics").is_ok_and(|(_, t)| sample(&t, objects, &[("kind", "ports")]) == 0.0)
    });
}

/// Runs the plugin binary as `plugin` with `conf` on stdin.
fn run_plugin(
    plugin: &str,
    command: &str,
    netns: &Path,
    conf: &serde_json::Value,
) -> std::process::Output {
    let bin = cluster::plugins::binary();
    let mut child = Command::new(bin)
        .arg(plugin)
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", "cvt-log-1")
        .env("CNI_NETNS", netns)
        .env("CNI_IFNAME", "lo")
        .env("CNI_PATH", "/nonexistent")
        .env_remove("RUST_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(conf.to_string().as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn plugins_log_to_the_file_their_configuration_names() {
    let ns = cluster::ns::Ns::new(&format!("cvt{}", std::process::id()), "log");
    let dir = tempfile::Builder::new()
        .prefix("cvt-log")
        .tempdir()
        .unwrap();
    let log = dir.path().join("plugin.log");
    let conf = json!({"cniVersion": "1.1.0", "name": "cvt-logged", "type": "loopback",
        "logFile": log, "logLevel": "debug"});
    let out = run_plugin("loopback", "ADD", &ns.path, &conf);
    assert!(out.status.success(), "{out:?}");
    // The result channel carries the result only.
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["cniVersion"], "1.1.0");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("INFO"), "{text}");
    assert!(text.contains("command=\"ADD\""), "{text}");
    assert!(text.contains("network=\"cvt-logged\""), "{text}");

    // A failure is one warn line with the error; appended, not overwritten.
    let out = run_plugin("loopback", "ADD", Path::new("/nonexistent/netns"), &conf);
    assert!(!out.status.success());
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        text.lines()
            .filter(|l| l.contains("command=\"ADD\""))
            .count(),
        2
    );
    assert!(text.contains("WARN"), "{text}");

    // A level that is not one says so on stderr and logs at info.
    let quiet = dir.path().join("quiet.log");
    let conf = json!({"cniVersion": "1.1.0", "name": "cvt-logged", "type": "loopback",
        "logFile": quiet, "logLevel": "loud"});
    let out = run_plugin("loopback", "DEL", &ns.path, &conf);
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("logLevel"));
    assert!(std::fs::read_to_string(&quiet)
        .unwrap()
        .contains("command=\"DEL\""));
}

#[test]
fn the_controller_runs_unprivileged() {
    // nobody, with no capability: the store's directory is all it needs.
    let dir = tempfile::Builder::new()
        .prefix("cvt-nobody")
        .tempdir()
        .unwrap();
    rustix::fs::chown(
        dir.path(),
        Some(rustix::fs::Uid::from_raw(65534)),
        Some(rustix::fs::Gid::from_raw(65534)),
    )
    .unwrap();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let store = format!("redb:{}", dir.path().join("state.redb").display());
    let child = {
        use std::os::unix::process::CommandExt;
        Command::new(env!("CARGO_BIN_EXE_corvid"))
            .args(["controller", "--store", &store])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .uid(65534)
            .gid(65534)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let controller = Proc(child);
    let client = Client::new(&url);
    wait_until(
        "the unprivileged controller",
        Duration::from_secs(20),
        || client.version().is_ok(),
    );
    let _: Network = client.create(json!({"name": "cvt-nobody"})).unwrap();
    let status = std::fs::read_to_string(format!("/proc/{}/status", controller.0.id())).unwrap();
    assert!(status
        .lines()
        .any(|l| l.starts_with("Uid:") && l.contains("65534")));
    assert!(
        status.lines().any(|l| l == "CapEff:\t0000000000000000"),
        "{status}"
    );
    assert_eq!(get(&format!("{url}/readyz")).0, 200);
}

//! dhcp with macvlan, against dnsmasq in a namespace on the master's segment: leases got,
//! renewed at T1 and released on DEL in every version; the same results as the
//! reference's daemon and plugin, and lists mixing theirs and ours; options provided and
//! routes from option 121; GC; a DEL while the server is gone; and refusals that leave
//! no interface behind.

mod support;

use corvid_cni::version::ALL;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::*;

/// A host namespace whose `cvtm0` leads to a server namespace running dnsmasq on
/// 10.89.0.1/24 (T1 2 s, T2 3 s), a pod namespace, and corvid's plugins.
struct Segment {
    host: TestNs,
    server: TestNs,
    pod: TestNs,
    plugins: PluginDir,
    dir: tempfile::TempDir,
    dnsmasq: Option<Child>,
}

impl Segment {
    fn new(dnsmasq_options: &[&str]) -> Segment {
        let (host, server, pod) = (TestNs::new(), TestNs::new(), TestNs::new());
        host.ip(&format!(
            "link add cvtm0 type veth peer name srv0 netns {}",
            server.name
        ));
        host.ip("link set cvtm0 up");
        server.ip("link set srv0 up");
        server.ip("addr add 10.89.0.1/24 dev srv0");
        let mut s = Segment {
            host,
            server,
            pod,
            plugins: PluginDir::new(),
            dir: tempfile::tempdir().unwrap(),
            dnsmasq: None,
        };
        s.start_dnsmasq(dnsmasq_options);
        s
    }

    fn start_dnsmasq(&mut self, options: &[&str]) {
        let d = self.dir.path();
        let child = self
            .server
            .command("dnsmasq")
            .args([
                "--keep-in-foreground",
                "--conf-file=/dev/null",
                "--interface=srv0",
                "--bind-interfaces",
                "--port=0",
                "--no-ping",
                "--dhcp-range=10.89.0.50,10.89.0.99,255.255.255.0,2m",
                "--dhcp-option=option:router,10.89.0.1",
                "--dhcp-option=option:T1,2",
                "--dhcp-option=option:T2,3",
            ])
            .arg(format!("--dhcp-leasefile={}", d.join("leases").display()))
            .arg(format!("--pid-file={}", d.join("dnsmasq.pid").display()))
            .args(options)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("dnsmasq (Debian's dnsmasq-base)");
        self.dnsmasq = Some(child);
        // It serves once its lease file is there.
        wait_for(|| d.join("leases").exists(), "dnsmasq to start");
    }

    /// dnsmasq's leases: (expiry, address, host name, client ID).
    fn leases(&self) -> Vec<(u64, String, String, String)> {
        let text = std::fs::read_to_string(self.dir.path().join("leases")).unwrap_or_default();
        text.lines()
            .map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (
                    f[0].parse().unwrap(),
                    f[2].to_string(),
                    f[3].to_string(),
                    f[4].to_string(),
                )
            })
            .collect()
    }

    fn socket(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Starts corvid's daemon (or the reference's) on `socket`, with short waits.
    fn daemon(&self, reference: bool, socket: &Path) -> Daemon {
        let program = if reference {
            PathBuf::from(REFERENCE_DIR).join("dhcp")
        } else {
            self.plugins.plugin("dhcp")
        };
        let mut cmd = self.host.command(program);
        cmd.arg("daemon")
            .arg("-socketpath")
            .arg(socket)
            .args(["-timeout", "1s"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if !reference {
            // Debian's reference predates -resendtimeout.
            cmd.args(["-resendtimeout", "4s"]);
        }
        let child = cmd.spawn().unwrap();
        wait_for(
            || std::os::unix::net::UnixStream::connect(socket).is_ok(),
            "the dhcp daemon to listen",
        );
        Daemon(child)
    }

    fn conf(&self, version: &str, socket: &Path, ipam: Value) -> String {
        let mut c = json!({"cniVersion": version, "name": "cvtdhcp", "type": "macvlan",
            "master": "cvtm0",
            "ipam": {"type": "dhcp", "daemonSocketPath": socket}});
        for (k, v) in ipam.as_object().unwrap() {
            c["ipam"][k] = v.clone();
        }
        c.to_string()
    }

    /// macvlan (corvid's or the reference's) delegating to the dhcp plugin (likewise).
    fn call(
        &self,
        macvlan_reference: bool,
        dhcp_reference: bool,
        command: &str,
        id: &str,
        conf: &str,
    ) -> Call<'_> {
        let (macvlan, _) = self.plugins.pick("macvlan", macvlan_reference);
        let (_, path) = self.plugins.pick("dhcp", dhcp_reference);
        let path = if macvlan_reference == dhcp_reference {
            path
        } else {
            // The other one's macvlan finds this dhcp first.
            let (_, other) = self.plugins.pick("macvlan", macvlan_reference);
            format!("{path}:{other}")
        };
        Call::new(
            &self.host,
            macvlan,
            command,
            id,
            &self.pod.path_str(),
            &path,
            conf,
        )
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        if let Some(mut c) = self.dnsmasq.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A running dhcp daemon, stopped with SIGTERM on drop.
struct Daemon(Child);

impl Daemon {
    fn stop(&mut self) -> std::process::ExitStatus {
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        self.0.wait().unwrap()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            self.stop();
        }
    }
}

fn wait_for(mut ok: impl FnMut() -> bool, what: &str) {
    let end = Instant::now() + Duration::from_secs(10);
    while !ok() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn with_prev(conf: &str, prev: &Value) -> String {
    let mut c: Value = serde_json::from_str(conf).unwrap();
    c["prevResult"] = prev.clone();
    c.to_string()
}

/// The first address of a result of any version.
fn address(r: &Value) -> String {
    if r["ip4"].is_object() {
        address_part(&r["ip4"]["ip"])
    } else {
        result_ip(r, true)
    }
}

#[test]
fn leases_are_got_renewed_and_released_in_every_version() {
    let seg = Segment::new(&[]);
    let socket = seg.socket("dhcp.sock");
    let _daemon = seg.daemon(false, &socket);
    for (n, version) in ALL.iter().enumerate() {
        let id = format!("cvtc{n}");
        let c = seg.conf(version.as_str(), &socket, json!({}));
        let r = seg.call(false, false, "ADD", &id, &c).ok();
        let ip = address(&r);
        assert!(ip.starts_with("10.89.0."), "{version}: {r}");
        assert!(seg.pod.ping("10.89.0.1"), "{version}: the server answers");
        let leases = seg.leases();
        let lease = leases
            .iter()
            .find(|l| l.1 == ip)
            .expect("dnsmasq has the lease");
        let client_id: String = format!("{id}/cvtdhcp/eth0")
            .bytes()
            .fold("00".to_string(), |s, b| format!("{s}:{b:02x}"));
        assert_eq!(lease.3, client_id, "{version}: the reference's client ID");
        if version.allows_check() {
            seg.call(false, false, "CHECK", &id, &with_prev(&c, &r))
                .ok();
        }
        if n == 0 {
            // T1 is 2 s: the daemon renews, and dnsmasq moves the expiry on.
            let first = lease.0;
            wait_for(
                || seg.leases().iter().any(|l| l.1 == ip && l.0 > first),
                "the lease to be renewed",
            );
        }
        // ADD again (a runtime retrying) answers the lease held.
        seg.pod.ip("link del eth0");
        let again = seg.call(false, false, "ADD", &id, &c).ok();
        assert_eq!(address(&again), ip, "{version}: the same lease");
        seg.call(false, false, "DEL", &id, &c).ok();
        wait_for(
            || !seg.leases().iter().any(|l| l.1 == ip),
            "dnsmasq to see the release",
        );
        assert!(seg.pod.links().is_empty(), "{version}: eth0 is gone");
        seg.call(false, false, "DEL", &id, &c).ok();
        if version.allows_check() {
            let o = seg
                .call(false, false, "CHECK", &id, &with_prev(&c, &r))
                .run();
            assert!(!o.success, "{version}: CHECK passed with no lease");
        }
    }
}

#[test]
fn a_del_while_the_server_is_gone_ends_with_the_renewal_under_way() {
    let mut seg = Segment::new(&[]);
    let socket = seg.socket("gone.sock");
    let _daemon = seg.daemon(false, &socket);
    let c = seg.conf("1.1.0", &socket, json!({}));
    let r = seg.call(false, false, "ADD", "cvtgone", &c).ok();
    assert!(address(&r).starts_with("10.89.0."), "{r}");
    // The server goes: the renewal at T1 (2 s) fails after the daemon's resends (4 s),
    // then the daemon waits for T2. The DEL comes during the renewal.
    if let Some(mut d) = seg.dnsmasq.take() {
        d.kill().unwrap();
        d.wait().unwrap();
    }
    std::thread::sleep(Duration::from_secs(3));
    let started = Instant::now();
    seg.call(false, false, "DEL", "cvtgone", &c).ok();
    // It ends when the renewal does, not when the lease expires (2 minutes).
    let took = started.elapsed();
    assert!(took < Duration::from_secs(15), "the DEL took {took:?}");
    assert!(seg.pod.links().is_empty());
}

#[test]
fn results_are_the_references_and_lists_mix() {
    let seg = Segment::new(&[]);
    let ours = seg.socket("ours.sock");
    let theirs = seg.socket("theirs.sock");
    let _d1 = seg.daemon(false, &ours);
    let _d2 = seg.daemon(true, &theirs);
    let shape = |r: &Value| {
        let mut r = r.clone();
        r["ips"][0]["address"] = json!("");
        r["interfaces"][0]["mac"] = json!("");
        r
    };
    let mut seen = Vec::new();
    for (macvlan_ref, dhcp_ref) in [(false, false), (true, true), (true, false), (false, true)] {
        let socket = if dhcp_ref { &theirs } else { &ours };
        let c = seg.conf("1.0.0", socket, json!({}));
        let r = seg.call(macvlan_ref, dhcp_ref, "ADD", "cvtmix", &c).ok();
        let ip = address(&r);
        assert!(seg.leases().iter().any(|l| l.1 == ip), "{r}");
        assert!(seg.pod.ping("10.89.0.1"));
        seen.push(shape(&r));
        seg.call(macvlan_ref, dhcp_ref, "DEL", "cvtmix", &c).ok();
        wait_for(|| !seg.leases().iter().any(|l| l.1 == ip), "the release");
        assert!(seg.pod.links().is_empty());
    }
    for (i, r) in seen.iter().enumerate().skip(1) {
        assert_eq!(&seen[0], r, "run {i} differs");
    }
}

#[test]
fn options_are_provided_and_classless_routes_used() {
    let seg = Segment::new(&[
        "--dhcp-option=option:classless-static-route,192.168.50.0/24,10.89.0.1,0.0.0.0/0,10.89.0.1",
    ]);
    let socket = seg.socket("dhcp.sock");
    let _daemon = seg.daemon(false, &socket);
    let c = seg.conf(
        "1.1.0",
        &socket,
        json!({"provide": [{"option": "host-name", "fromArg": "K8S_POD_NAME"}],
               "request": [{"option": "121"}], "priority": 7}),
    );
    let r = seg
        .call(false, false, "ADD", "cvtopt", &c)
        .set("CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAME=cvtweb")
        .ok();
    let routes = r["routes"].as_array().unwrap();
    let dsts: Vec<&str> = routes.iter().map(|r| r["dst"].as_str().unwrap()).collect();
    assert_eq!(dsts, ["192.168.50.0/24", "0.0.0.0/0"], "option 121: {r}");
    assert!(routes.iter().all(|r| r["priority"] == 7), "{r}");
    let ip = address(&r);
    assert!(
        seg.leases().iter().any(|l| l.1 == ip && l.2 == "cvtweb"),
        "dnsmasq got the host name: {:?}",
        seg.leases()
    );
    let route = seg
        .pod
        .command("ip")
        .args(["route", "get", "192.168.50.9"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&route.stdout).contains("via 10.89.0.1 dev eth0"));
    seg.call(false, false, "DEL", "cvtopt", &c).ok();
}

#[test]
fn gc_releases_leases_not_kept() {
    let seg = Segment::new(&[]);
    let socket = seg.socket("dhcp.sock");
    let _daemon = seg.daemon(false, &socket);
    let c = seg.conf("1.1.0", &socket, json!({}));
    let pod2 = TestNs::new();
    let r1 = seg.call(false, false, "ADD", "cvtkeep", &c).ok();
    let r2 = seg
        .call(false, false, "ADD", "cvtstale", &c)
        .set("CNI_NETNS", &pod2.path_str())
        .ok();
    let (a1, a2) = (address(&r1), address(&r2));
    let mut gc: Value = serde_json::from_str(&c).unwrap();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "cvtkeep", "ifname": "eth0"}]);
    seg.call(false, false, "GC", "", &gc.to_string())
        .unset("CNI_NETNS")
        .ok();
    wait_for(
        || !seg.leases().iter().any(|l| l.1 == a2),
        "the stale lease to be released",
    );
    assert!(seg.leases().iter().any(|l| l.1 == a1), "the kept one stays");
    seg.call(false, false, "STATUS", "", &c)
        .unset("CNI_NETNS")
        .ok();
    seg.call(false, false, "DEL", "cvtkeep", &c).ok();
}

#[test]
fn refusals_leave_no_interface() {
    let mut seg = Segment::new(&[]);
    let socket = seg.socket("dhcp.sock");
    let c = seg.conf("1.1.0", &socket, json!({}));

    // No daemon: ADD is to be tried again later, STATUS says not available, DEL is fine.
    let o = seg.call(false, false, "ADD", "cvtno", &c).run();
    assert!(!o.success);
    assert_eq!(o.code(), 11, "{}", o.stdout);
    assert!(seg.pod.links().is_empty(), "no half-made eth0");
    let o = seg
        .call(false, false, "STATUS", "", &c)
        .unset("CNI_NETNS")
        .run();
    assert_eq!(o.code(), 50, "{}", o.stdout);
    seg.call(false, false, "DEL", "cvtno", &c).ok();

    let mut daemon = seg.daemon(false, &socket);
    // An option with no name or number.
    let bad = seg.conf(
        "1.1.0",
        &socket,
        json!({"request": [{"option": "cvt-nope"}]}),
    );
    let o = seg.call(false, false, "ADD", "cvtbad", &bad).run();
    assert_eq!(o.code(), 7, "{}", o.stdout);
    assert!(seg.pod.links().is_empty());

    // No server answers: the daemon gives up after -resendtimeout.
    if let Some(mut d) = seg.dnsmasq.take() {
        d.kill().unwrap();
        d.wait().unwrap();
    }
    let o = seg.call(false, false, "ADD", "cvtquiet", &c).run();
    assert!(!o.success);
    assert!(o.stdout.contains("no DHCP answer"), "{}", o.stdout);
    assert!(seg.pod.links().is_empty());

    // Stopped, the daemon removes its socket.
    assert!(daemon.stop().success());
    assert!(!socket.exists());
    let o = Command::new(seg.plugins.plugin("dhcp"))
        .args(["daemon", "-nosuch"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("-nosuch"));
}

#[test]
fn the_daemon_serves_the_socket_systemd_passes() {
    let seg = Segment::new(&[]);
    let socket = seg.socket("activated.sock");
    // systemd-socket-activate holds the socket and starts the daemon at the first
    // connection with it as fd 3, as corvid-dhcp.socket does.
    let child = Command::new("systemd-socket-activate")
        .arg("-l")
        .arg(&socket)
        .arg(seg.plugins.plugin("dhcp"))
        .args(["daemon", "-timeout", "1s"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("systemd-socket-activate (package systemd)");
    let mut daemon = Daemon(child);
    wait_for(|| socket.exists(), "the held socket");
    let c = seg.conf("1.1.0", &socket, json!({}));
    let r = seg.call(false, false, "ADD", "cvtact", &c).ok();
    assert!(seg.leases().iter().any(|l| l.1 == address(&r)));
    seg.call(false, false, "DEL", "cvtact", &c).ok();
    assert!(daemon.stop().success());
    assert!(
        socket.exists(),
        "the socket is systemd's: the daemon leaves it"
    );
}

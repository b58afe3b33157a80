//! `corvid up` as the README tells a newcomer to use it, inside a private host namespace
//! (as root): it starts everything, writes the CNI configuration, and two namespaces
//! attached with `corvid cni add` ping each other.

#[path = "support/ns.rs"]
mod ns;

#[path = "support/plugins.rs"]
mod plugins;

#[path = "support/up.rs"]
mod stack;

use std::process::Stdio;
use std::time::Duration;

use ns::{wait_until, Ns, Proc};
use serde_json::Value;
use stack::{stop, Up};

#[test]
fn up_then_two_namespaces_ping_each_other() {
    let tag = format!("cvt{}up", std::process::id());
    let host = Ns::new(&tag, "host");
    host.ip("link set lo up");
    let stack = Up::new();
    let mut running = stack.start(&host, &[]);
    let conflist = stack.conf().join("corvid.conflist");
    let written: Value = serde_json::from_slice(&std::fs::read(&conflist).unwrap()).unwrap();
    assert_eq!(written["plugins"][0]["type"], "corvid");
    assert_eq!(written["plugins"][0]["hostId"], "demo");

    let a = Ns::new(&tag, "a");
    let b = Ns::new(&tag, "b");
    let (ra, rb) = (stack.add_result(&host, &a), stack.add_result(&host, &b));
    let ips = |r: &Value| -> Vec<String> {
        r["ips"]
            .as_array()
            .unwrap()
            .iter()
            .map(|ip| {
                ip["address"]
                    .as_str()
                    .unwrap()
                    .split('/')
                    .next()
                    .unwrap()
                    .to_string()
            })
            .collect()
    };
    let (ips_a, ips_b) = (ips(&ra), ips(&rb));
    // Dual stack by default: an address in 10.77.0.0/16 and one in fd77:0:0:1::/64.
    let in_fd77 = |ip: &str| {
        ip.parse::<std::net::Ipv6Addr>()
            .is_ok_and(|ip| ip.segments()[..4] == [0xfd77, 0, 0, 1])
    };
    assert!(
        ips_a.len() == 2 && ips_a[0].starts_with("10.77.") && in_fd77(&ips_a[1]),
        "{ra}"
    );
    assert_eq!(ra["routes"][0]["dst"], "0.0.0.0/0", "{ra}");
    assert_eq!(ra["routes"][1]["dst"], "::/0", "{ra}");
    let (ip_a, ip_b) = (ips_a[0].clone(), ips_b[0].clone());
    for (from, to) in [(&a, &ips_b), (&b, &ips_a)] {
        for ip in to {
            assert!(from.ping(ip), "{ip}");
        }
    }
    // The host over both families: the gateways its bridge holds.
    for gw in [&ra["ips"][0]["gateway"], &ra["ips"][1]["gateway"]] {
        assert!(a.ping(gw.as_str().unwrap()), "{gw}");
    }

    // One Ctrl-C stops it at once: the agent's open watch request does not hold it.
    stop(&mut running, libc::SIGINT, Duration::from_secs(5));
    // Started again on the same state, filtering by security groups this time: the
    // containers keep working (the plugin's ports have port security off), the agent is
    // ready and serves its metrics, a new attach works and a DEL removes its devices.
    // Without IPv6, new containers get an IPv4 address alone.
    running = stack.start(&host, &["--security-groups", "--no-ipv6"]);
    let agent_ready = || {
        host.open()
            .run(|| ureq::get("http://127.0.0.1:9697/readyz").call().is_ok())
            .unwrap()
    };
    wait_until(
        "corvid up's agent to be ready",
        Duration::from_secs(30),
        agent_ready,
    );
    assert!(a.ping(&ip_b));
    let tables = host
        .command("nft")
        .args(["list", "tables"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&tables.stdout).contains("bridge corvid-sg"),
        "{tables:?}"
    );
    let c = Ns::new(&tag, "c");
    let rc = stack.add_result(&host, &c);
    let ip_c = match &ips(&rc)[..] {
        [v4] => v4.clone(),
        _ => panic!("one address: {rc}"),
    };
    assert!(c.ping(&ip_a));
    assert!(a.ping(&ip_c));
    assert_eq!(host.links("cvp").len(), 3);
    stack.del(&host, &a);
    wait_until("the agent to unplug a", Duration::from_secs(10), || {
        a.links("eth0").is_empty() && host.links("cvp").len() == 2
    });
    stack.del(&host, &b);
    stack.del(&host, &c);
    wait_until(
        "the agent to remove the network's devices",
        Duration::from_secs(10),
        || {
            host.links("cvp").is_empty()
                && host.links("cvb").is_empty()
                && host.links("cvx").is_empty()
        },
    );
    drop(running);
}

#[test]
fn logs_go_to_stderr_filtered_by_level_and_as_json_on_request() {
    use std::io::{BufRead, BufReader};
    let state = tempfile::Builder::new()
        .prefix("cvt-log")
        .tempdir()
        .unwrap();
    let controller = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_corvid"))
            .args(args)
            .args(["controller", "--listen", "127.0.0.1:0", "--store"])
            .arg(format!("redb:{}", state.path().join("s.redb").display()))
            .env_remove("RUST_LOG")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    // JSON: one object per line, with the level and the message.
    let mut json = Proc(controller(&["--log-format", "json"]));
    let line = BufReader::new(json.0.stderr.take().unwrap())
        .lines()
        .next()
        .unwrap()
        .unwrap();
    let event: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!(event["level"], "INFO", "{line}");
    assert_eq!(event["fields"]["message"], "controller listening", "{line}");
    json.kill9();
    // Above the level: nothing is written.
    let mut quiet = Proc(controller(&["--log-level", "warn"]));
    std::thread::sleep(Duration::from_millis(500));
    quiet.kill9();
    let mut written = String::new();
    std::io::Read::read_to_string(&mut quiet.0.stderr.take().unwrap(), &mut written).unwrap();
    std::io::Read::read_to_string(&mut quiet.0.stdout.take().unwrap(), &mut written).unwrap();
    assert!(written.is_empty(), "{written}");
    // A filter that does not parse is refused before anything starts.
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_corvid"))
        .args(["--log-level", "info,[[", "cni", "list"])
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--log-level"));
}

//! `corvid up` on hosts as users have them, each a private "host" namespace: one with
//! dockerd's rules (FORWARD DROP behind `DOCKER-USER`, `bridge-nf-call-iptables` on),
//! one with ufw's (FORWARD DROP alone) and one whose own nftables table drops forwarding,
//! each in iptables and ip6tables. Containers reach each other and the outside of the
//! bridge, over both families, where iptables filters (the
//! agent lets corvid's bridges through, puts that back after a firewall reload and takes
//! it away with the last bridge); where another nftables table drops, `corvid doctor`
//! names the chain, and its fix works. Runs as root, in `cvt*` namespaces only.

#[path = "support/ns.rs"]
mod ns;

#[path = "support/plugins.rs"]
mod plugins;

#[path = "support/up.rs"]
mod stack;

use std::process::Output;
use std::time::Duration;

use ns::{wait_until, Ns};
use serde_json::Value;
use stack::Up;

/// What filters forwarding on the host.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Firewall {
    /// dockerd's rules.
    Docker,
    /// ufw's: FORWARD's policy drops.
    Ufw,
    /// A forward chain with policy drop in a table of the host's own.
    Nftables,
}

/// Runs `program args` in `ns`; it must succeed.
fn run(ns: &Ns, program: &str, args: &str) -> Output {
    let out = ns
        .command(program)
        .args(args.split_whitespace())
        .output()
        .unwrap();
    assert!(out.status.success(), "{program} {args}: {out:?}");
    out
}

fn iptables_rules(ns: &Ns) -> String {
    String::from_utf8(run(ns, "iptables", "-S").stdout).unwrap()
}

fn firewall_on(host: &Ns, kind: Firewall) {
    // Both families: ufw filters IPv6 as IPv4, and so does dockerd since 27 (ip6tables
    // on by default).
    match kind {
        Firewall::Docker => {
            for args in [
                "-N DOCKER-USER",
                "-A DOCKER-USER -j RETURN",
                "-I FORWARD -j DOCKER-USER",
                "-P FORWARD DROP",
            ] {
                run(host, "iptables", args);
                run(host, "ip6tables", args);
            }
        }
        Firewall::Ufw => {
            run(host, "iptables", "-P FORWARD DROP");
            run(host, "ip6tables", "-P FORWARD DROP");
        }
        Firewall::Nftables => {
            run(host, "nft", "add table inet cvtfw");
            let out = host
                .command("nft")
                .args([
                    "add chain inet cvtfw forward { type filter hook forward priority 0 ; policy drop ; }",
                ])
                .output()
                .unwrap();
            assert!(out.status.success(), "{out:?}");
        }
    }
    run(host, "sysctl", "-qw net.bridge.bridge-nf-call-iptables=1");
}

fn attach_and_ping(kind: Firewall) {
    let tag = format!("cvt{}fw{}", std::process::id(), kind as u8);
    let host = Ns::new(&tag, "host");
    host.ip("link set lo up");
    // Outside the bridge: a namespace behind the host's own interface.
    let outside = Ns::new(&tag, "out");
    outside.ip("link set lo up");
    host.ip(&format!(
        "link add cvtout type veth peer name eth0 netns {}",
        outside.name()
    ));
    host.ip("addr add 10.98.0.1/24 dev cvtout");
    host.ip("addr add fd98::1/64 dev cvtout nodad");
    host.ip("link set cvtout up");
    outside.ip("addr add 10.98.0.2/24 dev eth0");
    outside.ip("addr add fd98::2/64 dev eth0 nodad");
    outside.ip("link set eth0 up");
    firewall_on(&host, kind);

    let stack = Up::new();
    let up = stack.start(&host, &["--resync", "1"]);
    let (conf, bin) = (stack.conf(), stack.bin());
    let pods = [Ns::new(&tag, "a"), Ns::new(&tag, "b")];
    // corvid up's default network is dual stack: an address of each family.
    let results: Vec<Value> = pods.iter().map(|p| stack.add_result(&host, p)).collect();
    let address = |r: &Value, v6: bool| -> String {
        r["ips"]
            .as_array()
            .unwrap()
            .iter()
            .map(|ip| ip["address"].as_str().unwrap().split('/').next().unwrap())
            .find(|a| a.contains(':') == v6)
            .unwrap_or_else(|| panic!("no address of that family: {r}"))
            .to_string()
    };
    let ips: Vec<String> = results.iter().map(|r| address(r, false)).collect();
    let ips6: Vec<String> = results.iter().map(|r| address(r, true)).collect();
    let reach = |what: &str| {
        wait_until(what, Duration::from_secs(10), || {
            pods[0].ping(&ips[1])
                && pods[1].ping(&ips[0])
                && pods[0].ping("10.98.0.2")
                && pods[0].ping(&ips6[1])
                && pods[1].ping(&ips6[0])
                && pods[0].ping("fd98::2")
        });
    };

    if kind == Firewall::Nftables {
        // corvid may not rewrite another table: doctor names the chain and the way out.
        assert!(!pods[0].ping(&ips[1]), "the host's forward chain drops");
        let out = host
            .command(env!("CARGO_BIN_EXE_corvid"))
            .args(["doctor", "--json", "--host-id", "demo", "--conf-dir"])
            .arg(&conf)
            .arg("--cni-path")
            .arg(&bin)
            .output()
            .unwrap();
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        let finding = report["findings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["check"] == "forwarding" && f["status"] == "fail")
            .unwrap_or_else(|| panic!("no forwarding finding: {report:#}"));
        assert!(
            finding["message"]
                .as_str()
                .unwrap()
                .contains("table inet cvtfw chain forward"),
            "{finding}"
        );
        // The controller and agent `corvid up` runs are found at their defaults.
        let status = |check: &str| -> Vec<Value> {
            report["findings"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|f| f["check"] == check)
                .map(|f| f["status"].clone())
                .collect()
        };
        assert!(status("controller").iter().all(|s| s == "ok"), "{report:#}");
        assert!(status("agent").iter().all(|s| s == "ok"), "{report:#}");
        for fix in finding["fix"]
            .as_str()
            .unwrap()
            .split(" (firewalld")
            .next()
            .unwrap()
            .split("; ")
        {
            let out = host.command("sh").arg("-c").arg(fix).output().unwrap();
            assert!(out.status.success(), "{fix}: {out:?}");
        }
        reach("the containers after doctor's fix");
    } else {
        reach("the containers through the host's iptables");
        assert!(iptables_rules(&host).contains("-N CORVID-BRIDGES"));
        // A firewall reload that drops corvid's jump: the next full pass puts it back.
        let parent = if kind == Firewall::Docker {
            "DOCKER-USER"
        } else {
            "FORWARD"
        };
        // The agent is held while the jumps are gone, or its next full pass (every
        // second here) could put them back before the pings show the drop.
        let agent = up.0.id() as i32;
        assert_eq!(unsafe { libc::kill(agent, libc::SIGSTOP) }, 0);
        run(&host, "iptables", &format!("-D {parent} -j CORVID-BRIDGES"));
        run(
            &host,
            "ip6tables",
            &format!("-D {parent} -j CORVID-BRIDGES"),
        );
        let dropped = (!pods[0].ping(&ips[1]), !pods[0].ping(&ips6[1]));
        assert_eq!(unsafe { libc::kill(agent, libc::SIGCONT) }, 0);
        assert_eq!(
            dropped,
            (true, true),
            "without the jumps, FORWARD drops both families"
        );
        reach("the containers after the agent restored the jump");
    }

    for p in &pods {
        stack.del(&host, p);
    }
    wait_until(
        "the last bridge and its allowance to go",
        Duration::from_secs(10),
        || host.links("cvb").is_empty() && !iptables_rules(&host).contains("CORVID-BRIDGES"),
    );
    // Nothing else of the host's firewall was touched.
    match kind {
        Firewall::Docker => {
            let rules = iptables_rules(&host);
            assert!(
                rules.contains("-P FORWARD DROP") && rules.contains("-A DOCKER-USER -j RETURN"),
                "{rules}"
            );
        }
        Firewall::Ufw => {
            assert!(iptables_rules(&host).contains("-P FORWARD DROP"));
            let rules6 = String::from_utf8(run(&host, "ip6tables", "-S").stdout).unwrap();
            assert!(rules6.contains("-P FORWARD DROP"), "{rules6}");
        }
        Firewall::Nftables => {
            let out = run(&host, "nft", "list chain inet cvtfw forward");
            assert!(String::from_utf8_lossy(&out.stdout).contains("policy drop"));
        }
    }
}

#[test]
fn up_on_a_host_where_dockerd_runs() {
    attach_and_ping(Firewall::Docker);
}

#[test]
fn up_on_a_host_with_ufw() {
    attach_and_ping(Firewall::Ufw);
}

#[test]
fn up_on_a_host_whose_nftables_drops_forwarding() {
    attach_and_ping(Firewall::Nftables);
}

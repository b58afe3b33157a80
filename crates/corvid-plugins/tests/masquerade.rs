//! The bridge plugin's masquerade, through corvid's own nftables table: egress leaves with
//! the host's address, the subnet and the others' rules are left alone, and the table
//! holds exactly one element per live address whatever runs in parallel.

mod support;

use serde_json::{json, Value};
use std::collections::BTreeSet;
use support::*;

impl Site {
    fn conf(&self, masq: bool) -> String {
        json!({"cniVersion": "1.1.0", "name": "cvtmasq", "type": "bridge", "bridge": "cvtbrm",
            "isGateway": true, "ipMasq": masq,
            "ipam": {"type": "host-local", "dataDir": self.data.path(),
                "ranges": [[{"subnet": "10.78.0.0/24"}], [{"subnet": "fd78::/64"}]],
                "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]}})
        .to_string()
    }

    fn call(&self, command: &str, id: &str, ns: &TestNs, conf: &str) -> Value {
        self.call_in(command, id, &ns.path_str(), conf).ok()
    }

    fn call_in<'a>(&'a self, command: &str, id: &str, netns: &str, conf: &str) -> Call<'a> {
        self.ours("bridge", command, id, netns, conf)
    }

    /// GC with no attachment valid.
    fn gc_none_valid(&self, conf: &str) {
        let mut gc: Value = serde_json::from_str(conf).unwrap();
        gc["cni.dev/valid-attachments"] = json!([]);
        self.call_in("GC", "", "", &gc.to_string())
            .unset("CNI_CONTAINERID")
            .unset("CNI_IFNAME")
            .ok();
    }

    /// (address, tag) of every element of corvid's masquerade maps.
    fn elements(&self) -> BTreeSet<(String, String)> {
        self.host.run(|| {
            let mut nft = corvid_net::nftables::Nftables::open().unwrap();
            let mut out = BTreeSet::new();
            let sets = nft.sets().unwrap();
            for set in sets.iter().filter(|s| s.starts_with("masq-")) {
                for e in nft.elements(set).unwrap() {
                    let addr: std::net::IpAddr = if e.key.len() == 4 {
                        <[u8; 4]>::try_from(e.key.as_slice()).unwrap().into()
                    } else {
                        <[u8; 16]>::try_from(e.key.as_slice()).unwrap().into()
                    };
                    out.insert((addr.to_string(), e.comment.unwrap()));
                }
            }
            out
        })
    }

    /// The whole ruleset, stateless.
    fn ruleset(&self) -> String {
        let out = self
            .host
            .command("nft")
            .args(["-s", "list", "ruleset"])
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    }

    /// What others wrote: the whole ruleset but corvid's table.
    fn foreign_rules(&self) -> String {
        let text = self.ruleset();
        let mut keep = String::new();
        let mut ours = false;
        for line in text.lines() {
            if line.starts_with("table ") {
                ours = line == "table inet corvid {";
            }
            if !ours {
                keep.push_str(line);
                keep.push('\n');
            }
        }
        keep
    }
}

/// The source address a TCP server in `server` sees for a connection from `client`.
fn seen_source(server: &TestNs, client: &TestNs, addr: &str) -> String {
    let _server = EchoServer::start(server, 5998, false);
    echo(client, addr, 5998, false).expect("the server answers")
}

#[test]
fn egress_leaves_with_the_host_address_and_the_subnet_keeps_its_own() {
    let site = Site::new();
    let before = site.ruleset();
    let (c1, c2) = (TestNs::new(), TestNs::new());
    // Without masquerade the outside cannot answer: the test can tell the two apart.
    let plain = site.conf(false);
    site.call("ADD", "plain", &c1, &plain);
    assert!(
        !c1.ping("10.251.0.2"),
        "the outside answered unmasqueraded traffic"
    );
    site.call("DEL", "plain", &c1, &plain);

    let conf = site.conf(true);
    let r1 = site.call("ADD", "c1", &c1, &conf);
    let r2 = site.call("ADD", "c2", &c2, &conf);
    for (v4, outside, host) in [
        (true, "10.251.0.2", "10.251.0.1"),
        (false, "fd51::2", "fd51::1"),
    ] {
        assert!(c1.ping(outside), "{outside} unreachable from c1");
        assert_eq!(
            seen_source(&site.outside, &c1, outside),
            host,
            "egress is masqueraded"
        );
        let a1 = result_ip(&r1, v4);
        let a2 = result_ip(&r2, v4);
        assert_eq!(
            seen_source(&c2, &c1, &a2),
            a1,
            "traffic inside the subnet keeps its source"
        );
    }
    let tags: BTreeSet<String> = site.elements().into_iter().map(|(_, t)| t).collect();
    assert_eq!(tags.len(), 2, "one tag per attachment: {tags:?}");
    assert_eq!(site.elements().len(), 4, "two addresses each");

    site.call("DEL", "c1", &c1, &conf);
    assert!(c2.ping("10.251.0.2"), "c2 still goes out after c1 left");
    let left: Vec<String> = site.elements().into_iter().map(|(a, _)| a).collect();
    assert_eq!(left, [result_ip(&r2, true), result_ip(&r2, false)]);
    site.call("DEL", "c2", &c2, &conf);
    site.call("DEL", "c2", &c2, &conf);
    assert!(site.elements().is_empty());
    // The last DEL takes the sets, their rules, the chain and the table: nothing is left.
    assert_eq!(site.ruleset(), before);

    // The same through GC: an attachment no runtime lists any more.
    site.call("ADD", "c3", &c1, &conf);
    assert_ne!(site.ruleset(), before);
    site.gc_none_valid(&conf);
    assert!(site.elements().is_empty());
    assert_eq!(site.ruleset(), before);
}

/// A DEL sent again after the address went to another container takes nothing of the
/// new holder's: its elements stay, tagged its own, and it still goes out masqueraded.
#[test]
fn a_stale_del_leaves_the_next_holder_of_the_address_alone() {
    let site = Site::new();
    let mut conf: Value = serde_json::from_str(&site.conf(true)).unwrap();
    conf["ipam"]["ranges"] =
        single_address_ranges(&[("10.78.0.0/24", "10.78.0.9"), ("fd78::/64", "fd78::9")]);
    let conf = conf.to_string();
    let (b, rb) = repeat_a_stale_del(
        |id, ns| site.call("ADD", id, ns, &conf),
        |id, netns, prev| {
            site.call_in("DEL", id, netns, &with_prev_result(&conf, prev))
                .ok();
        },
    );
    let tag = corvid_net::nftables::AttachmentTag::new("cvtmasq", "b", "eth0");
    let want: BTreeSet<(String, String)> = [true, false]
        .map(|v4| (result_ip(&rb, v4), tag.as_str().to_string()))
        .into();
    assert_eq!(site.elements(), want, "b's addresses, as b's");
    for (outside, host) in [("10.251.0.2", "10.251.0.1"), ("fd51::2", "fd51::1")] {
        assert_eq!(
            seen_source(&site.outside, &b, outside),
            host,
            "b still goes out masqueraded"
        );
    }
}

#[test]
fn sixty_four_parallel_adds_and_dels_keep_one_element_per_address() {
    let site = Site::new();
    let before = site.ruleset();
    let conf = site.conf(true);
    let containers: Vec<TestNs> = (0..64).map(|_| TestNs::new()).collect();
    let run_all = |command: &str, which: &[usize]| -> Vec<Value> {
        let children: Vec<_> = which
            .iter()
            .map(|&i| {
                site.call_in(command, &format!("p{i}"), &containers[i].path_str(), &conf)
                    .spawn()
            })
            .collect();
        children
            .into_iter()
            .map(|child| {
                let out = child.wait_with_output().unwrap();
                let text = String::from_utf8_lossy(&out.stdout).to_string();
                assert!(out.status.success(), "{command}: {text}");
                serde_json::from_str(&text).unwrap_or(Value::Null)
            })
            .collect()
    };
    let all: Vec<usize> = (0..64).collect();
    let results = run_all("ADD", &all);
    let want: BTreeSet<String> = results
        .iter()
        .flat_map(|r| [result_ip(r, true), result_ip(r, false)])
        .collect();
    assert_eq!(want.len(), 128, "distinct addresses");
    let have: BTreeSet<String> = site.elements().into_iter().map(|(a, _)| a).collect();
    assert_eq!(have, want, "exactly the live addresses");
    assert_eq!(site.elements().len(), 128, "no address twice");

    // Half leave while they come back: the map follows exactly.
    let (evens, odds): (Vec<usize>, Vec<usize>) = all.iter().partition(|i| *i % 2 == 0);
    run_all("DEL", &evens);
    let back = std::thread::scope(|s| {
        let back = s.spawn(|| run_all("ADD", &evens));
        run_all("DEL", &odds);
        back.join().unwrap()
    });
    let want: BTreeSet<String> = back
        .iter()
        .flat_map(|r| [result_ip(r, true), result_ip(r, false)])
        .collect();
    let have: BTreeSet<String> = site.elements().into_iter().map(|(a, _)| a).collect();
    assert_eq!(have, want);
    run_all("DEL", &evens);
    assert!(site.elements().is_empty(), "{:?}", site.elements());
    assert_eq!(site.ruleset(), before, "the last DELs left something");
    // GC with nothing valid has nothing to take, and says so without error.
    site.gc_none_valid(&conf);
    assert!(site.elements().is_empty());
}

#[test]
fn iptables_rules_of_docker_and_the_reference_plugins_are_left_alone() {
    let site = Site::new();
    // Docker's rules as iptables-nft writes them.
    for rule in [
        "-t nat -N DOCKER",
        "-t nat -A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE",
        "-t nat -A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER",
        "-N DOCKER-USER",
        "-A FORWARD -j DOCKER-USER",
    ] {
        let status = site
            .host
            .command("iptables-nft")
            .args(rule.split_whitespace())
            .status()
            .unwrap();
        assert!(status.success(), "iptables {rule}");
    }
    // The reference's bridge masquerades another network with iptables beside corvid.
    let reference = std::path::Path::new(REFERENCE_DIR);
    let theirs_data = tempfile::tempdir().unwrap();
    let theirs = json!({"cniVersion": "1.0.0", "name": "cvtref", "type": "bridge",
        "bridge": "cvtbrr", "isGateway": true, "ipMasq": true,
        "ipam": {"type": "host-local", "subnet": "10.79.0.0/24", "dataDir": theirs_data.path(),
            "routes": [{"dst": "0.0.0.0/0"}]}})
    .to_string();
    let call_theirs = |command: &str, ns: &TestNs| {
        Call::new(
            &site.host,
            reference.join("bridge"),
            command,
            "ref",
            &ns.path_str(),
            REFERENCE_DIR,
            &theirs,
        )
        .set("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .ok()
    };
    let (ours_ns, theirs_ns) = (TestNs::new(), TestNs::new());
    call_theirs("ADD", &theirs_ns);
    let before = site.foreign_rules();
    assert!(
        before.contains("MASQUERADE") || before.contains("masquerade"),
        "{before}"
    );
    let conf = site.conf(true);
    site.call("ADD", "ours", &ours_ns, &conf);
    assert_eq!(
        site.foreign_rules(),
        before,
        "corvid's ADD touched others' rules"
    );
    assert!(ours_ns.ping("10.251.0.2"), "corvid's container goes out");
    assert!(
        theirs_ns.ping("10.251.0.2"),
        "the reference's container goes out"
    );
    site.gc_none_valid(&conf);
    assert_eq!(
        site.foreign_rules(),
        before,
        "corvid's GC touched others' rules"
    );
    site.call("DEL", "ours", &ours_ns, &conf);
    assert_eq!(
        site.foreign_rules(),
        before,
        "corvid's DEL touched others' rules"
    );
    assert!(
        theirs_ns.ping("10.251.0.2"),
        "the reference's container still goes out"
    );
    call_theirs("DEL", &theirs_ns);
}

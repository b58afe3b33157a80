//! The service datapath for real (as root): a private host namespace with a bridge, three
//! member namespaces serving their name over TCP and UDP, and a client namespace, all on
//! the bridge; connections to a VIP are spread, kept, refused and hairpinned as the
//! services say.

#[path = "../../corvid/tests/support/ns.rs"]
mod ns;

use corvid_net::nftables::portmap::Protocol;
use corvid_net::nftables::services::{Service, Services};
use corvid_net::nftables::Nftables;
use ns::{Ns, Proc};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

fn distinct(answers: &[String]) -> BTreeSet<&str> {
    answers.iter().map(String::as_str).collect()
}

struct Site {
    host: Ns,
    members: Vec<Ns>,
    client: Ns,
    _servers: Vec<Proc>,
}

const VIP: &str = "10.96.0.10";
const UDP_VIP: &str = "10.96.0.11";

fn member_ip(i: usize) -> String {
    format!("10.210.0.{}", 11 + i)
}

fn site(tag: &str) -> Site {
    let tag = format!("cvt{}{tag}", std::process::id());
    let host = Ns::new(&tag, "h");
    host.ip("link add cvtsb type bridge");
    host.ip("addr add 10.210.0.1/24 dev cvtsb");
    host.ip("link set cvtsb up");
    host.open()
        .run(|| {
            corvid_net::sysctl::set("net/ipv4/ip_forward", "1").unwrap();
            corvid_net::sysctl::set("net/bridge/bridge-nf-call-iptables", "1").unwrap();
        })
        .unwrap();
    let attach = |ns: &Ns, i: usize, addr: &str| {
        host.ip(&format!(
            "link add cvtsv{i} type veth peer name eth0 netns {}",
            ns.name()
        ));
        host.ip(&format!("link set cvtsv{i} master cvtsb up"));
        // A pod reaching itself through a VIP gets its packet back on its own port.
        host.ip(&format!("link set cvtsv{i} type bridge_slave hairpin on"));
        ns.ip(&format!("addr add {addr}/24 dev eth0"));
        ns.ip("link set eth0 up");
        ns.ip("link set lo up");
        ns.ip("route add default via 10.210.0.1");
    };
    let members: Vec<Ns> = (0..3).map(|i| Ns::new(&tag, &format!("m{i}"))).collect();
    for (i, m) in members.iter().enumerate() {
        attach(m, i, &member_ip(i));
    }
    let client = Ns::new(&tag, "c");
    attach(&client, 9, "10.210.0.20");
    let servers = members
        .iter()
        .enumerate()
        .flat_map(|(i, m)| {
            [
                m.serve_name(&format!("m{i}"), 8080),
                m.serve_name(&format!("m{i}"), 5353),
            ]
        })
        .collect();
    Site {
        host,
        members,
        client,
        _servers: servers,
    }
}

fn service(vip: &str, protocol: Protocol, port: u16, members: &[usize]) -> Service {
    let target = if protocol == Protocol::Udp {
        5353
    } else {
        8080
    };
    Service {
        vip: vip.parse().unwrap(),
        external: Vec::new(),
        protocol,
        port,
        node_port: None,
        members: members
            .iter()
            .map(|i| (member_ip(*i).parse().unwrap(), target))
            .collect(),
        outside: Default::default(),
        affinity: None,
    }
}

fn opened(site: &Site) -> Services {
    site.host
        .open()
        .run(|| Services::open(None, Vec::new()))
        .unwrap()
        .unwrap()
}

fn no_floating() -> BTreeMap<IpAddr, IpAddr> {
    BTreeMap::new()
}

#[test]
fn connections_to_a_vip_are_spread_kept_refused_and_hairpinned() {
    let site = site("a");
    let mut services = opened(&site);
    let mut want = BTreeMap::from([
        (
            "web".to_string(),
            service(VIP, Protocol::Tcp, 80, &[0, 1, 2]),
        ),
        (
            "dns".to_string(),
            service(UDP_VIP, Protocol::Udp, 53, &[0, 1, 2]),
        ),
    ]);
    let report = services.sync(&want, &no_floating()).unwrap();
    assert_eq!(report.added, 2);

    let answers = site.client.connect(VIP, 80, 60, false);
    assert_eq!(
        distinct(&answers),
        BTreeSet::from(["m0", "m1", "m2"]),
        "{answers:?}"
    );
    let answers = site.client.connect(UDP_VIP, 53, 30, true);
    assert_eq!(
        distinct(&answers),
        BTreeSet::from(["m0", "m1", "m2"]),
        "{answers:?}"
    );

    // A pod through the VIP to itself, among others: every connection answers.
    let answers = site.members[0].connect(VIP, 80, 30, false);
    assert!(answers.iter().all(|a| a.starts_with('m')), "{answers:?}");
    assert!(answers.iter().any(|a| a == "m0"), "{answers:?}");

    // Client affinity: one member for every connection of a client.
    want.get_mut("web").unwrap().affinity = Some(Duration::from_secs(10800));
    assert_eq!(services.sync(&want, &no_floating()).unwrap().changed, 1);
    let answers = site.client.connect(VIP, 80, 20, false);
    assert_eq!(distinct(&answers).len(), 1, "{answers:?}");
    // nft 1.0.6 once aborted listing an affinity chain.
    assert_eq!(ns::nft::ruleset_problem(&site.host.path), None);

    // A member taken out is not chosen again, affinity or not.
    let kept = answers[0].clone();
    let rest: Vec<usize> = (0..3).filter(|i| format!("m{i}") != kept).collect();
    want.get_mut("web").unwrap().members = service(VIP, Protocol::Tcp, 80, &rest).members;
    services.sync(&want, &no_floating()).unwrap();
    let answers = site.client.connect(VIP, 80, 20, false);
    assert!(!answers.contains(&kept), "{kept} still chosen: {answers:?}");
    assert_eq!(distinct(&answers).len(), 1, "{answers:?}");

    // The same number of members, one replaced: its elements change, not the chain's
    // rules, and nobody stays with the one that went.
    let chosen = answers[0].clone();
    let index = |name: &str| name[1..].parse::<usize>().unwrap();
    let other = rest
        .iter()
        .copied()
        .find(|i| format!("m{i}") != chosen)
        .unwrap();
    let swapped = [other, index(&kept)];
    want.get_mut("web").unwrap().members = service(VIP, Protocol::Tcp, 80, &swapped).members;
    assert_eq!(services.sync(&want, &no_floating()).unwrap().changed, 1);
    let answers = site.client.connect(VIP, 80, 20, false);
    assert!(
        !answers.contains(&chosen),
        "{chosen} still chosen: {answers:?}"
    );
    assert_eq!(distinct(&answers).len(), 1, "{answers:?}");

    // No member: refused at once, never a black hole.
    want.get_mut("web").unwrap().members.clear();
    want.get_mut("dns").unwrap().members.clear();
    services.sync(&want, &no_floating()).unwrap();
    let start = Instant::now();
    let answers = site.client.connect(VIP, 80, 5, false);
    assert_eq!(
        distinct(&answers),
        BTreeSet::from(["refused"]),
        "{answers:?}"
    );
    assert!(start.elapsed() < Duration::from_secs(2));
    let answers = site.client.connect(UDP_VIP, 53, 1, true);
    assert_eq!(answers, ["refused"]);

    // Back to serving, then gone: nothing of the services is left in the table.
    want.get_mut("web").unwrap().members = service(VIP, Protocol::Tcp, 80, &[1]).members;
    services.sync(&want, &no_floating()).unwrap();
    assert_eq!(site.client.connect(VIP, 80, 3, false), ["m1", "m1", "m1"]);
    assert_eq!(
        services
            .sync(&BTreeMap::new(), &no_floating())
            .unwrap()
            .removed,
        2
    );
    let mut nft = site.host.open().run(Nftables::open).unwrap().unwrap();
    let chains = nft.chains().unwrap();
    assert!(
        !chains
            .iter()
            .any(|c| c.starts_with("svc-") && c != "svc-reject"),
        "{chains:?}"
    );
    for set in [
        "service-ips4",
        "service-reject4",
        "service-members4",
        "service-hairpin4",
    ] {
        assert_eq!(nft.elements(set).unwrap(), [], "{set}");
    }
    let answers = site.client.connect(VIP, 80, 1, false);
    assert!(!answers[0].starts_with('m'), "{answers:?}");
}

#[test]
fn a_udp_flow_leaves_a_member_that_went_for_one_that_serves() {
    let site = site("u");
    let mut services = opened(&site);
    let mut want = BTreeMap::from([("dns".to_string(), service(UDP_VIP, Protocol::Udp, 53, &[0]))]);
    services.sync(&want, &no_floating()).unwrap();
    // One flow, as a client that keeps sending from one socket.
    assert_eq!(site.client.udp_flow(UDP_VIP, 53, 3, 40053), ["m0"; 3]);
    // A flow straight to a member, which no service translated.
    assert_eq!(site.client.udp_flow(&member_ip(0), 5353, 1, 40054), ["m0"]);
    // m0 leaves the service (its server still answers, as a pod being deleted may) and
    // m1 comes: the flow's next exchange reaches m1. The direct flow is not touched.
    want.get_mut("dns").unwrap().members = service(UDP_VIP, Protocol::Udp, 53, &[1]).members;
    assert_eq!(services.sync(&want, &no_floating()).unwrap().forgotten, 1);
    assert_eq!(site.client.udp_flow(UDP_VIP, 53, 3, 40053), ["m1"; 3]);
    // The service gone: what it translated goes with it.
    let report = services.sync(&BTreeMap::new(), &no_floating()).unwrap();
    assert_eq!((report.removed, report.forgotten), (1, 1));
}

#[test]
fn a_new_owner_rebuilds_the_table_and_keeps_serving() {
    let site = site("b");
    let want = BTreeMap::from([("web".to_string(), service(VIP, Protocol::Tcp, 80, &[0, 1]))]);
    let mut first = opened(&site);
    first.sync(&want, &no_floating()).unwrap();
    drop(first);
    // A second owner (an agent restarted) starts from what it finds, with another set.
    let mut second = opened(&site);
    let want = BTreeMap::from([
        ("web".to_string(), service(VIP, Protocol::Tcp, 80, &[2])),
        (
            "other".to_string(),
            service(UDP_VIP, Protocol::Udp, 53, &[0]),
        ),
    ]);
    assert_eq!(second.sync(&want, &no_floating()).unwrap().added, 2);
    assert_eq!(site.client.connect(VIP, 80, 5, false), ["m2"; 5]);
    assert_eq!(site.client.connect(UDP_VIP, 53, 2, true), ["m0"; 2]);
}

#[test]
fn a_thousand_services_go_in_one_transaction_and_out_again() {
    let tag = format!("cvt{}big", std::process::id());
    let host = Ns::new(&tag, "h");
    let mut services = host
        .open()
        .run(|| Services::open(None, Vec::new()))
        .unwrap()
        .unwrap();
    let want: BTreeMap<String, Service> = (0..1000u32)
        .map(|i| {
            let vip = format!("10.96.{}.{}", i / 256, i % 256);
            let mut s = service(&vip, Protocol::Tcp, 80, &[0, 1, 2]);
            s.affinity = (i % 2 == 0).then(|| Duration::from_secs(60));
            (format!("s{i}"), s)
        })
        .collect();
    // Far more than a socket's default buffers hold, as one batch and its answers.
    assert_eq!(services.sync(&want, &no_floating()).unwrap().added, 1000);
    let mut nft = host.open().run(Nftables::open).unwrap().unwrap();
    assert_eq!(nft.elements("service-ips4").unwrap().len(), 1000);
    assert_eq!(nft.elements("service-members4").unwrap().len(), 3000);
    assert_eq!(
        services
            .sync(&BTreeMap::new(), &no_floating())
            .unwrap()
            .removed,
        1000
    );
    assert_eq!(nft.elements("service-ips4").unwrap(), []);
    assert!(!nft
        .chains()
        .unwrap()
        .iter()
        .any(|c| c.starts_with("svc-") && c != "svc-reject"));
}

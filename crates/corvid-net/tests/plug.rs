//! `ensure_plugged` against every half-made state an interrupted plug or a hand can leave,
//! for real (as root), with the host and the pod each a namespace of their own.

use corvid_net::binding::{ensure_bridge, ensure_plugged, plug, BridgeSpec, Plugged, VethSpec};
use corvid_net::link::Link;
mod support;

use ipnet::IpNet;
use std::net::IpAddr;
use support::Named;

const MAC: &str = "02:42:0a:3c:00:05";
const HOST_END: &str = "cvtp1";

struct Setup {
    host: Named,
    pod: Named,
    bridge: Link,
    addrs: Vec<IpNet>,
    routes: Vec<(IpNet, Option<IpAddr>)>,
}

impl Setup {
    fn new(tag: &str) -> Setup {
        let host = Named::new(&format!("{tag}h"));
        let pod = Named::new(&format!("{tag}p"));
        let bridge = ensure_bridge(
            &mut host.netlink(),
            &BridgeSpec {
                name: "cvtbr",
                mtu: None,
                vlan_filtering: false,
                promisc: false,
                alias: None,
                ipv6: None,
            },
        )
        .unwrap();
        host.ip("addr add 10.60.0.1/24 dev cvtbr");
        Setup {
            host,
            pod,
            bridge,
            addrs: vec!["10.60.0.5/24".parse().unwrap()],
            routes: vec![(
                "0.0.0.0/0".parse().unwrap(),
                Some("10.60.0.1".parse().unwrap()),
            )],
        }
    }

    fn spec(&self) -> VethSpec<'static> {
        VethSpec {
            ifname: "eth0",
            mtu: None,
            hairpin: false,
            vlan: None,
            keep_default_vlan: true,
            mac: Some(MAC),
            host_name: Some(HOST_END),
            alias: None,
            kept: &[],
        }
    }

    fn ensure(&self) -> corvid_net::Result<Plugged> {
        ensure_plugged(
            &mut self.host.netlink(),
            &mut self.pod.netlink(),
            &self.pod.netns(),
            &self.bridge,
            &self.spec(),
            &self.addrs,
            &self.routes,
        )
    }

    /// Only the veth pair, as an agent killed right after creating it leaves it.
    fn bare_pair(&self) {
        plug(
            &mut self.host.netlink(),
            &mut self.pod.netlink(),
            &self.pod.netns(),
            &self.bridge,
            &self.spec(),
        )
        .unwrap();
        self.pod.ip("link set eth0 down");
    }

    /// The pod side works: up, with its MAC, address and default route, and it pings.
    fn assert_works(&self) {
        let mut nl = self.pod.netlink();
        let eth0 = nl.link_by_name("eth0").unwrap().expect("eth0");
        assert!(eth0.up, "eth0 is down");
        assert_eq!(eth0.mac, MAC);
        let addrs: Vec<IpNet> = nl
            .addresses(Some(eth0.index))
            .unwrap()
            .into_iter()
            .map(|(_, a)| a)
            .filter(|a| a.addr().is_ipv4())
            .collect();
        assert_eq!(addrs, self.addrs);
        let default = nl
            .routes()
            .unwrap()
            .into_iter()
            .find(|r| r.dst.prefix_len() == 0 && r.dst.addr().is_ipv4());
        assert_eq!(default.and_then(|r| r.gw), self.routes[0].1);
        assert!(self.pod.ping("10.60.0.1"), "the gateway does not answer");
        let host_ends: Vec<String> = self
            .host
            .netlink()
            .bridge_ports(&self.bridge)
            .unwrap()
            .into_iter()
            .map(|l| l.name)
            .collect();
        assert_eq!(host_ends, [HOST_END], "one host end on the bridge");
    }
}

#[test]
fn a_missing_pair_is_plugged_and_a_whole_one_left_alone() {
    let s = Setup::new("pn");
    assert_eq!(s.ensure().unwrap(), Plugged::New { replaced: false });
    s.assert_works();
    assert_eq!(s.ensure().unwrap(), Plugged::Intact);
    s.assert_works();
}

#[test]
fn ipv6_is_off_on_the_host_end_and_on_a_pod_end_without_an_ipv6_address() {
    let mut s = Setup::new("p6");
    s.ensure().unwrap();
    let link_locals = |ns: &Named, name: &str| -> Vec<IpNet> {
        let mut nl = ns.netlink();
        let link = nl.link_by_name(name).unwrap().expect(name);
        nl.addresses(Some(link.index))
            .unwrap()
            .into_iter()
            .map(|(_, a)| a)
            .filter(|a| matches!(a.addr(), IpAddr::V6(v6) if v6.segments()[0] == 0xfe80))
            .collect()
    };
    let disabled = |ns: &Named| {
        ns.netns()
            .run(|| corvid_net::sysctl::get("net/ipv6/conf/eth0/disable_ipv6"))
            .unwrap()
            .unwrap()
    };
    // The kernel makes a link-local address as the carrier comes up, on every end that
    // has IPv6 on: neither end of an IPv4-only port has one.
    assert_eq!(link_locals(&s.pod, "eth0"), []);
    assert_eq!(link_locals(&s.host, HOST_END), []);
    assert_eq!(disabled(&s.pod), "1");
    s.assert_works();
    // The same port given an IPv6 address turns IPv6 on first, and gets its
    // link-local address with it.
    s.addrs.push("fd60::5/64".parse().unwrap());
    assert!(matches!(s.ensure().unwrap(), Plugged::Finished(_)));
    assert_eq!(disabled(&s.pod), "0");
    assert_eq!(link_locals(&s.pod, "eth0").len(), 1);
    let v6: Vec<IpNet> = s
        .pod
        .netlink()
        .addresses(None)
        .unwrap()
        .into_iter()
        .map(|(_, a)| a)
        .filter(|a| a.addr().is_ipv6() && !a.addr().is_loopback())
        .filter(|a| !matches!(a.addr(), IpAddr::V6(v6) if v6.segments()[0] == 0xfe80))
        .collect();
    assert_eq!(v6, [s.addrs[1]]);
    assert_eq!(link_locals(&s.host, HOST_END), []);
}

#[test]
fn a_bare_pair_is_finished_in_place() {
    let s = Setup::new("pb");
    s.bare_pair();
    let index = s.pod.netlink().link_by_name("eth0").unwrap().unwrap().index;
    match s.ensure().unwrap() {
        Plugged::Finished(steps) => {
            let all = steps.join("; ");
            for want in [
                "eth0 set up",
                "address 10.60.0.5/24 added",
                "route to 0.0.0.0/0",
            ] {
                assert!(all.contains(want), "{want:?} not in {all:?}");
            }
        }
        other => panic!("a bare pair gave {other:?}"),
    }
    s.assert_works();
    let again = s.pod.netlink().link_by_name("eth0").unwrap().unwrap().index;
    assert_eq!(again, index, "the pair was remade instead of finished");
}

#[test]
fn a_pod_side_changed_by_hand_is_put_back() {
    let s = Setup::new("ph");
    s.ensure().unwrap();
    s.pod.ip("addr flush dev eth0");
    s.pod.ip("addr add 10.60.0.99/24 dev eth0");
    s.pod.ip("link set eth0 down");
    assert!(matches!(s.ensure().unwrap(), Plugged::Finished(_)));
    s.assert_works();

    // A default route via another gateway is replaced; one of another network's
    // interface is kept.
    s.pod.ip("route replace default via 10.60.0.254 dev eth0");
    assert!(matches!(s.ensure().unwrap(), Plugged::Finished(_)));
    s.assert_works();

    // Another MAC on the pod's end: the pair is made anew with the right one.
    s.pod.ip("link set eth0 address 02:42:0a:3c:00:77");
    assert_eq!(s.ensure().unwrap(), Plugged::New { replaced: true });
    s.assert_works();

    // The pod's end gone with its host end left (its namespace was replaced): anew.
    s.pod.ip("link del eth0");
    let pod2 = Named::new("ph2");
    let mut nl = s.host.netlink();
    nl.add_veth(
        HOST_END,
        Some(s.bridge.index),
        "eth0",
        &pod2.netns(),
        None,
        Some(MAC),
    )
    .unwrap();
    assert_eq!(s.ensure().unwrap(), Plugged::New { replaced: true });
    s.assert_works();
    assert!(pod2.netlink().link_by_name("eth0").unwrap().is_none());
}

#[test]
fn a_foreign_interface_with_the_name_is_refused_and_kept() {
    let s = Setup::new("pf");
    s.pod.ip("link add eth0 type bridge");
    let err = s.ensure().unwrap_err();
    assert_eq!(err.errno(), Some(libc::EEXIST), "{err}");
    assert!(err.to_string().contains("not its peer"), "{err}");
    let kept = s.pod.netlink().link_by_name("eth0").unwrap().unwrap();
    assert_eq!(kept.kind, corvid_net::link::LinkKind::Bridge);
    assert!(s.host.netlink().link_by_name(HOST_END).unwrap().is_none());
}

#[test]
fn a_full_bridge_is_named_as_the_reason() {
    let s = Setup::new("cvtfull");
    // A Linux bridge takes 1,024 ports: fill it with veth pairs made in one batch.
    let batch: String = (0..1024)
        .map(|i| format!("link add cvtf{i} master cvtbr type veth peer name cvtg{i}\n"))
        .collect();
    let mut ip = std::process::Command::new("ip")
        .args(["-n", &s.host.0, "-batch", "-"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    use std::io::Write;
    ip.stdin
        .take()
        .unwrap()
        .write_all(batch.as_bytes())
        .unwrap();
    let out = ip.wait_with_output().unwrap();
    // The batch stops at the first port too many.
    assert!(!out.status.success(), "1,024 ports were taken");
    let err = s.ensure().unwrap_err().to_string();
    assert!(err.contains("1,024 ports a Linux bridge can take"), "{err}");
    assert!(
        s.pod.netlink().link_by_name("eth0").unwrap().is_none(),
        "half a pair left in the pod"
    );
}

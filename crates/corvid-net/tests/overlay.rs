//! The overlay's kernel effects, in a namespace of their own (as root): a vxlan device on
//! a bridge, FDB and neighbour entries added, listed and removed; bridges with and
//! without the host's IPv6.

use corvid_net::binding::{ensure_bridge, BridgeSpec};
use corvid_net::link::LinkKind;
use corvid_net::overlay::{FdbEntry, NeighbourEntry, VxlanSpec};
use corvid_net::{Netlink, Netns};
use std::collections::BTreeSet;

struct Named(std::path::PathBuf);

impl Drop for Named {
    fn drop(&mut self) {
        let _ = Netns::delete_path(&self.0);
    }
}

#[test]
fn vxlan_fdb_and_neighbours_round_trip() {
    let ns = Named(Netns::create_named(&format!("cvt{}-vx", std::process::id())).unwrap());
    // In the namespace: the IPv6 switch goes through the thread's /proc/sys.
    let _in = Netns::open(&ns.0).unwrap().enter().unwrap();
    let mut nl = Netlink::open().unwrap();
    let bridge = ensure_bridge(
        &mut nl,
        &BridgeSpec {
            name: "cvtbr",
            mtu: Some(1450),
            vlan_filtering: false,
            promisc: false,
            alias: None,
            ipv6: None,
        },
    )
    .unwrap();
    nl.add_vxlan(&VxlanSpec {
        name: "cvtvx",
        vni: 4242,
        local: "10.98.0.1".parse().unwrap(),
        master: bridge.index,
        mtu: Some(1450),
    })
    .unwrap();
    let vx = nl.link_by_name("cvtvx").unwrap().unwrap();
    assert_eq!(vx.kind, LinkKind::Vxlan);
    assert_eq!(vx.master, Some(bridge.index));
    assert!(vx.up);
    // A bridge port: the host's IPv6 is off on it, so it has no link-local address.
    assert_eq!(
        corvid_net::sysctl::get("net/ipv6/conf/cvtvx/disable_ipv6").unwrap(),
        "1"
    );
    assert!(nl
        .addresses(Some(vx.index))
        .unwrap()
        .iter()
        .all(|(_, a)| a.addr().is_ipv4()));

    let fdb = FdbEntry {
        mac: "fa:16:3e:00:00:07".into(),
        dst: "10.98.0.2".parse().unwrap(),
    };
    nl.add_fdb(&vx, &fdb).unwrap();
    nl.add_fdb(&vx, &fdb).unwrap();
    assert_eq!(nl.fdb(&vx).unwrap(), BTreeSet::from([fdb.clone()]));
    let neighbour = NeighbourEntry {
        ip: "10.60.0.7".parse().unwrap(),
        mac: "fa:16:3e:00:00:07".into(),
    };
    nl.set_neighbour(&vx, &neighbour).unwrap();
    assert_eq!(
        nl.neighbours(&vx).unwrap(),
        BTreeSet::from([neighbour.clone()])
    );

    nl.delete_fdb(&vx, &fdb).unwrap();
    nl.delete_fdb(&vx, &fdb).unwrap();
    nl.delete_neighbour(&vx, &neighbour).unwrap();
    assert!(nl.fdb(&vx).unwrap().is_empty());
    assert!(nl.neighbours(&vx).unwrap().is_empty());
    assert!(nl
        .add_fdb(
            &vx,
            &FdbEntry {
                mac: "not-a-mac".into(),
                dst: fdb.dst
            }
        )
        .is_err());
}

#[test]
fn bridges_follow_their_ipv6_setting() {
    let ns = Named(Netns::create_named(&format!("cvt{}-v6", std::process::id())).unwrap());
    let _in = Netns::open(&ns.0).unwrap().enter().unwrap();
    let mut nl = Netlink::open().unwrap();
    let spec = |ipv6| BridgeSpec {
        name: "cvtbr6",
        mtu: None,
        vlan_filtering: false,
        promisc: false,
        alias: None,
        ipv6,
    };
    let link_local = |nl: &mut Netlink, index| {
        nl.addresses(Some(index))
            .unwrap()
            .iter()
            .any(|(_, a)| a.addr().is_ipv6())
    };
    let disabled = || corvid_net::sysctl::get("net/ipv6/conf/cvtbr6/disable_ipv6").unwrap();

    // Made without IPv6: up, and never given a link-local address, even with a port
    // giving it a carrier.
    let bridge = ensure_bridge(&mut nl, &spec(Some(false))).unwrap();
    assert!(bridge.up);
    nl.add_vxlan(&VxlanSpec {
        name: "cvtvx6",
        vni: 4243,
        local: "10.98.0.1".parse().unwrap(),
        master: bridge.index,
        mtu: None,
    })
    .unwrap();
    assert_eq!(disabled(), "1");
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(!link_local(&mut nl, bridge.index));

    // Asked for IPv6 later (an IPv6 subnet came): it gets it.
    let bridge = ensure_bridge(&mut nl, &spec(Some(true))).unwrap();
    assert_eq!(disabled(), "0");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !link_local(&mut nl, bridge.index) {
        assert!(
            std::time::Instant::now() < deadline,
            "no IPv6 link-local address"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }

    // No word: the setting is left as it is.
    ensure_bridge(&mut nl, &spec(None)).unwrap();
    assert_eq!(disabled(), "0");
    ensure_bridge(&mut nl, &spec(Some(false))).unwrap();
    assert_eq!(disabled(), "1");
    assert!(!link_local(&mut nl, bridge.index));
}

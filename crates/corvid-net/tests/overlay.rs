//! The overlay's kernel effects, in a namespace of their own (as root): a vxlan device on
//! a bridge, FDB and neighbour entries added, listed and removed.

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
    let mut nl = Netlink::open_in(&Netns::open(&ns.0).unwrap()).unwrap();
    let bridge = ensure_bridge(
        &mut nl,
        &BridgeSpec {
            name: "cvtbr",
            mtu: Some(1450),
            vlan_filtering: false,
            promisc: false,
            alias: None,
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

//! The floor of a member joining a group, for the benchmarks that time it end to end:
//! the same one-element change of a member set, bare through corvid-net.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Instant;

use super::cluster::ns::{median, Ns};
use corvid_net::nftables::security_groups::{
    Group, PortFilter, Remote, Rule, SecurityGroups, Touched, Want,
};

/// The bare floor: one member added to and removed from a set of `members` addresses
/// that a port's group names, through corvid-net in a namespace of its own; the median
/// time of one such change.
pub fn bare_member_change(tag: &str, members: usize, samples: usize) -> f64 {
    let host = Ns::new(tag, &format!("bare{members}"));
    let mut sg = host.open().run(SecurityGroups::open).unwrap().unwrap();
    let mut want = Want::default();
    want.ports.insert(
        "p".into(),
        PortFilter {
            ifname: "cvpbench".into(),
            bridge: "cvbbench".into(),
            mac: [2, 0, 0, 0, 0, 1],
            sources: vec![],
            groups: vec!["srv".into()],
            stateful: true,
        },
    );
    want.groups.insert(
        "srv".into(),
        Group {
            ingress: vec![Rule {
                v6: false,
                protocol: Some(17),
                ports: Some((5353, 5353)),
                icmp: None,
                remote: Remote::Group("clients".into()),
            }],
            egress: vec![],
        },
    );
    let address = |i: usize| IpAddr::V4(Ipv4Addr::from(0x0a46_0000 + i as u32));
    want.members
        .insert("clients".into(), (0..members).map(address).collect());
    host.open().run(|| sg.sync(&want)).unwrap().unwrap();
    let mut times = Vec::new();
    let touched = Touched {
        members: [("clients".to_string(), address(members))].into(),
        ..Touched::default()
    };
    for _ in 0..samples {
        for join in [true, false] {
            let set = want.members.get_mut("clients").unwrap();
            if join {
                set.insert(address(members));
            } else {
                set.remove(&address(members));
            }
            let start = Instant::now();
            host.open()
                .run(|| sg.sync_touched(&want, Some(&touched)))
                .unwrap()
                .unwrap();
            if join {
                times.push(start.elapsed().as_secs_f64() * 1e3);
            }
        }
    }
    median(times)
}

//! Address management over subnets as pure functions: Neutron's defaults for gateways and
//! allocation pools, picking a free address, carving subnets out of a subnetpool.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use corvid_api::AllocationPool;

use crate::error::NeutronError;
use ipnet::IpNet;

use crate::util::random_below;

fn to_int(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u32::from(a) as u128,
        IpAddr::V6(a) => u128::from(a),
    }
}

fn from_int(v6: bool, n: u128) -> IpAddr {
    if v6 {
        IpAddr::V6(Ipv6Addr::from(n))
    } else {
        IpAddr::V4(Ipv4Addr::from(n as u32))
    }
}

/// The gateway Neutron picks when none is given: the first address after the network's.
pub fn default_gateway(cidr: &IpNet) -> IpAddr {
    from_int(cidr.addr().is_ipv6(), to_int(cidr.network()) + 1)
}

/// Neutron's default pools: every host address of the prefix except the gateway (IPv4
/// also keeps the network and broadcast addresses out).
pub fn default_pools(cidr: &IpNet, gateway: Option<IpAddr>) -> Vec<AllocationPool> {
    let v6 = cidr.addr().is_ipv6();
    let first = to_int(cidr.network()) + 1;
    let last = if v6 {
        to_int(cidr.broadcast())
    } else {
        to_int(cidr.broadcast()).saturating_sub(1)
    };
    let mut pools = Vec::new();
    let mut push = |a: u128, b: u128| {
        if a <= b {
            pools.push(AllocationPool {
                start: from_int(v6, a),
                end: from_int(v6, b),
            })
        }
    };
    match gateway.map(to_int).filter(|g| (first..=last).contains(g)) {
        Some(g) => {
            if g > first {
                push(first, g - 1);
            }
            push(g + 1, last);
        }
        None => push(first, last),
    }
    pools
}

/// Whether `ip` is inside one of `pools`.
pub fn in_pools(pools: &[AllocationPool], ip: IpAddr) -> bool {
    let n = to_int(ip);
    pools.iter().any(|p| {
        p.start.is_ipv4() == ip.is_ipv4() && (to_int(p.start)..=to_int(p.end)).contains(&n)
    })
}

/// Checks that pools lie inside `cidr`, are ordered start <= end, and do not overlap.
pub fn check_pools(cidr: &IpNet, pools: &[AllocationPool]) -> Result<(), NeutronError> {
    let mut spans: Vec<(u128, u128)> = Vec::new();
    for p in pools {
        if !cidr.contains(&p.start) || !cidr.contains(&p.end) || to_int(p.start) > to_int(p.end) {
            return Err(NeutronError::bad_request(format!(
                "The allocation pool {}-{} spans beyond the subnet cidr {cidr}",
                p.start, p.end
            )));
        }
        spans.push((to_int(p.start), to_int(p.end)));
    }
    spans.sort();
    if spans.windows(2).any(|w| w[1].0 <= w[0].1) {
        return Err(NeutronError::bad_request(
            "Found overlapping allocation pools",
        ));
    }
    Ok(())
}

/// Picks a free address from `pools`, scanning on from `after` (the address picked last
/// there, so consecutive picks sit together), or from a random point when there is none,
/// so pickers on other controllers rarely collide; `free` says whether an address can be
/// taken.
pub fn pick(
    pools: &[AllocationPool],
    after: Option<IpAddr>,
    mut free: impl FnMut(IpAddr) -> bool,
) -> Option<IpAddr> {
    let spans: Vec<(bool, u128, u128)> = pools
        .iter()
        .map(|p| {
            (
                p.start.is_ipv6(),
                to_int(p.start),
                to_int(p.end) - to_int(p.start) + 1,
            )
        })
        .collect();
    let total: u128 = spans.iter().map(|s| s.2).sum();
    if total == 0 {
        return None;
    }
    let at = |mut i: u128| {
        for (v6, start, len) in &spans {
            if i < *len {
                return from_int(*v6, start + i);
            }
            i -= len;
        }
        from_int(false, 0)
    };
    let index_of = |ip: IpAddr| {
        let n = to_int(ip);
        let mut before = 0;
        for (v6, start, len) in &spans {
            if *v6 == ip.is_ipv6() && (*start..start + len).contains(&n) {
                return Some(before + n - start);
            }
            before += len;
        }
        None
    };
    let offset = match after.and_then(index_of) {
        Some(i) => (i + 1) % total,
        None => random_below(total),
    };
    const SCAN_LIMIT: u128 = 1 << 20;
    if total <= SCAN_LIMIT {
        (0..total)
            .map(|k| at((offset + k) % total))
            .find(|ip| free(*ip))
    } else {
        // Too large to scan whole (IPv6): a short scan on, then random probes, which
        // almost always hit a free address.
        (0..4096)
            .map(|k| at((offset + k) % total))
            .chain((0..4096).map(|_| at(random_below(total))))
            .find(|ip| free(*ip))
    }
}

/// Whether two prefixes share any address.
pub fn overlaps(a: &IpNet, b: &IpNet) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// The first prefix of length `len` inside `prefixes` that overlaps none of `taken`.
pub fn carve(prefixes: &[IpNet], taken: &[IpNet], len: u8) -> Option<IpNet> {
    prefixes
        .iter()
        .filter(|p| p.prefix_len() <= len)
        .filter_map(|p| p.subnets(len).ok())
        .flatten()
        .find(|c| !taken.iter().any(|t| overlaps(c, t)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn defaults_match_neutron() {
        let c = net("10.0.0.0/24");
        let gw = default_gateway(&c);
        assert_eq!(gw.to_string(), "10.0.0.1");
        let p = default_pools(&c, Some(gw));
        assert_eq!(p.len(), 1);
        assert_eq!(
            (p[0].start.to_string(), p[0].end.to_string()),
            ("10.0.0.2".into(), "10.0.0.254".into())
        );
        let no_gw = default_pools(&c, None);
        assert_eq!(no_gw[0].start.to_string(), "10.0.0.1");
        let mid = default_pools(&c, Some("10.0.0.100".parse().unwrap()));
        assert_eq!(mid.len(), 2);
        assert_eq!(mid[0].end.to_string(), "10.0.0.99");
        assert_eq!(mid[1].start.to_string(), "10.0.0.101");
        let v6 = default_pools(&net("fd00::/64"), Some(default_gateway(&net("fd00::/64"))));
        assert_eq!(v6[0].start.to_string(), "fd00::2");
        assert_eq!(v6[0].end.to_string(), "fd00::ffff:ffff:ffff:ffff");
    }

    #[test]
    fn pick_finds_every_address_then_none() {
        let pools = default_pools(&net("10.1.0.0/29"), None);
        let mut taken = HashSet::new();
        while let Some(ip) = pick(&pools, None, |ip| !taken.contains(&ip)) {
            assert!(in_pools(&pools, ip));
            taken.insert(ip);
        }
        assert_eq!(taken.len(), 6);
    }

    #[test]
    fn pick_goes_on_after_the_last_pick_and_wraps() {
        let pools = default_pools(&net("10.1.0.0/24"), Some("10.1.0.100".parse().unwrap()));
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let next = |after: &str| pick(&pools, Some(ip(after)), |_| true).unwrap().to_string();
        assert_eq!(next("10.1.0.7"), "10.1.0.8");
        assert_eq!(
            next("10.1.0.99"),
            "10.1.0.101",
            "skips the gateway between pools"
        );
        assert_eq!(next("10.1.0.254"), "10.1.0.1", "wraps to the first pool");
        let taken = [ip("10.1.0.8"), ip("10.1.0.9")];
        let got = pick(&pools, Some(ip("10.1.0.7")), |a| !taken.contains(&a));
        assert_eq!(got, Some(ip("10.1.0.10")));
    }

    #[test]
    fn carve_skips_taken_prefixes() {
        let prefixes = [net("10.10.0.0/16")];
        let first = carve(&prefixes, &[], 26).unwrap();
        assert_eq!(first, net("10.10.0.0/26"));
        let second = carve(&prefixes, &[first, net("10.10.0.64/26")], 24).unwrap();
        assert_eq!(second, net("10.10.1.0/24"));
        assert_eq!(carve(&prefixes, &[net("10.10.0.0/16")], 24), None);
    }

    #[test]
    fn bad_pools_are_refused() {
        let c = net("10.0.0.0/24");
        let p = |a: &str, b: &str| AllocationPool {
            start: a.parse().unwrap(),
            end: b.parse().unwrap(),
        };
        assert!(check_pools(&c, &[p("10.0.0.2", "10.0.0.9")]).is_ok());
        assert!(check_pools(&c, &[p("10.0.0.2", "10.0.1.9")]).is_err());
        assert!(check_pools(&c, &[p("10.0.0.9", "10.0.0.2")]).is_err());
        assert!(check_pools(&c, &[p("10.0.0.2", "10.0.0.9"), p("10.0.0.5", "10.0.0.20")]).is_err());
    }
}

//! Ranges and range sets, canonicalized with the reference plugin's defaults: gateway the
//! first address, start after the network address, end before the IPv4 broadcast.

use crate::Error;
use ipnet::IpNet;
use serde::Deserialize;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A range as configured (`subnet`, `rangeStart`, `rangeEnd`, `gateway`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RangeConf {
    /// The subnet in CIDR form.
    pub subnet: String,
    /// First address to hand out.
    #[serde(default)]
    pub range_start: Option<String>,
    /// Last address to hand out.
    #[serde(default)]
    pub range_end: Option<String>,
    /// The gateway; never handed out.
    #[serde(default)]
    pub gateway: Option<String>,
}

/// A canonical range: every field set and checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Range {
    /// The subnet (network address, prefix).
    pub subnet: IpNet,
    /// First address to hand out.
    pub start: IpAddr,
    /// Last address to hand out.
    pub end: IpAddr,
    /// The gateway.
    pub gateway: IpAddr,
}

pub(crate) fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v) => u32::from(v) as u128,
        IpAddr::V6(v) => u128::from(v),
    }
}

fn from_u128(v: u128, like: IpAddr) -> IpAddr {
    match like {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::from(v as u32)),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::from(v)),
    }
}

fn parse_ip(field: &str, s: &str) -> Result<IpAddr, Error> {
    s.parse()
        .map_err(|_| Error::InvalidRange(format!("{field} \"{s}\" is not an IP address")))
}

impl Range {
    /// Checks and completes a configured range.
    pub fn from_conf(c: &RangeConf) -> Result<Range, Error> {
        let subnet: IpNet = c.subnet.parse().map_err(|_| {
            Error::InvalidRange(format!("subnet \"{}\" is not in CIDR form", c.subnet))
        })?;
        if subnet.prefix_len() > subnet.max_prefix_len() - 2 {
            return Err(Error::InvalidRange(format!(
                "network {subnet} is too small to allocate from"
            )));
        }
        if subnet.addr() != subnet.network() {
            return Err(Error::InvalidRange(format!(
                "network {subnet} has host bits set; for a /{} the network address is {}",
                subnet.prefix_len(),
                subnet.network()
            )));
        }
        let net = to_u128(subnet.network());
        let family_ok = |ip: IpAddr| ip.is_ipv4() == subnet.addr().is_ipv4();
        let in_subnet = |field: &str, ip: IpAddr| {
            if family_ok(ip) && subnet.contains(&ip) {
                Ok(ip)
            } else {
                Err(Error::InvalidRange(format!(
                    "{field} {ip} is not in network {subnet}"
                )))
            }
        };
        let gateway = match &c.gateway {
            Some(g) => {
                let g = parse_ip("gateway", g)?;
                if !family_ok(g) {
                    return Err(Error::InvalidRange(format!(
                        "gateway {g} is not of the family of {subnet}"
                    )));
                }
                g
            }
            None => from_u128(net + 1, subnet.addr()),
        };
        let start = match &c.range_start {
            Some(s) => in_subnet("rangeStart", parse_ip("rangeStart", s)?)?,
            None => from_u128(net + 1, subnet.addr()),
        };
        let end = match &c.range_end {
            Some(s) => in_subnet("rangeEnd", parse_ip("rangeEnd", s)?)?,
            None => {
                let last = to_u128(subnet.broadcast());
                from_u128(
                    if subnet.addr().is_ipv4() {
                        last - 1
                    } else {
                        last
                    },
                    subnet.addr(),
                )
            }
        };
        if to_u128(start) > to_u128(end) {
            return Err(Error::InvalidRange(format!(
                "rangeStart {start} is after rangeEnd {end}"
            )));
        }
        Ok(Range {
            subnet,
            start,
            end,
            gateway,
        })
    }

    /// True when `ip` lies between start and end.
    pub fn contains(&self, ip: IpAddr) -> bool {
        ip.is_ipv4() == self.start.is_ipv4()
            && (to_u128(self.start)..=to_u128(self.end)).contains(&to_u128(ip))
    }

    fn overlaps(&self, other: &Range) -> bool {
        self.start.is_ipv4() == other.start.is_ipv4()
            && to_u128(self.start) <= to_u128(other.end)
            && to_u128(other.start) <= to_u128(self.end)
    }

    /// `ip` with this range's prefix length, as a result carries it.
    pub fn with_prefix(&self, ip: IpAddr) -> IpNet {
        IpNet::new(ip, self.subnet.prefix_len()).expect("prefix comes from a valid subnet")
    }
}

/// Ranges from which one address is allocated (one address per set per container).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeSet(pub Vec<Range>);

impl fmt::Display for RangeSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|r| format!("{}-{}", r.start, r.end))
            .collect();
        f.write_str(&parts.join(","))
    }
}

impl RangeSet {
    /// Checks a set: not empty, one family, no overlaps.
    pub fn new(ranges: Vec<Range>) -> Result<RangeSet, Error> {
        let first = ranges
            .first()
            .ok_or_else(|| Error::InvalidRange("empty range set".into()))?;
        for (i, r) in ranges.iter().enumerate() {
            if r.start.is_ipv4() != first.start.is_ipv4() {
                return Err(Error::InvalidRange(
                    "a range set mixes IPv4 and IPv6".into(),
                ));
            }
            if let Some(o) = ranges[..i].iter().find(|o| o.overlaps(r)) {
                return Err(Error::InvalidRange(format!(
                    "range {} overlaps {}",
                    r.subnet, o.subnet
                )));
            }
        }
        Ok(RangeSet(ranges))
    }

    /// The range holding `ip`, if any.
    pub fn range_for(&self, ip: IpAddr) -> Option<&Range> {
        self.0.iter().find(|r| r.contains(ip))
    }

    /// True when two sets share an address.
    pub fn overlaps(&self, other: &RangeSet) -> bool {
        self.0.iter().any(|a| other.0.iter().any(|b| a.overlaps(b)))
    }

    fn is_gateway(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|r| r.gateway == ip)
    }

    /// The next free address after `last` (or from the start), in round-robin order over
    /// the set's ranges, skipping gateways and whatever `taken` reports.
    pub fn next_free(
        &self,
        last: Option<IpAddr>,
        mut taken: impl FnMut(IpAddr) -> bool,
    ) -> Option<(IpAddr, &Range)> {
        let ranges = &self.0;
        let n = ranges.len();
        let (mut ri, mut cur) =
            match last.and_then(|l| ranges.iter().position(|r| r.contains(l)).map(|i| (i, l))) {
                Some((i, l)) if to_u128(l) < to_u128(ranges[i].end) => (i, to_u128(l) + 1),
                Some((i, _)) => ((i + 1) % n, to_u128(ranges[(i + 1) % n].start)),
                None => (0, to_u128(ranges[0].start)),
            };
        let total: u128 = ranges
            .iter()
            .map(|r| to_u128(r.end) - to_u128(r.start) + 1)
            .fold(0u128, |a, b| a.saturating_add(b));
        let mut seen: u128 = 0;
        while seen < total {
            let ip = from_u128(cur, ranges[ri].start);
            if !self.is_gateway(ip) && !taken(ip) {
                return Some((ip, &ranges[ri]));
            }
            seen += 1;
            if cur >= to_u128(ranges[ri].end) {
                ri = (ri + 1) % n;
                cur = to_u128(ranges[ri].start);
            } else {
                cur += 1;
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(subnet: &str) -> RangeConf {
        RangeConf {
            subnet: subnet.into(),
            ..RangeConf::default()
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn defaults_follow_the_reference() {
        let r = Range::from_conf(&conf("10.1.0.0/24")).unwrap();
        assert_eq!(
            (r.start, r.end, r.gateway),
            (ip("10.1.0.1"), ip("10.1.0.254"), ip("10.1.0.1"))
        );
        let r6 = Range::from_conf(&conf("fd00::/120")).unwrap();
        assert_eq!((r6.start, r6.end), (ip("fd00::1"), ip("fd00::ff")));
    }

    #[test]
    fn bad_ranges_are_refused() {
        for (c, why) in [
            (conf("10.1.0.0/31"), "too small"),
            (conf("10.1.0.0/32"), "too small"),
            (conf("fd00::/127"), "too small"),
            (conf("10.1.0.5/24"), "host bits"),
            (conf("nonsense"), "CIDR"),
            (
                RangeConf {
                    range_start: Some("10.2.0.5".into()),
                    ..conf("10.1.0.0/24")
                },
                "not in network",
            ),
            (
                RangeConf {
                    range_end: Some("10.1.1.5".into()),
                    ..conf("10.1.0.0/24")
                },
                "not in network",
            ),
            (
                RangeConf {
                    range_start: Some("10.1.0.50".into()),
                    range_end: Some("10.1.0.40".into()),
                    ..conf("10.1.0.0/24")
                },
                "after",
            ),
            (
                RangeConf {
                    gateway: Some("fd00::1".into()),
                    ..conf("10.1.0.0/24")
                },
                "family",
            ),
        ] {
            let e = Range::from_conf(&c).unwrap_err().to_string();
            assert!(e.contains(why), "{c:?}: {e}");
        }
    }

    #[test]
    fn sets_refuse_overlap_and_mixed_families() {
        let a = Range::from_conf(&conf("10.1.0.0/24")).unwrap();
        let b = Range::from_conf(&conf("10.1.0.0/25")).unwrap();
        let c = Range::from_conf(&conf("fd00::/64")).unwrap();
        assert!(RangeSet::new(vec![a.clone(), b]).is_err());
        assert!(RangeSet::new(vec![a.clone(), c]).is_err());
        assert!(RangeSet::new(vec![]).is_err());
        assert!(RangeSet::new(vec![a]).is_ok());
    }

    #[test]
    fn rotates_after_the_last_reserved_and_wraps() {
        let set = RangeSet::new(vec![Range::from_conf(&RangeConf {
            range_start: Some("10.1.0.10".into()),
            range_end: Some("10.1.0.12".into()),
            ..conf("10.1.0.0/24")
        })
        .unwrap()])
        .unwrap();
        assert_eq!(set.next_free(None, |_| false).unwrap().0, ip("10.1.0.10"));
        assert_eq!(
            set.next_free(Some(ip("10.1.0.10")), |_| false).unwrap().0,
            ip("10.1.0.11")
        );
        assert_eq!(
            set.next_free(Some(ip("10.1.0.12")), |_| false).unwrap().0,
            ip("10.1.0.10")
        );
        assert_eq!(
            set.next_free(Some(ip("10.9.9.9")), |_| false).unwrap().0,
            ip("10.1.0.10")
        );
        let taken = |i: IpAddr| i != ip("10.1.0.11");
        assert_eq!(
            set.next_free(Some(ip("10.1.0.11")), taken).unwrap().0,
            ip("10.1.0.11")
        );
        assert!(set.next_free(None, |_| true).is_none());
    }

    #[test]
    fn skips_gateways_and_moves_across_ranges() {
        // Each /30 holds .1 (the gateway) and .2: one address per range.
        let a = Range::from_conf(&conf("10.1.0.0/30")).unwrap();
        let b = Range::from_conf(&conf("10.2.0.0/30")).unwrap();
        let set = RangeSet::new(vec![a, b]).unwrap();
        let mut got = Vec::new();
        let mut last = None;
        while let Some((ip, _)) = set.next_free(last, |i| got.contains(&i)) {
            got.push(ip);
            last = Some(ip);
        }
        assert_eq!(got, vec![ip("10.1.0.2"), ip("10.2.0.2")]);
    }
}

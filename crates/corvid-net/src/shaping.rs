//! Rate limits with tc through rtnetlink: a token bucket (tbf) as a link's root qdisc,
//! and an ifb device that a link's ingress is redirected to (matchall + mirred), so that
//! what enters the link can be shaped as the ifb's egress. The bandwidth plugin's
//! datapath.

use crate::link::Link;
use crate::netlink::Netlink;
use crate::{netlink_err, Result};
use netlink_packet_core::{DefaultNla, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL};
use netlink_packet_route::link::{InfoKind, LinkAttribute, LinkInfo};
use netlink_packet_route::tc::{
    TcAction, TcActionAttribute, TcActionGeneric, TcActionMirrorOption, TcActionOption,
    TcActionType, TcAttribute, TcFilterU32Option, TcHandle, TcHeader, TcMessage, TcMirror,
    TcMirrorActionType, TcOption, TcU32Key, TcU32Selector, TcU32SelectorFlags,
};
use netlink_packet_route::RouteNetlinkMessage;

/// A token bucket: `rate` bytes per second with bursts of `burst` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenBucket {
    /// Bytes per second.
    pub rate: u64,
    /// Bytes that may go at once.
    pub burst: u32,
}

/// How long a packet may wait in the bucket's queue, as the reference sets it.
const LATENCY_MS: u64 = 25;
const TCA_TBF_PARMS: u16 = 1;
const TCA_TBF_RATE64: u16 = 4;
const TCA_TBF_BURST: u16 = 6;
/// The kernel's scheduler clock: one tick is 64 ns.
const PSCHED_SHIFT: u32 = 6;
/// ETH_P_ALL in network order, as tc filters take the protocol.
const ALL_PROTOCOLS: u32 = 0x0300;

/// The (type, value) of each netlink attribute packed in `buf`.
fn nested(buf: &[u8]) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    let mut rest = buf;
    while rest.len() >= 4 {
        let len = usize::from(u16::from_ne_bytes([rest[0], rest[1]]));
        let kind = u16::from_ne_bytes([rest[2], rest[3]]) & 0x3fff;
        if len < 4 || len > rest.len() {
            break;
        }
        out.push((kind, &rest[4..len]));
        rest = rest.get((len + 3) & !3..).unwrap_or_default();
    }
    out
}

/// `struct tc_tbf_qopt`: the rate (a `tc_ratespec`), no peak rate, the queue limit,
/// the bucket size in scheduler ticks and no MTU.
fn tbf_parms(bucket: TokenBucket) -> Vec<u8> {
    let mut out = Vec::with_capacity(36);
    // tc_ratespec: cell_log, linklayer (ethernet), overhead, cell_align, mpu, rate
    out.extend([0u8, 1]);
    out.extend(0u16.to_ne_bytes());
    out.extend((-1i16).to_ne_bytes());
    out.extend(0u16.to_ne_bytes());
    out.extend((bucket.rate.min(u64::from(u32::MAX)) as u32).to_ne_bytes());
    out.extend([0u8; 12]);
    let limit = bucket.rate * LATENCY_MS / 1000 + u64::from(bucket.burst);
    out.extend((limit.min(u64::from(u32::MAX)) as u32).to_ne_bytes());
    let buffer_ns = u64::from(bucket.burst) * 1_000_000_000 / bucket.rate.max(1);
    out.extend(((buffer_ns >> PSCHED_SHIFT).min(u64::from(u32::MAX)) as u32).to_ne_bytes());
    out.extend(0u32.to_ne_bytes());
    out
}

fn qdisc(link: &Link, handle: TcHandle, parent: TcHandle, kind: &str) -> TcMessage {
    let mut m = TcMessage::with_index(link.index as i32);
    m.header.handle = handle;
    m.header.parent = parent;
    m.attributes.push(TcAttribute::Kind(kind.into()));
    m
}

impl Netlink {
    /// Makes `bucket` the root qdisc of `link`, replacing what was there.
    pub fn set_token_bucket(&mut self, link: &Link, bucket: TokenBucket) -> Result<()> {
        let mut m = qdisc(link, TcHandle { major: 1, minor: 0 }, TcHandle::ROOT, "tbf");
        let mut options = vec![
            TcOption::Other(DefaultNla::new(TCA_TBF_PARMS, tbf_parms(bucket))),
            TcOption::Other(DefaultNla::new(
                TCA_TBF_BURST,
                bucket.burst.to_ne_bytes().to_vec(),
            )),
        ];
        if bucket.rate > u64::from(u32::MAX) {
            options.push(TcOption::Other(DefaultNla::new(
                TCA_TBF_RATE64,
                bucket.rate.to_ne_bytes().to_vec(),
            )));
        }
        m.attributes.push(TcAttribute::Options(options));
        self.request(
            RouteNetlinkMessage::NewQueueDiscipline(m),
            NLM_F_CREATE | netlink_packet_core::NLM_F_REPLACE | NLM_F_ACK,
        )
        .map(drop)
        .map_err(netlink_err(format!("shape {} with tbf", link.name)))
    }

    /// The token bucket at the root of `link`, if there is one.
    pub fn token_bucket(&mut self, link: &Link) -> Result<Option<TokenBucket>> {
        let replies = self
            .request(
                RouteNetlinkMessage::GetQueueDiscipline(TcMessage::with_index(link.index as i32)),
                NLM_F_DUMP,
            )
            .map_err(netlink_err(format!("list the qdiscs of {}", link.name)))?;
        for r in replies {
            let RouteNetlinkMessage::NewQueueDiscipline(m) = r else {
                continue;
            };
            if m.header.index != link.index as i32 || m.header.parent != TcHandle::ROOT {
                continue;
            }
            if !m.attributes.contains(&TcAttribute::Kind("tbf".into())) {
                continue;
            }
            // The crate keeps an unknown kind's options whole: TCA_OPTIONS holding the
            // tbf attributes.
            let mut rate = None;
            let mut rate64 = None;
            let mut buffer_ticks = 0u64;
            for o in m.attributes.iter().filter_map(|a| match a {
                TcAttribute::Options(o) => Some(o),
                _ => None,
            }) {
                for o in o {
                    let TcOption::Other(nla) = o else { continue };
                    let mut value = vec![0; netlink_packet_core::Nla::value_len(nla)];
                    netlink_packet_core::Nla::emit_value(nla, &mut value);
                    for (kind, v) in nested(&value) {
                        match kind {
                            TCA_TBF_PARMS if v.len() >= 32 => {
                                let word = |at: usize| {
                                    u32::from_ne_bytes(v[at..at + 4].try_into().expect("4 bytes"))
                                };
                                rate = Some(u64::from(word(8)));
                                buffer_ticks = u64::from(word(28));
                            }
                            TCA_TBF_RATE64 if v.len() == 8 => {
                                rate64 = Some(u64::from_ne_bytes(v.try_into().expect("8 bytes")));
                            }
                            _ => {}
                        }
                    }
                }
            }
            if let Some(rate) = rate64.or(rate) {
                let burst =
                    (buffer_ticks << PSCHED_SHIFT) as u128 * u128::from(rate) / 1_000_000_000;
                return Ok(Some(TokenBucket {
                    rate,
                    burst: burst.min(u128::from(u32::MAX)) as u32,
                }));
            }
        }
        Ok(None)
    }
    /// Removes the root and ingress qdiscs of `link`; none there is fine.
    pub fn clear_qdiscs(&mut self, link: &Link) -> Result<()> {
        for (handle, parent, kind) in [
            (TcHandle { major: 1, minor: 0 }, TcHandle::ROOT, "tbf"),
            (
                TcHandle {
                    major: 0xffff,
                    minor: 0,
                },
                TcHandle::INGRESS,
                "ingress",
            ),
        ] {
            let m = qdisc(link, handle, parent, kind);
            match self.request(RouteNetlinkMessage::DelQueueDiscipline(m), NLM_F_ACK) {
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::ENOENT | libc::EINVAL | libc::ENODEV)
                    ) => {}
                r => {
                    r.map_err(netlink_err(format!(
                        "remove the {kind} qdisc of {}",
                        link.name
                    )))?;
                }
            }
        }
        Ok(())
    }

    /// Creates the ifb device `name`, up, with `mtu`.
    pub fn add_ifb(&mut self, name: &str, mtu: u32) -> Result<()> {
        let mut m = crate::link::new_up_link(name, Some(mtu));
        m.attributes
            .push(LinkAttribute::LinkInfo(vec![LinkInfo::Kind(InfoKind::Ifb)]));
        self.request(
            RouteNetlinkMessage::NewLink(m),
            NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK,
        )
        .map(drop)
        .map_err(netlink_err(format!("create ifb {name}")))
    }

    /// Sends everything that enters `link` out of `to` instead (an ingress qdisc with a
    /// u32 filter that matches all, whose action is a mirred redirect; u32 rather than
    /// matchall because kernels built without cls_matchall, as this one, still have it).
    pub fn redirect_ingress(&mut self, link: &Link, to: &Link) -> Result<()> {
        let m = qdisc(
            link,
            TcHandle {
                major: 0xffff,
                minor: 0,
            },
            TcHandle::INGRESS,
            "ingress",
        );
        self.request(
            RouteNetlinkMessage::NewQueueDiscipline(m),
            NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK,
        )
        .map(drop)
        .map_err(netlink_err(format!(
            "add an ingress qdisc to {}",
            link.name
        )))?;
        let mut filter = TcMessage::from_parts(
            TcHeader {
                index: link.index as i32,
                parent: TcHandle {
                    major: 0xffff,
                    minor: 0,
                },
                info: (1 << 16) | ALL_PROTOCOLS,
                ..TcHeader::default()
            },
            vec![TcAttribute::Kind("u32".into())],
        );
        let mut mirror = TcMirror::default();
        mirror.generic = TcActionGeneric::default();
        mirror.generic.action = TcActionType::Stolen;
        mirror.eaction = TcMirrorActionType::EgressRedir;
        mirror.ifindex = to.index;
        let mut action = TcAction::default();
        action.tab = 1;
        action.attributes = vec![
            TcActionAttribute::Kind("mirred".into()),
            TcActionAttribute::Options(vec![TcActionOption::Mirror(TcActionMirrorOption::Parms(
                mirror,
            ))]),
        ];
        let mut everything = TcU32Selector::default();
        everything.flags = TcU32SelectorFlags::Terminal;
        everything.nkeys = 1;
        everything.keys = vec![TcU32Key::default()];
        filter.attributes.push(TcAttribute::Options(vec![
            TcOption::U32(TcFilterU32Option::Selector(everything)),
            TcOption::U32(TcFilterU32Option::Action(vec![action])),
        ]));
        self.request(
            RouteNetlinkMessage::NewTrafficFilter(filter),
            NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK,
        )
        .map(drop)
        .map_err(netlink_err(format!(
            "redirect {} to {}",
            link.name, to.name
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_is_sized_as_tc_sizes_it() {
        let p = tbf_parms(TokenBucket {
            rate: 125_000,
            burst: 12_500,
        });
        assert_eq!(p.len(), 36);
        assert_eq!(u32::from_ne_bytes(p[8..12].try_into().unwrap()), 125_000);
        // 25 ms of rate plus the burst.
        assert_eq!(
            u32::from_ne_bytes(p[24..28].try_into().unwrap()),
            3_125 + 12_500
        );
        // 12.5 kB at 125 kB/s is 100 ms: 1,562,500 ticks of 64 ns.
        assert_eq!(u32::from_ne_bytes(p[28..32].try_into().unwrap()), 1_562_500);
    }
}

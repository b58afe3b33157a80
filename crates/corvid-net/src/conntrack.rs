//! Connection tracking: forgetting the UDP flows a service translated to a member that
//! is no longer one. UDP has no end, so a client that keeps sending from one port keeps
//! its conntrack entry, and with it the gone member, for as long as it sends; new
//! members never see it. kube-proxy deletes these entries for the same reason.
//! And the TCP timeouts a host that translates connections sets, as kube-proxy does.

use std::collections::BTreeSet;
use std::io;
use std::net::IpAddr;

use netlink_packet_core::{NLM_F_ACK, NLM_F_DUMP};
use netlink_packet_netfilter::conntrack::{
    ConntrackAttribute, ConntrackMessage, IPTuple, ProtoTuple, Protocol, Tuple,
};
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
};
use netlink_sys::protocols::NETLINK_NETFILTER;

use crate::netlink::Channel;
use crate::{netlink_err, sysctl, Result};

/// How long the calling namespace's conntrack remembers TCP connections in two states;
/// `None` leaves the kernel's setting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TcpTimeouts {
    /// A connection one side closed (`CLOSE_WAIT`). The kernel's 60 s forgets a
    /// translated connection whose server still sends after the client's FIN: its
    /// packets then leave untranslated and the client answers them with resets.
    pub close_wait: Option<std::time::Duration>,
    /// An open connection (`ESTABLISHED`); the kernel's five days keep idle entries of
    /// vanished peers long after they matter.
    pub established: Option<std::time::Duration>,
}

impl TcpTimeouts {
    /// Writes the timeouts given; conntrack must be loaded (the services' NAT loads it).
    pub fn apply(&self) -> Result<()> {
        let keys = [
            ("close_wait", self.close_wait),
            ("established", self.established),
        ];
        for (state, timeout) in keys {
            if let Some(t) = timeout {
                let key = format!("net/netfilter/nf_conntrack_tcp_timeout_{state}");
                sysctl::set(&key, &t.as_secs().to_string())?;
            }
        }
        Ok(())
    }
}

/// One direction of an entry: addresses, protocol and source port.
#[derive(Default)]
struct Flow {
    src: Option<IpAddr>,
    dst: Option<IpAddr>,
    protocol: Option<Protocol>,
    sport: Option<u16>,
}

fn flow(tuple: &[Tuple]) -> Flow {
    let mut f = Flow::default();
    for t in tuple {
        match t {
            Tuple::Ip(ips) => {
                for ip in ips {
                    match ip {
                        IPTuple::SourceAddress(a) => f.src = Some(*a),
                        IPTuple::DestinationAddress(a) => f.dst = Some(*a),
                        _ => {}
                    }
                }
            }
            Tuple::Proto(ps) => {
                for p in ps {
                    match p {
                        ProtoTuple::Protocol(p) => f.protocol = Some(*p),
                        ProtoTuple::SourcePort(port) => f.sport = Some(*port),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    f
}

/// The original tuple of an entry whose UDP flow was translated to one of `members`:
/// its reply comes from the member, its original destination was another address (a
/// VIP, a node port). Flows straight to the member are left alone.
fn translated_to(
    attrs: &[ConntrackAttribute],
    members: &BTreeSet<(IpAddr, u16)>,
) -> Option<Vec<Tuple>> {
    let (mut orig, mut reply) = (None, None);
    for a in attrs {
        match a {
            ConntrackAttribute::CtaTupleOrig(t) => orig = Some(t),
            ConntrackAttribute::CtaTupleReply(t) => reply = Some(t),
            _ => {}
        }
    }
    let (orig, reply) = (orig?, reply?);
    let (o, r) = (flow(orig), flow(reply));
    let member = (r.src?, r.sport?);
    (o.protocol == Some(Protocol::Udp) && members.contains(&member) && o.dst != Some(member.0))
        .then(|| orig.clone())
}

fn header(family: NetfilterProtoFamily) -> NetfilterHeader {
    NetfilterHeader::new(family, 0, 0)
}

/// A conntrack netlink socket bound to the namespace it was opened in.
pub struct Conntrack {
    channel: Channel,
}

impl Conntrack {
    /// Opens a socket in the calling thread's namespace.
    pub fn open() -> Result<Conntrack> {
        let channel =
            Channel::open(NETLINK_NETFILTER).map_err(netlink_err("open a conntrack socket"))?;
        Ok(Conntrack { channel })
    }

    /// Deletes the entries of UDP flows that were translated to one of `members`
    /// (address and port); returns how many went.
    pub fn forget_udp_translated_to(&mut self, members: &BTreeSet<(IpAddr, u16)>) -> Result<usize> {
        if members.is_empty() {
            return Ok(0);
        }
        let dump = NetfilterMessage::new(
            header(NetfilterProtoFamily::Unspec),
            ConntrackMessage::Get(Vec::new()),
        );
        let entries = self
            .channel
            .request(dump, NLM_F_DUMP)
            .map_err(netlink_err("list conntrack entries"))?;
        let mut forgotten = 0;
        for e in entries {
            let NetfilterMessageInner::Conntrack(ConntrackMessage::New(attrs)) = &e.inner else {
                continue;
            };
            let Some(orig) = translated_to(attrs, members) else {
                continue;
            };
            let family = match flow(&orig).src {
                Some(IpAddr::V6(_)) => NetfilterProtoFamily::IPv6,
                _ => NetfilterProtoFamily::IPv4,
            };
            let delete = NetfilterMessage::new(
                header(family),
                ConntrackMessage::Delete(vec![ConntrackAttribute::CtaTupleOrig(orig)]),
            );
            match self.channel.request(delete, NLM_F_ACK) {
                Ok(_) => forgotten += 1,
                // Gone meanwhile: it timed out, or the flow ended.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(netlink_err("delete a conntrack entry")(e)),
            }
        }
        Ok(forgotten)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tuple(src: &str, dst: &str, sport: u16, dport: u16) -> Vec<Tuple> {
        vec![
            Tuple::Ip(vec![
                IPTuple::SourceAddress(src.parse().unwrap()),
                IPTuple::DestinationAddress(dst.parse().unwrap()),
            ]),
            Tuple::Proto(vec![
                ProtoTuple::Protocol(Protocol::Udp),
                ProtoTuple::SourcePort(sport),
                ProtoTuple::DestinationPort(dport),
            ]),
        ]
    }

    #[test]
    fn only_flows_translated_to_a_gone_member_are_chosen() {
        let members = BTreeSet::from([("10.1.0.5".parse().unwrap(), 5353)]);
        let entry = |orig, reply| {
            vec![
                ConntrackAttribute::CtaTupleOrig(orig),
                ConntrackAttribute::CtaTupleReply(reply),
            ]
        };
        // Client to the VIP, translated to the member.
        let via_vip = entry(
            tuple("10.1.0.9", "10.96.0.10", 40000, 53),
            tuple("10.1.0.5", "10.1.0.9", 5353, 40000),
        );
        assert!(translated_to(&via_vip, &members).is_some());
        // Straight to the member: not a service's doing.
        let direct = entry(
            tuple("10.1.0.9", "10.1.0.5", 40000, 5353),
            tuple("10.1.0.5", "10.1.0.9", 5353, 40000),
        );
        assert!(translated_to(&direct, &members).is_none());
        // Another member, or another port of it.
        let other = entry(
            tuple("10.1.0.9", "10.96.0.10", 40000, 53),
            tuple("10.1.0.6", "10.1.0.9", 5353, 40000),
        );
        assert!(translated_to(&other, &members).is_none());
        let port = entry(
            tuple("10.1.0.9", "10.96.0.10", 40000, 53),
            tuple("10.1.0.5", "10.1.0.9", 8080, 40000),
        );
        assert!(translated_to(&port, &members).is_none());
    }
}

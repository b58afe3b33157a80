//! The netfilter netlink socket: sending a batch and reading its acknowledgements, and
//! the dumps (chains, sets, elements, rules) corvid reads back.

use crate::netlink::Channel;
use crate::{Error, Result};
use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST,
};
use netlink_packet_netfilter::nftables::{
    ChainAttribute, ChainMessage, DataAttribute, Hook, ListAttribute, NfTablesMessage,
    RuleAttribute, RuleMessage, SetAttribute, SetElementAttribute, SetElementList,
    SetElementMessage, SetMessage,
};
use netlink_packet_netfilter::{
    none::ControlMessage, NetfilterHeader, NetfilterMessage, NetfilterMessageInner,
    NetfilterProtoFamily,
};
use netlink_sys::protocols::NETLINK_NETFILTER;
use std::io;

use crate::netns::Netns;

use super::batch::{element_message, udata_comment};
use super::*;

/// A netfilter netlink socket bound to the namespace it was opened in.
pub struct Nftables {
    channel: Channel,
    /// The receive and send buffers asked for so far, in bytes.
    buffers: (usize, usize),
}

/// What one acknowledgement takes of a socket's receive buffer: a small message in a
/// buffer of its own, as the kernel counts it (its true size).
const ACK_COST: usize = 1024;

/// The buffers a socket starts with (the kernel's usual default).
const SOCKET_BUFFER: usize = 212_992;

fn nft_err(op: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
    let op = op.into();
    move |source| Error::Nftables { op, source }
}

impl Nftables {
    /// Opens a socket in the calling thread's namespace.
    pub fn open() -> Result<Nftables> {
        let channel =
            Channel::open(NETLINK_NETFILTER).map_err(nft_err("open a netfilter netlink socket"))?;
        // Acknowledgements without a copy of the request: a batch gets one per message.
        channel
            .socket
            .set_cap_ack(true)
            .map_err(nft_err("ask for short acknowledgements"))?;
        Ok(Nftables {
            channel,
            buffers: (SOCKET_BUFFER, SOCKET_BUFFER),
        })
    }

    /// Makes room for a batch of `bytes` (sent in one message, which must fit the send
    /// buffer) and its `acks` acknowledgements (the kernel answers the whole batch inside
    /// the send, and what does not fit the receive buffer is lost, ENOBUFS).
    fn room_for(&mut self, bytes: usize, acks: usize) -> Result<()> {
        use rustix::net::sockopt;
        let fd = &self.channel.socket;
        // The FORCE options pass over net.core.[rw]mem_max (CAP_NET_ADMIN, which
        // nftables needs anyway).
        let receive = acks * ACK_COST + SOCKET_BUFFER;
        if receive > self.buffers.0 {
            sockopt::set_socket_recv_buffer_size_force(fd, receive)
                .or_else(|_| sockopt::set_socket_recv_buffer_size(fd, receive))
                .map_err(|e| nft_err("grow the receive buffer for a batch's answers")(e.into()))?;
            self.buffers.0 = receive;
        }
        let send = bytes + SOCKET_BUFFER;
        if send > self.buffers.1 {
            sockopt::set_socket_send_buffer_size_force(fd, send)
                .or_else(|_| sockopt::set_socket_send_buffer_size(fd, send))
                .map_err(|e| nft_err("grow the send buffer for a batch")(e.into()))?;
            self.buffers.1 = send;
        }
        Ok(())
    }

    /// Opens a socket inside `ns`; it keeps working there from any thread.
    pub fn open_in(ns: &Netns) -> Result<Nftables> {
        ns.run(Nftables::open)?
    }

    fn serialize(
        &mut self,
        inner: NetfilterMessageInner,
        flags: u16,
        family: NetfilterProtoFamily,
        out: &mut Vec<u8>,
    ) -> u32 {
        let seq = self.channel.next_seq();
        let res_id = match inner {
            NetfilterMessageInner::None(_) => NFNL_SUBSYS_NFTABLES,
            _ => 0,
        };
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | flags;
        header.sequence_number = seq;
        let mut packet = NetlinkMessage::new(
            header,
            NetlinkPayload::InnerMessage(NetfilterMessage::new(
                NetfilterHeader::new(family, 0, res_id),
                inner,
            )),
        );
        packet.finalize();
        let start = out.len();
        out.resize(start + packet.buffer_len(), 0);
        packet.serialize(&mut out[start..]);
        seq
    }

    /// Commits a batch as one transaction; on failure nothing of it is applied and the
    /// error names the step the kernel refused.
    pub fn commit(&mut self, batch: Batch) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let mut out = Vec::with_capacity(1024);
        let unspec = NetfilterProtoFamily::Unspec;
        let begin = self.serialize(ControlMessage::BatchBegin.into(), 0, unspec, &mut out);
        let mut steps = Vec::with_capacity(batch.messages.len());
        for (message, flags, what, family) in batch.messages {
            let seq = self.serialize(message.into(), flags | NLM_F_ACK, family, &mut out);
            steps.push((seq, what));
        }
        let end = self.serialize(ControlMessage::BatchEnd.into(), 0, unspec, &mut out);
        self.room_for(out.len(), steps.len() + 2)?;
        self.channel
            .socket
            .send(&out, 0)
            .map_err(nft_err("send an nftables batch"))?;
        // The kernel runs the batch inside sendmsg: every answer is queued by now.
        let mut acked = 0;
        let mut failure: Option<Error> = None;
        loop {
            self.channel.buf.clear();
            match self
                .channel
                .socket
                .recv(&mut self.channel.buf, libc::MSG_DONTWAIT)
            {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(nft_err("read the nftables answer")(e)),
            }
            for (seq, code) in parse_acks(&self.channel.buf) {
                if seq < begin || seq > end {
                    continue;
                }
                acked += 1;
                if let (Some(code), None) = (code, &failure) {
                    let what = steps
                        .iter()
                        .find(|(s, _)| *s == seq)
                        .map(|(_, w)| w.as_str())
                        .unwrap_or("begin the nftables transaction");
                    failure = Some(nft_err(what)(io::Error::from_raw_os_error(code)));
                }
            }
        }
        match failure {
            Some(e) => Err(e),
            None if acked < steps.len() => {
                Err(nft_err("commit an nftables batch")(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the kernel answered only in part",
                )))
            }
            None => Ok(()),
        }
    }

    fn request(
        &mut self,
        message: NfTablesMessage,
        flags: u16,
    ) -> io::Result<Vec<NfTablesMessage>> {
        self.request_in(NetfilterProtoFamily::Inet, message, flags)
    }

    fn request_in(
        &mut self,
        family: NetfilterProtoFamily,
        message: NfTablesMessage,
        flags: u16,
    ) -> io::Result<Vec<NfTablesMessage>> {
        let message = NetfilterMessage::new(NetfilterHeader::new(family, 0, 0), message);
        Ok(self
            .channel
            .request(message, flags)?
            .into_iter()
            .filter_map(|m| match m.inner {
                NetfilterMessageInner::NfTables(m) => Some(m),
                _ => None,
            })
            .collect())
    }

    /// One element of a set by its key; none when the element, the set or the table is
    /// missing.
    pub fn element(&mut self, set: &str, key: &[u8]) -> Result<Option<Element>> {
        let message = NfTablesMessage::GetSetElement(element_message(
            TABLE,
            set,
            vec![SetElementAttribute::Key(DataAttribute::Value(key.to_vec()))],
        ));
        match self.request(message, 0) {
            Ok(replies) => Ok(replies.iter().flat_map(elements_of).next()),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(nft_err(format!("read an element of {set}"))(e)),
        }
    }

    /// Every element of a set; none when the set or the table is missing.
    pub fn elements(&mut self, set: &str) -> Result<Vec<Element>> {
        let message = NfTablesMessage::GetSetElement(SetElementMessage {
            attributes: vec![
                SetElementList::Table(TABLE.into()),
                SetElementList::Set(set.into()),
            ],
        });
        match self.request(message, NLM_F_DUMP) {
            Ok(replies) => Ok(replies.iter().flat_map(elements_of).collect()),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(Vec::new()),
            Err(e) => Err(nft_err(format!("list the elements of {set}"))(e)),
        }
    }

    /// True when corvid's table has the chain `name`.
    pub fn has_chain(&mut self, name: &str) -> Result<bool> {
        self.has_chain_in(TableRef::CORVID, name)
    }

    /// True when `table` exists and has the chain `name`.
    pub fn has_chain_in(&mut self, table: TableRef, name: &str) -> Result<bool> {
        let message = NfTablesMessage::GetChain(ChainMessage {
            attributes: vec![
                ChainAttribute::Table(table.name.into()),
                ChainAttribute::Name(name.into()),
            ],
        });
        match self.request_in(table.family, message, 0) {
            Ok(_) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
            Err(e) => Err(nft_err(format!("look for chain {name}"))(e)),
        }
    }

    /// The (handle, comment) of every rule of `chain` in `table`; none when either is
    /// missing.
    pub fn rules(&mut self, table: TableRef, chain: &str) -> Result<Vec<(u64, Option<String>)>> {
        let message = NfTablesMessage::GetRule(RuleMessage {
            attributes: vec![
                RuleAttribute::Table(table.name.into()),
                RuleAttribute::Chain(chain.into()),
            ],
        });
        let replies = match self.request_in(table.family, message, NLM_F_DUMP) {
            Ok(r) => r,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(Vec::new()),
            Err(e) => return Err(nft_err(format!("list the rules of {chain}"))(e)),
        };
        Ok(replies
            .into_iter()
            .filter_map(|m| match m {
                NfTablesMessage::NewRule(r) => {
                    let in_chain = r
                        .attributes
                        .iter()
                        .any(|a| matches!(a, RuleAttribute::Chain(c) if c == chain));
                    let handle = r.attributes.iter().find_map(|a| match a {
                        RuleAttribute::Handle(h) => Some(*h),
                        _ => None,
                    })?;
                    let comment = r.attributes.iter().find_map(|a| match a {
                        RuleAttribute::UserData(u) => udata_comment(u),
                        _ => None,
                    });
                    in_chain.then_some((handle, comment))
                }
                _ => None,
            })
            .collect())
    }

    /// The names of the chains of corvid's table; none when the table is missing.
    pub fn chains(&mut self) -> Result<Vec<String>> {
        let message = NfTablesMessage::GetChain(ChainMessage {
            attributes: vec![ChainAttribute::Table(TABLE.into())],
        });
        self.names(message, "list chains", |m| match m {
            NfTablesMessage::NewChain(c) => {
                let ours = c
                    .attributes
                    .iter()
                    .any(|a| matches!(a, ChainAttribute::Table(t) if t == TABLE));
                c.attributes.into_iter().find_map(|a| match a {
                    ChainAttribute::Name(n) if ours => Some(n),
                    _ => None,
                })
            }
            _ => None,
        })
    }

    /// The forward base chains of other tables whose policy drops: iptables' rules can be
    /// given an accept for corvid's bridges, but a chain of another nftables table
    /// drops whatever corvid's own table accepts (an accept ends one chain only).
    /// iptables-nft's `filter` tables are left out: corvid writes its accepts there.
    pub fn forward_drops(&mut self) -> Result<Vec<ForwardDrop>> {
        let mut out = Vec::new();
        for (family, name) in [
            (NetfilterProtoFamily::Inet, "inet"),
            (NetfilterProtoFamily::IPv4, "ip"),
            (NetfilterProtoFamily::IPv6, "ip6"),
            (NetfilterProtoFamily::Bridge, "bridge"),
        ] {
            let message = NfTablesMessage::GetChain(ChainMessage { attributes: vec![] });
            let replies = match self.request_in(family, message, NLM_F_DUMP) {
                Ok(r) => r,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                Err(e) => return Err(nft_err("list chains")(e)),
            };
            for reply in replies {
                let NfTablesMessage::NewChain(c) = reply else {
                    continue;
                };
                let (mut table, mut chain, mut forward, mut drops) =
                    (String::new(), String::new(), false, false);
                for a in c.attributes {
                    match a {
                        ChainAttribute::Table(t) => table = t,
                        ChainAttribute::Name(n) => chain = n,
                        ChainAttribute::Policy(p) => drops = p == NF_DROP,
                        ChainAttribute::Hook(hooks) => forward = hooks.iter().any(
                            |h| matches!(h, Hook::Number(n) if u32::from(*n) == NF_INET_FORWARD),
                        ),
                        _ => {}
                    }
                }
                let ours = (name == "inet" && table == TABLE)
                    || (matches!(name, "ip" | "ip6") && table == "filter");
                if forward && drops && !ours {
                    out.push(ForwardDrop {
                        family: name,
                        table,
                        chain,
                    });
                }
            }
        }
        Ok(out)
    }

    /// What `pick` finds in each answer to a dump; none when the table is missing.
    fn names(
        &mut self,
        message: NfTablesMessage,
        what: &str,
        pick: impl Fn(NfTablesMessage) -> Option<String>,
    ) -> Result<Vec<String>> {
        match self.request(message, NLM_F_DUMP) {
            Ok(replies) => Ok(replies.into_iter().filter_map(pick).collect()),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(Vec::new()),
            Err(e) => Err(nft_err(what)(e)),
        }
    }

    /// True when corvid's table has the set `name`.
    pub fn has_set(&mut self, name: &str) -> Result<bool> {
        let message = NfTablesMessage::GetSet(SetMessage {
            attributes: vec![
                SetAttribute::Table(TABLE.into()),
                SetAttribute::Name(name.into()),
            ],
        });
        match self.request(message, 0) {
            Ok(_) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
            Err(e) => Err(nft_err(format!("look for set {name}"))(e)),
        }
    }

    /// The names of the sets of corvid's table; none when the table is missing.
    pub fn sets(&mut self) -> Result<Vec<String>> {
        let message = NfTablesMessage::GetSet(SetMessage {
            attributes: vec![SetAttribute::Table(TABLE.into())],
        });
        self.names(message, "list sets", |m| match m {
            NfTablesMessage::NewSet(s) => {
                let ours = s
                    .attributes
                    .iter()
                    .any(|a| matches!(a, SetAttribute::Table(t) if t == TABLE));
                s.attributes.into_iter().find_map(|a| match a {
                    SetAttribute::Name(n) if ours => Some(n),
                    _ => None,
                })
            }
            _ => None,
        })
    }
}

/// (sequence, errno) of each acknowledgement or error in a buffer of answers.
fn parse_acks(buf: &[u8]) -> Vec<(u32, Option<i32>)> {
    let mut out = Vec::new();
    let mut offset = 0;
    while offset + 16 <= buf.len() {
        let header = &buf[offset..];
        let len = u32::from_ne_bytes(header[0..4].try_into().expect("4 bytes")) as usize;
        let kind = u16::from_ne_bytes(header[4..6].try_into().expect("2 bytes"));
        let seq = u32::from_ne_bytes(header[8..12].try_into().expect("4 bytes"));
        if len < 16 || offset + len > buf.len() {
            break;
        }
        // NLMSG_ERROR carries the errno (0 for an acknowledgement) after the header.
        if kind == 2 && len >= 20 {
            let code = i32::from_ne_bytes(header[16..20].try_into().expect("4 bytes"));
            out.push((seq, (code != 0).then_some(-code)));
        }
        offset += (len + 3) & !3;
    }
    out
}

fn elements_of(message: &NfTablesMessage) -> Vec<Element> {
    let NfTablesMessage::NewSetElement(m) = message else {
        return Vec::new();
    };
    m.attributes
        .iter()
        .filter_map(|a| match a {
            SetElementList::Elements(list) => Some(list),
            _ => None,
        })
        .flatten()
        .filter_map(|e| match e {
            ListAttribute::Element(attrs) => {
                let key = attrs.iter().find_map(|a| match a {
                    SetElementAttribute::Key(DataAttribute::Value(k)) => Some(k.clone()),
                    _ => None,
                })?;
                let comment = attrs.iter().find_map(|a| match a {
                    SetElementAttribute::UserData(u) => udata_comment(u),
                    _ => None,
                });
                Some(Element { key, comment })
            }
            _ => None,
        })
        .collect()
}

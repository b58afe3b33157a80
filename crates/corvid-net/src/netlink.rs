//! A synchronous rtnetlink client: one socket, one request at a time, replies matched by
//! sequence number.

use crate::{netlink_err, Result};
use netlink_packet_core::{
    NetlinkDeserializable, NetlinkHeader, NetlinkMessage, NetlinkPayload, NetlinkSerializable,
    NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};
use std::io;

use crate::netns::Netns;

/// A netlink socket of one protocol: requests go out one at a time and replies are
/// matched by sequence number. rtnetlink ([`Netlink`]) and nftables share it.
pub(crate) struct Channel {
    pub(crate) socket: Socket,
    seq: u32,
    pub(crate) buf: Vec<u8>,
}

impl Channel {
    /// Opens a socket of `protocol` in the calling thread's namespace.
    pub(crate) fn open(protocol: isize) -> io::Result<Channel> {
        let mut socket = Socket::new(protocol)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        Ok(Channel {
            socket,
            seq: 0,
            buf: Vec::with_capacity(1 << 16),
        })
    }

    /// The next sequence number.
    pub(crate) fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// Sends one request and collects the replies (all parts of a dump, or the single
    /// answer, or nothing for an acknowledged change).
    pub(crate) fn request<T>(&mut self, message: T, flags: u16) -> io::Result<Vec<T>>
    where
        T: NetlinkSerializable + NetlinkDeserializable,
    {
        let seq = self.next_seq();
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | flags;
        header.sequence_number = seq;
        let mut packet = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(message));
        packet.finalize();
        let mut out = vec![0; packet.buffer_len()];
        packet.serialize(&mut out);
        self.socket.send(&out, 0)?;

        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        let mut replies = Vec::new();
        loop {
            self.buf.clear();
            let n = self.socket.recv(&mut self.buf, 0)?;
            if n > self.buf.len() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "netlink reply truncated",
                ));
            }
            let mut offset = 0;
            while offset + 16 <= self.buf.len() {
                let reply = NetlinkMessage::<T>::deserialize(&self.buf[offset..])
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
                let len = reply.header.length as usize;
                if len < 16 {
                    break;
                }
                offset += (len + 3) & !3;
                if reply.header.sequence_number != seq {
                    continue;
                }
                match reply.payload {
                    NetlinkPayload::Error(e) => {
                        return match e.code {
                            Some(code) => Err(io::Error::from_raw_os_error(-code.get())),
                            None => Ok(replies),
                        }
                    }
                    NetlinkPayload::Done(_) => return Ok(replies),
                    NetlinkPayload::InnerMessage(m) => {
                        replies.push(m);
                        if !dump && flags & NLM_F_ACK == 0 {
                            return Ok(replies);
                        }
                    }
                    _ => {}
                }
            }
        }
    }
}

/// An rtnetlink socket bound to the namespace it was opened in.
pub struct Netlink {
    channel: Channel,
}

impl Netlink {
    /// Opens a socket in the calling thread's namespace.
    pub fn open() -> Result<Netlink> {
        let open = || -> io::Result<Netlink> {
            let channel = Channel::open(NETLINK_ROUTE)?;
            // Lets the kernel filter dumps (addresses of one link) instead of sending all;
            // kernels without it send everything and callers filter anyway.
            let _ = channel.socket.set_netlink_get_strict_chk(true);
            Ok(Netlink { channel })
        };
        open().map_err(netlink_err("open netlink socket"))
    }

    /// Opens a socket inside `ns`; it keeps working there from any thread.
    pub fn open_in(ns: &Netns) -> Result<Netlink> {
        ns.run(Netlink::open)?
    }

    /// Sends one rtnetlink request and collects the replies.
    pub(crate) fn request(
        &mut self,
        message: RouteNetlinkMessage,
        flags: u16,
    ) -> io::Result<Vec<RouteNetlinkMessage>> {
        self.channel.request(message, flags)
    }
}

//! One container interface's lease: acquired (DISCOVER, OFFER, REQUEST, ACK), then kept
//! by its own thread (renewed at T1 from the server, rebound at T2 from anyone, the
//! interface brought down when it expires), and released when the container goes.

use super::wire::{resend_delay, Wire};
use corvid_cni::result::Route;
use corvid_net::route::SCOPE_LINK;
use corvid_net::{Netlink, Netns};
use dhcproto::v4::{
    DhcpOption, Flags, HType, Message, MessageType, Opcode, OptionCode, UnknownOption,
};
use ipnet::{IpNet, Ipv4Net};
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The lease time assumed when the server gives none, as the reference does.
const DEFAULT_LEASE: Duration = Duration::from_secs(3600);

/// How the daemon talks DHCP: its flags.
#[derive(Clone, Debug)]
pub(crate) struct Timing {
    /// How long to wait for each reply.
    pub(crate) reply: Duration,
    /// The longest pause between resends.
    pub(crate) resend_max: Duration,
    /// When to give up resending.
    pub(crate) give_up: Duration,
    /// Ask the server to broadcast its replies.
    pub(crate) broadcast: bool,
}

/// What the client sends besides the message type: its identifier, the options it
/// provides (host name and the like) and the parameter request list.
#[derive(Clone, Debug)]
pub(crate) struct Asking {
    /// The client identifier, the reference's `containerID/network/ifname`.
    pub(crate) client_id: String,
    /// Options provided to the server.
    pub(crate) provide: Vec<(u8, Vec<u8>)>,
    /// The option codes asked for.
    pub(crate) request: Vec<u8>,
}

/// The parts of an ACK the result is made of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Bound {
    /// The address with the subnet mask's prefix.
    pub(crate) address: Ipv4Net,
    /// The first router.
    pub(crate) gateway: Option<Ipv4Addr>,
    /// Option 121 when given, else option 33 plus a default route to the gateway.
    pub(crate) routes: Vec<Route>,
    /// The server that granted it.
    pub(crate) server: Ipv4Addr,
    lease: Duration,
    renew: Duration,
    rebind: Duration,
}

fn option_err(msg: impl Into<String>) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, msg.into())
}

impl Bound {
    /// Reads an ACK; it must carry a subnet mask, as the reference wants.
    fn from_ack(ack: &Message) -> std::io::Result<Bound> {
        let opts = ack.opts();
        let Some(DhcpOption::SubnetMask(mask)) = opts.get(OptionCode::SubnetMask) else {
            return Err(option_err("DHCP option Subnet Mask not found in DHCPACK"));
        };
        let prefix = u32::from(*mask).leading_ones() as u8;
        let address = Ipv4Net::new(ack.yiaddr(), prefix)
            .map_err(|_| option_err(format!("bad subnet mask {mask}")))?;
        let gateway = match opts.get(OptionCode::Router) {
            Some(DhcpOption::Router(r)) => r.first().copied(),
            _ => None,
        };
        let mut routes = Vec::new();
        if let Some(DhcpOption::ClasslessStaticRoute(rs)) =
            opts.get(OptionCode::ClasslessStaticRoute)
        {
            for (dst, gw) in rs {
                routes.push(Route {
                    dst: IpNet::V4(*dst),
                    gw: Some(IpAddr::V4(*gw)),
                    scope: gw.is_unspecified().then_some(SCOPE_LINK),
                    ..Route::default()
                });
            }
        } else {
            if let Some(DhcpOption::StaticRoutingTable(rs)) =
                opts.get(OptionCode::StaticRoutingTable)
            {
                for (dst, gw) in rs {
                    routes.push(Route {
                        dst: IpNet::V4(classful(*dst)),
                        gw: Some(IpAddr::V4(*gw)),
                        ..Route::default()
                    });
                }
            }
            if let Some(gw) = gateway {
                routes.push(Route {
                    dst: "0.0.0.0/0".parse().expect("a valid network"),
                    gw: Some(IpAddr::V4(gw)),
                    ..Route::default()
                });
            }
        }
        let seconds = |code, default: Duration| match opts.get(code) {
            Some(
                DhcpOption::AddressLeaseTime(s) | DhcpOption::Renewal(s) | DhcpOption::Rebinding(s),
            ) => Duration::from_secs(u64::from(*s)),
            _ => default,
        };
        let lease = seconds(OptionCode::AddressLeaseTime, DEFAULT_LEASE);
        let server = match opts.get(OptionCode::ServerIdentifier) {
            Some(DhcpOption::ServerIdentifier(s)) => *s,
            _ => ack.siaddr(),
        };
        Ok(Bound {
            address,
            gateway,
            routes,
            server,
            lease,
            renew: seconds(OptionCode::Renewal, lease / 2),
            rebind: seconds(OptionCode::Rebinding, lease * 85 / 100),
        })
    }
}

/// The network of a classful destination (option 33 has no masks).
fn classful(dst: Ipv4Addr) -> Ipv4Net {
    let prefix = match dst.octets()[0] {
        0..=127 => 8,
        128..=191 => 16,
        _ => 24,
    };
    Ipv4Net::new(dst, prefix).expect("8, 16 and 24 are valid prefixes")
}

/// A client on one interface, found by name each time it talks: a runtime may make the
/// interface again under the same name while the lease is held.
struct Client {
    ns: Netns,
    ifname: String,
    asking: Asking,
    timing: Timing,
}

/// A packet socket on the interface as it is now, and its MAC.
struct Port {
    wire: Wire,
    mac: Vec<u8>,
}

impl Client {
    fn port(&self) -> std::io::Result<Port> {
        let gone = |what: String| std::io::Error::new(std::io::ErrorKind::NotFound, what);
        let mut nl = Netlink::open_in(&self.ns).map_err(|e| gone(e.to_string()))?;
        let link = nl
            .link_by_name(&self.ifname)
            .map_err(|e| gone(e.to_string()))?
            .ok_or_else(|| {
                gone(format!(
                    "error looking up {:?}: no such interface",
                    self.ifname
                ))
            })?;
        let mac = corvid_net::link::parse_mac(&link.mac)
            .ok_or_else(|| gone(format!("{} has no MAC address", self.ifname)))?;
        let wire = self
            .ns
            .run(|| Wire::open(link.index))
            .map_err(|e| gone(e.to_string()))??;
        Ok(Port { wire, mac })
    }

    fn message(&self, port: &Port, kind: MessageType, ciaddr: Ipv4Addr) -> Message {
        let mut m = Message::new(
            ciaddr,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            &port.mac,
        );
        m.set_opcode(Opcode::BootRequest).set_htype(HType::Eth);
        if self.timing.broadcast {
            m.set_flags(Flags::default().set_broadcast());
        }
        let opts = m.opts_mut();
        opts.insert(DhcpOption::MessageType(kind));
        let mut id = vec![0];
        id.extend_from_slice(self.asking.client_id.as_bytes());
        opts.insert(DhcpOption::ClientIdentifier(id));
        for (code, value) in &self.asking.provide {
            opts.insert(DhcpOption::Unknown(UnknownOption::new(
                OptionCode::from(*code),
                value.clone(),
            )));
        }
        if !self.asking.request.is_empty() && kind != MessageType::Release {
            let list = self.asking.request.iter().map(|c| OptionCode::from(*c));
            opts.insert(DhcpOption::ParameterRequestList(list.collect()));
        }
        m
    }

    /// Sends `msg` until a reply with its transaction ID and one of `want` types comes,
    /// resending with the reference's backoff until `give_up` passes.
    fn exchange(
        &self,
        port: &Port,
        msg: &Message,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        want: &[MessageType],
    ) -> std::io::Result<Message> {
        let end = Instant::now() + self.timing.give_up;
        let xid = msg.xid();
        for attempt in 0.. {
            port.wire.send(msg, src, dst)?;
            let wait = Instant::now() + self.timing.reply;
            let got = port.wire.receive(wait.min(end), |m| {
                m.xid() == xid
                    && m.opcode() == Opcode::BootReply
                    && m.chaddr().starts_with(&port.mac)
                    && matches!(m.opts().msg_type(), Some(t) if want.contains(&t))
            })?;
            if let Some(reply) = got {
                return Ok(reply);
            }
            let pause = resend_delay(attempt, self.timing.resend_max);
            if Instant::now() + pause >= end {
                break;
            }
            std::thread::sleep(pause);
        }
        Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!(
                "no DHCP answer within {}",
                humantime::format_duration(self.timing.give_up)
            ),
        ))
    }

    /// DISCOVER, OFFER, REQUEST, ACK.
    fn acquire(&self) -> std::io::Result<Bound> {
        let port = self.port()?;
        let any = Ipv4Addr::UNSPECIFIED;
        let discover = self.message(&port, MessageType::Discover, any);
        let offer = self.exchange(
            &port,
            &discover,
            any,
            Ipv4Addr::BROADCAST,
            &[MessageType::Offer],
        )?;
        let mut request = self.message(&port, MessageType::Request, any);
        request.set_xid(offer.xid());
        request
            .opts_mut()
            .insert(DhcpOption::RequestedIpAddress(offer.yiaddr()));
        if let Some(s) = offer.opts().get(OptionCode::ServerIdentifier) {
            request.opts_mut().insert(s.clone());
        }
        self.bind(&port, &request, any, Ipv4Addr::BROADCAST)
    }

    /// Sends a REQUEST and reads the ACK (a NAK is an error).
    fn bind(
        &self,
        port: &Port,
        request: &Message,
        src: Ipv4Addr,
        dst: Ipv4Addr,
    ) -> std::io::Result<Bound> {
        let want = [MessageType::Ack, MessageType::Nak];
        let reply = self.exchange(port, request, src, dst, &want)?;
        if reply.opts().msg_type() == Some(MessageType::Nak) {
            return Err(option_err("the DHCP server refused the request (DHCPNAK)"));
        }
        Bound::from_ack(&reply)
    }

    /// REQUEST with the bound address as ciaddr: to the server that granted it when
    /// renewing, to everyone when rebinding.
    fn extend(&self, bound: &Bound, to: Ipv4Addr) -> std::io::Result<Bound> {
        let port = self.port()?;
        let me = bound.address.addr();
        let request = self.message(&port, MessageType::Request, me);
        self.bind(&port, &request, me, to)
    }

    fn release(&self, bound: &Bound) -> std::io::Result<()> {
        let port = self.port()?;
        let me = bound.address.addr();
        let mut m = self.message(&port, MessageType::Release, me);
        m.opts_mut()
            .insert(DhcpOption::ServerIdentifier(bound.server));
        port.wire.send(&m, me, bound.server)
    }
}

/// Why no lease was acquired.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LeaseError {
    /// The container's namespace or interface.
    #[error(transparent)]
    Net(#[from] corvid_net::Error),
    /// The interface is not in the namespace.
    #[error("error looking up {ifname:?}: no such interface in {}", netns.display())]
    NoInterface { ifname: String, netns: PathBuf },
    /// The exchange with the DHCP server, for the client named.
    #[error("{client_id}: {source}")]
    Exchange {
        client_id: String,
        source: std::io::Error,
    },
}

/// What the daemon keeps of a lease: the latest ACK and the thread that keeps it.
pub(crate) struct Lease {
    bound: Arc<Mutex<Bound>>,
    stop: mpsc::Sender<()>,
    keeper: Option<JoinHandle<()>>,
}

impl Lease {
    /// Acquires a lease for `ifname` in `netns` and starts the thread that keeps it.
    pub(crate) fn acquire(
        netns: &Path,
        ifname: &str,
        asking: Asking,
        timing: Timing,
    ) -> Result<Lease, LeaseError> {
        let ns = Netns::open(netns)?;
        let mut nl = Netlink::open_in(&ns)?;
        let link = nl
            .link_by_name(ifname)?
            .ok_or_else(|| LeaseError::NoInterface {
                ifname: ifname.to_string(),
                netns: netns.to_path_buf(),
            })?;
        if !link.up {
            nl.set_up(&link)?;
        }
        let client = Client {
            ns,
            ifname: ifname.to_string(),
            asking,
            timing,
        };
        let bound = client.acquire().map_err(|source| LeaseError::Exchange {
            client_id: client.asking.client_id.clone(),
            source,
        })?;
        tracing::info!(
            "{}: lease of {} acquired from {}, for {}",
            client.asking.client_id,
            bound.address,
            bound.server,
            humantime::format_duration(bound.lease)
        );
        let bound = Arc::new(Mutex::new(bound));
        let (stop, stopped) = mpsc::channel();
        let kept = Arc::clone(&bound);
        let keeper = std::thread::spawn(move || keep(client, nl, kept, stopped));
        Ok(Lease {
            bound,
            stop,
            keeper: Some(keeper),
        })
    }

    /// The latest ACK.
    pub(crate) fn bound(&self) -> Bound {
        self.bound.lock().expect("lease lock").clone()
    }

    /// Whether its thread still keeps it (it ends when it expired or the interface went).
    pub(crate) fn kept(&self) -> bool {
        self.keeper.as_ref().is_some_and(|k| !k.is_finished())
    }

    /// Releases it to the server and waits for its thread to end.
    pub(crate) fn stop(mut self) {
        let _ = self.stop.send(());
        if let Some(k) = self.keeper.take() {
            let _ = k.join();
        }
    }
}

/// The keeper thread: renew at T1, rebind at T2, bring the interface down at expiry,
/// release when told to stop.
fn keep(client: Client, mut nl: Netlink, bound: Arc<Mutex<Bound>>, stopped: mpsc::Receiver<()>) {
    let id = client.asking.client_id.clone();
    let mut granted = Instant::now();
    loop {
        let now_bound = bound.lock().expect("lease lock").clone();
        let renew_at = granted + now_bound.renew;
        let rebind_at = granted + now_bound.rebind;
        let expire_at = granted + now_bound.lease;
        // Told to stop (or dropped) while waiting for T1 or, after a failed renewal, for
        // T2: release and end, wherever the wait was.
        let stop = |wait: Duration| stopped.recv_timeout(wait) != Err(RecvTimeoutError::Timeout);
        let release = || match client.release(&now_bound) {
            Ok(()) => tracing::info!("{id}: lease of {} released", now_bound.address),
            Err(e) => tracing::warn!("{id}: failed to send DHCPRELEASE: {e}"),
        };
        if stop(renew_at.saturating_duration_since(Instant::now())) {
            release();
            return;
        }
        let Ok(Some(link)) = nl.link_by_name(&client.ifname) else {
            tracing::info!("{id}: the interface is gone; the lease is no longer kept");
            return;
        };
        let renewed = match client.extend(&now_bound, now_bound.server) {
            Ok(b) => Ok(b),
            Err(e) => {
                tracing::warn!("{id}: renewing: {e}");
                if stop(rebind_at.saturating_duration_since(Instant::now())) {
                    release();
                    return;
                }
                client.extend(&now_bound, Ipv4Addr::BROADCAST)
            }
        };
        match renewed {
            Ok(b) => {
                tracing::info!(
                    "{id}: lease of {} renewed for {}",
                    b.address,
                    humantime::format_duration(b.lease)
                );
                granted = Instant::now();
                *bound.lock().expect("lease lock") = b;
            }
            Err(e) if Instant::now() >= expire_at => {
                tracing::warn!("{id}: lease expired ({e}); bringing the interface down");
                let _ = nl.set_down(&link);
                return;
            }
            Err(e) => tracing::warn!("{id}: rebinding: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ack(opts: Vec<DhcpOption>) -> Message {
        let mut m = Message::default();
        m.set_yiaddr(Ipv4Addr::new(10, 9, 0, 50));
        for o in opts {
            m.opts_mut().insert(o);
        }
        m
    }

    #[test]
    fn routes_come_from_option_121_before_33_and_the_router() {
        let base = vec![
            DhcpOption::SubnetMask(Ipv4Addr::new(255, 255, 255, 0)),
            DhcpOption::Router(vec![Ipv4Addr::new(10, 9, 0, 1)]),
            DhcpOption::AddressLeaseTime(600),
        ];
        let b = Bound::from_ack(&ack(base.clone())).unwrap();
        assert_eq!(b.address.to_string(), "10.9.0.50/24");
        assert_eq!(b.routes.len(), 1);
        assert_eq!(b.routes[0].dst.to_string(), "0.0.0.0/0");
        assert_eq!(
            (b.renew, b.rebind),
            (Duration::from_secs(300), Duration::from_secs(510))
        );

        let mut with33 = base.clone();
        with33.push(DhcpOption::StaticRoutingTable(vec![(
            Ipv4Addr::new(172, 16, 0, 0),
            Ipv4Addr::new(10, 9, 0, 2),
        )]));
        let b = Bound::from_ack(&ack(with33.clone())).unwrap();
        assert_eq!(b.routes[0].dst.to_string(), "172.16.0.0/16");
        assert_eq!(b.routes.len(), 2);

        let mut with121 = with33;
        with121.push(DhcpOption::ClasslessStaticRoute(vec![(
            "192.168.7.0/24".parse().unwrap(),
            Ipv4Addr::UNSPECIFIED,
        )]));
        let b = Bound::from_ack(&ack(with121)).unwrap();
        assert_eq!(b.routes.len(), 1, "121 replaces 33 and the router");
        assert_eq!(b.routes[0].scope, Some(SCOPE_LINK));
    }

    #[test]
    fn an_ack_without_a_mask_is_refused() {
        assert!(Bound::from_ack(&ack(vec![])).is_err());
    }
}

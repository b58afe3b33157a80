//! bandwidth: rate limits for a container's traffic with tc token buckets, from the
//! configuration or runtimeConfig `bandwidth` (either casing). What enters the container
//! is shaped on the host end of its veth; what leaves it is redirected from there to an
//! ifb device and shaped on that. The datapath is corvid-net's `shaping`.

use crate::errors;
use corvid_cni::skel::{CmdArgs, Plugin};
use corvid_cni::{CniResult, Error, ErrorCode};
use corvid_net::link::Link;
use corvid_net::shaping::TokenBucket;
use corvid_net::{names, Netlink, Netns};
use serde::Deserialize;

/// The bandwidth plugin.
pub struct Bandwidth;

/// Rates in bits per second and bursts in bits, as the reference takes them.
#[derive(Deserialize, Default, Clone, Copy)]
#[serde(rename_all = "camelCase")]
struct Limits {
    #[serde(default, alias = "IngressRate")]
    ingress_rate: u64,
    #[serde(default, alias = "IngressBurst")]
    ingress_burst: u64,
    #[serde(default, alias = "EgressRate")]
    egress_rate: u64,
    #[serde(default, alias = "EgressBurst")]
    egress_burst: u64,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct BandwidthConf {
    #[serde(flatten)]
    limits: Limits,
    #[serde(default)]
    unshaped_subnets: Option<Vec<String>>,
    #[serde(default)]
    shaped_subnets: Option<Vec<String>>,
}

fn invalid(msg: &str) -> Error {
    Error::new(ErrorCode::InvalidNetworkConfig, msg)
}

/// The buckets for traffic into and out of the container; none where unlimited.
fn load(args: &CmdArgs) -> Result<(Option<TokenBucket>, Option<TokenBucket>), Error> {
    let conf: BandwidthConf = serde_json::from_slice(&args.stdin).map_err(errors::config)?;
    let subnets = [&conf.unshaped_subnets, &conf.shaped_subnets];
    if subnets
        .iter()
        .any(|s| s.as_ref().is_some_and(|s| !s.is_empty()))
    {
        return Err(Error::new(
            ErrorCode::UnsupportedField,
            "unsupported fields \"unshapedSubnets\" and \"shapedSubnets\": corvid's bandwidth shapes all of a container's traffic",
        ));
    }
    let runtime = args
        .conf
        .runtime_config
        .as_ref()
        .and_then(|r| r.get("bandwidth"))
        .map(|v| Limits::deserialize(v).map_err(errors::config))
        .transpose()?;
    let l = runtime.unwrap_or(conf.limits);
    Ok((
        bucket(l.ingress_rate, l.ingress_burst)?,
        bucket(l.egress_rate, l.egress_burst)?,
    ))
}

fn bucket(rate_bits: u64, burst_bits: u64) -> Result<Option<TokenBucket>, Error> {
    match (rate_bits, burst_bits) {
        (0, 0) => Ok(None),
        (_, 0) => Err(invalid("if rate is set, burst must also be set")),
        (0, _) => Err(invalid("if burst is set, rate must also be set")),
        (_, b) if b / 8 >= u64::from(u32::MAX) => Err(invalid("burst cannot be more than 4GB")),
        (r, _) if r < 8 => Err(invalid("rate must be at least 8 bits per second")),
        (r, b) => Ok(Some(TokenBucket {
            rate: r / 8,
            burst: (b / 8) as u32,
        })),
    }
}

/// The host end of the container's veth.
fn host_end(args: &CmdArgs, host: &mut Netlink) -> Result<Link, Error> {
    let path = args
        .netns
        .as_ref()
        .ok_or_else(|| Error::new(ErrorCode::InvalidEnvironment, "CNI_NETNS is required"))?;
    let ns = Netns::open(path).map_err(errors::net)?;
    let mut container = Netlink::open_in(&ns).map_err(errors::net)?;
    let link = container.link_by_name(&args.ifname).map_err(errors::net)?;
    let peer = link.and_then(|l| l.peer_index).ok_or_else(|| {
        Error::new(
            ErrorCode::Kernel,
            format!(
                "{} in {} is not a veth: bandwidth shapes veth pairs",
                args.ifname,
                path.display()
            ),
        )
    })?;
    host.link_by_index(peer)
        .map_err(errors::net)?
        .ok_or_else(|| {
            Error::new(
                ErrorCode::Kernel,
                format!("the host end of {} is gone", args.ifname),
            )
        })
}

fn ifb_name(args: &CmdArgs) -> String {
    names::ifb(&args.conf.name, &args.container_id, &args.ifname)
}

/// The attachment's ifb device, under its name or the one versions before GC gave it.
fn existing_ifb(args: &CmdArgs, host: &mut Netlink) -> Result<Option<Link>, Error> {
    let before = names::ifb_before_gc(&args.conf.name, &args.container_id, &args.ifname);
    for name in [ifb_name(args), before] {
        if let Some(dev) = host.link_by_name(&name).map_err(errors::net)? {
            return Ok(Some(dev));
        }
    }
    Ok(None)
}

fn shape(
    host: &mut Netlink,
    veth: &Link,
    ifb: &str,
    into: Option<TokenBucket>,
    out_of: Option<TokenBucket>,
) -> corvid_net::Result<()> {
    if let Some(b) = into {
        host.set_token_bucket(veth, b)?;
    }
    if let Some(b) = out_of {
        host.add_ifb(ifb, veth.mtu)?;
        let dev = host
            .link_by_name(ifb)?
            .expect("the ifb device was just made");
        host.set_token_bucket(&dev, b)?;
        host.redirect_ingress(veth, &dev)?;
    }
    Ok(())
}

impl Plugin for Bandwidth {
    fn add(&self, args: &CmdArgs) -> Result<CniResult, Error> {
        let (into, out_of) = load(args)?;
        let prev = args
            .prev_result
            .clone()
            .ok_or_else(|| invalid("bandwidth must be called as a chained plugin"))?;
        if into.is_none() && out_of.is_none() {
            return Ok(prev);
        }
        let mut host = Netlink::open().map_err(errors::net)?;
        let veth = host_end(args, &mut host)?;
        let ifb = ifb_name(args);
        if let Err(e) = shape(&mut host, &veth, &ifb, into, out_of) {
            // Nothing half-made: the veth's qdiscs and the ifb go.
            let _ = host.clear_qdiscs(&veth);
            if let Ok(Some(dev)) = host.link_by_name(&ifb) {
                let _ = host.delete_link(&dev);
            }
            return Err(errors::net(e));
        }
        Ok(prev)
    }

    fn del(&self, args: &CmdArgs) -> Result<(), Error> {
        load(args)?;
        let mut host = Netlink::open().map_err(errors::net)?;
        let mut failures = Vec::new();
        if let Some(dev) = existing_ifb(args, &mut host)? {
            if let Err(e) = host.delete_link(&dev) {
                failures.push(errors::net(e));
            }
        }
        if let Ok(veth) = host_end(args, &mut host) {
            if let Err(e) = host.clear_qdiscs(&veth) {
                failures.push(errors::net(e));
            }
        }
        Error::all(failures)
    }

    fn check(&self, args: &CmdArgs) -> Result<(), Error> {
        let (into, out_of) = load(args)?;
        let mut host = Netlink::open().map_err(errors::net)?;
        let veth = host_end(args, &mut host)?;
        let fail = |msg: String| Err(Error::new(ErrorCode::CheckFailed, msg));
        let have = host.token_bucket(&veth).map_err(errors::net)?;
        if into.is_some() && have.map(|h| h.rate) != into.map(|b| b.rate) {
            return fail(format!(
                "{} is shaped {have:?}, configured {into:?}",
                veth.name
            ));
        }
        if let Some(want) = out_of {
            let Some(dev) = existing_ifb(args, &mut host)? else {
                return fail(format!("ifb device {} is missing", ifb_name(args)));
            };
            let ifb = &dev.name;
            let have = host.token_bucket(&dev).map_err(errors::net)?;
            if have.map(|h| h.rate) != Some(want.rate) {
                return fail(format!("{ifb} is shaped {have:?}, configured {want:?}"));
            }
        }
        Ok(())
    }

    /// Removes the network's ifb devices whose attachment is not valid: a sandbox
    /// removed without DEL takes its veth along, but the ifb is the host's.
    fn gc(&self, args: &CmdArgs) -> Result<(), Error> {
        load(args)?;
        let network = &args.conf.name;
        let valid: Vec<String> = args
            .conf
            .valid_attachments
            .iter()
            .flatten()
            .map(|a| names::ifb(network, &a.container_id, &a.ifname))
            .collect();
        let prefix = names::ifb_prefix(network);
        let mut host = Netlink::open().map_err(errors::net)?;
        let mut failures = Vec::new();
        for dev in host.links().map_err(errors::net)? {
            if dev.name.starts_with(&prefix) && !valid.contains(&dev.name) {
                if let Err(e) = host.delete_link(&dev) {
                    failures.push(errors::net(e));
                }
            }
        }
        Error::all(failures)
    }

    fn status(&self, args: &CmdArgs) -> Result<(), Error> {
        load(args).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_bursts_come_in_pairs() {
        assert_eq!(bucket(0, 0).unwrap(), None);
        assert_eq!(
            bucket(8_000_000, 800_000).unwrap(),
            Some(TokenBucket {
                rate: 1_000_000,
                burst: 100_000
            })
        );
        for (r, b) in [(1000, 0), (0, 1000), (1000, 8 * u64::from(u32::MAX))] {
            assert_eq!(
                bucket(r, b).unwrap_err().code,
                ErrorCode::InvalidNetworkConfig as u32
            );
        }
        let pascal: Limits =
            serde_json::from_value(serde_json::json!({"IngressRate": 8, "IngressBurst": 16}))
                .unwrap();
        assert_eq!((pascal.ingress_rate, pascal.ingress_burst), (8, 16));
    }
}

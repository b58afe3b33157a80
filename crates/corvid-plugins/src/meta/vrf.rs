//! vrf: chained after the plugin that made CNI_IFNAME, puts it into the VRF `vrfname`
//! (made, up, with routing table `table` or the first free one, when missing). The
//! interface's gateway routes move to the VRF's table with it, and IPv6 addresses the
//! kernel drops when the interface joins are put back. DEL takes it out and removes the
//! VRF when no interface is left in it.

use crate::errors;
use corvid_cni::skel::{CmdArgs, Plugin};
use corvid_cni::{CniResult, Error, ErrorCode};
use corvid_net::link::{Link, LinkKind};
use corvid_net::route::{RouteSpec, MAIN_TABLE, SCOPE_UNIVERSE};
use corvid_net::{Netlink, Netns};
use serde::Deserialize;
use std::time::{Duration, Instant};

/// The vrf plugin.
pub struct Vrf;

#[derive(Deserialize)]
struct Conf {
    #[serde(default)]
    vrfname: String,
    #[serde(default)]
    table: u32,
}

fn fail(msg: impl Into<String>) -> Error {
    Error::new(ErrorCode::Internal, msg)
}

fn load(args: &CmdArgs, needs_prev: bool) -> Result<Conf, Error> {
    let c: Conf = serde_json::from_slice(&args.stdin).map_err(errors::config)?;
    if c.vrfname.is_empty() {
        return Err(Error::new(
            ErrorCode::InvalidNetworkConfig,
            "vrf: configuration is expected to have a valid vrf name",
        ));
    }
    if needs_prev && args.prev_result.is_none() {
        return Err(Error::new(
            ErrorCode::InvalidNetworkConfig,
            "vrf: missing prevResult from earlier plugin",
        ));
    }
    Ok(c)
}

/// The VRF named `name`, if there is one; a link of that name of another kind is refused.
fn find(nl: &mut Netlink, name: &str) -> Result<Option<Link>, Error> {
    match nl.link_by_name(name).map_err(errors::net)? {
        Some(l) if l.kind != LinkKind::Vrf => Err(fail(format!("vrf: {name} is not a VRF"))),
        found => Ok(found),
    }
}

/// The VRF to join: the one there (its table must be `table` when that is set) or a new
/// one; true when made here.
fn vrf(nl: &mut Netlink, c: &Conf) -> Result<(Link, bool), Error> {
    if let Some(v) = find(nl, &c.vrfname)? {
        if c.table != 0 && v.vrf_table != Some(c.table) {
            return Err(fail(format!(
                "vrf: VRF {} already exists with a different routing table {}",
                c.vrfname,
                v.vrf_table.unwrap_or_default()
            )));
        }
        return Ok((v, false));
    }
    let links = nl.links().map_err(errors::net)?;
    let table = if c.table != 0 {
        c.table
    } else {
        let taken: Vec<u32> = links.iter().filter_map(|l| l.vrf_table).collect();
        (1..).find(|t| !taken.contains(t)).unwrap_or(1)
    };
    nl.add_vrf(&c.vrfname, table).map_err(errors::net)?;
    let made = find(nl, &c.vrfname)?.ok_or_else(|| fail(format!("vrf: {} vanished", c.vrfname)))?;
    Ok((made, true))
}

fn is_global_v6(a: &ipnet::IpNet) -> bool {
    matches!(a, ipnet::IpNet::V6(v) if (v.addr().segments()[0] & 0xffc0) != 0xfe80)
}

/// Puts `link` into `vrf`, keeping its global IPv6 addresses and moving its gateway
/// routes to the VRF's table.
fn join(nl: &mut Netlink, link: &Link, vrf: &Link) -> Result<(), Error> {
    if let Some(m) = link.master {
        let name = nl
            .link_by_index(m)
            .ok()
            .flatten()
            .map_or_else(|| m.to_string(), |l| l.name);
        return Err(fail(format!(
            "vrf: interface {} already has a master: {name}",
            link.name
        )));
    }
    let table = vrf.vrf_table.unwrap_or_default();
    let before: Vec<ipnet::IpNet> = nl
        .addresses(Some(link.index))
        .map_err(errors::net)?
        .into_iter()
        .map(|(_, a)| a)
        .filter(is_global_v6)
        .collect();
    let gateway_routes: Vec<RouteSpec> = nl
        .routes()
        .map_err(errors::net)?
        .into_iter()
        .filter(|r| {
            r.oif == link.index
                && r.table == Some(MAIN_TABLE)
                && r.scope == Some(SCOPE_UNIVERSE)
                && r.gw.is_some()
        })
        .collect();
    nl.set_master(link, Some(vrf)).map_err(errors::net)?;
    let after: Vec<ipnet::IpNet> = nl
        .addresses(Some(link.index))
        .map_err(errors::net)?
        .into_iter()
        .map(|(_, a)| a)
        .collect();
    for a in before.iter().filter(|a| !after.contains(a)) {
        nl.add_address(link.index, a).map_err(errors::net)?;
    }
    for r in gateway_routes {
        let mut moved = r.clone();
        moved.table = Some(table);
        // A gateway is reachable once the address's connected route reached the VRF's
        // table, which for a restored IPv6 address takes a moment.
        let end = Instant::now() + Duration::from_secs(3);
        loop {
            match nl.replace_route(&moved) {
                Ok(()) => break,
                Err(e) if e.errno() == Some(libc::ENETUNREACH) && Instant::now() < end => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(errors::net(e)),
            }
        }
    }
    Ok(())
}

fn add(args: &CmdArgs) -> Result<CniResult, Error> {
    let c = load(args, true)?;
    let ns = Netns::open(crate::attach::netns_path(args)?).map_err(errors::net)?;
    let mut nl = Netlink::open_in(&ns).map_err(errors::net)?;
    let link = nl
        .link_by_name(&args.ifname)
        .map_err(errors::net)?
        .ok_or_else(|| fail(format!("vrf: could not get link by name {}", args.ifname)))?;
    let (vrf, made) = vrf(&mut nl, &c)?;
    if let Err(e) = join(&mut nl, &link, &vrf) {
        let _ = nl.set_master(&link, None);
        if made {
            let _ = nl.delete_link(&vrf);
        }
        return Err(e);
    }
    Ok(args.prev_result.clone().unwrap_or_default())
}

fn del(args: &CmdArgs) -> Result<(), Error> {
    let c = load(args, false)?;
    let Some(ns) = args.netns.as_ref().and_then(|p| Netns::open(p).ok()) else {
        return Ok(());
    };
    let mut nl = Netlink::open_in(&ns).map_err(errors::net)?;
    let Some(vrf) = find(&mut nl, &c.vrfname)? else {
        return Ok(());
    };
    if let Some(link) = nl.link_by_name(&args.ifname).map_err(errors::net)? {
        if link.master == Some(vrf.index) {
            nl.set_master(&link, None).map_err(errors::net)?;
        }
    }
    let left = nl
        .links()
        .map_err(errors::net)?
        .into_iter()
        .any(|l| l.master == Some(vrf.index));
    if !left {
        nl.delete_link(&vrf).map_err(errors::net)?;
    }
    Ok(())
}

fn check(args: &CmdArgs) -> Result<(), Error> {
    let c = load(args, true)?;
    let ns = Netns::open(crate::attach::netns_path(args)?).map_err(errors::net)?;
    let mut nl = Netlink::open_in(&ns).map_err(errors::net)?;
    let vrf =
        find(&mut nl, &c.vrfname)?.ok_or_else(|| fail(format!("vrf: no VRF {}", c.vrfname)))?;
    let joined = nl
        .link_by_name(&args.ifname)
        .map_err(errors::net)?
        .is_some_and(|l| l.master == Some(vrf.index));
    if !joined {
        return Err(Error::new(
            ErrorCode::CheckFailed,
            format!("vrf: {} is not in vrf {}", args.ifname, c.vrfname),
        ));
    }
    Ok(())
}

impl Plugin for Vrf {
    fn add(&self, args: &CmdArgs) -> Result<CniResult, Error> {
        add(args)
    }

    fn del(&self, args: &CmdArgs) -> Result<(), Error> {
        del(args)
    }

    fn check(&self, args: &CmdArgs) -> Result<(), Error> {
        check(args)
    }

    fn gc(&self, args: &CmdArgs) -> Result<(), Error> {
        load(args, false).map(drop)
    }

    fn status(&self, args: &CmdArgs) -> Result<(), Error> {
        load(args, false).map(drop)
    }
}

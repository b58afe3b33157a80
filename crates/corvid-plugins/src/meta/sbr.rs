//! sbr: source-based routing, chained after the plugin that made CNI_IFNAME. Each address
//! the previous result gave the interface gets a rule sending packets from it to a table of
//! its own, and the interface's routes move there from the main table, so replies leave
//! through the interface they came in on. With `table`, only the rules are added, to that
//! table. DEL removes the rules of the interface's addresses.

use crate::errors;
use corvid_cni::result::IpConfig;
use corvid_cni::skel::{CmdArgs, Plugin};
use corvid_cni::{CniResult, Error, ErrorCode};
use corvid_net::route::{RouteSpec, MAIN_TABLE, SCOPE_LINK};
use corvid_net::rule::RuleSpec;
use corvid_net::{Netlink, Netns};
use ipnet::IpNet;
use serde::Deserialize;
use std::collections::BTreeSet;
use std::net::IpAddr;
use std::os::fd::AsRawFd;

/// The sbr plugin.
pub struct Sbr;

/// The first table sbr picks when the configuration names none, as the reference does.
const FIRST_TABLE: u32 = 100;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Conf {
    table: Option<u32>,
    #[serde(default)]
    gateways: Vec<String>,
    #[serde(default)]
    add_source_hints: bool,
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorCode::InvalidNetworkConfig, msg)
}

/// The configuration, with its static gateways split by family.
struct Loaded {
    conf: Conf,
    gw4: Option<IpAddr>,
    gw6: Option<IpAddr>,
}

fn load(args: &CmdArgs) -> Result<Loaded, Error> {
    let conf: Conf = serde_json::from_slice(&args.stdin).map_err(errors::config)?;
    if conf.gateways.len() > 2 {
        return Err(invalid(
            "sbr: gateways list cannot contain more than 2 entries (one IPv4, one IPv6)",
        ));
    }
    let (mut gw4, mut gw6) = (None, None);
    for g in &conf.gateways {
        let ip: IpAddr = g
            .parse()
            .map_err(|_| invalid(format!("sbr: invalid static gateway IP address: {g}")))?;
        let slot = if ip.is_ipv4() { &mut gw4 } else { &mut gw6 };
        if let Some(old) = slot.replace(ip) {
            return Err(invalid(format!(
                "sbr: gateways list has two addresses of one family: {old} and {ip}"
            )));
        }
    }
    Ok(Loaded { conf, gw4, gw6 })
}

/// The previous result's addresses that belong to CNI_IFNAME (or to no interface).
fn addresses<'a>(args: &CmdArgs, prev: &'a CniResult) -> Result<Vec<&'a IpConfig>, Error> {
    if prev.ips.is_empty() {
        return Err(invalid(format!(
            "sbr: no IP addresses supplied on interface {}",
            args.ifname
        )));
    }
    Ok(prev
        .ips
        .iter()
        .filter(|ip| {
            ip.interface
                .and_then(|i| prev.interfaces.get(i))
                .is_none_or(|i| i.name == args.ifname)
        })
        .collect())
}

/// Takes the lock the reference takes on the namespace file, so two sbr runs on one
/// container (theirs or ours) never pick the same table; it holds until the file drops.
fn lock_netns(path: &std::path::Path) -> Result<std::fs::File, Error> {
    let fail = |e: std::io::Error| {
        Error::new(
            ErrorCode::Internal,
            format!("sbr: lock {}: {e}", path.display()),
        )
    };
    let file = std::fs::File::open(path).map_err(fail)?;
    // SAFETY: flock on a descriptor this function owns.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(fail(std::io::Error::last_os_error()));
    }
    Ok(file)
}

/// A table number no rule and no route uses yet, from `from` up.
fn free_table(used: &BTreeSet<u32>, from: u32) -> u32 {
    (from..).find(|t| !used.contains(t)).unwrap_or(from)
}

fn add(args: &CmdArgs, l: &Loaded) -> Result<CniResult, Error> {
    let prev = args.prev_result.as_ref().ok_or_else(|| {
        invalid("sbr: this plugin must be called as a chained plugin (no prevResult)")
    })?;
    let ips = addresses(args, prev)?;
    let path = crate::attach::netns_path(args)?;
    let _lock = lock_netns(path)?;
    let ns = Netns::open(path).map_err(errors::net)?;
    let mut nl = Netlink::open_in(&ns).map_err(errors::net)?;
    let mut made = Made::default();
    let done = match l.conf.table {
        Some(table) => ips.iter().try_for_each(|ip| {
            made.rule(
                &mut nl,
                RuleSpec::from_source(IpNet::from(ip.address.addr()), table),
            )
        }),
        None => own_tables(&mut nl, args, l, &ips, &mut made),
    };
    match done {
        Ok(()) => Ok(prev.clone()),
        Err(e) => {
            made.undo(&mut nl);
            Err(errors::net(e))
        }
    }
}

/// What an ADD changed, undone in reverse when a later step fails.
#[derive(Default)]
struct Made {
    rules: Vec<RuleSpec>,
    routes: Vec<RouteSpec>,
    moved: Vec<RouteSpec>,
}

impl Made {
    fn rule(&mut self, nl: &mut Netlink, r: RuleSpec) -> corvid_net::Result<()> {
        nl.add_rule(&r)?;
        self.rules.push(r);
        Ok(())
    }

    fn route(&mut self, nl: &mut Netlink, r: RouteSpec) -> corvid_net::Result<()> {
        nl.replace_route(&r)?;
        self.routes.push(r);
        Ok(())
    }

    fn undo(self, nl: &mut Netlink) {
        for r in self.moved.iter().rev() {
            let _ = nl.replace_route(r);
        }
        for r in self.routes.iter().rev() {
            let _ = nl.delete_route(r);
        }
        for r in self.rules.iter().rev() {
            let _ = nl.delete_rule(r);
        }
    }
}

/// The reference's default: a table per address holding the interface's routes, which
/// leave the main table.
fn own_tables(
    nl: &mut Netlink,
    args: &CmdArgs,
    l: &Loaded,
    ips: &[&IpConfig],
    made: &mut Made,
) -> corvid_net::Result<()> {
    let rules = nl.rules()?;
    let all_routes = nl.routes()?;
    let used: BTreeSet<u32> = rules
        .iter()
        .map(|r| r.table)
        .chain(all_routes.iter().filter_map(|r| r.table))
        .collect();
    let Some(link) = nl.link_by_name(&args.ifname)? else {
        return Err(corvid_net::Error::Netlink {
            op: format!("sbr: find interface {}", args.ifname),
            source: std::io::Error::from_raw_os_error(libc::ENODEV),
        });
    };
    let own: Vec<RouteSpec> = all_routes
        .into_iter()
        .filter(|r| r.oif == link.index && r.table == Some(MAIN_TABLE))
        .collect();
    let mut table = free_table(&used, FIRST_TABLE);
    for ip in ips {
        let addr = ip.address.addr();
        made.rule(nl, RuleSpec::from_source(IpNet::from(addr), table))?;
        let gateway = if addr.is_ipv4() { l.gw4 } else { l.gw6 }.or(ip.gateway);
        if let Some(gw) = gateway {
            let unspecified = if addr.is_ipv4() {
                IpAddr::from([0u8; 4])
            } else {
                IpAddr::from([0u16; 8])
            };
            let any = IpNet::new(unspecified, 0).expect("prefix 0 is valid");
            let mut default = RouteSpec::new(any, Some(gw), link.index);
            default.table = Some(table);
            made.route(nl, default)?;
        }
        let mine = |a: Option<IpAddr>| a.is_some_and(|a| ip.address.contains(&a));
        for r in own
            .iter()
            .filter(|r| mine(r.src) || mine(r.gw) || (r.src.is_none() && r.gw.is_none()))
        {
            let mut copy = r.clone();
            copy.table = Some(table);
            made.route(nl, copy)?;
        }
        table = free_table(&used, table + 1);
    }
    let leaving: Vec<&RouteSpec> = if l.conf.add_source_hints {
        for ip in ips {
            let mut hint = RouteSpec::new(ip.address.trunc(), None, link.index);
            hint.src = Some(ip.address.addr());
            hint.scope = Some(SCOPE_LINK);
            if let Err(e) = nl.replace_route(&hint) {
                tracing::warn!("sbr: source hint for {}: {e}", ip.address);
            }
        }
        own.iter().filter(|r| r.scope != Some(SCOPE_LINK)).collect()
    } else {
        own.iter().collect()
    };
    for r in leaving {
        nl.delete_route(r)?;
        made.moved.push(r.clone());
    }
    Ok(())
}

/// Removes every rule whose source is an address of CNI_IFNAME (of `table` only, when set).
fn del(args: &CmdArgs, l: &Loaded) -> Result<(), Error> {
    let Some(path) = args.netns.as_deref() else {
        return Ok(());
    };
    let Ok(ns) = Netns::open(path) else {
        return Ok(());
    };
    let _lock = lock_netns(path)?;
    let mut nl = Netlink::open_in(&ns).map_err(errors::net)?;
    let Some(link) = nl.link_by_name(&args.ifname).map_err(errors::net)? else {
        return Ok(());
    };
    let addrs: Vec<IpAddr> = nl
        .addresses(Some(link.index))
        .map_err(errors::net)?
        .into_iter()
        .map(|(_, a)| a.addr())
        .collect();
    let mut failures = Vec::new();
    for rule in nl.rules().map_err(errors::net)? {
        let in_table = l.conf.table.is_none_or(|t| t == rule.table);
        if in_table && rule.src.is_some_and(|s| addrs.contains(&s.addr())) {
            if let Err(e) = nl.delete_rule(&rule) {
                failures.push(errors::net(e));
            }
        }
    }
    Error::all(failures)
}

/// Each address of the interface has its rule.
fn check(args: &CmdArgs, l: &Loaded) -> Result<(), Error> {
    let Some(prev) = args.prev_result.as_ref() else {
        return Err(invalid("sbr: CHECK needs prevResult"));
    };
    let path = crate::attach::netns_path(args)?;
    let ns = Netns::open(path).map_err(errors::net)?;
    let mut nl = Netlink::open_in(&ns).map_err(errors::net)?;
    let rules = nl.rules().map_err(errors::net)?;
    for ip in addresses(args, prev)? {
        let from = IpNet::from(ip.address.addr());
        let found = rules
            .iter()
            .any(|r| r.src == Some(from) && l.conf.table.is_none_or(|t| t == r.table));
        if !found {
            return Err(Error::new(
                ErrorCode::Internal,
                format!("sbr: no rule for source {from} in {}", path.display()),
            ));
        }
    }
    Ok(())
}

impl Plugin for Sbr {
    fn add(&self, args: &CmdArgs) -> Result<CniResult, Error> {
        add(args, &load(args)?)
    }

    fn del(&self, args: &CmdArgs) -> Result<(), Error> {
        del(args, &load(args)?)
    }

    fn check(&self, args: &CmdArgs) -> Result<(), Error> {
        check(args, &load(args)?)
    }

    fn gc(&self, args: &CmdArgs) -> Result<(), Error> {
        load(args).map(drop)
    }

    fn status(&self, args: &CmdArgs) -> Result<(), Error> {
        load(args).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_table_skips_used_ones() {
        let used: BTreeSet<u32> = [100, 101, 103, 254, 255].into_iter().collect();
        assert_eq!(free_table(&used, FIRST_TABLE), 102);
        assert_eq!(free_table(&used, 103), 104);
        assert_eq!(free_table(&BTreeSet::new(), FIRST_TABLE), 100);
    }
}

//! host-local IPAM: addresses from configured range sets, leases on local disk in the
//! reference plugin's layout.

use crate::errors;
use corvid_cni::result::{Dns, IpConfig, Route};
use corvid_cni::skel::{CmdArgs, Plugin};
use corvid_cni::{CniResult, Error, ErrorCode};
use corvid_ipam::leases::DEFAULT_DATA_DIR;
use corvid_ipam::{LeaseDir, Range, RangeConf, RangeSet};
use serde::Deserialize;
use std::collections::HashSet;
use std::net::IpAddr;
use std::path::Path;

/// The host-local plugin.
pub struct HostLocal;

#[derive(Deserialize)]
struct Conf {
    ipam: IpamConf,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct IpamConf {
    #[serde(default)]
    subnet: Option<String>,
    #[serde(default)]
    range_start: Option<String>,
    #[serde(default)]
    range_end: Option<String>,
    #[serde(default)]
    gateway: Option<String>,
    #[serde(default)]
    ranges: Vec<Vec<RangeConf>>,
    #[serde(default)]
    routes: Vec<Route>,
    #[serde(default)]
    data_dir: Option<String>,
    #[serde(default)]
    resolv_conf: Option<String>,
}

struct Setup {
    sets: Vec<RangeSet>,
    conf: IpamConf,
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorCode::InvalidNetworkConfig, msg)
}

fn load(args: &CmdArgs) -> Result<Setup, Error> {
    let conf: Conf = serde_json::from_slice(&args.stdin).map_err(errors::config)?;
    let mut conf = conf.ipam;
    let mut confs = std::mem::take(&mut conf.ranges);
    if let Some(subnet) = conf.subnet.take() {
        confs.insert(
            0,
            vec![RangeConf {
                subnet,
                range_start: conf.range_start.take(),
                range_end: conf.range_end.take(),
                gateway: conf.gateway.take(),
            }],
        );
    }
    if confs.is_empty() {
        return Err(invalid(
            "host-local: no IP ranges specified (set \"subnet\" or \"ranges\")",
        ));
    }
    let mut sets: Vec<RangeSet> = Vec::with_capacity(confs.len());
    for set in &confs {
        let ranges = set
            .iter()
            .map(Range::from_conf)
            .collect::<Result<Vec<_>, _>>()
            .map_err(errors::ipam)?;
        let set = RangeSet::new(ranges).map_err(errors::ipam)?;
        if let Some(other) = sets.iter().find(|s| s.overlaps(&set)) {
            return Err(invalid(format!(
                "host-local: range set {set} overlaps range set {other}"
            )));
        }
        sets.push(set);
    }
    Ok(Setup { sets, conf })
}

fn data_dir(conf: &IpamConf) -> &Path {
    Path::new(conf.data_dir.as_deref().unwrap_or(DEFAULT_DATA_DIR))
}

fn parse_requested(s: &str) -> Result<IpAddr, Error> {
    let bare = s.split('/').next().unwrap_or(s);
    bare.trim().parse().map_err(|_| {
        Error::new(
            ErrorCode::InvalidNetworkConfig,
            format!("requested IP \"{s}\" is not an IP address"),
        )
    })
}

/// Addresses asked for through CNI_ARGS `IP=`, `args.cni.ips` or `runtimeConfig.ips`.
fn requested_ips(args: &CmdArgs) -> Result<Vec<IpAddr>, Error> {
    let mut out = Vec::new();
    if let Some(list) = args.args.get("IP") {
        for s in list.split(',').filter(|s| !s.is_empty()) {
            out.push(parse_requested(s)?);
        }
    }
    for v in [
        args.conf.args_cni_value("ips"),
        args.conf.runtime_config_value("ips"),
    ]
    .into_iter()
    .flatten()
    {
        let list = v
            .as_array()
            .ok_or_else(|| invalid("\"ips\" must be a list of addresses"))?;
        for s in list {
            let s = s
                .as_str()
                .ok_or_else(|| invalid("\"ips\" must be a list of addresses"))?;
            out.push(parse_requested(s)?);
        }
    }
    out.dedup();
    Ok(out)
}

fn read_resolv_conf(path: &str) -> Result<Dns, Error> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Error::new(
            ErrorCode::Io,
            format!("host-local: cannot read resolvConf {path}"),
        )
        .with_details(e.to_string())
    })?;
    let mut dns = Dns::default();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("nameserver") => dns.nameservers.extend(words.next().map(String::from)),
            Some("domain") => dns.domain = words.next().unwrap_or_default().to_string(),
            Some("search") => dns.search = words.map(String::from).collect(),
            Some("options") => dns.options = words.map(String::from).collect(),
            _ => {}
        }
    }
    Ok(dns)
}

impl Plugin for HostLocal {
    fn add(&self, args: &CmdArgs) -> Result<CniResult, Error> {
        let setup = load(args)?;
        let mut requested = requested_ips(args)?;
        for ip in &requested {
            if !setup.sets.iter().any(|s| s.range_for(*ip).is_some()) {
                return Err(Error::new(
                    ErrorCode::AddressUnavailable,
                    format!("host-local: requested IP {ip} is not in any configured range"),
                ));
            }
        }
        let dns = match &setup.conf.resolv_conf {
            Some(p) => read_resolv_conf(p)?,
            None => Dns::default(),
        };
        let store = LeaseDir::open(data_dir(&setup.conf), &args.conf.name).map_err(errors::ipam)?;
        // Written before the lock: concurrent ADDs then wait on each other only for the
        // scan and the link.
        let mut prepared = (0..setup.sets.len())
            .map(|_| store.prepare_lease(&args.container_id, &args.ifname))
            .collect::<Result<Vec<_>, _>>()
            .map_err(errors::ipam)?;
        let lock = store.lock().map_err(errors::ipam)?;
        // From the attachment's index entry, not a read of every lease: an attachment
        // without one (made by the reference) gets a new address on a repeated ADD.
        let held = lock
            .held(&args.container_id, &args.ifname)
            .map_err(errors::ipam)?
            .unwrap_or_default();
        let mut reserved_now: Vec<IpAddr> = Vec::new();
        let mut ips = Vec::with_capacity(setup.sets.len());
        let allocated = (|| {
            for (i, set) in setup.sets.iter().enumerate() {
                // An ADD repeated for the same attachment gets the same address back.
                if let Some(ip) = held.iter().copied().find(|ip| set.range_for(*ip).is_some()) {
                    ips.push((ip, set.range_for(ip).cloned()));
                    continue;
                }
                let mut lease = prepared.pop().expect("one prepared lease per range set");
                let ip = if let Some(pos) =
                    requested.iter().position(|ip| set.range_for(*ip).is_some())
                {
                    let ip = requested.remove(pos);
                    if lock.reserve(lease, ip, i).map_err(errors::ipam)?.is_err() {
                        return Err(Error::new(
                            ErrorCode::AddressUnavailable,
                            format!("host-local: requested IP {ip} is already allocated"),
                        ));
                    }
                    ip
                } else {
                    loop {
                        let Some((ip, _)) =
                            set.next_free(lock.last_reserved(i), |ip| lock.is_reserved(ip))
                        else {
                            return Err(errors::ipam(corvid_ipam::Error::Exhausted(
                                set.to_string(),
                            )));
                        };
                        match lock.reserve(lease, ip, i).map_err(errors::ipam)? {
                            Ok(()) => break ip,
                            Err(back) => lease = back,
                        }
                    }
                };
                reserved_now.push(ip);
                ips.push((ip, set.range_for(ip).cloned()));
            }
            if let Some(ip) = requested.first() {
                return Err(Error::new(
                    ErrorCode::AddressUnavailable,
                    format!("host-local: requested IP {ip} could not be given: its range set already has an address"),
                ));
            }
            Ok(())
        })();
        let noted = allocated.and_then(|()| {
            let all: Vec<IpAddr> = ips.iter().map(|(ip, _)| *ip).collect();
            lock.note_held(&args.container_id, &args.ifname, &all)
                .map_err(errors::ipam)
        });
        if let Err(e) = noted {
            for ip in reserved_now {
                let _ = lock.release(ip);
            }
            return Err(e);
        }
        Ok(CniResult {
            interfaces: Vec::new(),
            ips: ips
                .into_iter()
                .filter_map(|(ip, range)| {
                    let range = range?;
                    Some(IpConfig {
                        address: range.with_prefix(ip),
                        gateway: Some(range.gateway),
                        interface: None,
                    })
                })
                .collect(),
            routes: setup.conf.routes.clone(),
            dns,
        })
    }

    fn del(&self, args: &CmdArgs) -> Result<(), Error> {
        let setup = load(args)?;
        let store = LeaseDir::open(data_dir(&setup.conf), &args.conf.name).map_err(errors::ipam)?;
        let lock = store.lock().map_err(errors::ipam)?;
        lock.release_by_id(&args.container_id, &args.ifname)
            .map(drop)
            .map_err(errors::ipam)
    }

    fn check(&self, args: &CmdArgs) -> Result<(), Error> {
        let setup = load(args)?;
        let store = LeaseDir::open(data_dir(&setup.conf), &args.conf.name).map_err(errors::ipam)?;
        let lock = store.lock().map_err(errors::ipam)?;
        let held = match lock
            .held(&args.container_id, &args.ifname)
            .map_err(errors::ipam)?
        {
            Some(held) => held,
            None => lock
                .get_by_id(&args.container_id, &args.ifname)
                .map_err(errors::ipam)?,
        };
        if held.is_empty() {
            return Err(Error::new(
                ErrorCode::CheckFailed,
                format!(
                    "host-local: {} holds no address on {}",
                    args.container_id, args.ifname
                ),
            ));
        }
        let prev = args
            .prev_result
            .as_ref()
            .map(|r| r.ips.as_slice())
            .unwrap_or_default();
        for ip in prev {
            let addr = ip.address.addr();
            if setup.sets.iter().any(|s| s.range_for(addr).is_some()) && !held.contains(&addr) {
                return Err(Error::new(
                    ErrorCode::CheckFailed,
                    format!(
                        "host-local: {addr} is not leased to {} on {}",
                        args.container_id, args.ifname
                    ),
                ));
            }
        }
        Ok(())
    }

    fn gc(&self, args: &CmdArgs) -> Result<(), Error> {
        let setup = load(args)?;
        let valid: HashSet<(&str, &str)> = args
            .conf
            .valid_attachments
            .iter()
            .flatten()
            .map(|a| (a.container_id.as_str(), a.ifname.as_str()))
            .collect();
        let store = LeaseDir::open(data_dir(&setup.conf), &args.conf.name).map_err(errors::ipam)?;
        let lock = store.lock().map_err(errors::ipam)?;
        for lease in lock.leases().map_err(errors::ipam)? {
            let kept = valid.contains(&(lease.container_id.as_str(), lease.ifname.as_str()))
                || (lease.ifname.is_empty()
                    && valid.iter().any(|(id, _)| *id == lease.container_id));
            if !kept {
                lock.release(lease.ip).map_err(errors::ipam)?;
            }
        }
        lock.prune_index().map_err(errors::ipam)
    }

    fn status(&self, args: &CmdArgs) -> Result<(), Error> {
        let setup = load(args)?;
        LeaseDir::open(data_dir(&setup.conf), &args.conf.name)
            .map(drop)
            .map_err(|e| Error::new(ErrorCode::PluginNotAvailable, e.to_string()))
    }
}

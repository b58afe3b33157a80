//! static IPAM: the addresses, routes and DNS the configuration states, as the reference
//! plugin reads them. CNI_ARGS `IP=` (CIDRs, comma-separated) adds addresses and `GATEWAY=`
//! gives them gateways; `args.cni.ips`, then `runtimeConfig.ips`, replace them all. It
//! holds nothing, so DEL and GC have nothing to release.

use crate::errors;
use corvid_cni::result::{Dns, IpConfig, Route};
use corvid_cni::skel::{CmdArgs, Plugin};
use corvid_cni::{CniResult, Error, ErrorCode, Version};
use ipnet::IpNet;
use serde::Deserialize;
use std::net::IpAddr;

/// The static plugin.
pub struct Static;

#[derive(Deserialize)]
struct Conf {
    ipam: Option<IpamConf>,
}

#[derive(Deserialize, Default)]
struct IpamConf {
    #[serde(default)]
    addresses: Vec<AddressConf>,
    #[serde(default)]
    routes: Vec<Route>,
    #[serde(default)]
    dns: Dns,
}

#[derive(Deserialize)]
struct AddressConf {
    address: String,
    #[serde(default)]
    gateway: Option<IpAddr>,
}

/// CNI_ARGS keys this plugin reads; `MAC` is the main plugin's, and passes.
const KNOWN_ARGS: [&str; 3] = ["IP", "GATEWAY", "MAC"];

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorCode::InvalidNetworkConfig, msg)
}

/// An address with its prefix, as `field` of the configuration (or CNI_ARGS) holds it.
fn cidr(s: &str, field: &str) -> Result<IpNet, Error> {
    s.trim().parse().map_err(|_| {
        invalid(format!(
            "static: the '{field}' field is expected to be in CIDR notation, got: '{s}'"
        ))
    })
}

/// Every address ADD reports, with its gateway, in the order the reference gives them.
fn addresses(args: &CmdArgs, conf: IpamConf) -> Result<(Vec<IpConfig>, IpamConf), Error> {
    args.args.only("static", &KNOWN_ARGS)?;
    let mut ips = conf
        .addresses
        .iter()
        .map(|a| {
            Ok(IpConfig {
                address: cidr(&a.address, "address")?,
                gateway: a.gateway,
                interface: None,
            })
        })
        .collect::<Result<Vec<_>, Error>>()?;
    if let Some(list) = args.args.get("IP") {
        for s in list.split(',').filter(|s| !s.trim().is_empty()) {
            ips.push(IpConfig {
                address: cidr(s, "ip")?,
                gateway: None,
                interface: None,
            });
        }
    }
    if let Some(list) = args.args.get("GATEWAY") {
        for s in list.split(',').filter(|s| !s.trim().is_empty()) {
            let gw: IpAddr = s
                .trim()
                .parse()
                .map_err(|_| invalid(format!("static: invalid gateway address: {s}")))?;
            for ip in ips.iter_mut().filter(|ip| ip.address.contains(&gw)) {
                ip.gateway = Some(gw);
            }
        }
    }
    for v in [
        args.conf.args_cni_value("ips"),
        args.conf.runtime_config_value("ips"),
    ]
    .into_iter()
    .flatten()
    {
        let list = v.as_array().filter(|l| !l.is_empty()).map(|l| {
            l.iter()
                .map(|s| s.as_str().unwrap_or_default())
                .collect::<Vec<_>>()
        });
        if let Some(list) = list {
            ips = list
                .into_iter()
                .map(|s| {
                    Ok(IpConfig {
                        address: cidr(s, "ips")?,
                        gateway: None,
                        interface: None,
                    })
                })
                .collect::<Result<_, Error>>()?;
        }
    }
    let v4 = ips.iter().filter(|ip| ip.address.addr().is_ipv4()).count();
    if (v4 > 1 || ips.len() - v4 > 1) && args.version < Version::V0_3_0 {
        return Err(Error::new(
            ErrorCode::IncompatibleVersion,
            format!(
                "static: CNI version {} does not support more than 1 address per family",
                args.version
            ),
        ));
    }
    Ok((ips, conf))
}

fn load(args: &CmdArgs) -> Result<(Vec<IpConfig>, IpamConf), Error> {
    let conf: Conf = serde_json::from_slice(&args.stdin).map_err(errors::config)?;
    let ipam = conf
        .ipam
        .ok_or_else(|| invalid("static: IPAM config missing 'ipam' key"))?;
    addresses(args, ipam)
}

impl Plugin for Static {
    fn add(&self, args: &CmdArgs) -> Result<CniResult, Error> {
        let (ips, conf) = load(args)?;
        Ok(CniResult {
            ips,
            routes: conf.routes,
            dns: conf.dns,
            ..CniResult::default()
        })
    }

    fn del(&self, _args: &CmdArgs) -> Result<(), Error> {
        // Nothing is held, so nothing can stand in the way of a DEL (the reference's also
        // succeeds whatever the configuration).
        Ok(())
    }

    fn check(&self, args: &CmdArgs) -> Result<(), Error> {
        let (ips, _) = load(args)?;
        let prev = args
            .prev_result
            .as_ref()
            .ok_or_else(|| invalid("static: Required prevResult missing"))?;
        for want in &ips {
            let found = prev
                .ips
                .iter()
                .find(|have| have.address.addr() == want.address.addr());
            match found {
                Some(have) if want.gateway.is_none() || want.gateway == have.gateway => {}
                _ => {
                    return Err(Error::new(
                        ErrorCode::Internal,
                        format!(
                            "static: Failed to match addr {} on interface {}",
                            want.address.addr(),
                            args.ifname
                        ),
                    ))
                }
            }
        }
        Ok(())
    }

    fn gc(&self, _args: &CmdArgs) -> Result<(), Error> {
        Ok(())
    }

    fn status(&self, _args: &CmdArgs) -> Result<(), Error> {
        Ok(())
    }
}

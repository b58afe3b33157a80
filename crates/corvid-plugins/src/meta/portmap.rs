//! portmap: publishes container ports on the host (runtimeConfig `portMappings`, as
//! podman writes it in camelCase and containerd's CRI in PascalCase), chained after the
//! plugin that gave the container its addresses. The rules are corvid-net's.

use crate::{attachments, errors};
use corvid_cni::skel::{CmdArgs, Plugin};
use corvid_cni::{CniResult, Error, ErrorCode};
use corvid_net::nftables::portmap::{self, PortMapping, Protocol};
use corvid_net::sysctl;
use serde::Deserialize;
use std::net::IpAddr;

/// The portmap plugin.
pub struct Portmap;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PortmapConf {
    #[serde(default = "yes")]
    snat: bool,
    #[serde(default)]
    mark_masq_bit: Option<u32>,
    #[serde(default)]
    external_set_mark_chain: Option<String>,
    #[serde(default)]
    conditions_v4: Option<Vec<String>>,
    #[serde(default)]
    conditions_v6: Option<Vec<String>>,
    #[serde(default)]
    backend: Option<String>,
}

fn yes() -> bool {
    true
}

/// One entry of `portMappings`, in either casing.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Entry {
    #[serde(alias = "HostPort")]
    host_port: i64,
    #[serde(alias = "ContainerPort")]
    container_port: i64,
    #[serde(default, alias = "Protocol")]
    protocol: String,
    #[serde(default, rename = "hostIP", alias = "HostIP", alias = "hostIp")]
    host_ip: String,
}

fn invalid(msg: String) -> Error {
    Error::new(ErrorCode::InvalidNetworkConfig, msg)
}

fn load(args: &CmdArgs) -> Result<(PortmapConf, Vec<PortMapping>), Error> {
    let conf: PortmapConf = serde_json::from_slice(&args.stdin).map_err(errors::config)?;
    let refused = [
        (
            conf.external_set_mark_chain.is_some(),
            "externalSetMarkChain",
        ),
        (
            conf.conditions_v4.as_ref().is_some_and(|c| !c.is_empty()),
            "conditionsV4",
        ),
        (
            conf.conditions_v6.as_ref().is_some_and(|c| !c.is_empty()),
            "conditionsV6",
        ),
        (
            // Configurations written for the reference name its backends; either way the
            // rules are nftables rules in corvid's table.
            conf.backend
                .as_deref()
                .is_some_and(|b| !matches!(b, "" | "iptables" | "nftables")),
            "backend",
        ),
    ];
    if let Some((_, field)) = refused.iter().find(|(asked, _)| *asked) {
        return Err(Error::new(
            ErrorCode::UnsupportedField,
            format!("unsupported field \"{field}\": corvid's portmap writes its rules with nftables, in its own table"),
        ));
    }
    if conf.mark_masq_bit.is_some_and(|b| b > 31) {
        return Err(invalid("markMasqBit must be between 0 and 31".into()));
    }
    let entries = args
        .conf
        .runtime_config
        .as_ref()
        .and_then(|r| r.get("portMappings"))
        .map(|v| Vec::<Entry>::deserialize(v).map_err(errors::config))
        .transpose()?
        .unwrap_or_default();
    let mappings = entries.iter().map(mapping).collect::<Result<_, _>>()?;
    Ok((conf, mappings))
}

fn mapping(e: &Entry) -> Result<PortMapping, Error> {
    let port = |p: i64, what: &str| {
        u16::try_from(p)
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| invalid(format!("invalid {what} port number: {p}")))
    };
    let protocol = match e.protocol.to_ascii_lowercase().as_str() {
        "" | "tcp" => Protocol::Tcp,
        "udp" => Protocol::Udp,
        "sctp" => Protocol::Sctp,
        other => {
            return Err(invalid(format!(
                "unknown protocol \"{other}\" (tcp, udp or sctp)"
            )))
        }
    };
    let host_ip = match e.host_ip.as_str() {
        "" => None,
        s => Some(
            s.parse::<IpAddr>()
                .map_err(|_| invalid(format!("invalid hostIP \"{s}\"")))?,
        )
        .filter(|ip| !ip.is_unspecified()),
    };
    Ok(PortMapping {
        protocol,
        host_port: port(e.host_port, "host")?,
        container_port: port(e.container_port, "container")?,
        host_ip,
    })
}

impl Plugin for Portmap {
    fn add(&self, args: &CmdArgs) -> Result<CniResult, Error> {
        let (conf, mappings) = load(args)?;
        let prev = args
            .prev_result
            .clone()
            .ok_or_else(|| invalid("portmap must be called as a chained plugin".into()))?;
        let addrs = attachments::addresses(&prev);
        if mappings.is_empty() || addrs.is_empty() {
            return Ok(prev);
        }
        if conf.snat && addrs.iter().any(|a| a.is_ipv4()) {
            // The host reaches its mappings on 127.0.0.1 only if the kernel may route
            // loopback addresses out of the host side's interface.
            if let Some(host) = prev.interfaces.iter().find(|i| i.sandbox.is_empty()) {
                let key = format!("net/ipv4/conf/{}/route_localnet", host.name);
                if std::path::Path::new("/proc/sys").join(&key).exists() {
                    sysctl::set(&key, "1").map_err(errors::net)?;
                }
            }
        }
        portmap::add_port_mappings(
            &mut attachments::nftables()?,
            &attachments::tag(args),
            &addrs,
            &mappings,
            conf.snat,
        )
        .map_err(errors::net)?;
        Ok(prev)
    }

    fn del(&self, args: &CmdArgs) -> Result<(), Error> {
        let (_, mappings) = load(args)?;
        let addrs = args.prev_result.as_ref().map(attachments::addresses);
        let known = addrs
            .as_deref()
            .filter(|a| !a.is_empty() && !mappings.is_empty())
            .map(|a| (a, mappings.as_slice()));
        portmap::delete_port_mappings(
            &mut attachments::nftables()?,
            &attachments::tag(args),
            known,
        )
        .map_err(errors::net)
    }

    fn check(&self, args: &CmdArgs) -> Result<(), Error> {
        let (_, mappings) = load(args)?;
        let prev = args
            .prev_result
            .as_ref()
            .expect("skel requires prevResult for CHECK");
        let missing = portmap::missing_port_mappings(
            &mut attachments::nftables()?,
            &attachments::tag(args),
            &attachments::addresses(prev),
            &mappings,
        )
        .map_err(errors::net)?;
        if missing.is_empty() {
            Ok(())
        } else {
            Err(Error::new(
                ErrorCode::CheckFailed,
                format!("port mappings missing: {}", missing.join(", ")),
            ))
        }
    }

    fn gc(&self, args: &CmdArgs) -> Result<(), Error> {
        load(args)?;
        portmap::gc_port_mappings(
            &mut attachments::nftables()?,
            &args.conf.name,
            &attachments::valid(args),
        )
        .map_err(errors::net)
    }

    fn status(&self, args: &CmdArgs) -> Result<(), Error> {
        load(args).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(v: serde_json::Value) -> Result<PortMapping, Error> {
        mapping(&serde_json::from_value(v).unwrap())
    }

    #[test]
    fn both_casings_and_bad_entries() {
        let camel = entry(
            serde_json::json!({"hostPort": 8080, "containerPort": 80, "protocol": "udp", "hostIP": "0.0.0.0"}),
        );
        let pascal = entry(
            serde_json::json!({"HostPort": 8080, "ContainerPort": 80, "Protocol": "UDP", "HostIP": ""}),
        );
        assert_eq!(camel.unwrap(), pascal.unwrap());
        for bad in [
            serde_json::json!({"hostPort": 0, "containerPort": 80}),
            serde_json::json!({"hostPort": 70000, "containerPort": 80}),
            serde_json::json!({"hostPort": 80, "containerPort": 80, "protocol": "icmp"}),
            serde_json::json!({"hostPort": 80, "containerPort": 80, "hostIP": "nope"}),
        ] {
            assert_eq!(
                entry(bad).unwrap_err().code,
                ErrorCode::InvalidNetworkConfig as u32
            );
        }
    }
}

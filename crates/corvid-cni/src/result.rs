//! CNI results of every spec version.
//!
//! One model, [`CniResult`], holds the richest form (1.1.0); each version's wire shape is
//! read into it and written from it, so converting is parsing in one version and printing
//! in another.

use crate::error::{Error, ErrorCode};
use crate::version::Version;
use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::net::IpAddr;

/// A plugin's result, independent of the version it travels in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniResult {
    /// Interfaces the plugin created or touched.
    pub interfaces: Vec<Interface>,
    /// Addresses assigned, each optionally pointing into `interfaces`.
    pub ips: Vec<IpConfig>,
    /// Routes the plugin installed.
    pub routes: Vec<Route>,
    /// DNS settings for the container.
    pub dns: Dns,
}

/// An interface in a result.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Interface {
    /// Interface name.
    pub name: String,
    /// Hardware address, when meaningful.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mac: String,
    /// The namespace path for interfaces inside the container; empty on the host.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sandbox: String,
    /// MTU (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// vhost-user socket path (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket_path: Option<String>,
    /// PCI address of the device (1.1.0).
    #[serde(default, rename = "pciID", skip_serializing_if = "Option::is_none")]
    pub pci_id: Option<String>,
}

/// An address in a result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpConfig {
    /// The address with its prefix length, e.g. 10.1.0.5/24.
    pub address: IpNet,
    /// The subnet's gateway, if any.
    pub gateway: Option<IpAddr>,
    /// Index into the result's interfaces.
    pub interface: Option<usize>,
}

/// A route in a result.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Route {
    /// Destination network.
    pub dst: IpNet,
    /// Next hop; the plugin's default gateway when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<IpAddr>,
    /// Route MTU (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// Advertised MSS (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advmss: Option<u32>,
    /// Route priority (metric) (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    /// Routing table (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<u32>,
    /// Route scope (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<u8>,
}

/// DNS settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dns {
    /// Name servers in priority order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    /// Local domain.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub domain: String,
    /// Search domains in priority order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
    /// Resolver options.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

impl Dns {
    /// True when nothing is set.
    pub fn is_empty(&self) -> bool {
        self.nameservers.is_empty()
            && self.domain.is_empty()
            && self.search.is_empty()
            && self.options.is_empty()
    }
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireResult {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    cni_version: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    interfaces: Vec<Interface>,
    #[serde(default, alias = "ip", skip_serializing_if = "Vec::is_empty")]
    ips: Vec<WireIp>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    routes: Vec<Route>,
    #[serde(default)]
    dns: Dns,
}

#[derive(Serialize, Deserialize)]
struct WireIp {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    version: Option<String>,
    address: IpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gateway: Option<IpAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    interface: Option<usize>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireLegacyResult {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    cni_version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ip4: Option<WireLegacyIp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ip6: Option<WireLegacyIp>,
    #[serde(default)]
    dns: Dns,
}

#[derive(Serialize, Deserialize)]
struct WireLegacyIp {
    ip: IpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gateway: Option<IpAddr>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    routes: Vec<Route>,
}

fn decode_error(what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(ErrorCode::Decoding, format!("failed to decode {what}")).with_details(e.to_string())
}

fn family_tag(addr: &IpNet) -> &'static str {
    match addr {
        IpNet::V4(_) => "4",
        IpNet::V6(_) => "6",
    }
}

impl CniResult {
    /// Reads a result; its own `cniVersion` wins over `default_version` when present.
    pub fn parse(value: &Value, default_version: Version) -> Result<(CniResult, Version), Error> {
        let what = "result";
        let obj = value
            .as_object()
            .ok_or_else(|| decode_error(what, "a result must be a JSON object"))?;
        let version = match obj.get("cniVersion") {
            None => default_version,
            Some(Value::String(s)) => Version::parse(s)?,
            Some(other) => {
                return Err(decode_error(
                    what,
                    format!("cniVersion {other} is not a string"),
                ))
            }
        };
        let result = if version.is_legacy_result() {
            let wire: WireLegacyResult =
                serde_json::from_value(value.clone()).map_err(|e| decode_error(what, e))?;
            CniResult::from_legacy(wire)
        } else {
            let wire: WireResult =
                serde_json::from_value(value.clone()).map_err(|e| decode_error(what, e))?;
            CniResult::from_wire(wire)?
        };
        Ok((result, version))
    }

    fn from_legacy(wire: WireLegacyResult) -> CniResult {
        let mut result = CniResult {
            dns: wire.dns,
            ..CniResult::default()
        };
        for ip in [wire.ip4, wire.ip6].into_iter().flatten() {
            result.ips.push(IpConfig {
                address: ip.ip,
                gateway: ip.gateway,
                interface: None,
            });
            result.routes.extend(ip.routes);
        }
        result
    }

    fn from_wire(wire: WireResult) -> Result<CniResult, Error> {
        let mut ips = Vec::with_capacity(wire.ips.len());
        for (i, ip) in wire.ips.into_iter().enumerate() {
            if let Some(v) = &ip.version {
                if v != family_tag(&ip.address) {
                    return Err(decode_error(
                        "result",
                        format!(
                            "ips[{i}]: version \"{v}\" does not match address {}",
                            ip.address
                        ),
                    ));
                }
            }
            if let Some(idx) = ip.interface {
                if idx >= wire.interfaces.len() {
                    return Err(decode_error(
                        "result",
                        format!("ips[{i}]: interface index {idx} is out of range"),
                    ));
                }
            }
            ips.push(IpConfig {
                address: ip.address,
                gateway: ip.gateway,
                interface: ip.interface,
            });
        }
        Ok(CniResult {
            interfaces: wire.interfaces,
            ips,
            routes: wire.routes,
            dns: wire.dns,
        })
    }

    /// Writes the result in the wire shape of `version`; error code 1 when it cannot be.
    pub fn to_value(&self, version: Version) -> Result<Value, Error> {
        let value = if version.is_legacy_result() {
            serde_json::to_value(self.to_legacy(version)?)
        } else {
            serde_json::to_value(self.to_wire(version))
        };
        value.map_err(|e| {
            Error::new(ErrorCode::Io, "failed to encode result").with_details(e.to_string())
        })
    }

    fn to_wire(&self, version: Version) -> WireResult {
        let rich = version >= Version::V1_1_0;
        let with_ip_version = version < Version::V1_0_0;
        WireResult {
            cni_version: version.as_str().to_string(),
            interfaces: self
                .interfaces
                .iter()
                .map(|i| {
                    let mut i = i.clone();
                    if !rich {
                        i.mtu = None;
                        i.socket_path = None;
                        i.pci_id = None;
                    }
                    i
                })
                .collect(),
            ips: self
                .ips
                .iter()
                .map(|ip| WireIp {
                    version: with_ip_version.then(|| family_tag(&ip.address).to_string()),
                    address: ip.address,
                    gateway: ip.gateway,
                    interface: ip.interface,
                })
                .collect(),
            routes: self
                .routes
                .iter()
                .map(|r| {
                    if rich {
                        r.clone()
                    } else {
                        Route {
                            dst: r.dst,
                            gw: r.gw,
                            ..Route::default()
                        }
                    }
                })
                .collect(),
            dns: self.dns.clone(),
        }
    }

    fn to_legacy(&self, version: Version) -> Result<WireLegacyResult, Error> {
        let mut ip4: Option<WireLegacyIp> = None;
        let mut ip6: Option<WireLegacyIp> = None;
        for ip in &self.ips {
            let slot = if ip.address.addr().is_ipv4() {
                &mut ip4
            } else {
                &mut ip6
            };
            if slot.is_some() {
                return Err(Error::new(
                    ErrorCode::IncompatibleVersion,
                    format!("cannot convert result to CNI {version}"),
                )
                .with_details(format!(
                    "version {version} holds one IPv{} address, the result has several",
                    family_tag(&ip.address)
                )));
            }
            *slot = Some(WireLegacyIp {
                ip: ip.address,
                gateway: ip.gateway,
                routes: Vec::new(),
            });
        }
        for route in &self.routes {
            let slot = if route.dst.addr().is_ipv4() {
                &mut ip4
            } else {
                &mut ip6
            };
            let Some(slot) = slot else {
                return Err(Error::new(
                    ErrorCode::IncompatibleVersion,
                    format!("cannot convert result to CNI {version}"),
                )
                .with_details(format!(
                    "route to {} has no address of its family to hang on",
                    route.dst
                )));
            };
            slot.routes.push(Route {
                dst: route.dst,
                gw: route.gw,
                ..Route::default()
            });
        }
        Ok(WireLegacyResult {
            cni_version: version.as_str().to_string(),
            ip4,
            ip6,
            dns: self.dns.clone(),
        })
    }

    /// Converts a result value from its version into `to`.
    pub fn convert(value: &Value, default_version: Version, to: Version) -> Result<Value, Error> {
        let (result, _) = CniResult::parse(value, default_version)?;
        result.to_value(to)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::version::ALL;
    use serde_json::json;

    fn sample() -> CniResult {
        CniResult {
            interfaces: vec![
                Interface {
                    name: "cni0".into(),
                    mac: "0a:58:0a:01:00:01".into(),
                    ..Interface::default()
                },
                Interface {
                    name: "eth0".into(),
                    mac: "0a:58:0a:01:00:05".into(),
                    sandbox: "/run/netns/x".into(),
                    mtu: Some(1400),
                    ..Interface::default()
                },
            ],
            ips: vec![
                IpConfig {
                    address: "10.1.0.5/24".parse().unwrap(),
                    gateway: Some("10.1.0.1".parse().unwrap()),
                    interface: Some(1),
                },
                IpConfig {
                    address: "fd00::5/64".parse().unwrap(),
                    gateway: Some("fd00::1".parse().unwrap()),
                    interface: Some(1),
                },
            ],
            routes: vec![
                Route {
                    dst: "0.0.0.0/0".parse().unwrap(),
                    gw: Some("10.1.0.1".parse().unwrap()),
                    priority: Some(10),
                    ..Route::default()
                },
                Route {
                    dst: "::/0".parse().unwrap(),
                    ..Route::default()
                },
            ],
            dns: Dns {
                nameservers: vec!["10.1.0.1".into()],
                search: vec!["svc".into()],
                ..Dns::default()
            },
        }
    }

    #[test]
    fn v110_keeps_everything() {
        let v = sample().to_value(Version::V1_1_0).unwrap();
        assert_eq!(v["cniVersion"], "1.1.0");
        assert_eq!(v["interfaces"][1]["mtu"], 1400);
        assert_eq!(v["routes"][0]["priority"], 10);
        assert!(v["ips"][0].get("version").is_none());
        let (back, ver) = CniResult::parse(&v, Version::V0_1_0).unwrap();
        assert_eq!(ver, Version::V1_1_0);
        assert_eq!(back, sample());
    }

    #[test]
    fn v100_drops_ip_version_and_rich_fields() {
        let v = sample().to_value(Version::V1_0_0).unwrap();
        assert!(v["ips"][0].get("version").is_none());
        assert!(v["interfaces"][1].get("mtu").is_none());
        assert!(v["routes"][0].get("priority").is_none());
    }

    #[test]
    fn v03x_and_v040_carry_ip_version() {
        for ver in [Version::V0_3_0, Version::V0_3_1, Version::V0_4_0] {
            let v = sample().to_value(ver).unwrap();
            assert_eq!(v["cniVersion"], ver.as_str());
            assert_eq!(v["ips"][0]["version"], "4");
            assert_eq!(v["ips"][1]["version"], "6");
            assert_eq!(v["ips"][0]["interface"], 1);
        }
    }

    #[test]
    fn legacy_form_splits_by_family() {
        for ver in [Version::V0_1_0, Version::V0_2_0] {
            let v = sample().to_value(ver).unwrap();
            assert_eq!(v["ip4"]["ip"], "10.1.0.5/24");
            assert_eq!(v["ip4"]["gateway"], "10.1.0.1");
            assert_eq!(v["ip4"]["routes"][0]["dst"], "0.0.0.0/0");
            assert_eq!(v["ip6"]["ip"], "fd00::5/64");
            assert_eq!(v["ip6"]["routes"][0]["dst"], "::/0");
            assert_eq!(v["dns"]["nameservers"][0], "10.1.0.1");
            assert!(v.get("interfaces").is_none());
        }
    }

    #[test]
    fn legacy_reads_into_the_model() {
        let v = json!({"cniVersion":"0.2.0","ip4":{"ip":"10.1.0.3/16","gateway":"10.1.0.1",
            "routes":[{"dst":"0.0.0.0/0"}]},"dns":{"nameservers":["10.1.0.1"]}});
        let (r, ver) = CniResult::parse(&v, Version::V1_0_0).unwrap();
        assert_eq!(ver, Version::V0_2_0);
        assert_eq!(r.ips.len(), 1);
        assert_eq!(r.routes[0].dst.to_string(), "0.0.0.0/0");
        let up = r.to_value(Version::V1_0_0).unwrap();
        assert_eq!(up["ips"][0]["address"], "10.1.0.3/16");
    }

    #[test]
    fn every_pair_of_versions_round_trips_what_both_can_hold() {
        let mut single = sample();
        single.interfaces.iter_mut().for_each(|i| i.mtu = None);
        single.routes.iter_mut().for_each(|r| r.priority = None);
        for from in ALL {
            for to in ALL {
                let v = single.to_value(from).unwrap();
                let out = CniResult::convert(&v, from, to).unwrap();
                let (back, ver) = CniResult::parse(&out, from).unwrap();
                assert_eq!(ver, to);
                assert_eq!(back.ips.len(), 2, "{from} -> {to}");
                assert_eq!(back.routes.len(), 2, "{from} -> {to}");
                assert_eq!(back.dns, single.dns, "{from} -> {to}");
                if !from.is_legacy_result() && !to.is_legacy_result() {
                    assert_eq!(back, single, "{from} -> {to}");
                }
            }
        }
    }

    #[test]
    fn v030_accepts_the_old_ip_key() {
        let v = json!({"cniVersion":"0.3.0","ip":[{"version":"4","address":"10.0.0.2/24"}]});
        let (r, _) = CniResult::parse(&v, Version::V0_3_0).unwrap();
        assert_eq!(r.ips[0].address.to_string(), "10.0.0.2/24");
    }

    #[test]
    fn impossible_conversions_are_code_1() {
        let mut two = sample();
        two.ips.push(IpConfig {
            address: "10.1.0.6/24".parse().unwrap(),
            gateway: None,
            interface: None,
        });
        assert_eq!(two.to_value(Version::V0_2_0).unwrap_err().code, 1);
        let orphan = CniResult {
            routes: vec![Route {
                dst: "10.0.0.0/8".parse().unwrap(),
                ..Route::default()
            }],
            ..CniResult::default()
        };
        assert_eq!(orphan.to_value(Version::V0_1_0).unwrap_err().code, 1);
        assert_eq!(
            CniResult::convert(
                &json!({"cniVersion":"9.9.9"}),
                Version::V1_0_0,
                Version::V1_0_0
            )
            .unwrap_err()
            .code,
            1
        );
    }

    #[test]
    fn wrong_shapes_are_code_6() {
        for bad in [
            json!("a string"),
            json!({"ips": "x"}),
            json!({"ips": [{"address": "not-an-ip"}]}),
            json!({"ips": [{"address": "10.0.0.1"}]}),
            json!({"ips": [{"version": "6", "address": "10.0.0.1/24"}]}),
            json!({"interfaces": [], "ips": [{"address": "10.0.0.1/24", "interface": 0}]}),
            json!({"cniVersion": 1}),
        ] {
            let e = CniResult::parse(&bad, Version::V1_0_0).unwrap_err();
            assert_eq!(e.code, 6, "{bad}");
        }
    }
}

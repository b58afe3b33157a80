//! A port's addresses and MAC, resolved against the view: Neutron's defaults, the
//! requested subnets and addresses checked, free ones picked, and the compares and puts
//! that take each of them in the same transaction as the port.

use std::collections::HashSet;
use std::net::IpAddr;

use axum::http::StatusCode;
use corvid_api::{FixedIp, Ipv6Mode, Network, Port, Subnet};
use ipnet::IpNet;
use serde::Deserialize;

use super::Pending;
use crate::error::NeutronError;
use crate::keys;
use crate::store::{Compare, Op, Txn};
use crate::view::View;

/// One requested address: a subnet, an address, or both.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FixedIpRequest {
    /// The subnet to take an address from.
    pub subnet_id: Option<String>,
    /// The address to take.
    pub ip_address: Option<IpAddr>,
}

/// A unicast MAC in the usual colon form.
pub fn mac_valid(mac: &str) -> bool {
    let parts: Vec<&str> = mac.split(':').collect();
    parts.len() == 6
        && parts
            .iter()
            .all(|p| p.len() == 2 && p.chars().all(|c| c.is_ascii_hexdigit()))
        && u8::from_str_radix(parts[0], 16).is_ok_and(|b| b & 1 == 0)
}

/// The address a port with `mac` has on a /64 `prefix` by stateless autoconfiguration:
/// the prefix and the modified EUI-64 of the MAC (RFC 4291, appendix A), which Neutron
/// gives ports on SLAAC and stateless DHCPv6 subnets. None for an IPv4 prefix or a MAC
/// that does not parse.
pub fn eui64(prefix: &IpNet, mac: &str) -> Option<IpAddr> {
    let IpNet::V6(prefix) = prefix else {
        return None;
    };
    let m: Vec<u8> = mac
        .split(':')
        .map(|b| u8::from_str_radix(b, 16))
        .collect::<Result<_, _>>()
        .ok()?;
    let [m0, m1, m2, m3, m4, m5] = m[..] else {
        return None;
    };
    let mut octets = prefix.network().octets();
    octets[8..].copy_from_slice(&[m0 ^ 0x02, m1, m2, 0xff, 0xfe, m3, m4, m5]);
    Some(IpAddr::from(octets))
}

/// Whether ports' addresses on `s` are computed from their MAC rather than allocated.
pub fn is_auto_address(s: &Subnet) -> bool {
    s.ipv6_address_mode.is_some_and(Ipv6Mode::is_auto_address)
}

/// The subnets of `net`, in its order.
fn subnets_of<'v>(v: &'v View, net: &Network) -> Vec<&'v Subnet> {
    net.subnets
        .iter()
        .filter_map(|s| v.subnets.get(s.as_str()).map(|e| &*e.obj))
        .collect()
}

/// Resolves requested addresses (`None`: Neutron's default, one address from the first
/// subnet of each IP version that allocates, and one on every SLAAC or stateless DHCPv6
/// subnet) into the port's fixed IPs on `net`, adding to `txn` the compares and puts
/// that take each new one for `owner`. On SLAAC and stateless DHCPv6 subnets the
/// address is `mac`'s EUI-64, and asking for another is an error. An address in `held`
/// (the port's own, on an update) that is asked for again stays as it is; one not asked
/// for again is freed.
#[allow(clippy::too_many_arguments)]
pub fn assign_fixed_ips(
    v: &View,
    pending: &mut Pending,
    net: &Network,
    requests: Option<Vec<FixedIpRequest>>,
    owner: &str,
    mac: &str,
    held: &[FixedIp],
    txn: &mut Txn,
) -> Result<Vec<FixedIp>, NeutronError> {
    let (network_id, subnets) = (&net.id, subnets_of(v, net));
    let requests = requests.unwrap_or_else(|| {
        let mut seen = HashSet::new();
        subnets
            .iter()
            .filter(|s| is_auto_address(s) || seen.insert(s.ip_version))
            .map(|s| FixedIpRequest {
                subnet_id: Some(s.id.clone()),
                ip_address: None,
            })
            .collect()
    });
    let mut fixed_ips: Vec<FixedIp> = Vec::new();
    for r in requests {
        let subnet = match (&r.subnet_id, r.ip_address) {
            // A subnet nobody has (yet, as this view knows) is not found, as in Neutron,
            // which also lets the write ask the store before answering.
            (Some(s), _) if !v.subnets.contains_key(s.as_str()) => {
                return Err(NeutronError::not_found("Subnet", s))
            }
            (Some(s), _) => subnets.iter().find(|x| x.id == *s).copied().ok_or_else(|| {
                NeutronError::invalid_input(format!("Subnet {s} is not on network {network_id}"))
            })?,
            (None, Some(ip)) => subnets.iter().find(|x| x.cidr.contains(&ip)).copied().ok_or_else(|| {
                NeutronError::new(
                    StatusCode::BAD_REQUEST,
                    "InvalidIpForNetwork",
                    format!("IP address {ip} is not a valid IP for any of the subnets on the specified network."),
                )
            })?,
            (None, None) => return Err(NeutronError::invalid_input("fixed_ips entry needs subnet_id or ip_address")),
        };
        let taken = v.ips.get(subnet.id.as_str());
        let asked = if is_auto_address(subnet) {
            let computed = eui64(&subnet.cidr, mac).ok_or_else(|| {
                NeutronError::invalid_input(format!("'{mac}' is not a valid MAC address"))
            })?;
            if let Some(ip) = r.ip_address.filter(|ip| *ip != computed) {
                return Err(NeutronError::invalid_input(format!(
                    "IPv6 address {ip} cannot be directly assigned to a port on subnet {} since the subnet is configured for automatic addresses",
                    subnet.id
                )));
            }
            Some(computed)
        } else {
            r.ip_address
        };
        let ip = match asked {
            Some(ip) => {
                if !subnet.cidr.contains(&ip) {
                    return Err(NeutronError::new(
                        StatusCode::BAD_REQUEST,
                        "InvalidIpForSubnet",
                        format!("IP address {ip} is not a valid IP for the specified subnet."),
                    ));
                }
                let again = fixed_ips.iter().any(|f| f.ip_address == ip);
                if !again
                    && held
                        .iter()
                        .any(|h| h.subnet_id == subnet.id && h.ip_address == ip)
                {
                    fixed_ips.push(FixedIp {
                        subnet_id: subnet.id.clone(),
                        ip_address: ip,
                    });
                    continue;
                }
                if again
                    || taken.is_some_and(|t| t.contains(&ip))
                    || !pending.reserve(keys::ip(&subnet.id, ip))
                {
                    return Err(NeutronError::conflict(
                        "IpAddressAlreadyAllocated",
                        format!("IP address {ip} already allocated in subnet {}", subnet.id),
                    ));
                }
                ip
            }
            None => pending
                .pick_ip(subnet, |ip| !taken.is_some_and(|t| t.contains(&ip)))
                .ok_or_else(|| {
                    NeutronError::conflict(
                        "IpAddressGenerationFailure",
                        format!("No more IP addresses available on network {network_id}."),
                    )
                })?,
        };
        let key = keys::ip(&subnet.id, ip);
        txn.compares.push(Compare::CreateRevision(key.clone(), 0));
        txn.compares.push(Compare::CreateRevision(
            keys::resource("subnets", &subnet.id),
            v.subnets
                .get(subnet.id.as_str())
                .map_or(0, |e| e.create_revision),
        ));
        txn.ops.push(Op::Put(key, owner.as_bytes().to_vec()));
        fixed_ips.push(FixedIp {
            subnet_id: subnet.id.clone(),
            ip_address: ip,
        });
    }
    for h in held.iter().filter(|h| !fixed_ips.contains(h)) {
        txn.ops
            .push(Op::Delete(keys::ip(&h.subnet_id, h.ip_address)));
    }
    Ok(fixed_ips)
}

/// The MAC of a new port: `given` if valid and free, else the next free one; `txn` takes
/// it for `owner`.
pub fn take_mac(
    v: &View,
    pending: &mut Pending,
    given: Option<String>,
    network_id: &str,
    owner: &str,
    txn: &mut Txn,
) -> Result<String, NeutronError> {
    let mac = match given {
        Some(m) => {
            let m = m.to_ascii_lowercase();
            if !mac_valid(&m) {
                return Err(NeutronError::invalid_input(format!(
                    "'{m}' is not a valid MAC address"
                )));
            }
            if v.macs.contains(m.as_str()) || !pending.reserve(keys::mac(&m)) {
                return Err(NeutronError::conflict(
                    "MacAddressInUse",
                    format!("Unable to complete operation for network {network_id}. The mac address {m} is in use."),
                ));
            }
            m
        }
        None => pending.pick_mac(&v.macs),
    };
    txn.compares
        .push(Compare::CreateRevision(keys::mac(&mac), 0));
    txn.ops
        .push(Op::Put(keys::mac(&mac), owner.as_bytes().to_vec()));
    Ok(mac)
}

/// A new MAC, as Neutron allows it: valid, free, and only while the port is unbound
/// (a bound port's MAC is already in a datapath).
pub fn change_mac(
    v: &View,
    p: &Port,
    old_mac: &str,
    old_host: &str,
    txn: &mut Txn,
) -> Result<(), NeutronError> {
    let m = &p.mac_address;
    if !mac_valid(m) {
        return Err(NeutronError::invalid_input(format!(
            "'{m}' is not a valid MAC address"
        )));
    }
    if !old_host.is_empty() {
        return Err(NeutronError::conflict(
            "PortBound",
            format!("Unable to complete operation on port {}: the MAC address of a port bound to host {old_host} cannot change.", p.id),
        ));
    }
    if v.macs.contains(m.as_str()) {
        return Err(NeutronError::conflict(
            "MacAddressInUse",
            format!(
                "Unable to complete operation for network {}. The mac address {m} is in use.",
                p.network_id
            ),
        ));
    }
    txn.compares.push(Compare::CreateRevision(keys::mac(m), 0));
    txn.ops
        .push(Op::Put(keys::mac(m), p.id.clone().into_bytes()));
    txn.ops.push(Op::Delete(keys::mac(old_mac)));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{eui64, mac_valid};

    #[test]
    fn slaac_addresses_are_the_prefix_and_the_macs_modified_eui64() {
        // RFC 4291's example form: the universal/local bit flipped, ff:fe in the middle.
        assert_eq!(
            eui64(&"fd00:1::/64".parse().unwrap(), "fa:16:3e:11:22:33"),
            Some("fd00:1::f816:3eff:fe11:2233".parse().unwrap())
        );
        assert_eq!(
            eui64(&"2001:db8:0:7::/64".parse().unwrap(), "00:00:5e:00:53:01"),
            Some("2001:db8:0:7:200:5eff:fe00:5301".parse().unwrap())
        );
        assert_eq!(
            eui64(&"10.0.0.0/24".parse().unwrap(), "fa:16:3e:11:22:33"),
            None
        );
        assert_eq!(eui64(&"fd00::/64".parse().unwrap(), "fa:16:3e:11:22"), None);
    }

    #[test]
    fn macs_are_checked() {
        assert!(mac_valid("fa:16:3e:11:22:33"));
        assert!(!mac_valid("fa:16:3e:11:22"));
        assert!(!mac_valid("01:16:3e:11:22:33"), "multicast");
        assert!(!mac_valid("zz:16:3e:11:22:33"));
    }
}

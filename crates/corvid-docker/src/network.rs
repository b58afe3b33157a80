//! NetworkDriver: Docker networks are controller networks tagged with Docker's NetworkID,
//! endpoints are ports tagged with the EndpointID, and Join binds the port on this host
//! with the same corvid-net functions the agent and the bridge plugin use.

use corvid_api::{
    AllocationPool, FixedIpRequest, Network, NetworkCreate, Port, PortCreate, PortUpdate, Status,
    Subnet, SubnetCreate,
};
use corvid_net::binding::{ensure_bridge, ensure_plugged, BridgeSpec, VethSpec};
use corvid_net::{Netlink, Netns};
use ipnet::IpNet;
use serde_json::{json, Value};

use crate::tags::{
    ADDRESS_TAG, ADOPTED_TAG, NET_ID_OPTION, NET_NAME_OPTION, POOL_NETWORK_TAG, POOL_TAG,
    SUBNET_ID_OPTION, SUBNET_POOL_TAG,
};
use crate::{field, Driver, DriverError, Result};

/// The name Docker gets for the container end until it moves it into the sandbox.
pub fn container_veth(port: &str) -> String {
    let host = corvid_net::names::host_veth(port);
    format!("cvc{}", &host[3..])
}

impl Driver {
    /// The controller network behind a Docker NetworkID.
    pub(crate) fn network(&self, docker_id: &str) -> Result<Network> {
        self.client
            .list::<Network>(&[("tags", docker_id)])?
            .0
            .into_iter()
            .next()
            .ok_or_else(|| DriverError::new(format!("unknown network {docker_id}")))
    }

    /// The port behind a Docker EndpointID.
    pub(crate) fn endpoint(&self, endpoint_id: &str) -> Result<Port> {
        self.client
            .list::<Port>(&[("tags", endpoint_id)])?
            .0
            .into_iter()
            .next()
            .ok_or_else(|| DriverError::new(format!("unknown endpoint {endpoint_id}")))
    }

    /// CreateNetwork: adopt the network an option names, or create a network and a subnet
    /// for each IPAM pool Docker got. Sent again for a network the driver made, it makes
    /// what a killed call left unmade.
    pub(crate) fn create_network(&self, req: &Value) -> Result<Value> {
        let id = docker_id(req, "NetworkID")?;
        let existing = self.network(id).ok();
        if existing
            .as_ref()
            .is_some_and(|n| n.tags.iter().any(|t| t == ADOPTED_TAG))
        {
            return Ok(json!({}));
        }
        let generic = &req["Options"]["com.docker.network.generic"];
        let adopt = match (
            generic[NET_ID_OPTION].as_str(),
            generic[NET_NAME_OPTION].as_str(),
        ) {
            _ if existing.is_some() => None,
            (Some(net), _) => Some(self.client.get::<Network>(net).map_err(|_| {
                DriverError::new(format!("{NET_ID_OPTION}={net}: no such corvid network"))
            })?),
            (None, Some(name)) => Some(
                self.client
                    .list::<Network>(&[("name", name)])?
                    .0
                    .into_iter()
                    .next()
                    .ok_or_else(|| {
                        DriverError::new(format!(
                            "{NET_NAME_OPTION}={name}: no such corvid network"
                        ))
                    })?,
            ),
            _ => None,
        };
        let pools: Vec<&Value> = req["IPv4Data"]
            .as_array()
            .into_iter()
            .chain(req["IPv6Data"].as_array())
            .flatten()
            .collect();
        if let Some(net) = adopt {
            let subnets = self.client.list::<Subnet>(&[("network_id", &net.id)])?.0;
            for data in &pools {
                let pool = field(data, "Pool");
                if !subnets.iter().any(|s| s.cidr.to_string() == pool) {
                    return Err(DriverError::new(format!(
                        "pool {pool} is not a subnet of corvid network {}: use this driver for \
                         IPAM too, with --ipam-opt {}=<one of its subnets>",
                        net.id, SUBNET_ID_OPTION
                    )));
                }
            }
            self.client.add_tag::<Network>(&net.id, id)?;
            self.client.add_tag::<Network>(&net.id, ADOPTED_TAG)?;
            return Ok(json!({}));
        }
        // Every pool and gateway is read before anything is made: a refused call leaves
        // the controller as it found it.
        let mut wanted = Vec::new();
        for data in pools {
            let cidr: IpNet = field(data, "Pool")
                .parse()
                .map_err(|_| DriverError::new(format!("bad pool {}", data["Pool"])))?;
            let gateway: Option<std::net::IpAddr> = match field(data, "Gateway") {
                "" => None,
                g => Some(
                    g.split('/')
                        .next()
                        .unwrap_or(g)
                        .parse()
                        .map_err(|_| DriverError::new(format!("bad gateway {g}")))?,
                ),
            };
            wanted.push((cidr, gateway));
        }
        let fresh = existing.is_none();
        let net: Network = match existing {
            Some(net) => net,
            None => self.client.create(NetworkCreate {
                name: Some(format!("docker-{}", &id[..12.min(id.len())])),
                tags: Some(vec![id.to_string()]),
                ..Default::default()
            })?,
        };
        let have = self.client.list::<Subnet>(&[("network_id", &net.id)])?.0;
        wanted.retain(|(cidr, _)| !have.iter().any(|s| s.cidr == *cidr));
        let tag = format!("{POOL_NETWORK_TAG}{}", net.id);
        let mut tagged = Vec::new();
        let made = (|| -> Result<()> {
            for (cidr, gateway) in wanted {
                let pool = self.find_pool(&cidr)?;
                let gateway = gateway.or_else(|| pool.as_ref().and_then(Driver::pool_gateway));
                if let Some(p) = &pool {
                    self.client.add_tag::<corvid_api::SubnetPool>(&p.id, &tag)?;
                    tagged.push(p.id.clone());
                }
                self.make_subnet(&net.id, cidr, gateway, pool.as_ref())?;
            }
            Ok(())
        })();
        let Err(e) = made else {
            return Ok(json!({}));
        };
        // What this call made is undone; a network an earlier call made stays, for the
        // next CreateNetwork to finish.
        if fresh {
            for pool in tagged {
                let path = format!("/v2.0/subnetpools/{pool}/tags/{tag}");
                self.client.request("DELETE", &path, None)?;
            }
            for s in self.client.list::<Subnet>(&[("network_id", &net.id)])?.0 {
                self.delete_gone_ok::<Subnet>(&s.id)?;
            }
            self.delete_gone_ok::<Network>(&net.id)?;
        }
        Err(e)
    }

    /// The subnet of a Docker pool on a network: the pool's range, the gateway Docker
    /// got, and `--ip-range` as the allocation pool.
    pub(crate) fn make_subnet(
        &self,
        network_id: &str,
        cidr: IpNet,
        gateway: Option<std::net::IpAddr>,
        pool: Option<&corvid_api::SubnetPool>,
    ) -> Result<Subnet> {
        let mut attrs = SubnetCreate {
            network_id: network_id.to_string(),
            cidr: Some(cidr),
            ip_version: Some(if cidr.addr().is_ipv4() { 4 } else { 6 }),
            gateway_ip: Some(gateway),
            ..Default::default()
        };
        if let Some(p) = pool {
            attrs.tags = Some(vec![format!("{SUBNET_POOL_TAG}{}", p.id)]);
            if let Some(sub) = Driver::pool_subpool(p) {
                let mut hosts = sub.hosts();
                if let (Some(start), Some(end)) = (hosts.next(), sub.hosts().last()) {
                    attrs.allocation_pools = Some(vec![AllocationPool { start, end }]);
                }
            }
        }
        Ok(self.client.create(attrs)?)
    }

    fn find_pool(&self, cidr: &IpNet) -> Result<Option<corvid_api::SubnetPool>> {
        Ok(self
            .client
            .list::<corvid_api::SubnetPool>(&[("tags", POOL_TAG)])?
            .0
            .into_iter()
            .find(|p| p.prefixes.first() == Some(cidr)))
    }

    /// The network, its subnets, and any port left on it: Docker deletes every endpoint
    /// before the network, so a port still there is one a killed call left (an address
    /// requested and never answered) and would keep its subnet in use.
    fn delete_network_fully(&self, net: &Network) -> Result<()> {
        for p in self.client.list::<Port>(&[("network_id", &net.id)])?.0 {
            self.delete_gone_ok::<Port>(&p.id)?;
        }
        for s in &net.subnets {
            self.delete_gone_ok::<Subnet>(s)?;
        }
        self.delete_gone_ok::<Network>(&net.id)
    }

    /// DeleteNetwork: an adopted network is only untagged; one the driver made goes, with
    /// its subnets and its bridge on this host. An unknown network is already gone.
    pub(crate) fn delete_network(&self, req: &Value) -> Result<Value> {
        let id = docker_id(req, "NetworkID")?;
        let Ok(net) = self.network(id) else {
            return Ok(json!({}));
        };
        if net.tags.iter().any(|t| t == ADOPTED_TAG) {
            for tag in [id, ADOPTED_TAG] {
                let path = format!("/v2.0/networks/{}/tags/{tag}", net.id);
                self.client.request("DELETE", &path, None)?;
            }
        } else {
            // The bridge first: once the network is gone, a DeleteNetwork sent again
            // cannot name it.
            let mut nl = Netlink::open()?;
            if let Some(bridge) = nl.link_by_name(&corvid_net::names::bridge(&net.id))? {
                nl.delete_link(&bridge)?;
                // Cleanup: the network goes whether or not the rules could be looked at.
                if let Err(e) = corvid_net::iptables::sync_bridges_allowance(&mut nl) {
                    tracing::warn!("iptables: removing the allowance of corvid's bridges: {e}");
                }
            }
            self.delete_network_fully(&net)?;
        }
        Ok(json!({}))
    }

    /// CreateEndpoint: the port RequestAddress made for this address, bound to this host
    /// and tagged with the EndpointID; a new port when the address came from elsewhere.
    /// RequestAddress makes a port per address, so on a dual-stack network the IPv6
    /// address's port is deleted and its address joins the endpoint's port: one port
    /// per container, holding both, as the agent and the other hosts must see it.
    pub(crate) fn create_endpoint(&self, req: &Value) -> Result<Value> {
        let net = self.network(docker_id(req, "NetworkID")?)?;
        let endpoint = docker_id(req, "EndpointID")?;
        let iface = &req["Interface"];
        let docker_mac = field(iface, "MacAddress");
        let mut addresses: Vec<std::net::IpAddr> = Vec::new();
        for key in ["Address", "AddressIPv6"] {
            let address = field(iface, key);
            let ip = address.split('/').next().unwrap_or(address);
            if !ip.is_empty() {
                addresses.push(ip.parse().map_err(|_| {
                    DriverError::new(format!("Interface.{key} {address} is not an address"))
                })?);
            }
        }
        let holding = |ip: &std::net::IpAddr| -> Result<Vec<Port>> {
            let filter = format!("ip_address={ip}");
            Ok(self
                .client
                .list::<Port>(&[("fixed_ips", &filter), ("network_id", &net.id)])?
                .0)
        };
        let existing = match addresses.first() {
            Some(ip) => holding(ip)?.into_iter().next(),
            None => None,
        };
        let port = match existing {
            Some(p) => p,
            None => self.client.create(PortCreate {
                network_id: net.id.clone(),
                device_owner: Some("docker".into()),
                fixed_ips: (!addresses.is_empty()).then(|| {
                    addresses
                        .iter()
                        .map(|a| FixedIpRequest {
                            subnet_id: None,
                            ip_address: Some(*a),
                        })
                        .collect()
                }),
                mac_address: (!docker_mac.is_empty()).then(|| docker_mac.to_string()),
                ..Default::default()
            })?,
        };
        let joining: Vec<std::net::IpAddr> = addresses
            .iter()
            .filter(|a| !port.fixed_ips.iter().any(|f| f.ip_address == **a))
            .copied()
            .collect();
        for ip in &joining {
            // Only RequestAddress's own, unbound placeholder: never another container's.
            for other in holding(ip)?
                .iter()
                .filter(|p| p.binding_host_id.is_empty() && p.tags.iter().any(|t| t == ADDRESS_TAG))
            {
                self.delete_gone_ok::<Port>(&other.id)?;
            }
        }
        let fixed_ips = (!joining.is_empty()).then(|| {
            port.fixed_ips
                .iter()
                .map(|f| f.ip_address)
                .chain(joining.iter().copied())
                .map(|ip| FixedIpRequest {
                    subnet_id: None,
                    ip_address: Some(ip),
                })
                .collect()
        });
        let binding = PortUpdate {
            host_id: Some(self.cfg.host_id.clone()),
            fixed_ips,
            device_id: Some(endpoint.to_string()),
            // Docker gives the container its own MAC; the port must say the same, or other
            // hosts would forward to a MAC nobody has.
            mac_address: (!docker_mac.is_empty()
                && !docker_mac.eq_ignore_ascii_case(&port.mac_address))
            .then(|| docker_mac.to_string()),
            ..Default::default()
        };
        self.client.update(&port.id, binding)?;
        self.client.add_tag::<Port>(&port.id, endpoint)?;
        if docker_mac.is_empty() {
            Ok(json!({"Interface": {"MacAddress": port.mac_address}}))
        } else {
            Ok(json!({"Interface": {}}))
        }
    }

    /// DeleteEndpoint: the port goes, and with it a subnet of the driver's that is left
    /// empty (RequestAddress makes it again from its pool); an unknown endpoint is already
    /// gone.
    pub(crate) fn delete_endpoint(&self, req: &Value) -> Result<Value> {
        if let Ok(port) = self.endpoint(docker_id(req, "EndpointID")?) {
            // A veth left behind is the agent's to remove once the port is gone; the port
            // and its address go regardless.
            let unbound = self.unbind(&port);
            self.delete_gone_ok::<Port>(&port.id)?;
            for f in &port.fixed_ips {
                self.delete_subnet_if_empty(&f.subnet_id)?;
            }
            unbound?;
        }
        Ok(json!({}))
    }

    fn delete_subnet_if_empty(&self, id: &str) -> Result<()> {
        let Ok(subnet) = self.client.get::<Subnet>(id) else {
            return Ok(());
        };
        if !subnet.tags.iter().any(|t| t.starts_with(SUBNET_POOL_TAG)) {
            return Ok(());
        }
        let filter = format!("subnet_id={id}");
        if !self
            .client
            .list::<Port>(&[("fixed_ips", &filter)])?
            .0
            .is_empty()
        {
            return Ok(());
        }
        match self.client.delete::<Subnet>(id) {
            // A port that came meanwhile keeps it (SubnetInUse).
            Ok(())
            | Err(corvid_api::ApiError::Neutron {
                status: 404 | 409, ..
            }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// EndpointOperInfo: what the controller knows of the endpoint.
    pub(crate) fn endpoint_info(&self, req: &Value) -> Result<Value> {
        let port = self.endpoint(docker_id(req, "EndpointID")?)?;
        Ok(json!({"Value": {
            "port_id": port.id,
            "mac_address": port.mac_address,
            "fixed_ips": port.fixed_ips,
            "status": port.status,
            "host_veth": corvid_net::names::host_veth(&port.id),
        }}))
    }

    /// The MTU a network of `network_mtu` gets on this host: the agent's, which lowers
    /// it to what this host's underlay carries once encapsulated (found from the
    /// underlay address the agent registered; the network's own before it has).
    fn pod_mtu(&self, nl: &mut Netlink, network_mtu: u32) -> Result<u32> {
        let underlay = self.client.registered_underlay(&self.cfg.host_id)?;
        Ok(corvid_net::overlay::pod_mtu(nl, underlay, network_mtu)?)
    }

    /// Join: a veth pair whose host end is on the network's bridge on this host and whose
    /// other end Docker moves into the sandbox; the port is then ACTIVE.
    pub(crate) fn join(&self, req: &Value) -> Result<Value> {
        let net = self.network(docker_id(req, "NetworkID")?)?;
        let port = self.endpoint(docker_id(req, "EndpointID")?)?;
        let host_name = corvid_net::names::host_veth(&port.id);
        let src = container_veth(&port.id);
        let cluster = self.cluster()?;
        let mut nl = Netlink::open()?;
        let mtu = self.pod_mtu(&mut nl, net.mtu)?;
        let bridge_name = corvid_net::names::bridge(&net.id);
        if nl.link_by_name(&bridge_name)?.is_none() {
            // A new bridge: whatever filters forwarding must let it through (checked per
            // bridge, not per Join: an agent beside may have removed the allowance with
            // the last bridge it saw).
            corvid_net::iptables::allow_bridges()?;
        }
        let bridge = ensure_bridge(
            &mut nl,
            &BridgeSpec {
                name: &bridge_name,
                mtu: Some(mtu),
                vlan_filtering: false,
                promisc: false,
                alias: Some(&corvid_net::names::owner_mark(cluster, &net.id)),
                ipv6: None,
            },
        )?;
        // A pair left by an interrupted Join, or whose end Docker took into a sandbox
        // and gave back, is checked: kept when whole, made anew otherwise.
        let here = Netns::current()?;
        let mut peer = Netlink::open()?;
        ensure_plugged(
            &mut nl,
            &mut peer,
            &here,
            &bridge,
            &VethSpec {
                ifname: &src,
                mtu: Some(mtu),
                hairpin: false,
                vlan: None,
                keep_default_vlan: true,
                mac: Some(&port.mac_address),
                host_name: Some(&host_name),
                alias: Some(&corvid_net::names::owner_mark(cluster, &port.id)),
                kept: &[],
            },
            &[],
            &[],
        )?;
        let subnets: Vec<Subnet> = port
            .fixed_ips
            .iter()
            .filter_map(|f| self.client.get::<Subnet>(&f.subnet_id).ok())
            .collect();
        let mut answer = json!({
            "InterfaceName": {"SrcName": src, "DstPrefix": self.cfg.dst_prefix},
            "DisableGatewayService": false,
        });
        if let Some(gw) = subnets
            .iter()
            .filter_map(|s| s.gateway_ip)
            .find(|g| g.is_ipv4())
        {
            answer["Gateway"] = json!(gw);
        }
        if let Some(gw) = subnets
            .iter()
            .filter_map(|s| s.gateway_ip)
            .find(|g| g.is_ipv6())
        {
            answer["GatewayIPv6"] = json!(gw);
        }
        let routes: Vec<Value> = subnets
            .iter()
            .flat_map(|s| &s.host_routes)
            .map(|r| json!({"Destination": r.destination, "RouteType": 0, "NextHop": r.nexthop}))
            .collect();
        if !routes.is_empty() {
            answer["StaticRoutes"] = json!(routes);
        }
        self.client.set_port_status(&port.id, Status::Active)?;
        Ok(answer)
    }

    /// Leave: the veth pair goes (Docker has moved the other end out again or the sandbox
    /// is gone); the port is DOWN.
    pub(crate) fn leave(&self, req: &Value) -> Result<Value> {
        let port = self.endpoint(docker_id(req, "EndpointID")?)?;
        // Reported DOWN even when a veth end would not go: the port is no longer plugged.
        let unbound = self.unbind(&port);
        self.client.set_port_status(&port.id, Status::Down)?;
        unbound.map(|_| json!({}))
    }

    /// Removes the port's veth pair, both ends tried whatever the other did.
    fn unbind(&self, port: &Port) -> Result<()> {
        let mut nl = Netlink::open()?;
        let mut failures = Vec::new();
        for name in [
            corvid_net::names::host_veth(&port.id),
            container_veth(&port.id),
        ] {
            let removed = nl
                .link_by_name(&name)
                .and_then(|l| l.map_or(Ok(()), |l| nl.delete_link(&l)));
            if let Err(e) = removed {
                failures.push(format!("delete veth {name} of port {}: {e}", port.id));
            }
        }
        if failures.is_empty() {
            Ok(())
        } else {
            Err(DriverError::new(failures.join("; ")))
        }
    }
}

/// A Docker ID field: 1 to 128 characters of [0-9a-zA-Z_.-].
fn docker_id<'a>(req: &'a Value, key: &str) -> Result<&'a str> {
    let id = field(req, key);
    if id.is_empty()
        || id.len() > 128
        || !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
    {
        return Err(DriverError::new(format!("{key} {id:?} is not a Docker ID")));
    }
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_ids_are_checked() {
        let ok = json!({"NetworkID": "0cea0df0253027f487de2501d72190ee94c90cbe4599d65fe58ecb2a13a47f90"});
        assert!(docker_id(&ok, "NetworkID").is_ok());
        assert!(docker_id(&json!({"NetworkID": "a/b"}), "NetworkID").is_err());
        assert!(docker_id(&json!({}), "NetworkID").is_err());
    }

    #[test]
    fn veth_names_fit() {
        let n = container_veth("cb33feb4acb5");
        assert_eq!(n.len(), 15);
        assert!(n.starts_with("cvc"));
    }
}

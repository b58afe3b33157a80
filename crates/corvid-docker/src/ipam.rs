//! IpamDriver: Docker's pools are controller subnetpools, its addresses unbound ports.
//! Docker asks for the pool and the gateway before the network exists, so the gateway is
//! remembered on the subnetpool (a tag) until CreateNetwork makes the subnet.
//!
//! A pool may instead be an existing controller subnet (`--ipam-opt corvid.subnet.id=S`):
//! its PoolID is the subnet's ID, and the driver neither creates nor deletes anything for
//! it. That is how a second Docker host joins a network another host (or CNI) made.

use std::net::IpAddr;

use corvid_api::{FixedIpRequest, Port, PortCreate, Subnet, SubnetPool, SubnetPoolCreate};
use ipnet::IpNet;
use serde_json::{json, Value};

use crate::tags::{
    decode_mac, ADDRESS_TAG, GATEWAY_TAG, POOL_NETWORK_TAG, POOL_TAG, SUBNET_ID_OPTION,
    SUBNET_POOL_TAG, SUBPOOL_TAG,
};
use crate::{field, Driver, DriverError, Result};

/// What a Docker PoolID stands for.
pub(crate) enum Pool {
    /// A subnetpool the driver made; its subnet exists once CreateNetwork ran.
    Own(SubnetPool),
    /// An existing controller subnet the driver only uses.
    Adopted(Subnet),
}

impl Pool {
    fn prefix(&self) -> IpNet {
        match self {
            Pool::Own(p) => p.prefixes[0],
            Pool::Adopted(s) => s.cidr,
        }
    }
}

fn tag_value<'a>(tags: &'a [String], prefix: &str) -> Option<&'a str> {
    tags.iter().find_map(|t| t.strip_prefix(prefix))
}

impl Driver {
    pub(crate) fn pool(&self, id: &str) -> Result<Pool> {
        let unknown = || DriverError::new(format!("unknown pool {id}"));
        match self.client.get::<SubnetPool>(id) {
            Ok(p) if p.tags.iter().any(|t| t == POOL_TAG) => return Ok(Pool::Own(p)),
            Ok(_) => return Err(unknown()),
            Err(corvid_api::ApiError::Neutron { status: 404, .. }) => {}
            Err(e) => return Err(e.into()),
        }
        match self.client.get::<Subnet>(id) {
            Ok(s) => Ok(Pool::Adopted(s)),
            Err(corvid_api::ApiError::Neutron { status: 404, .. }) => Err(unknown()),
            Err(e) => Err(e.into()),
        }
    }

    /// The subnet a pool's addresses come from, if the network exists yet.
    pub(crate) fn pool_subnet(&self, pool: &Pool) -> Result<Option<Subnet>> {
        let own = match pool {
            Pool::Own(p) => p,
            Pool::Adopted(s) => return Ok(Some(s.clone())),
        };
        let tag = format!("{SUBNET_POOL_TAG}{}", own.id);
        Ok(self
            .client
            .list::<Subnet>(&[("tags", &tag)])?
            .0
            .into_iter()
            .next())
    }

    /// The pool's subnet, made again if DeleteEndpoint removed it when it emptied.
    fn pool_subnet_or_remake(&self, pool: &Pool) -> Result<Subnet> {
        if let Some(s) = self.pool_subnet(pool)? {
            return Ok(s);
        }
        let no_network = || {
            DriverError::new(format!(
                "pool {} has no network yet: create the network before its endpoints",
                pool.prefix()
            ))
        };
        let Pool::Own(own) = pool else {
            return Err(no_network());
        };
        let network = tag_value(&own.tags, POOL_NETWORK_TAG).ok_or_else(no_network)?;
        match self.make_subnet(
            network,
            own.prefixes[0],
            Driver::pool_gateway(own),
            Some(own),
        ) {
            Ok(s) => Ok(s),
            // Another call made it at the same time.
            Err(e) => self.pool_subnet(pool)?.ok_or(e),
        }
    }

    /// RequestPool with `corvid.subnet.id`: the subnet is the pool, as it is.
    fn adopt_subnet(&self, id: &str, asked: &str) -> Result<Value> {
        let subnet = self.client.get::<Subnet>(id).map_err(|e| match e {
            corvid_api::ApiError::Neutron { status: 404, .. } => {
                DriverError::new(format!("{SUBNET_ID_OPTION}={id}: no such corvid subnet"))
            }
            e => e.into(),
        })?;
        if !asked.is_empty() && asked.parse::<IpNet>().ok().map(|p| p.trunc()) != Some(subnet.cidr)
        {
            return Err(DriverError::new(format!(
                "--subnet {asked} is not subnet {id}'s {}: leave --subnet out or give that",
                subnet.cidr
            )));
        }
        Ok(json!({"PoolID": subnet.id, "Pool": subnet.cidr, "Data": {}}))
    }

    /// The driver's pools, and every prefix already in use: theirs and every subnet's.
    fn taken(&self) -> Result<(Vec<SubnetPool>, Vec<IpNet>)> {
        let pools = self.client.list::<SubnetPool>(&[("tags", POOL_TAG)])?.0;
        let subnets = self.client.list::<Subnet>(&[])?.0;
        let prefixes = pools
            .iter()
            .flat_map(|p| p.prefixes.clone())
            .chain(subnets.into_iter().map(|s| s.cidr))
            .collect();
        Ok((pools, prefixes))
    }

    /// A pool of exactly `pool` (and `tags`) that no network was ever made on: what a
    /// RequestPool left when the driver died before Docker had its answer. Docker asks
    /// again for the same pool, and gets that one.
    fn abandoned<'a>(
        pools: &'a [SubnetPool],
        pool: IpNet,
        tags: &[String],
    ) -> Option<&'a SubnetPool> {
        let mut want: Vec<&String> = tags.iter().collect();
        want.sort();
        pools.iter().find(|p| {
            let mut have: Vec<&String> = p
                .tags
                .iter()
                .filter(|t| !t.starts_with(GATEWAY_TAG))
                .collect();
            have.sort();
            p.prefixes == [pool] && tag_value(&p.tags, POOL_NETWORK_TAG).is_none() && have == want
        })
    }

    /// RequestPool: a subnetpool for the asked pool, or a free one from the default range.
    pub(crate) fn request_pool(&self, req: &Value) -> Result<Value> {
        if req["V6"].as_bool() == Some(true) && field(req, "Pool").is_empty() {
            return Err(DriverError::new(
                "IPv6 pools must be given with --subnet: corvid has no default IPv6 range",
            ));
        }
        if let Some(id) = req["Options"][SUBNET_ID_OPTION].as_str() {
            return self.adopt_subnet(id, field(req, "Pool"));
        }
        let (pools, taken) = self.taken()?;
        let overlaps = |a: &IpNet, b: &IpNet| a.contains(&b.network()) || b.contains(&a.network());
        let pool: IpNet = match field(req, "Pool") {
            "" => self
                .cfg
                .default_range
                .subnets(self.cfg.default_prefix)
                .map_err(|e| DriverError::new(format!("default range: {e}")))?
                .find(|c| !taken.iter().any(|t| overlaps(t, c)))
                .ok_or_else(|| {
                    DriverError::new(format!(
                        "no free /{} left in the default range {}: give --subnet",
                        self.cfg.default_prefix, self.cfg.default_range
                    ))
                })?,
            p => p
                .parse::<IpNet>()
                .map_err(|_| DriverError::new(format!("Pool {p} is not a CIDR")))?
                .trunc(),
        };
        let mut tags = vec![POOL_TAG.to_string()];
        match field(req, "SubPool") {
            "" => {}
            s => {
                let sub: IpNet = s
                    .parse()
                    .map_err(|_| DriverError::new(format!("SubPool {s} is not a CIDR")))?;
                if !pool.contains(&sub) {
                    return Err(DriverError::new(format!(
                        "--ip-range {sub} is not inside the pool {pool}"
                    )));
                }
                tags.push(format!("{SUBPOOL_TAG}{}", sub.trunc()));
            }
        }
        if !field(req, "Pool").is_empty() {
            if let Some(left) = Self::abandoned(&pools, pool, &tags) {
                return Ok(json!({"PoolID": left.id, "Pool": pool, "Data": {}}));
            }
            if let Some(t) = taken.iter().find(|t| overlaps(t, &pool)) {
                return Err(DriverError::new(format!(
                    "pool {pool} overlaps {t}, which is already in use"
                )));
            }
        }
        let created = self.client.create(SubnetPoolCreate {
            name: Some(format!("docker-{pool}")),
            prefixes: vec![pool],
            default_prefixlen: Some(pool.prefix_len()),
            min_prefixlen: Some(pool.prefix_len()),
            max_prefixlen: Some(pool.max_prefix_len()),
            tags: Some(tags),
            ..Default::default()
        })?;
        Ok(json!({"PoolID": created.id, "Pool": pool, "Data": {}}))
    }

    /// ReleasePool: the subnetpool goes (Docker sends it before DeleteNetwork); an
    /// adopted subnet stays.
    pub(crate) fn release_pool(&self, req: &Value) -> Result<Value> {
        let id = field(req, "PoolID");
        match self.pool(id) {
            Ok(Pool::Own(_)) => {
                self.delete_gone_ok::<SubnetPool>(id)?;
                Ok(json!({}))
            }
            Ok(Pool::Adopted(_)) | Err(_) => Ok(json!({})),
        }
    }

    /// RequestAddress: the gateway is reserved on the pool; any other address is an
    /// unbound port holding it (the asked one, or the next free one).
    pub(crate) fn request_address(&self, req: &Value) -> Result<Value> {
        let pool = self.pool(field(req, "PoolID"))?;
        let prefix = pool.prefix();
        let asked = match field(req, "Address") {
            "" => None,
            a => Some(
                a.split('/')
                    .next()
                    .unwrap_or(a)
                    .parse::<IpAddr>()
                    .map_err(|_| DriverError::new(format!("Address {a} is not an IP address")))?,
            ),
        };
        if let Some(a) = asked {
            if !prefix.contains(&a) {
                return Err(DriverError::new(format!(
                    "address {a} is outside the pool {prefix}"
                )));
            }
        }
        let options = &req["Options"];
        if options["RequestAddressType"] == "com.docker.network.gateway" {
            let own = match &pool {
                Pool::Own(p) => p,
                Pool::Adopted(s) => return adopted_gateway(s, asked),
            };
            let gw = match asked {
                Some(a) => a,
                // The prefix's first address after its network address, for IPv6 too
                // (whose `hosts()` starts at the subnet-router anycast address), as
                // Docker's own IPAM and Neutron pick it.
                None => prefix
                    .hosts()
                    .find(|a| *a != prefix.network())
                    .ok_or_else(|| {
                        DriverError::new(format!("pool {prefix} has no host address"))
                    })?,
            };
            let tag = format!("{GATEWAY_TAG}{gw}");
            self.client.add_tag::<SubnetPool>(&own.id, &tag)?;
            return Ok(
                json!({"Address": IpNet::new(gw, prefix.prefix_len()).map_err(|e| DriverError::new(e.to_string()))?, "Data": {}}),
            );
        }
        let subnet = self.pool_subnet_or_remake(&pool)?;
        let mac = options["com.docker.network.endpoint.macaddress"]
            .as_str()
            .map(decode_mac)
            .transpose()?;
        let port = self.client.create(PortCreate {
            network_id: subnet.network_id,
            fixed_ips: Some(vec![FixedIpRequest {
                subnet_id: Some(subnet.id),
                ip_address: asked,
            }]),
            device_owner: Some("docker".into()),
            tags: Some(vec![ADDRESS_TAG.into()]),
            mac_address: mac,
            ..Default::default()
        })?;
        let ip = port
            .fixed_ips
            .first()
            .map(|f| f.ip_address)
            .ok_or_else(|| DriverError::new("the controller gave the port no address"))?;
        Ok(
            json!({"Address": IpNet::new(ip, subnet.cidr.prefix_len()).map_err(|e| DriverError::new(e.to_string()))?, "Data": {}}),
        )
    }

    /// ReleaseAddress: the gateway's reservation, or the port holding the address; an
    /// address nobody holds (already released with its endpoint) is fine.
    pub(crate) fn release_address(&self, req: &Value) -> Result<Value> {
        let pool = match self.pool(field(req, "PoolID")) {
            Ok(p) => p,
            Err(_) => return Ok(json!({})),
        };
        let address = field(req, "Address");
        let address = address.split('/').next().unwrap_or(address);
        if let Pool::Own(own) = &pool {
            if tag_value(&own.tags, GATEWAY_TAG) == Some(address) {
                let tag = format!("{GATEWAY_TAG}{address}");
                let path = format!("/v2.0/subnetpools/{}/tags/{tag}", own.id);
                self.client.request("DELETE", &path, None)?;
                return Ok(json!({}));
            }
        }
        if let Some(subnet) = self.pool_subnet(&pool)? {
            let filter = format!("ip_address={address}");
            let ports = self
                .client
                .list::<Port>(&[("fixed_ips", &filter), ("network_id", &subnet.network_id)])?
                .0;
            for p in ports
                .iter()
                .filter(|p| p.tags.iter().any(|t| t == ADDRESS_TAG))
            {
                self.delete_gone_ok::<Port>(&p.id)?;
            }
        }
        Ok(json!({}))
    }

    /// The gateway reserved on a pool, if any.
    pub(crate) fn pool_gateway(pool: &SubnetPool) -> Option<IpAddr> {
        tag_value(&pool.tags, GATEWAY_TAG).and_then(|g| g.parse().ok())
    }

    /// The `--ip-range` of a pool, if any.
    pub(crate) fn pool_subpool(pool: &SubnetPool) -> Option<IpNet> {
        tag_value(&pool.tags, SUBPOOL_TAG).and_then(|g| g.parse().ok())
    }
}

/// The gateway of an adopted subnet is the subnet's own: Docker may only confirm it.
fn adopted_gateway(subnet: &Subnet, asked: Option<IpAddr>) -> Result<Value> {
    let gw = subnet
        .gateway_ip
        .ok_or_else(|| DriverError::new(format!("subnet {} has no gateway", subnet.id)))?;
    if asked.is_some_and(|a| a != gw) {
        return Err(DriverError::new(format!(
            "--gateway must be subnet {}'s gateway {gw}",
            subnet.id
        )));
    }
    let address =
        IpNet::new(gw, subnet.cidr.prefix_len()).map_err(|e| DriverError::new(e.to_string()))?;
    Ok(json!({"Address": address, "Data": {}}))
}

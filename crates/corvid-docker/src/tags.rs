//! What the driver keeps in the controller and reads from Docker: the tags that let a
//! restarted driver find its pools, subnets, networks and ports again, the options a
//! user passes to `docker network create`, and Docker's encoding of a MAC option.

use base64::Engine;

use crate::{DriverError, Result};

/// Tag of every subnetpool the driver made.
pub const POOL_TAG: &str = "docker-pool";
/// Tag prefix naming a pool's `--ip-range`.
pub const SUBPOOL_TAG: &str = "docker-subpool:";
/// Tag prefix naming a pool's reserved gateway.
pub const GATEWAY_TAG: &str = "docker-gateway:";
/// Tag prefix linking a subnet to its pool.
pub const SUBNET_POOL_TAG: &str = "docker-pool:";
/// Tag prefix linking a pool to the network CreateNetwork made for it.
pub const POOL_NETWORK_TAG: &str = "docker-network:";
/// Tag of the ports RequestAddress made.
pub const ADDRESS_TAG: &str = "docker-address";
/// IPAM option naming an existing controller subnet to use as the pool.
pub const SUBNET_ID_OPTION: &str = "corvid.subnet.id";

/// Tag of a network the driver adopted rather than created: DeleteNetwork leaves it.
pub const ADOPTED_TAG: &str = "docker-adopted";
/// Generic option naming an existing controller network to adopt, by name.
pub const NET_NAME_OPTION: &str = "corvid.net.name";
/// Generic option naming an existing controller network to adopt, by ID.
pub const NET_ID_OPTION: &str = "corvid.net.id";

/// Docker sends `--mac-address` in the options as base64 of the six bytes.
pub fn decode_mac(b64: &str) -> Result<String> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|_| DriverError::new(format!("MAC option {b64} is not base64")))?;
    if bytes.len() != 6 {
        return Err(DriverError::new(format!(
            "MAC option decodes to {} bytes, not 6",
            bytes.len()
        )));
    }
    Ok(corvid_net::link::format_mac(&bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_decode_from_docker_base64() {
        assert_eq!(decode_mac("AkKs/gAB").unwrap(), "02:42:ac:fe:00:01");
        assert!(decode_mac("AkI=").is_err());
        assert!(decode_mac("!!").is_err());
    }
}

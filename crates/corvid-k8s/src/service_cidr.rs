//! The cluster's service range (the API server's `--service-cluster-ip-range`), found
//! from the API server when the operator names none: kubeadm's ClusterConfiguration
//! says it, and otherwise the API server itself does, when asked for a service at an
//! address outside it (it refuses, naming the range, and makes nothing).

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::api::{Api, PostParams};
use serde_json::json;

/// An address no cluster's service range holds (TEST-NET-3), asked for on purpose.
const OUTSIDE: &str = "203.0.113.254";
/// What the API server's refusal says before the range.
const RANGE_IS: &str = "The range of valid IPs is ";

/// The IPv4 service range, from kubeadm's configuration or the API server's refusal.
pub async fn discover(kube: &kube::Client) -> Result<IpNet, crate::Error> {
    if let Some(cidr) = from_kubeadm(kube).await {
        return Ok(cidr);
    }
    from_refusal(kube).await.ok_or(crate::Error::NoServiceRange)
}

/// `networking.serviceSubnet` of kubeadm's ClusterConfiguration (its IPv4 range, for a
/// dual-stack list).
async fn from_kubeadm(kube: &kube::Client) -> Option<IpNet> {
    let cm = Api::<ConfigMap>::namespaced(kube.clone(), "kube-system")
        .get_opt("kubeadm-config")
        .await
        .ok()??;
    let text = cm.data?.remove("ClusterConfiguration")?;
    service_subnet(&text)
}

/// The IPv4 range in a ClusterConfiguration's `serviceSubnet:` line.
fn service_subnet(text: &str) -> Option<IpNet> {
    text.lines()
        .find_map(|l| l.trim().strip_prefix("serviceSubnet:"))?
        .split(',')
        .map(|s| s.trim().trim_matches('"'))
        .filter_map(|s| s.parse::<IpNet>().ok())
        .find(|n| n.addr().is_ipv4())
}

/// The range the API server names when refusing a service at [`OUTSIDE`].
async fn from_refusal(kube: &kube::Client) -> Option<IpNet> {
    let api = Api::<Service>::namespaced(kube.clone(), "default");
    let probe: Service = serde_json::from_value(json!({
        "metadata": {"generateName": "corvid-service-range-"},
        "spec": {"clusterIP": OUTSIDE, "ports": [{"port": 1}]},
    }))
    .ok()?;
    match api.create(&PostParams::default(), &probe).await {
        Err(kube::Error::Api(e)) => range_in(&e.message),
        Ok(made) => {
            // The range held the address after all: nothing learnt, and nothing kept.
            if let Some(name) = made.metadata.name {
                let _ = api.delete(&name, &Default::default()).await;
            }
            None
        }
        Err(_) => None,
    }
}

/// The range in the API server's refusal message.
fn range_in(message: &str) -> Option<IpNet> {
    let rest = &message[message.find(RANGE_IS)? + RANGE_IS.len()..];
    rest.split(|c: char| c.is_whitespace() || c == ',' || c == '"')
        .next()?
        .trim_end_matches('.')
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubeadm_service_subnets_read_single_and_dual_stack() {
        let single = "apiVersion: kubeadm.k8s.io/v1beta2\nnetworking:\n  dnsDomain: cluster.local\n  serviceSubnet: 10.96.0.0/12\n";
        assert_eq!(
            service_subnet(single),
            Some("10.96.0.0/12".parse().unwrap())
        );
        let dual = "networking:\n  serviceSubnet: \"fd00:10:96::/112,10.96.0.0/16\"\n";
        assert_eq!(service_subnet(dual), Some("10.96.0.0/16".parse().unwrap()));
        assert_eq!(
            service_subnet("networking:\n  podSubnet: 10.244.0.0/16\n"),
            None
        );
    }

    #[test]
    fn the_range_is_read_from_the_api_servers_refusal() {
        let m = "Service \"corvid-service-range-x\" is invalid: spec.clusterIPs: Invalid value: []string{\"203.0.113.254\"}: failed to allocated ip:203.0.113.254 with error:provided IP is not in the valid range. The range of valid IPs is 10.0.0.0/24";
        assert_eq!(range_in(m), Some("10.0.0.0/24".parse().unwrap()));
        assert_eq!(range_in("something else"), None);
    }
}

//! firewall: lets a container's traffic through the host's forwarding filter (outbound,
//! and replies inbound) and applies the network's ingress policy, chained after the
//! plugin that gave the container its addresses. The rules are corvid-net's.

use crate::{attachments, errors};
use corvid_cni::skel::{CmdArgs, Plugin};
use corvid_cni::{CniResult, Error, ErrorCode};
use corvid_net::nftables::firewall::{self, IngressPolicy};
use serde::Deserialize;

/// The firewall plugin.
pub struct Firewall;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct FirewallConf {
    #[serde(default)]
    backend: Option<String>,
    #[serde(default)]
    ingress_policy: Option<String>,
    #[serde(default)]
    iptables_admin_chain_name: Option<String>,
}

fn load(args: &CmdArgs) -> Result<IngressPolicy, Error> {
    let conf: FirewallConf = serde_json::from_slice(&args.stdin).map_err(errors::config)?;
    // Configurations written for the reference name its backends; corvid's rules are
    // nftables rules in its own table whichever is named, but firewalld zones are not.
    match conf.backend.as_deref() {
        None | Some("" | "iptables" | "nftables") => {}
        Some(other) => {
            return Err(Error::new(
                ErrorCode::UnsupportedField,
                format!(
                "unsupported field \"backend\": {other} (corvid's firewall writes nftables rules)"
            ),
            ))
        }
    }
    if conf.iptables_admin_chain_name.is_some() {
        return Err(Error::new(
            ErrorCode::UnsupportedField,
            "unsupported field \"iptablesAdminChainName\": corvid's firewall has no iptables admin chain",
        ));
    }
    match conf.ingress_policy.as_deref() {
        None | Some("" | "open") => Ok(IngressPolicy::Open),
        Some("same-bridge") => Ok(IngressPolicy::SameBridge),
        Some("isolated") => Ok(IngressPolicy::Isolated),
        Some(other) => Err(Error::new(
            ErrorCode::InvalidNetworkConfig,
            format!("invalid ingressPolicy \"{other}\" (open, same-bridge or isolated)"),
        )),
    }
}

impl Plugin for Firewall {
    fn add(&self, args: &CmdArgs) -> Result<CniResult, Error> {
        let policy = load(args)?;
        let prev = args.prev_result.clone().ok_or_else(|| {
            Error::new(
                ErrorCode::InvalidNetworkConfig,
                "firewall must be called as a chained plugin",
            )
        })?;
        // The bridge is the first interface on the host side, as the reference takes it.
        let bridge = prev.interfaces.iter().find(|i| i.sandbox.is_empty());
        if policy != IngressPolicy::Open && bridge.is_none() {
            return Err(Error::new(
                ErrorCode::InvalidNetworkConfig,
                "an ingressPolicy needs a bridge in prevResult: chain firewall after bridge",
            ));
        }
        firewall::add_firewall(
            &mut attachments::nftables()?,
            &attachments::tag(args),
            &attachments::addresses(&prev),
            bridge.map(|b| b.name.as_str()),
            policy,
        )
        .map_err(errors::net)?;
        Ok(prev)
    }

    fn del(&self, args: &CmdArgs) -> Result<(), Error> {
        load(args)?;
        let addrs = args.prev_result.as_ref().map(attachments::addresses);
        let known = addrs.as_deref().filter(|a| !a.is_empty());
        firewall::delete_firewall(
            &mut attachments::nftables()?,
            &attachments::tag(args),
            known,
        )
        .map_err(errors::net)
    }

    fn check(&self, args: &CmdArgs) -> Result<(), Error> {
        load(args)?;
        let prev = args
            .prev_result
            .as_ref()
            .expect("skel requires prevResult for CHECK");
        let missing = firewall::missing_firewall(
            &mut attachments::nftables()?,
            &attachments::tag(args),
            &attachments::addresses(prev),
        )
        .map_err(errors::net)?;
        match missing.as_slice() {
            [] => Ok(()),
            m => Err(Error::new(
                ErrorCode::CheckFailed,
                format!("the firewall does not let {m:?} through"),
            )),
        }
    }

    fn gc(&self, args: &CmdArgs) -> Result<(), Error> {
        load(args)?;
        firewall::gc_firewall(
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

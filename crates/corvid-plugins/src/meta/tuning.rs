//! tuning: sysctls (`net.*` only, against the allowlist file when there is one) and the
//! interface's MAC, MTU, promiscuous and all-multicast modes and transmit queue length,
//! inside the container. What it changes on the interface is saved first, in the
//! reference's file layout, and DEL puts it back.

use crate::errors;
use corvid_cni::result::CniResult;
use corvid_cni::skel::{CmdArgs, Plugin};
use corvid_cni::{Error, ErrorCode};
use corvid_net::link::{parse_mac, Link};
use corvid_net::{sysctl, Netlink, Netns};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The tuning plugin.
pub struct Tuning;

/// Where the reference keeps what DEL restores.
const DEFAULT_DATA_DIR: &str = "/run/cni/tuning";
/// The reference's allowlist of sysctl patterns; `CORVID_TUNING_ALLOWLIST` names another.
const ALLOWLIST: &str = "/etc/cni/tuning/allowlist.conf";

/// The settings, from the configuration with `args.cni`, runtimeConfig and CNI_ARGS
/// layered on, as the reference layers them.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Settings {
    #[serde(default)]
    sysctl: BTreeMap<String, String>,
    #[serde(default)]
    mac: Option<String>,
    #[serde(default)]
    promisc: Option<bool>,
    #[serde(default)]
    mtu: Option<u32>,
    #[serde(default, rename = "txQLen")]
    tx_qlen: Option<u32>,
    #[serde(default)]
    allmulti: Option<bool>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TuningConf {
    #[serde(default)]
    data_dir: Option<PathBuf>,
    #[serde(flatten)]
    settings: Settings,
}

/// What ADD found before changing the interface (the reference's backup file).
#[derive(Serialize, Deserialize, Default, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
struct Backup {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    mac: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    promisc: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mtu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    allmulti: Option<bool>,
    #[serde(default, rename = "txQLen", skip_serializing_if = "Option::is_none")]
    tx_qlen: Option<u32>,
}

struct Loaded {
    settings: Settings,
    sysctls: Vec<(String, String)>,
    data_dir: PathBuf,
}

fn invalid(msg: String) -> Error {
    Error::new(ErrorCode::InvalidNetworkConfig, msg)
}

fn load(args: &CmdArgs) -> Result<Loaded, Error> {
    let conf: TuningConf = serde_json::from_slice(&args.stdin).map_err(errors::config)?;
    let mut s = conf.settings;
    if let Some(mac) = args.args.get("MAC") {
        s.mac = Some(mac.to_string());
    }
    let runtime_mac = args.conf.runtime_config.as_ref().and_then(|r| r.get("mac"));
    if let Some(mac) = runtime_mac
        .and_then(|m| m.as_str())
        .filter(|m| !m.is_empty())
    {
        s.mac = Some(mac.to_string());
    }
    if let Some(cni) = args.conf.args.as_ref().and_then(|a| a.get("cni")) {
        let over = Settings::deserialize(cni).map_err(errors::config)?;
        s.sysctl.extend(over.sysctl);
        s.mac = over.mac.or(s.mac);
        s.promisc = over.promisc.or(s.promisc);
        s.mtu = over.mtu.or(s.mtu);
        s.tx_qlen = over.tx_qlen.or(s.tx_qlen);
        s.allmulti = over.allmulti.or(s.allmulti);
    }
    s.mtu = s.mtu.filter(|m| *m != 0);
    if let Some(mac) = &s.mac {
        if parse_mac(mac).is_none() {
            return Err(invalid(format!("invalid MAC address \"{mac}\"")));
        }
    }
    if s.mtu.is_some_and(|m| m < 68) {
        return Err(invalid(format!("invalid mtu {}", s.mtu.unwrap_or(0))));
    }
    if args.ifname.contains('/') {
        return Err(Error::new(
            ErrorCode::InvalidEnvironment,
            format!("interface name {} contains '/'", args.ifname),
        ));
    }
    let allowlist = allowlist()?;
    let mut sysctls = Vec::with_capacity(s.sysctl.len());
    for (key, value) in &s.sysctl {
        if let Some(patterns) = &allowlist {
            if !patterns.iter().any(|p| p.is_match(key)) {
                return Err(invalid(format!(
                    "sysctl {key} is not allowed by the allowlist"
                )));
            }
        }
        sysctls.push((sysctl_key(key, &args.ifname)?, value.clone()));
    }
    Ok(Loaded {
        settings: s,
        sysctls,
        data_dir: conf.data_dir.unwrap_or_else(|| DEFAULT_DATA_DIR.into()),
    })
}

/// The allowlist's patterns, or none when there is no file.
fn allowlist() -> Result<Option<Vec<regex_lite::Regex>>, Error> {
    let path = std::env::var("CORVID_TUNING_ALLOWLIST").unwrap_or_else(|_| ALLOWLIST.into());
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::new(ErrorCode::Io, format!("read {path}: {e}"))),
    };
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| {
            regex_lite::Regex::new(l).map_err(|e| invalid(format!("allowlist pattern {l}: {e}")))
        })
        .collect::<Result<_, _>>()
        .map(Some)
}

/// A sysctl name (dots or slashes) as a path under /proc/sys/net, with `IFNAME` standing
/// for the interface; anything outside net/ is refused.
fn sysctl_key(key: &str, ifname: &str) -> Result<String, Error> {
    let path = key.replace('.', "/").replacen("IFNAME", ifname, 1);
    let parts: Vec<&str> = path.split('/').collect();
    if parts.first() != Some(&"net")
        || parts.len() < 2
        || parts.iter().any(|p| p.is_empty() || *p == "..")
    {
        return Err(invalid(format!("invalid net sysctl key: \"{key}\"")));
    }
    Ok(path)
}

fn backup_path(dir: &Path, args: &CmdArgs) -> PathBuf {
    dir.join(format!("{}_{}.json", args.container_id, args.ifname))
}

fn open(args: &CmdArgs) -> Result<(Netns, Netlink, Link), Error> {
    let path = args
        .netns
        .as_ref()
        .ok_or_else(|| Error::new(ErrorCode::InvalidEnvironment, "CNI_NETNS is required"))?;
    let ns = Netns::open(path).map_err(errors::net)?;
    let mut nl = Netlink::open_in(&ns).map_err(errors::net)?;
    let link = nl
        .link_by_name(&args.ifname)
        .map_err(errors::net)?
        .ok_or_else(|| {
            Error::new(
                ErrorCode::Kernel,
                format!("interface {} not found in {}", args.ifname, path.display()),
            )
        })?;
    Ok((ns, nl, link))
}

/// Sets what `want` names on the link.
fn apply(nl: &mut Netlink, link: &Link, want: &Backup) -> corvid_net::Result<()> {
    if !want.mac.is_empty() {
        nl.set_mac(link, &want.mac)?;
    }
    if let Some(on) = want.promisc {
        nl.set_promisc(link, on)?;
    }
    if let Some(mtu) = want.mtu {
        nl.set_mtu(link, mtu)?;
    }
    if let Some(on) = want.allmulti {
        nl.set_allmulti(link, on)?;
    }
    if let Some(len) = want.tx_qlen {
        nl.set_txqlen(link, len)?;
    }
    Ok(())
}

impl Settings {
    /// The link changes asked for, in the backup's shape.
    fn wanted(&self) -> Backup {
        Backup {
            mac: self.mac.clone().unwrap_or_default(),
            promisc: self.promisc.filter(|p| *p),
            mtu: self.mtu,
            allmulti: self.allmulti,
            tx_qlen: self.tx_qlen,
        }
    }
}

impl Backup {
    /// The link's current values of what `want` changes.
    fn of(link: &Link, want: &Backup) -> Backup {
        Backup {
            mac: if want.mac.is_empty() {
                String::new()
            } else {
                link.mac.clone()
            },
            promisc: want.promisc.map(|_| link.promisc),
            mtu: want.mtu.map(|_| link.mtu),
            allmulti: want.allmulti.map(|_| link.allmulti),
            tx_qlen: want.tx_qlen.map(|_| link.txqlen),
        }
    }

    fn is_empty(&self) -> bool {
        *self == Backup::default()
    }
}

impl Plugin for Tuning {
    fn add(&self, args: &CmdArgs) -> Result<CniResult, Error> {
        let loaded = load(args)?;
        let mut prev = args
            .prev_result
            .clone()
            .ok_or_else(|| invalid("tuning must be called as a chained plugin".into()))?;
        let (ns, mut nl, link) = open(args)?;
        let want = loaded.settings.wanted();
        let before = Backup::of(&link, &want);
        let file = backup_path(&loaded.data_dir, args);
        if !want.is_empty() {
            write_backup(&file, &before)?;
        }
        // All or nothing: what was set is put back when a later step fails.
        let mut set_sysctls: Vec<(String, String)> = Vec::new();
        let applied = ns
            .run(|| -> corvid_net::Result<()> {
                for (key, value) in &loaded.sysctls {
                    let old = sysctl::get(key)?;
                    sysctl::set(key, value)?;
                    set_sysctls.push((key.clone(), old));
                }
                Ok(())
            })
            .map_err(errors::net)?
            .and_then(|()| apply(&mut nl, &link, &want));
        if let Err(e) = applied {
            let _ = ns.run(|| {
                for (key, old) in set_sysctls.iter().rev() {
                    let _ = sysctl::set(key, old);
                }
            });
            let _ = apply(&mut nl, &link, &before);
            let _ = std::fs::remove_file(&file);
            return Err(errors::net(e));
        }
        if let Some(mac) = &loaded.settings.mac {
            for iface in prev.interfaces.iter_mut().filter(|i| i.name == args.ifname) {
                iface.mac = mac.to_ascii_lowercase();
            }
        }
        Ok(prev)
    }

    fn del(&self, args: &CmdArgs) -> Result<(), Error> {
        let conf: TuningConf = serde_json::from_slice(&args.stdin).map_err(errors::config)?;
        let dir = conf.data_dir.unwrap_or_else(|| DEFAULT_DATA_DIR.into());
        let file = backup_path(&dir, args);
        let Ok(text) = std::fs::read(&file) else {
            return Ok(());
        };
        // A torn backup restores nothing but must not block DEL.
        let before: Backup = serde_json::from_slice(&text).unwrap_or_default();
        if let Ok((_, mut nl, link)) = open(args) {
            apply(&mut nl, &link, &before)
                .map_err(|e| errors::net(e).during("restore the interface"))?;
        }
        std::fs::remove_file(&file)
            .map_err(|e| Error::new(ErrorCode::Io, format!("remove {}: {e}", file.display())))
    }

    fn check(&self, args: &CmdArgs) -> Result<(), Error> {
        let loaded = load(args)?;
        let (ns, _, link) = open(args)?;
        let fail = |msg: String| Err(Error::new(ErrorCode::CheckFailed, msg));
        for (key, value) in &loaded.sysctls {
            let now = ns
                .run(|| sysctl::get(key))
                .map_err(errors::net)?
                .map_err(errors::net)?;
            if now != *value {
                return fail(format!("sysctl {key} is {now}, configured {value}"));
            }
        }
        let s = &loaded.settings;
        if let Some(mac) = &s.mac {
            if !mac.eq_ignore_ascii_case(&link.mac) {
                return fail(format!(
                    "{} has MAC {}, configured {mac}",
                    link.name, link.mac
                ));
            }
        }
        if s.promisc.unwrap_or(false) != link.promisc {
            return fail(format!(
                "{} promiscuous mode is {}",
                link.name, link.promisc
            ));
        }
        let numbers = [("MTU", s.mtu, link.mtu), ("txQLen", s.tx_qlen, link.txqlen)];
        for (what, want, have) in numbers {
            if want.is_some_and(|w| w != have) {
                return fail(format!(
                    "{} {what} is {have}, configured {}",
                    link.name,
                    want.unwrap_or(0)
                ));
            }
        }
        if s.allmulti.is_some_and(|a| a != link.allmulti) {
            return fail(format!(
                "{} all-multicast mode is {}",
                link.name, link.allmulti
            ));
        }
        Ok(())
    }

    fn gc(&self, args: &CmdArgs) -> Result<(), Error> {
        let conf: TuningConf = serde_json::from_slice(&args.stdin).map_err(errors::config)?;
        let dir = conf.data_dir.unwrap_or_else(|| DEFAULT_DATA_DIR.into());
        let valid: Vec<String> = args
            .conf
            .valid_attachments
            .iter()
            .flatten()
            .map(|a| format!("{}_{}.json", a.container_id, a.ifname))
            .collect();
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Ok(());
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.ends_with(".json") && !valid.contains(&name) {
                let _ = std::fs::remove_file(e.path());
            }
        }
        Ok(())
    }

    fn status(&self, args: &CmdArgs) -> Result<(), Error> {
        load(args).map(drop)
    }
}

/// Writes the backup whole or not at all.
fn write_backup(file: &Path, backup: &Backup) -> Result<(), Error> {
    let io = |e: std::io::Error| Error::new(ErrorCode::Io, format!("save {}: {e}", file.display()));
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let tmp = file.with_extension("tmp");
    std::fs::write(
        &tmp,
        serde_json::to_vec(backup).expect("plain data serializes"),
    )
    .map_err(io)?;
    std::fs::rename(&tmp, file).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysctl_keys_stay_under_net() {
        assert_eq!(
            sysctl_key("net.core.somaxconn", "eth0").unwrap(),
            "net/core/somaxconn"
        );
        assert_eq!(
            sysctl_key("net.ipv4.conf.IFNAME.arp_filter", "eth1").unwrap(),
            "net/ipv4/conf/eth1/arp_filter"
        );
        for bad in ["kernel.panic", "net/../kernel/panic", "net", "net..core"] {
            assert!(sysctl_key(bad, "eth0").is_err(), "{bad}");
        }
    }

    #[test]
    fn backups_read_what_the_reference_writes() {
        let theirs =
            r#"{"mac": "02:00:00:00:00:01", "promisc": false, "mtu": 1500, "txQLen": 1000}"#;
        let b: Backup = serde_json::from_str(theirs).unwrap();
        assert_eq!(b.mtu, Some(1500));
        assert_eq!(b.tx_qlen, Some(1000));
        assert_eq!(serde_json::to_value(&b).unwrap()["txQLen"], 1000);
    }
}

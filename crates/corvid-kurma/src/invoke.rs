//! The plugin side of Kurma's API, as pure translation: `/opt/network/add <netns> <pod
//! uuid> [<interface>]` (and `del`) with the network's entry on stdin becomes a CNI call
//! of the plugin the entry's `type` names, and the CNI result comes back in the
//! document's `ip4`/`ip6` form.

use std::path::{Path, PathBuf};

use corvid_cni::result::CniResult;
use corvid_cni::version::Version;
use serde_json::Value;

/// Why a call cannot be translated.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum InvokeError {
    /// The command line is not `<netns> <pod uuid> [<interface>]`.
    #[error("usage: {program} <network namespace path> <pod uuid> [<interface>]")]
    Usage {
        /// `add` or `del`.
        program: &'static str,
    },
    /// The entry on stdin names no plugin.
    #[error("the network's configuration names no plugin (type)")]
    NoType,
    /// The plugin answered something that is not a CNI result.
    #[error("the plugin's result: {0}")]
    Result(String),
}

/// `add` or `del`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Set the pod's network up.
    Add,
    /// Take it down.
    Del,
}

impl Action {
    /// The program's name, and the CNI command.
    pub fn names(self) -> (&'static str, &'static str) {
        match self {
            Action::Add => ("add", "ADD"),
            Action::Del => ("del", "DEL"),
        }
    }
}

/// One call of `/opt/network/add` or `del`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// Which.
    pub action: Action,
    /// The pod's network namespace, as the plugin container sees it.
    pub netns: PathBuf,
    /// The pod's UUID: the CNI container ID, and the key of the plugin's state.
    pub pod: String,
    /// The interface to configure, when the network names one.
    pub interface: Option<String>,
}

impl Call {
    /// Reads the arguments after the program's name.
    pub fn parse(action: Action, args: &[String]) -> Result<Call, InvokeError> {
        let usage = InvokeError::Usage {
            program: action.names().0,
        };
        match args {
            [netns, pod] | [netns, pod, _] if !netns.is_empty() && !pod.is_empty() => Ok(Call {
                action,
                netns: netns.into(),
                pod: pod.clone(),
                interface: args.get(2).filter(|i| !i.is_empty()).cloned(),
            }),
            _ => Err(usage),
        }
    }

    /// The CNI environment of the call, plugins found in `plugins`. A network that names
    /// no interface (loopback's) gets `eth0`, which such plugins ignore.
    pub fn environment(&self, plugins: &Path) -> Vec<(&'static str, String)> {
        vec![
            ("CNI_COMMAND", self.action.names().1.to_string()),
            ("CNI_CONTAINERID", self.pod.clone()),
            ("CNI_NETNS", self.netns.display().to_string()),
            (
                "CNI_IFNAME",
                self.interface.clone().unwrap_or_else(|| "eth0".into()),
            ),
            ("CNI_PATH", plugins.display().to_string()),
        ]
    }
}

/// The plugin the network's entry names.
pub fn plugin_type(entry: &Value) -> Result<String, InvokeError> {
    entry["type"]
        .as_str()
        .filter(|t| !t.is_empty() && !t.contains('/'))
        .map(str::to_string)
        .ok_or(InvokeError::NoType)
}

/// A plugin's CNI result (of the entry's `cniVersion`, 0.1.0 when it has none) in the
/// `ip4`/`ip6` form Kurma reads.
pub fn kurma_result(stdout: &[u8], entry: &Value) -> Result<Value, InvokeError> {
    let value: Value = serde_json::from_slice(stdout)
        .map_err(|e| InvokeError::Result(format!("not JSON: {e}")))?;
    let version = entry["cniVersion"]
        .as_str()
        .and_then(|v| Version::parse(v).ok())
        .unwrap_or(Version::V0_1_0);
    CniResult::convert(&value, version, Version::V0_1_0)
        .map_err(|e| InvokeError::Result(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_document_and_kurma_call_forms_become_a_cni_call() {
        let call = Call::parse(
            Action::Add,
            &args(&["/var/lib/kurma/netns/146d", "146d7cef", "eth1"]),
        )
        .unwrap();
        let env = call.environment(Path::new("/opt/cni/bin"));
        assert!(env.contains(&("CNI_COMMAND", "ADD".into())));
        assert!(env.contains(&("CNI_NETNS", "/var/lib/kurma/netns/146d".into())));
        assert!(env.contains(&("CNI_CONTAINERID", "146d7cef".into())));
        assert!(env.contains(&("CNI_IFNAME", "eth1".into())));
        let del = Call::parse(Action::Del, &args(&["/proc/123/ns/net", "u"])).unwrap();
        assert_eq!(del.interface, None);
        assert!(del
            .environment(Path::new("/x"))
            .contains(&("CNI_COMMAND", "DEL".into())));
        for bad in [
            args(&[]),
            args(&["only"]),
            args(&["a", "b", "c", "d"]),
            args(&["", "u"]),
        ] {
            let err = Call::parse(Action::Add, &bad).unwrap_err();
            assert!(err.to_string().starts_with("usage: add"), "{bad:?}");
        }
    }

    #[test]
    fn results_come_back_in_the_ip4_form_and_bad_ones_are_errors() {
        let entry = json!({"cniVersion": "1.0.0", "type": "bridge"});
        assert_eq!(plugin_type(&entry).unwrap(), "bridge");
        assert_eq!(
            plugin_type(&json!({"type": "../x"})),
            Err(InvokeError::NoType)
        );
        let result = json!({"cniVersion": "1.0.0",
            "ips": [{"address": "10.10.0.5/16", "gateway": "10.10.0.1"}],
            "routes": [{"dst": "0.0.0.0/0"}]});
        let kurma = kurma_result(result.to_string().as_bytes(), &entry).unwrap();
        assert_eq!(kurma["ip4"]["ip"], "10.10.0.5/16");
        assert_eq!(kurma["ip4"]["gateway"], "10.10.0.1");
        assert!(kurma.get("ips").is_none());
        let err = kurma_result(b"not json", &entry).unwrap_err();
        assert!(err.to_string().contains("not JSON"), "{err}");
    }
}

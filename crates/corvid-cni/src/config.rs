//! Network configuration: the fields every plugin shares, checked before a plugin runs.

use crate::error::{Error, ErrorCode};
use crate::result::Dns;
use crate::version::Version;
use serde::Deserialize;
use serde_json::{Map, Value};

/// The well-known part of a network configuration; plugins read their own fields from
/// the same JSON.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetConf {
    /// The spec version the configuration conforms to; 0.1.0 when it names none.
    #[serde(default)]
    pub cni_version: String,
    /// Network name.
    pub name: String,
    /// Plugin type: the executable's name.
    #[serde(rename = "type")]
    pub plugin_type: String,
    /// Capabilities the plugin declares (for the runtime side).
    #[serde(default)]
    pub capabilities: Map<String, Value>,
    /// The IPAM section, when the plugin delegates address management.
    #[serde(default)]
    pub ipam: Option<IpamConf>,
    /// DNS settings.
    #[serde(default)]
    pub dns: Option<Dns>,
    /// Free-form arguments from the runtime (`args.cni.ips`, labels...).
    #[serde(default)]
    pub args: Option<Value>,
    /// The previous plugin's result in a list.
    #[serde(default)]
    pub prev_result: Option<Value>,
    /// Values for declared capabilities.
    #[serde(default)]
    pub runtime_config: Option<Map<String, Value>>,
    /// GC: the attachments that are still in use.
    #[serde(default, rename = "cni.dev/valid-attachments")]
    pub valid_attachments: Option<Vec<Attachment>>,
}

/// One container attachment: what GC keeps.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize, serde::Serialize)]
pub struct Attachment {
    /// The container ID.
    #[serde(rename = "containerID")]
    pub container_id: String,
    /// The interface name inside the container.
    pub ifname: String,
}

/// The part of the `ipam` section every IPAM plugin shares.
#[derive(Debug, Clone, Deserialize)]
pub struct IpamConf {
    /// The IPAM plugin's executable name.
    #[serde(rename = "type")]
    pub ipam_type: String,
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorCode::InvalidNetworkConfig, msg)
}

/// Checks a network or plugin name: `[A-Za-z0-9][A-Za-z0-9_.-]*`, as the reference does.
pub fn validate_name(what: &str, name: &str) -> Result<(), Error> {
    let mut chars = name.chars();
    let ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if ok {
        Ok(())
    } else {
        Err(invalid(format!("invalid {what} \"{name}\"")).with_details(
            "must start with a letter or digit and hold only letters, digits, '_', '.' and '-'",
        ))
    }
}

impl NetConf {
    /// Parses and checks a configuration: malformed JSON is code 6, a missing or bad
    /// well-known field code 7, an unsupported version code 1.
    pub fn parse(stdin: &[u8]) -> Result<(NetConf, Version), Error> {
        let value: Value = serde_json::from_slice(stdin).map_err(|e| {
            Error::new(
                ErrorCode::Decoding,
                "failed to decode network configuration",
            )
            .with_details(e.to_string())
        })?;
        let obj = value.as_object().ok_or_else(|| {
            Error::new(
                ErrorCode::Decoding,
                "network configuration must be a JSON object",
            )
        })?;
        for field in ["name", "type"] {
            match obj.get(field) {
                Some(Value::String(s)) if !s.is_empty() => {}
                Some(Value::String(_)) | None => {
                    return Err(invalid(format!("network configuration has no \"{field}\"")))
                }
                Some(_) => return Err(invalid(format!("\"{field}\" must be a string"))),
            }
        }
        if obj.get("cniVersion").is_some_and(|v| !v.is_string()) {
            return Err(invalid("\"cniVersion\" must be a string"));
        }
        let mut conf: NetConf = serde_json::from_value(value.clone())
            .map_err(|e| invalid("invalid network configuration").with_details(e.to_string()))?;
        // Configurations from before 0.2.0 (and Kurma's) name no version: libcni reads
        // them as 0.1.0, and so do the reference plugins.
        if conf.cni_version.is_empty() {
            conf.cni_version = Version::V0_1_0.as_str().into();
        }
        let version = Version::parse(&conf.cni_version)?;
        validate_name("network name", &conf.name)?;
        if conf.plugin_type.contains('/') {
            return Err(invalid(format!(
                "invalid plugin type \"{}\"",
                conf.plugin_type
            )));
        }
        if let Some(ipam) = &conf.ipam {
            if ipam.ipam_type.is_empty() || ipam.ipam_type.contains('/') {
                return Err(invalid(format!("invalid ipam type \"{}\"", ipam.ipam_type)));
            }
        }
        Ok((conf, version))
    }

    /// A `runtimeConfig` value, its key matched without regard to case: CRI-O sends
    /// PascalCase where podman sends the spec's camelCase.
    pub fn runtime_config_value(&self, key: &str) -> Option<&Value> {
        lookup_ignore_case(self.runtime_config.as_ref()?, key)
    }

    /// A value under `args.cni`.
    pub fn args_cni_value(&self, key: &str) -> Option<&Value> {
        self.args.as_ref()?.get("cni")?.get(key)
    }
}

/// A map lookup that ignores ASCII case.
pub fn lookup_ignore_case<'a>(map: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    map.get(key).or_else(|| {
        map.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(input: &str) -> u32 {
        NetConf::parse(input.as_bytes()).unwrap_err().code
    }

    #[test]
    fn parses_a_bridge_config() {
        let (c, v) = NetConf::parse(
            br#"{"cniVersion":"1.0.0","name":"net1","type":"bridge","bridge":"cvt0",
                 "ipam":{"type":"host-local","subnet":"10.1.0.0/24"},
                 "runtimeConfig":{"IPs":["10.1.0.9/24"]}}"#,
        )
        .unwrap();
        assert_eq!(v, Version::V1_0_0);
        assert_eq!(c.ipam.as_ref().unwrap().ipam_type, "host-local");
        assert!(c.runtime_config_value("ips").is_some());
    }

    #[test]
    fn a_config_without_a_version_is_0_1_0() {
        let (c, v) = NetConf::parse(br#"{"name":"n","type":"bridge"}"#).unwrap();
        assert_eq!(v, Version::V0_1_0);
        assert_eq!(c.cni_version, "0.1.0");
        let (_, v) = NetConf::parse(br#"{"cniVersion":"","name":"n","type":"bridge"}"#).unwrap();
        assert_eq!(v, Version::V0_1_0);
    }

    #[test]
    fn bad_configs_have_the_right_codes() {
        assert_eq!(code("{not json"), 6);
        assert_eq!(code("[1,2]"), 6);
        assert_eq!(code(r#"{"cniVersion":1,"name":"n","type":"bridge"}"#), 7);
        assert_eq!(code(r#"{"cniVersion":"1.0.0","type":"bridge"}"#), 7);
        assert_eq!(code(r#"{"cniVersion":"1.0.0","name":"n"}"#), 7);
        assert_eq!(
            code(r#"{"cniVersion":"1.0.0","name":"","type":"bridge"}"#),
            7
        );
        assert_eq!(
            code(r#"{"cniVersion":"7.0.0","name":"n","type":"bridge"}"#),
            1
        );
        assert_eq!(
            code(r#"{"cniVersion":"1.0.0","name":"../etc","type":"bridge"}"#),
            7
        );
        assert_eq!(
            code(r#"{"cniVersion":"1.0.0","name":"n","type":"bridge","ipam":3}"#),
            7
        );
        assert_eq!(
            code(r#"{"cniVersion":"1.0.0","name":"n","type":"b","ipam":{"type":"../x"}}"#),
            7
        );
    }

    #[test]
    fn names_follow_the_reference_rule() {
        assert!(validate_name("n", "net-1_a.b").is_ok());
        for bad in ["", "-x", "a/b", "a b", "ä"] {
            assert!(validate_name("n", bad).is_err(), "{bad}");
        }
    }
}

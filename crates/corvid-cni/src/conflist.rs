//! Network configuration lists: several plugins run in order for one network.

use crate::config::validate_name;
use crate::error::{Error, ErrorCode};
use crate::version::{Version, ALL};
use serde_json::{Map, Value};

/// A checked configuration list.
#[derive(Debug, Clone)]
pub struct NetConfList {
    /// The network name, injected into every plugin's configuration.
    pub name: String,
    /// The version the list runs at: `cniVersion`, or the highest of `cniVersions` this
    /// library speaks (1.1.0).
    pub version: Version,
    /// CHECK is skipped for this network.
    pub disable_check: bool,
    /// GC is skipped for this network.
    pub disable_gc: bool,
    /// The plugins' configurations, in order, as written.
    pub plugins: Vec<Map<String, Value>>,
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorCode::InvalidNetworkConfig, msg)
}

fn flag(obj: &Map<String, Value>, key: &str) -> Result<bool, Error> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        // Older runtimes wrote these as strings.
        Some(Value::String(s)) if s == "true" || s == "false" => Ok(s == "true"),
        Some(other) => Err(invalid(format!("\"{key}\" must be a boolean, not {other}"))),
    }
}

fn pick_version(obj: &Map<String, Value>) -> Result<Version, Error> {
    if let Some(list) = obj.get("cniVersions") {
        let list = list
            .as_array()
            .ok_or_else(|| invalid("\"cniVersions\" must be a list of versions"))?;
        let best = list
            .iter()
            .filter_map(Value::as_str)
            .filter_map(|v| ALL.into_iter().find(|k| k.as_str() == v))
            .max();
        if let Some(v) = best {
            return Ok(v);
        }
        if obj.get("cniVersion").is_none() {
            return Err(Error::new(
                ErrorCode::IncompatibleVersion,
                "none of the list's \"cniVersions\" is supported",
            ));
        }
    }
    match obj.get("cniVersion") {
        // A list without a version runs at 0.1.0, as libcni reads it.
        None => Ok(Version::V0_1_0),
        Some(Value::String(s)) if s.is_empty() => Ok(Version::V0_1_0),
        Some(Value::String(s)) => Version::parse(s),
        Some(_) => Err(invalid("\"cniVersion\" must be a string")),
    }
}

impl NetConfList {
    /// Parses and checks a list: malformed JSON is code 6, a missing name, version or
    /// plugin, or a plugin without a type, code 7; an unsupported version code 1.
    pub fn parse(bytes: &[u8]) -> Result<NetConfList, Error> {
        let value: Value = serde_json::from_slice(bytes).map_err(|e| {
            Error::new(ErrorCode::Decoding, "failed to decode configuration list")
                .with_details(e.to_string())
        })?;
        let obj = value.as_object().ok_or_else(|| {
            Error::new(
                ErrorCode::Decoding,
                "configuration list must be a JSON object",
            )
        })?;
        let name = match obj.get("name") {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            _ => return Err(invalid("configuration list has no \"name\"")),
        };
        validate_name("network name", &name)?;
        let version = pick_version(obj)?;
        let plugins = match obj.get("plugins") {
            Some(Value::Array(list)) if !list.is_empty() => list,
            Some(Value::Array(_)) => return Err(invalid("configuration list has no plugins")),
            _ => return Err(invalid("configuration list has no \"plugins\" list")),
        };
        let mut out = Vec::with_capacity(plugins.len());
        for (i, p) in plugins.iter().enumerate() {
            let p = p
                .as_object()
                .ok_or_else(|| invalid(format!("plugins[{i}] must be an object")))?;
            match p.get("type") {
                Some(Value::String(t)) if !t.is_empty() && !t.contains('/') => {}
                _ => return Err(invalid(format!("plugins[{i}] has no valid \"type\""))),
            }
            out.push(p.clone());
        }
        Ok(NetConfList {
            name,
            version,
            disable_check: flag(obj, "disableCheck")?,
            disable_gc: flag(obj, "disableGC")?,
            plugins: out,
        })
    }

    /// Wraps a single network configuration as a one-plugin list, as runtimes do for
    /// 1.0.0 and later.
    pub fn from_single(bytes: &[u8]) -> Result<NetConfList, Error> {
        let (conf, version) = crate::config::NetConf::parse(bytes)?;
        let plugin: Map<String, Value> = serde_json::from_slice(bytes).map_err(|e| {
            Error::new(
                ErrorCode::Decoding,
                "failed to decode network configuration",
            )
            .with_details(e.to_string())
        })?;
        Ok(NetConfList {
            name: conf.name,
            version,
            disable_check: false,
            disable_gc: false,
            plugins: vec![plugin],
        })
    }

    /// The `type` of plugin `index` (checked non-empty by `parse`).
    pub fn plugin_type(&self, index: usize) -> &str {
        self.plugins[index]["type"].as_str().unwrap_or_default()
    }

    /// The configuration plugin `index` receives: the list's `name` and `cniVersion`
    /// injected, and `prevResult` when given.
    pub fn plugin_config(&self, index: usize, prev_result: Option<&Value>) -> Value {
        let mut conf = self.plugins[index].clone();
        conf.insert("name".into(), self.name.clone().into());
        conf.insert("cniVersion".into(), self.version.as_str().into());
        conf.remove("cniVersions");
        match prev_result {
            Some(prev) => {
                conf.insert("prevResult".into(), prev.clone());
            }
            None => {
                conf.remove("prevResult");
            }
        }
        Value::Object(conf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<NetConfList, Error> {
        NetConfList::parse(v.to_string().as_bytes())
    }

    #[test]
    fn injects_name_version_and_prev_result() {
        let list = parse(json!({"cniVersion": "1.0.0", "name": "net", "disableCheck": true,
            "plugins": [{"type": "bridge", "name": "ignored", "cniVersion": "0.1.0"}, {"type": "tuning"}]}))
        .unwrap();
        assert!(list.disable_check);
        let first = list.plugin_config(0, None);
        assert_eq!(first["name"], "net");
        assert_eq!(first["cniVersion"], "1.0.0");
        assert!(first.get("prevResult").is_none());
        let prev = json!({"cniVersion": "1.0.0", "ips": []});
        assert_eq!(list.plugin_config(1, Some(&prev))["prevResult"], prev);
    }

    #[test]
    fn a_list_without_a_version_runs_at_0_1_0() {
        let list = parse(json!({"name": "n", "plugins": [{"type": "bridge"}]})).unwrap();
        assert_eq!(list.version, Version::V0_1_0);
        assert_eq!(list.plugin_config(0, None)["cniVersion"], "0.1.0");
    }

    #[test]
    fn cni_versions_picks_the_highest_supported() {
        let list = parse(
            json!({"cniVersion": "0.4.0", "cniVersions": ["0.4.0", "1.1.0", "9.0.0"],
            "name": "n", "plugins": [{"type": "bridge"}]}),
        )
        .unwrap();
        assert_eq!(list.version, Version::V1_1_0);
        assert!(list.plugin_config(0, None).get("cniVersions").is_none());
        let none =
            parse(json!({"cniVersions": ["9.0.0"], "name": "n", "plugins": [{"type": "b"}]}));
        assert_eq!(none.unwrap_err().code, 1);
    }

    #[test]
    fn bad_lists_have_the_right_codes() {
        let code = |v: Value| parse(v).unwrap_err().code;
        assert_eq!(NetConfList::parse(b"{").unwrap_err().code, 6);
        assert_eq!(
            code(json!({"cniVersion": "1.0.0", "plugins": [{"type": "b"}]})),
            7
        );
        assert_eq!(
            code(json!({"cniVersion": 1, "name": "n", "plugins": [{"type": "b"}]})),
            7
        );
        assert_eq!(
            code(json!({"cniVersion": "1.0.0", "name": "n", "plugins": []})),
            7
        );
        assert_eq!(
            code(json!({"cniVersion": "1.0.0", "name": "n", "plugins": [{"x": 1}]})),
            7
        );
        assert_eq!(
            code(json!({"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "../b"}]})),
            7
        );
        assert_eq!(
            code(json!({"cniVersion": "3.0.0", "name": "n", "plugins": [{"type": "b"}]})),
            1
        );
        assert_eq!(
            code(
                json!({"cniVersion": "1.0.0", "name": "n", "disableGC": 3, "plugins": [{"type": "b"}]})
            ),
            7
        );
    }

    #[test]
    fn a_single_config_becomes_a_list_of_one() {
        let list =
            NetConfList::from_single(br#"{"cniVersion":"0.4.0","name":"n","type":"bridge"}"#)
                .unwrap();
        assert_eq!(list.plugins.len(), 1);
        assert_eq!(list.version, Version::V0_4_0);
    }
}

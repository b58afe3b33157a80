//! A Kurma configuration's networks (`pod_networks`, or `podNetworks` as later Kurma
//! wrote it) and the interface names their `containerInterface` templates render to.

use std::time::Duration;

use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    /// Not JSON, or not an object.
    #[error("the configuration is not a JSON object: {0}")]
    NotJson(String),
    /// A network entry lacks what it needs or repeats a name.
    #[error("pod network {index}: {message}")]
    Network {
        /// Its place in the list.
        index: usize,
        /// What is wrong.
        message: String,
    },
    /// A runtime setting has a wrong value.
    #[error("{0}")]
    Setting(String),
    /// A template cannot give a name.
    #[error("containerInterface {template:?}: {message}")]
    Template {
        /// The template.
        template: String,
        /// What is wrong.
        message: String,
    },
}

/// One network a pod may join, with the plugin image that serves it.
#[derive(Debug, Clone, PartialEq)]
pub struct PodNetwork {
    /// Its unique name.
    pub name: String,
    /// Where its plugin image comes from (`file://`, `http(s)://`, `docker://`, or an
    /// image name found by discovery).
    pub aci: String,
    /// Joined by pods that name no network.
    pub default: bool,
    /// The interface name or template inside the pod, if the plugin configures one.
    pub container_interface: Option<String>,
    /// The entry, parsed.
    pub entry: Map<String, Value>,
    /// The whole entry as written, which the plugin reads on stdin (as Kurma passed it).
    pub text: String,
}

/// What a pod's setup does when one of its networks fails to add.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailurePolicy {
    /// Log it and run the pod without that network, as Kurma did (the default).
    #[default]
    Continue,
    /// Take the pod's other networks down again and fail the pod.
    Fail,
}

/// The runtime's settings around its networks, from the configuration's top level.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// `failurePolicy` (or `failure_policy`): `continue` or `fail`.
    pub failure: FailurePolicy,
    /// `restartPlugins` (or `restart_plugins`): start a plugin again when its main exits.
    pub restart: bool,
    /// `pluginTimeout` (or `plugin_timeout`), seconds: how long add or del may take.
    pub timeout: Duration,
    /// How images are fetched.
    pub fetch: FetchSettings,
}

/// How plugin images are fetched.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FetchSettings {
    /// `insecureRegistries`: registries (`host:port`) spoken to over plain HTTP.
    pub insecure_registries: Vec<String>,
    /// `discoveryBaseUrl`: replaces `https://<host>` of an image name in discovery (tests
    /// and mirrors).
    pub discovery_base_url: Option<String>,
    /// `insecureDiscovery`: discovery, and the images it finds, may use plain HTTP.
    pub insecure_discovery: bool,
    /// `keyring`: armored OpenPGP public keys; when set, every image fetched must carry a
    /// detached signature (`.asc`) one of them made.
    pub keyring: Option<std::path::PathBuf>,
}

/// How long an add or del may run, as Kurma allowed.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// A Kurma configuration: its networks and the runtime's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The networks, in order.
    pub networks: Vec<PodNetwork>,
    /// The settings.
    pub settings: Settings,
}

impl Config {
    /// Reads a whole configuration.
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let networks = pod_networks(text)?;
        let v: Map<String, Value> =
            serde_json::from_str(text).map_err(|e| ConfigError::NotJson(e.to_string()))?;
        let get = |camel: &str, snake: &str| v.get(camel).or_else(|| v.get(snake)).cloned();
        let bad = |message: String| ConfigError::Setting(message);
        let failure = match get("failurePolicy", "failure_policy") {
            None | Some(Value::Null) => FailurePolicy::default(),
            Some(p) => serde_json::from_value(p.clone())
                .map_err(|_| bad(format!("failurePolicy is continue or fail, not {p}")))?,
        };
        let flag = |camel: &str, snake: &str| -> Result<bool, ConfigError> {
            match get(camel, snake) {
                None | Some(Value::Null) => Ok(false),
                Some(Value::Bool(b)) => Ok(b),
                Some(v) => Err(bad(format!("{camel} is true or false, not {v}"))),
            }
        };
        let restart = flag("restartPlugins", "restart_plugins")?;
        let timeout = match get("pluginTimeout", "plugin_timeout") {
            None | Some(Value::Null) => DEFAULT_TIMEOUT,
            Some(t) => t
                .as_f64()
                .filter(|s| *s > 0.0 && *s <= 86_400.0)
                .map(Duration::from_secs_f64)
                .ok_or_else(|| bad(format!("pluginTimeout is seconds above 0, not {t}")))?,
        };
        let text_list = |camel: &str, snake: &str| -> Result<Vec<String>, ConfigError> {
            match get(camel, snake) {
                None | Some(Value::Null) => Ok(Vec::new()),
                Some(v) => serde_json::from_value(v.clone())
                    .map_err(|_| bad(format!("{camel} is a list of strings, not {v}"))),
            }
        };
        let text = |camel: &str, snake: &str| -> Result<Option<String>, ConfigError> {
            match get(camel, snake) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) if !s.is_empty() => Ok(Some(s)),
                Some(v) => Err(bad(format!("{camel} is a string, not {v}"))),
            }
        };
        let fetch = FetchSettings {
            insecure_registries: text_list("insecureRegistries", "insecure_registries")?,
            discovery_base_url: text("discoveryBaseUrl", "discovery_base_url")?,
            insecure_discovery: flag("insecureDiscovery", "insecure_discovery")?,
            keyring: text("keyring", "keyring")?.map(Into::into),
        };
        Ok(Config {
            networks,
            settings: Settings {
                failure,
                restart,
                timeout,
                fetch,
            },
        })
    }
}

/// The networks of a Kurma configuration, in order.
pub fn pod_networks(text: &str) -> Result<Vec<PodNetwork>, ConfigError> {
    let top: Value = serde_json::from_str(text).map_err(|e| ConfigError::NotJson(e.to_string()))?;
    if !top.is_object() {
        return Err(ConfigError::NotJson(
            "a JSON value that is not an object".into(),
        ));
    }
    // Read again with the entries as written, so each plugin gets its entry's own text.
    let obj: std::collections::HashMap<String, &RawValue> =
        serde_json::from_str(text).map_err(|e| ConfigError::NotJson(e.to_string()))?;
    let list: Vec<&RawValue> = match obj.get("pod_networks").or_else(|| obj.get("podNetworks")) {
        None => return Ok(Vec::new()),
        Some(raw) if raw.get() == "null" => return Ok(Vec::new()),
        Some(raw) => serde_json::from_str(raw.get())
            .map_err(|_| ConfigError::NotJson("pod_networks must be a list of networks".into()))?,
    };
    let mut out: Vec<PodNetwork> = Vec::new();
    for (index, item) in list.iter().enumerate() {
        let bad = |message: String| ConfigError::Network { index, message };
        let entry: Map<String, Value> =
            serde_json::from_str(item.get()).map_err(|_| bad("not an object".into()))?;
        let text = |key: &str| -> Result<Option<String>, ConfigError> {
            match entry.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(other) => Err(bad(format!("{key} must be a string, not {other}"))),
            }
        };
        let name = text("name")?
            .filter(|n| !n.is_empty())
            .ok_or_else(|| bad("no name".into()))?;
        if out.iter().any(|n| n.name == name) {
            return Err(bad(format!("the name {name:?} is used twice")));
        }
        let aci = text("aci")?
            .filter(|a| !a.is_empty())
            .ok_or_else(|| bad(format!("{name} names no plugin image (aci)")))?;
        let default = match entry.get("default") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(other) => return Err(bad(format!("default must be true or false, not {other}"))),
        };
        let container_interface = text("containerInterface")?;
        if let Some(t) = &container_interface {
            parse(t)?;
        }
        out.push(PodNetwork {
            name,
            aci,
            default,
            container_interface,
            entry,
            text: item.get().to_string(),
        });
    }
    Ok(out)
}

/// The networks a pod joins: those it names (each must exist), else the defaults.
pub fn networks_for<'a>(
    named: &[String],
    all: &'a [PodNetwork],
) -> Result<Vec<&'a PodNetwork>, ConfigError> {
    if named.is_empty() {
        return Ok(all.iter().filter(|n| n.default).collect());
    }
    named
        .iter()
        .map(|name| {
            all.iter()
                .find(|n| &n.name == name)
                .ok_or_else(|| ConfigError::Network {
                    index: all.len(),
                    message: format!(
                        "the pod asks for {name:?}, which is not among {:?}",
                        all.iter().map(|n| n.name.as_str()).collect::<Vec<_>>()
                    ),
                })
        })
        .collect()
}

/// One piece of a `containerInterface` template.
#[derive(Debug, Clone, PartialEq)]
enum Piece {
    Text(String),
    /// The pod's UUID as given, as Kurma rendered it.
    Uuid,
    /// Its first 8 characters.
    ShortUuid,
    /// The lowest number that makes the name new.
    Num,
    /// N random hex digits.
    Random(usize),
}

fn parse(template: &str) -> Result<Vec<Piece>, ConfigError> {
    let bad = |message: &str| ConfigError::Template {
        template: template.to_string(),
        message: message.to_string(),
    };
    let mut pieces = Vec::new();
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        if start > 0 {
            pieces.push(Piece::Text(rest[..start].to_string()));
        }
        let end = rest[start..]
            .find("}}")
            .ok_or_else(|| bad("an unclosed {{"))?;
        let inner = rest[start + 2..start + end].trim();
        let mut words = inner.split_whitespace();
        pieces.push(match (words.next(), words.next(), words.next()) {
            (Some("uuid"), None, _) => Piece::Uuid,
            (Some("shortuuid"), None, _) => Piece::ShortUuid,
            (Some("num"), None, _) => Piece::Num,
            (Some("random"), Some(n), None) => match n.parse::<usize>() {
                Ok(n) if (1..=15).contains(&n) => Piece::Random(n),
                _ => return Err(bad("random takes a length from 1 to 15")),
            },
            _ => return Err(bad(&format!("unknown {{{{{inner}}}}}"))),
        });
        rest = &rest[start + end + 2..];
    }
    if !rest.is_empty() {
        pieces.push(Piece::Text(rest.to_string()));
    }
    let fixed: usize = pieces
        .iter()
        .map(|p| match p {
            Piece::Text(t) => t.len(),
            Piece::Random(n) => *n,
            _ => 0,
        })
        .sum();
    if fixed > MAX_IFNAME || (fixed == 0 && pieces.iter().all(|p| matches!(p, Piece::Text(_)))) {
        return Err(bad("gives no interface name of 1 to 15 bytes"));
    }
    Ok(pieces)
}

/// The longest interface name Linux takes.
pub const MAX_IFNAME: usize = 15;

/// Renders `template` for the pod `uuid` into a name none of `taken` has; `random` gives
/// hex digits for `{{random N}}`. A name over 15 bytes is an error naming the template,
/// never cut: Linux would refuse it, and a cut one could collide.
pub fn interface_name(
    template: &str,
    uuid: &str,
    taken: &[String],
    mut random: impl FnMut(usize) -> String,
) -> Result<String, ConfigError> {
    let pieces = parse(template)?;
    let bad = |message: String| ConfigError::Template {
        template: template.to_string(),
        message,
    };
    let short: String = uuid.chars().take(8).collect();
    let render = |num: usize, random: &mut dyn FnMut(usize) -> String| -> String {
        let mut out = String::new();
        for p in &pieces {
            match p {
                Piece::Text(t) => out.push_str(t),
                Piece::Uuid => out.push_str(uuid),
                Piece::ShortUuid => out.push_str(&short),
                Piece::Num => out.push_str(&num.to_string()),
                Piece::Random(n) => out.push_str(&random(*n)),
            }
        }
        out
    };
    let varies = pieces
        .iter()
        .any(|p| matches!(p, Piece::Num | Piece::Random(_)));
    for attempt in 0..100 {
        let name = render(attempt, &mut random);
        if name.len() > MAX_IFNAME {
            return Err(bad(format!(
                "renders to {name:?} for pod {uuid}, {} bytes; an interface name has at most {MAX_IFNAME}",
                name.len()
            )));
        }
        if name.is_empty() {
            return Err(bad(format!("renders to an empty name for pod {uuid:?}")));
        }
        if !taken.contains(&name) {
            return Ok(name);
        }
        if !varies {
            break;
        }
    }
    Err(bad(format!("no name that the pod's {taken:?} do not have")))
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: &str = "146d7cef-fbf6-41da-a2f8-eba218597f9c";

    fn counter() -> impl FnMut(usize) -> String {
        let mut n = 0u64;
        move |len| {
            n += 1;
            format!("{n:0len$x}")
        }
    }

    #[test]
    fn both_spellings_and_every_field_are_read_and_the_entry_kept_whole() {
        let text = r#"{"podNetworks": [{"name": "mynet", "aci": "file:///x.aci", "default": true,
            "containerInterface": "eth{{num}}", "type": "bridge", "ipam": {"type": "host-local"}}]}"#;
        let nets = pod_networks(text).unwrap();
        assert_eq!(nets[0].name, "mynet");
        assert!(nets[0].default);
        assert_eq!(nets[0].entry["type"], "bridge");
        assert_eq!(nets[0].entry["ipam"]["type"], "host-local");
        let snake = text.replace("podNetworks", "pod_networks");
        assert_eq!(pod_networks(&snake).unwrap(), nets);
        assert_eq!(pod_networks("{}").unwrap(), []);
    }

    #[test]
    fn settings_have_kurmas_defaults_and_both_spellings() {
        let plain = Config::parse(r#"{"pod_networks": []}"#).unwrap().settings;
        assert_eq!(plain.failure, FailurePolicy::Continue);
        assert!(!plain.restart);
        assert_eq!(plain.timeout, DEFAULT_TIMEOUT);
        assert_eq!(plain.fetch, FetchSettings::default());
        let camel = Config::parse(
            r#"{"failurePolicy": "fail", "restartPlugins": true, "pluginTimeout": 2.5,
                "insecureRegistries": ["127.0.0.1:5000"], "discoveryBaseUrl": "http://127.0.0.1:8",
                "insecureDiscovery": true, "keyring": "/k.asc"}"#,
        )
        .unwrap()
        .settings;
        assert_eq!(camel.failure, FailurePolicy::Fail);
        assert!(camel.restart);
        assert_eq!(camel.timeout, Duration::from_millis(2500));
        assert_eq!(camel.fetch.insecure_registries, ["127.0.0.1:5000"]);
        assert_eq!(
            camel.fetch.discovery_base_url.as_deref(),
            Some("http://127.0.0.1:8")
        );
        assert!(camel.fetch.insecure_discovery);
        assert_eq!(camel.fetch.keyring, Some("/k.asc".into()));
        let snake = Config::parse(
            r#"{"failure_policy": "fail", "restart_plugins": true, "plugin_timeout": 2.5,
                "insecure_registries": ["127.0.0.1:5000"], "discovery_base_url": "http://127.0.0.1:8",
                "insecure_discovery": true, "keyring": "/k.asc"}"#,
        )
        .unwrap()
        .settings;
        assert_eq!(snake, camel);
        for (text, says) in [
            (r#"{"failurePolicy": "maybe"}"#, "continue or fail"),
            (r#"{"restartPlugins": "yes"}"#, "true or false"),
            (r#"{"pluginTimeout": 0}"#, "seconds above 0"),
            (r#"{"insecureRegistries": "x"}"#, "list of strings"),
            (r#"{"keyring": 3}"#, "is a string"),
        ] {
            let err = Config::parse(text).unwrap_err().to_string();
            assert!(err.contains(says), "{text}: {err}");
        }
    }

    #[test]
    fn the_entry_goes_to_the_plugin_as_written() {
        let text = r#"{"pod_networks": [{"type": "bridge", "name": "a", "aci": "x",
            "ipam": {"type": "host-local"}}]}"#;
        let net = &pod_networks(text).unwrap()[0];
        assert!(
            net.text.starts_with(r#"{"type": "bridge", "name": "a""#),
            "{}",
            net.text
        );
    }

    #[test]
    fn malformed_configurations_say_what_is_wrong() {
        for (text, says) in [
            ("[", "not a JSON object"),
            ("[]", "not an object"),
            (r#"{"pod_networks": {}}"#, "must be a list"),
            (r#"{"pod_networks": [{"aci": "file:///x"}]}"#, "no name"),
            (
                r#"{"pod_networks": [{"name": "a"}]}"#,
                "names no plugin image",
            ),
            (
                r#"{"pod_networks": [{"name": "a", "aci": "x"}, {"name": "a", "aci": "y"}]}"#,
                "used twice",
            ),
            (
                r#"{"pod_networks": [{"name": "a", "aci": "x", "default": "yes"}]}"#,
                "true or false",
            ),
            (
                r#"{"pod_networks": [{"name": "a", "aci": "x", "containerInterface": "eth{{nope}}"}]}"#,
                "unknown",
            ),
            (
                r#"{"pod_networks": [{"name": "a", "aci": "x", "containerInterface": "a-very-long-interface"}]}"#,
                "1 to 15 bytes",
            ),
        ] {
            let err = pod_networks(text).unwrap_err().to_string();
            assert!(err.contains(says), "{text}: {err}");
        }
    }

    #[test]
    fn a_pod_joins_what_it_names_or_else_the_defaults() {
        let nets = pod_networks(
            r#"{"pod_networks": [{"name": "a", "aci": "x", "default": true},
                {"name": "b", "aci": "y"}, {"name": "c", "aci": "z", "default": true}]}"#,
        )
        .unwrap();
        let names = |v: Vec<&PodNetwork>| v.iter().map(|n| n.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(networks_for(&[], &nets).unwrap()), ["a", "c"]);
        assert_eq!(names(networks_for(&["b".into()], &nets).unwrap()), ["b"]);
        let err = networks_for(&["nope".into()], &nets)
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"nope\", which is not among"), "{err}");
    }

    #[test]
    fn templates_render_new_names_of_at_most_15_bytes() {
        let taken = vec!["eth0".to_string(), "eth1".to_string()];
        assert_eq!(
            interface_name("eth{{num}}", UUID, &taken, counter()).unwrap(),
            "eth2"
        );
        assert_eq!(
            interface_name("eth0", UUID, &[], counter()).unwrap(),
            "eth0"
        );
        assert!(interface_name("eth0", UUID, &taken, counter()).is_err());
        assert_eq!(
            interface_name("veth{{shortuuid}}", UUID, &[], counter()).unwrap(),
            "veth146d7cef"
        );
        // Kurma's whole UUID does not fit: an error naming the template, not a cut name.
        let err = interface_name("k{{uuid}}", UUID, &[], counter())
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("containerInterface \"k{{uuid}}\": renders to \"k146d7cef-fbf6")
                && err.contains("37 bytes; an interface name has at most 15"),
            "{err}"
        );
        assert_eq!(
            interface_name("k{{uuid}}", "146d7cef", &[], counter()).unwrap(),
            "k146d7cef"
        );
        let err = interface_name("abcdef{{shortuuid}}xy", UUID, &[], counter())
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"abcdef146d7cefxy\" for pod"), "{err}");
        // A random name that collides is drawn again.
        let first = interface_name("r{{random 4}}", UUID, &[], counter()).unwrap();
        let again = interface_name(
            "r{{random 4}}",
            UUID,
            std::slice::from_ref(&first),
            counter(),
        )
        .unwrap();
        assert_eq!((first.as_str(), again.as_str()), ("r0001", "r0002"));
    }
}

//! The plugin entry: environment and stdin in, one command dispatched, the result or the
//! spec's error JSON out.

use crate::args::CniArgs;
use crate::command::Command;
use crate::config::NetConf;
use crate::error::{Error, ErrorCode};
use crate::result::CniResult;
use crate::version::{version_info, Version};
use std::io::{Read, Write};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

/// Everything a plugin gets for one invocation, checked.
#[derive(Debug, Clone)]
pub struct CmdArgs {
    /// The command.
    pub command: Command,
    /// CNI_CONTAINERID (empty for GC and STATUS).
    pub container_id: String,
    /// CNI_NETNS; `None` when unset or empty (DEL after the container is gone).
    pub netns: Option<PathBuf>,
    /// CNI_IFNAME (empty for GC and STATUS).
    pub ifname: String,
    /// CNI_ARGS.
    pub args: CniArgs,
    /// CNI_PATH, split.
    pub path: Vec<PathBuf>,
    /// The raw configuration, for plugin-specific fields and for delegation.
    pub stdin: Vec<u8>,
    /// The well-known configuration fields.
    pub conf: NetConf,
    /// The configuration's version: results are printed in it.
    pub version: Version,
    /// `prevResult`, decoded.
    pub prev_result: Option<CniResult>,
}

/// A CNI plugin: one method per command.
pub trait Plugin {
    /// ADD: attach and return the result.
    fn add(&self, args: &CmdArgs) -> Result<CniResult, Error>;
    /// DEL: detach; must succeed when the resources are already gone.
    fn del(&self, args: &CmdArgs) -> Result<(), Error>;
    /// CHECK: fail when the container's network differs from `args.prev_result`.
    fn check(&self, args: &CmdArgs) -> Result<(), Error>;
    /// GC: release what `conf.valid_attachments` does not name.
    fn gc(&self, args: &CmdArgs) -> Result<(), Error>;
    /// STATUS: fail with 50 or 51 when ADD cannot be served now.
    fn status(&self, args: &CmdArgs) -> Result<(), Error>;
}

/// Checks an interface name against the kernel's rules.
pub fn validate_ifname(name: &str) -> Result<(), Error> {
    let problem = if name.is_empty() {
        Some("is empty")
    } else if name.len() > 15 {
        Some("is longer than 15 bytes")
    } else if name == "." || name == ".." {
        Some("is . or ..")
    } else if name
        .chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        Some("contains '/', ':' or whitespace")
    } else {
        None
    };
    match problem {
        Some(p) => Err(Error::new(
            ErrorCode::InvalidEnvironment,
            format!("invalid interface name \"{name}\": it {p}"),
        )),
        None => Ok(()),
    }
}

/// Checks a container ID: `[A-Za-z0-9][A-Za-z0-9_.-]*`.
pub fn validate_container_id(id: &str) -> Result<(), Error> {
    crate::config::validate_name("container ID", id).map_err(|e| Error {
        code: ErrorCode::InvalidEnvironment as u32,
        ..e
    })
}

fn build_args(
    env: &dyn Fn(&str) -> Option<String>,
    stdin: &[u8],
) -> Result<Option<CmdArgs>, Error> {
    let command = Command::parse(&env("CNI_COMMAND").unwrap_or_default())?;
    let missing: Vec<&str> = command
        .required_env()
        .iter()
        .copied()
        .filter(|k| env(k).is_none_or(|v| v.is_empty()))
        .collect();
    if !missing.is_empty() {
        return Err(Error::new(
            ErrorCode::InvalidEnvironment,
            format!(
                "required environment variables missing: {}",
                missing.join(", ")
            ),
        ));
    }
    if command == Command::Version {
        return Ok(None);
    }
    let container_id = env("CNI_CONTAINERID").unwrap_or_default();
    let ifname = env("CNI_IFNAME").unwrap_or_default();
    if matches!(command, Command::Add | Command::Del | Command::Check) {
        validate_container_id(&container_id)?;
        validate_ifname(&ifname)?;
    }
    let args = CniArgs::parse(&env("CNI_ARGS").unwrap_or_default())?;
    let (conf, version) = NetConf::parse(stdin)?;
    match command {
        Command::Check if !version.allows_check() => {
            return Err(Error::new(
                ErrorCode::IncompatibleVersion,
                format!("CNI version {version} does not allow CHECK"),
            ))
        }
        Command::Gc | Command::Status if !version.allows_gc_and_status() => {
            return Err(Error::new(
                ErrorCode::IncompatibleVersion,
                format!("CNI version {version} does not allow {command}"),
            ))
        }
        _ => {}
    }
    let prev_result = match &conf.prev_result {
        Some(v) if !v.is_null() => Some(
            CniResult::parse(v, version)
                .map_err(|e| {
                    Error::new(ErrorCode::Decoding, "failed to decode prevResult")
                        .with_details(e.to_string())
                })?
                .0,
        ),
        _ => None,
    };
    if command == Command::Check && prev_result.is_none() {
        return Err(Error::new(
            ErrorCode::InvalidNetworkConfig,
            "CHECK requires prevResult",
        ));
    }
    Ok(Some(CmdArgs {
        command,
        container_id,
        netns: env("CNI_NETNS")
            .filter(|s| !s.is_empty())
            .map(PathBuf::from),
        ifname,
        args,
        path: env("CNI_PATH")
            .unwrap_or_default()
            .split(':')
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .collect(),
        stdin: stdin.to_vec(),
        conf,
        version,
        prev_result,
    }))
}

/// One line per invocation that changed or checked something: info when it worked, warn
/// with the error when not. The configuration is not logged (it may hold a token).
fn log_outcome(args: &CmdArgs, outcome: &Result<Option<serde_json::Value>, Error>) {
    if args.command == Command::Version {
        return;
    }
    let (command, network) = (args.command.as_str(), &args.conf.name);
    let (container, ifname) = (&args.container_id, &args.ifname);
    match outcome {
        Ok(_) => tracing::info!(command, network, container, ifname, "done"),
        Err(e) => tracing::warn!(
            command,
            network,
            container,
            ifname,
            code = e.code,
            "{}",
            e.msg
        ),
    }
}

fn dispatch(plugin: &dyn Plugin, args: &CmdArgs) -> Result<Option<serde_json::Value>, Error> {
    match args.command {
        Command::Add => plugin.add(args)?.to_value(args.version).map(Some),
        Command::Del => plugin.del(args).map(|_| None),
        Command::Check => plugin.check(args).map(|_| None),
        Command::Gc => plugin.gc(args).map(|_| None),
        Command::Status => plugin.status(args).map(|_| None),
        Command::Version => Ok(Some(version_info())),
    }
}

/// Runs one invocation with the given environment and stdin; returns the exit code.
pub fn run_with(
    plugin: &dyn Plugin,
    env: &dyn Fn(&str) -> Option<String>,
    stdin: &[u8],
    stdout: &mut dyn Write,
) -> i32 {
    let mut version = Version::CURRENT.as_str().to_string();
    let outcome = catch_unwind(AssertUnwindSafe(|| match build_args(env, stdin)? {
        None => Ok(Some(version_info())),
        Some(args) => {
            version = args.version.as_str().to_string();
            let outcome = dispatch(plugin, &args);
            log_outcome(&args, &outcome);
            outcome
        }
    }))
    .unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Err(Error::new(ErrorCode::Internal, "internal error in plugin").with_details(what))
    });
    match outcome {
        Ok(out) => {
            if let Some(v) = out {
                let _ = writeln!(stdout, "{v}");
            }
            0
        }
        Err(e) => {
            tracing::warn!(code = e.code, "{}", e.msg);
            let _ = writeln!(stdout, "{}", e.to_json(&version));
            1
        }
    }
}

/// Runs one invocation from the process's environment and stdin; returns the exit code.
pub fn run(plugin: &dyn Plugin) -> i32 {
    run_after(plugin, |_| {})
}

/// As [`run`], calling `setup` with the configuration read from stdin first (the plugin
/// binary opens the log file the configuration names there).
pub fn run_after(plugin: &dyn Plugin, setup: impl FnOnce(&[u8])) -> i32 {
    // A panic becomes error JSON in run_with; the default hook would add a backtrace.
    std::panic::set_hook(Box::new(|_| {}));
    let mut stdin = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut stdin) {
        let e = Error::new(ErrorCode::Io, "failed to read stdin").with_details(e.to_string());
        println!("{}", e.to_json(Version::CURRENT.as_str()));
        return 1;
    }
    setup(&stdin);
    let env = |k: &str| std::env::var(k).ok();
    run_with(plugin, &env, &stdin, &mut std::io::stdout().lock())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::result::IpConfig;
    use crate::version::ALL;
    use std::collections::HashMap;

    struct Fake;
    impl Plugin for Fake {
        fn add(&self, a: &CmdArgs) -> Result<CniResult, Error> {
            if a.conf.name == "boom" {
                panic!("kaboom");
            }
            let mut r = a.prev_result.clone().unwrap_or_default();
            r.ips.push(IpConfig {
                address: "10.9.0.2/24".parse().unwrap(),
                gateway: None,
                interface: None,
            });
            Ok(r)
        }
        fn del(&self, _: &CmdArgs) -> Result<(), Error> {
            Ok(())
        }
        fn check(&self, _: &CmdArgs) -> Result<(), Error> {
            Ok(())
        }
        fn gc(&self, _: &CmdArgs) -> Result<(), Error> {
            Ok(())
        }
        fn status(&self, _: &CmdArgs) -> Result<(), Error> {
            Ok(())
        }
    }

    fn invoke(env: &[(&str, &str)], stdin: &str) -> (i32, serde_json::Value) {
        let map: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut out = Vec::new();
        let code = run_with(&Fake, &|k| map.get(k).cloned(), stdin.as_bytes(), &mut out);
        let v = if out.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_slice(&out).unwrap()
        };
        (code, v)
    }

    const ADD: [(&str, &str); 5] = [
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "c1"),
        ("CNI_NETNS", "/run/netns/x"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin"),
    ];

    fn conf(version: &str) -> String {
        format!(r#"{{"cniVersion":"{version}","name":"n","type":"fake"}}"#)
    }

    fn with(over: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
        let mut env: Vec<_> = ADD
            .iter()
            .copied()
            .filter(|(k, _)| !over.iter().any(|(o, _)| o == k))
            .collect();
        env.extend(over.iter().copied().filter(|(_, v)| !v.is_empty()));
        env
    }

    #[test]
    fn add_prints_in_the_config_version_for_every_version() {
        for v in ALL {
            let (code, out) = invoke(&ADD, &conf(v.as_str()));
            assert_eq!(code, 0, "{v}: {out}");
            assert_eq!(out["cniVersion"], v.as_str());
        }
    }

    #[test]
    fn version_answers_without_a_config() {
        let (code, out) = invoke(&[("CNI_COMMAND", "VERSION")], "");
        assert_eq!(code, 0);
        assert_eq!(
            out["supportedVersions"].as_array().unwrap().len(),
            ALL.len()
        );
    }

    #[test]
    fn environment_errors_are_code_4() {
        for env in [
            with(&[("CNI_COMMAND", "FROB")]),
            with(&[("CNI_COMMAND", "")]),
            with(&[("CNI_NETNS", "")]),
            with(&[("CNI_IFNAME", "a/b")]),
            with(&[("CNI_IFNAME", "this-is-too-long-x")]),
            with(&[("CNI_IFNAME", "..")]),
            with(&[("CNI_IFNAME", "a b")]),
            with(&[("CNI_IFNAME", "a:b")]),
            with(&[("CNI_CONTAINERID", "-bad")]),
            with(&[("CNI_ARGS", "nokey")]),
        ] {
            let (code, out) = invoke(&env, &conf("1.0.0"));
            assert_eq!(code, 1);
            assert_eq!(out["code"], 4, "{env:?}: {out}");
            assert_eq!(out["cniVersion"], "1.1.0");
        }
    }

    #[test]
    fn del_does_not_need_a_netns() {
        let env = with(&[("CNI_COMMAND", "DEL"), ("CNI_NETNS", "")]);
        assert_eq!(invoke(&env, &conf("1.0.0")).0, 0);
    }

    #[test]
    fn version_gates() {
        let prev = r#","prevResult":{"cniVersion":"0.3.1","ips":[]}"#;
        let check = with(&[("CNI_COMMAND", "CHECK")]);
        let c031 = format!(r#"{{"cniVersion":"0.3.1","name":"n","type":"f"{prev}}}"#);
        let (_, out) = invoke(&check, &c031);
        assert_eq!(out["code"], 1);
        assert_eq!(out["cniVersion"], "1.1.0");
        let (_, out) = invoke(&check, &conf("0.4.0"));
        assert_eq!(out["code"], 7, "CHECK without prevResult");
        let (_, out) = invoke(&[("CNI_COMMAND", "GC"), ("CNI_PATH", "/x")], &conf("1.0.0"));
        assert_eq!(out["code"], 1);
        assert_eq!(out["msg"], "CNI version 1.0.0 does not allow GC");
        let (code, _) = invoke(
            &[("CNI_COMMAND", "STATUS"), ("CNI_PATH", "/x")],
            &conf("1.1.0"),
        );
        assert_eq!(code, 0);
    }

    #[test]
    fn prev_result_is_passed_through_or_rejected() {
        let good = r#"{"cniVersion":"1.0.0","name":"n","type":"f","prevResult":
            {"cniVersion":"1.0.0","ips":[{"address":"10.0.0.2/24"}]}}"#;
        let (code, out) = invoke(&ADD, good);
        assert_eq!(code, 0);
        assert_eq!(out["ips"].as_array().unwrap().len(), 2);
        let bad = r#"{"cniVersion":"1.0.0","name":"n","type":"f","prevResult":{"ips":7}}"#;
        let (code, out) = invoke(&ADD, bad);
        assert_eq!((code, out["code"].as_u64()), (1, Some(6)));
    }

    #[test]
    fn a_panic_becomes_error_json() {
        std::panic::set_hook(Box::new(|_| {}));
        let (code, out) = invoke(&ADD, r#"{"cniVersion":"0.4.0","name":"boom","type":"f"}"#);
        assert_eq!(code, 1);
        assert_eq!(out["code"], 999);
        assert_eq!(out["cniVersion"], "0.4.0");
        assert_eq!(out["details"], "kaboom");
    }
}

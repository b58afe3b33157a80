//! Running a delegated plugin (the IPAM plugin of `ipam.type`) exactly as the spec says:
//! found on CNI_PATH, same environment and stdin, CNI_COMMAND set for the call; in-process
//! when the delegate is this very binary.

use corvid_cni::exec::{Failure, Runtime, RuntimeConf};
use corvid_cni::skel::{CmdArgs, Plugin};
use corvid_cni::{CniResult, Command, Error, ErrorCode};
use std::path::PathBuf;
use std::time::Duration;

/// Finds a plugin on CNI_PATH; not finding it is a delegation failure (105).
pub fn find(plugin: &str, path: &[PathBuf]) -> Result<PathBuf, Error> {
    corvid_cni::exec::find_plugin(plugin, path).map_err(|e| Error {
        code: ErrorCode::Delegate as u32,
        ..e
    })
}

/// True when `exe` is this very binary (same device and inode as /proc/self/exe).
fn is_this_binary(exe: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(exe), std::fs::metadata("/proc/self/exe")) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// The plugin itself when CNI_PATH resolves `plugin` to this very binary: it can then run
/// in-process, with exactly the code, environment and configuration an exec would give it.
pub fn in_process(plugin: &str, args: &CmdArgs) -> Option<&'static (dyn Plugin + Sync)> {
    let own = crate::plugin_for(plugin)?;
    is_this_binary(&find(plugin, &args.path).ok()?).then_some(own)
}

/// Runs a plugin of this binary in-process for `command`.
pub fn call(
    plugin: &dyn Plugin,
    command: Command,
    args: &CmdArgs,
) -> Result<Option<CniResult>, Error> {
    let delegated = CmdArgs {
        command,
        ..args.clone()
    };
    match command {
        Command::Add => plugin.add(&delegated).map(Some),
        Command::Del => plugin.del(&delegated).map(|_| None),
        Command::Check => plugin.check(&delegated).map(|_| None),
        Command::Gc => plugin.gc(&delegated).map(|_| None),
        Command::Status => plugin.status(&delegated).map(|_| None),
        Command::Version => Ok(None),
    }
}

/// Runs `plugin` for `command` with the invocation's stdin; ADD returns its result.
/// A plugin of this binary runs in-process (see [`in_process`]); anything else, the
/// reference host-local say, is exec'd by the runtime side's invocation layer.
pub fn run(plugin: &str, command: Command, args: &CmdArgs) -> Result<Option<CniResult>, Error> {
    if let Some(own) = in_process(plugin, args) {
        return call(own, command, args);
    }
    let runtime = Runtime {
        plugin_dirs: args.path.clone(),
        // Bounded by our own caller's timeout: the delegate dies with us.
        timeout: Duration::MAX,
        ..Runtime::new(Vec::new())
    };
    let rt = RuntimeConf {
        container_id: args.container_id.clone(),
        netns: args
            .netns
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        ifname: args.ifname.clone(),
        args: args.args.0.clone(),
        capability_args: Default::default(),
    };
    let out = runtime
        .invoke(plugin, command, &rt, &args.stdin)
        .map_err(|f| match f {
            Failure::Failed(e) => e,
            Failure::NotRun(e) => Error {
                code: ErrorCode::Delegate.into(),
                msg: format!("delegated plugin \"{plugin}\": {}", e.msg),
                ..e
            },
        })?;
    if command != Command::Add {
        return Ok(None);
    }
    let value: serde_json::Value = serde_json::from_slice(&out).map_err(|e| {
        Error::new(
            ErrorCode::Delegate,
            format!("delegated plugin \"{plugin}\" printed an unreadable result: {e}"),
        )
    })?;
    CniResult::parse(&value, args.version).map(|(r, _)| Some(r))
}

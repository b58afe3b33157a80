//! Running a delegated plugin (the IPAM plugin of `ipam.type`) exactly as the spec says:
//! found on CNI_PATH, same environment and stdin, CNI_COMMAND set for the call.

use corvid_cni::skel::{CmdArgs, Command, Plugin};
use corvid_cni::{CniResult, Error, ErrorCode};
use std::io::Write;
use std::path::PathBuf;
use std::process::Stdio;

fn command_name(c: Command) -> &'static str {
    match c {
        Command::Add => "ADD",
        Command::Del => "DEL",
        Command::Check => "CHECK",
        Command::Version => "VERSION",
        Command::Gc => "GC",
        Command::Status => "STATUS",
    }
}

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
/// reference host-local say, is exec'd.
pub fn run(plugin: &str, command: Command, args: &CmdArgs) -> Result<Option<CniResult>, Error> {
    if let Some(own) = in_process(plugin, args) {
        return call(own, command, args);
    }
    let exe = find(plugin, &args.path)?;
    let failed = |what: String| {
        Error::new(
            ErrorCode::Delegate,
            format!("delegated plugin \"{plugin}\" {what}"),
        )
    };
    let mut cmd = std::process::Command::new(&exe);
    // A delegate must not outlive us: orphaned, it could allocate after the runtime's DEL.
    // SAFETY: prctl is async-signal-safe and only affects the child.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd
        .env("CNI_COMMAND", command_name(command))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| failed(format!("could not be started: {e}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(&args.stdin)
            .map_err(|e| failed(format!("did not take its configuration: {e}")))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| failed(format!("did not finish: {e}")))?;
    if !out.status.success() {
        return Err(Error::from_plugin_output(&out.stdout).unwrap_or_else(|| {
            failed(format!("failed ({}) without an error message", out.status))
                .with_details(String::from_utf8_lossy(&out.stdout).into_owned())
        }));
    }
    if command != Command::Add {
        return Ok(None);
    }
    let value: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| failed(format!("printed an unreadable result: {e}")))?;
    CniResult::parse(&value, args.version).map(|(r, _)| Some(r))
}

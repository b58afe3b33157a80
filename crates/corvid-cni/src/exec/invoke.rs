//! Finding a plugin on the plugin path and running it once: its environment, its
//! configuration on stdin, its result or error on stdout, within the runtime's timeout.

use super::*;
use crate::command::Command;
use crate::error::{Error, ErrorCode};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::mpsc;

/// Finds a plugin in `dirs` (CNI_PATH order); its name must not hold a path separator.
pub fn find_plugin(plugin: &str, dirs: &[PathBuf]) -> Result<PathBuf, Error> {
    if plugin.is_empty() || plugin.contains('/') {
        return Err(Error::new(
            ErrorCode::InvalidNetworkConfig,
            format!("invalid plugin type \"{plugin}\""),
        ));
    }
    dirs.iter()
        .map(|d| d.join(plugin))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            Error::new(
                ErrorCode::InvalidNetworkConfig,
                format!("failed to find plugin \"{plugin}\" in path"),
            )
            .with_details(
                dirs.iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(":"),
            )
        })
}

impl Runtime {
    /// Finds a plugin on this runtime's plugin path.
    pub fn find(&self, plugin: &str) -> Result<PathBuf, Error> {
        find_plugin(plugin, &self.plugin_dirs)
    }

    /// Runs one plugin: the spec's environment, `stdin` as configuration; kills it past the
    /// timeout. Returns what it printed on success, its CNI error otherwise.
    pub fn run_plugin(
        &self,
        plugin: &str,
        command: Command,
        rt: &RuntimeConf,
        stdin: &[u8],
    ) -> Result<Vec<u8>, Error> {
        self.invoke(plugin, command, rt, stdin)
            .map_err(|f| match f {
                Failure::NotRun(e) => e,
                Failure::Failed(e) => plugin_error(plugin, e),
            })
    }

    /// The one way corvid execs a plugin, for the runtime side and for a plugin delegating
    /// to another (its IPAM) alike: found on the plugin path, CNI_* from `rt`, the rest of
    /// the environment inherited, killed with us and past the timeout.
    pub fn invoke(
        &self,
        plugin: &str,
        command: Command,
        rt: &RuntimeConf,
        stdin: &[u8],
    ) -> Result<Vec<u8>, Failure> {
        let exe = self.find(plugin).map_err(Failure::NotRun)?;
        let path = std::env::join_paths(&self.plugin_dirs).unwrap_or_default();
        let args: Vec<String> = rt.args.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let mut cmd = std::process::Command::new(&exe);
        // A plugin must not outlive its caller: orphaned, an IPAM could allocate after
        // the runtime's DEL.
        // SAFETY: the closure only makes the prctl system call, which is async-signal-safe.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                rustix::process::set_parent_process_death_signal(Some(
                    rustix::process::Signal::KILL,
                ))
                .map_err(std::io::Error::from)
            });
        }
        let mut child = cmd
            .env("CNI_COMMAND", command.as_str())
            .env("CNI_CONTAINERID", &rt.container_id)
            .env("CNI_NETNS", &rt.netns)
            .env("CNI_IFNAME", &rt.ifname)
            .env("CNI_ARGS", args.join(";"))
            .env("CNI_PATH", path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| {
                Failure::NotRun(Error::new(
                    ErrorCode::Io,
                    format!("plugin {plugin} could not be started: {e}"),
                ))
            })?;
        let mut input = child.stdin.take().expect("piped");
        let mut output = child.stdout.take().expect("piped");
        let config = stdin.to_vec();
        let (tx, rx) = mpsc::channel();
        // A plugin that never reads or never exits must not hang us: I/O happens on a
        // helper thread and we wait for it with the timeout.
        std::thread::spawn(move || {
            let _ = input.write_all(&config);
            drop(input);
            let mut out = Vec::new();
            let read = output.read_to_end(&mut out).map(|_| out);
            let _ = tx.send(read);
        });
        let io = |e: std::io::Error| {
            Failure::NotRun(Error::new(ErrorCode::Io, format!("plugin {plugin}: {e}")))
        };
        let out = match rx.recv_timeout(self.timeout) {
            Ok(read) => read.map_err(io)?,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Failure::NotRun(Error::new(
                    ErrorCode::TryAgainLater,
                    format!(
                        "plugin {plugin} did not finish {command} within {:?}; killed",
                        self.timeout
                    ),
                )));
            }
        };
        let status = child.wait().map_err(io)?;
        if status.success() {
            return Ok(out);
        }
        Err(Failure::Failed(
            Error::from_plugin_output(&out).unwrap_or_else(|| {
                Error::new(
                    ErrorCode::Decoding,
                    format!("failed ({status}) and printed no CNI error"),
                )
                .with_details(String::from_utf8_lossy(&out).into_owned())
            }),
        ))
    }
}

//! Runs `/opt/network/add` or `del` inside a running plugin container's mount namespace,
//! as root with the container's capabilities, with the network's entry on stdin, and
//! kills it with its whole process group when it overruns its time.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use rustix::thread::LinkNameSpaceType;

use crate::invoke::Action;
use crate::runtime::caps;

/// How a call ended badly.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The plugin's container is gone.
    #[error("the plugin container (pid {pid}) is not running: {source}")]
    NotRunning {
        /// Its main process.
        pid: u32,
        /// Why its namespace could not be opened.
        source: std::io::Error,
    },
    /// The program could not be started.
    #[error("could not run {program}: {source}")]
    Spawn {
        /// `/opt/network/add` or `del`.
        program: String,
        /// Why.
        source: std::io::Error,
    },
    /// It ran past its time; it and its process group were killed.
    #[error("{program} did not return within {limit:?} and was killed with its process group")]
    Timeout {
        /// Which.
        program: String,
        /// The limit.
        limit: Duration,
    },
    /// It exited non-zero; its output says why.
    #[error("{program} exited with {status}: {output}")]
    Failed {
        /// Which.
        program: String,
        /// How it ended.
        status: std::process::ExitStatus,
        /// stdout then stderr, trimmed.
        output: String,
    },
}

/// The program Kurma calls for `action`.
pub fn program(action: Action) -> String {
    format!("/opt/network/{}", action.names().0)
}

/// Runs `action` in the container whose main process is `pid`, with every capability when
/// its image is `privileged`, else with Kurma's default ones; answers its stdout.
pub fn call(
    pid: u32,
    privileged: bool,
    action: Action,
    args: &[String],
    stdin_text: &str,
    limit: Duration,
) -> Result<Vec<u8>, CallError> {
    let program = program(action);
    let ns = File::open(format!("/proc/{pid}/ns/mnt"))
        .map_err(|source| CallError::NotRunning { pid, source })?;
    let mut cmd = Command::new(&program);
    cmd.args(args)
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    // SAFETY: runs in the child between fork and exec and only makes system calls; a
    // single-threaded child may enter another mount namespace (its root follows).
    unsafe {
        cmd.pre_exec(move || {
            rustix::thread::move_into_link_name_space(ns.as_fd(), Some(LinkNameSpaceType::Mount))?;
            // After the setns, which needs CAP_SYS_ADMIN.
            if !privileged {
                caps::restrict_to_kurma_default()?;
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|source| CallError::Spawn {
        program: program.clone(),
        source,
    })?;
    let pgid = child.id();
    let (done, finished) = mpsc::channel::<()>();
    let killer = std::thread::spawn(move || {
        let overran = matches!(
            finished.recv_timeout(limit),
            Err(mpsc::RecvTimeoutError::Timeout)
        );
        if overran {
            if let Some(group) = rustix::process::Pid::from_raw(pgid as i32) {
                let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
            }
        }
        overran
    });
    let mut stdin = child.stdin.take();
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let errors = std::thread::spawn(move || {
        let mut err = Vec::new();
        if let Some(e) = stderr.as_mut() {
            let _ = e.read_to_end(&mut err);
        }
        err
    });
    if let Some(mut input) = stdin.take() {
        // A plugin that ignores its stdin closes the pipe early: not an error of ours.
        let _ = input.write_all(stdin_text.as_bytes());
    }
    let mut out = Vec::new();
    if let Some(o) = stdout.as_mut() {
        let _ = o.read_to_end(&mut out);
    }
    let err = errors.join().unwrap_or_default();
    let status = child.wait().map_err(|source| CallError::Spawn {
        program: program.clone(),
        source,
    })?;
    let _ = done.send(());
    if killer.join().unwrap_or(false) {
        return Err(CallError::Timeout { program, limit });
    }
    if !status.success() {
        let text = |b: &[u8]| String::from_utf8_lossy(b).trim().to_string();
        let output = [text(&out), text(&err)]
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join("; ");
        return Err(CallError::Failed {
            program,
            status,
            output,
        });
    }
    Ok(out)
}

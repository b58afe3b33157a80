//! The plugin side of Kurma, for corvid's plugin image: `/opt/network/add` and `del` as
//! a CNI call of the plugin the network's `type` names (corvid's own in process, any
//! other from CNI_PATH), and `/opt/network/netplugin`, the container's main process.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use corvid_kurma::invoke::{self, Action, Call, InvokeError};

/// Where the image keeps the CNI plugins.
pub const CNI_PATH: &str = "/opt/cni/bin";

/// Why `add` or `del` failed; the runtime reports what it prints.
#[derive(Debug, thiserror::Error)]
enum CallError {
    /// The arguments, the network's `type`, or the plugin's result.
    #[error(transparent)]
    Invoke(#[from] InvokeError),
    /// A plugin from CNI_PATH could not be run.
    #[error("running {}: {source}", program.display())]
    Run {
        program: PathBuf,
        source: std::io::Error,
    },
    /// The plugin failed; what it printed (its CNI error) says why.
    #[error("{plugin}: {output}")]
    Plugin { plugin: String, output: String },
}

/// The program names of the image, and what each does.
pub fn action_for(name: &str) -> Option<Option<Action>> {
    match name {
        "add" => Some(Some(Action::Add)),
        "del" => Some(Some(Action::Del)),
        "netplugin" => Some(None),
        _ => None,
    }
}

/// Runs as `add`, `del` (an action) or the main process (none); answers the exit code.
pub fn main(action: Option<Action>, args: &[String]) -> i32 {
    let mut stdin = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut stdin) {
        eprintln!("reading the configuration from stdin: {e}");
        return 1;
    }
    let entry: serde_json::Value = match serde_json::from_slice(&stdin) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("the configuration on stdin is not JSON: {e}");
            return 1;
        }
    };
    let Some(action) = action else {
        return serve(&entry);
    };
    match call(action, args, &entry, &stdin) {
        Ok(out) => {
            let _ = std::io::stdout().write_all(&out);
            0
        }
        Err(e) => {
            eprintln!("{e}");
            1
        }
    }
}

/// The main process: the plugins need nothing running, so it holds the container open.
fn serve(entry: &serde_json::Value) -> i32 {
    tracing::info!(network = %entry["name"], "Kurma network plugin ready");
    loop {
        std::thread::park();
    }
}

fn call(
    action: Action,
    args: &[String],
    entry: &serde_json::Value,
    stdin: &[u8],
) -> Result<Vec<u8>, CallError> {
    let call = Call::parse(action, args)?;
    let plugin = invoke::plugin_type(entry)?;
    let env = call.environment(Path::new(CNI_PATH));
    let mut out = Vec::new();
    let code = match crate::plugin_for(&plugin) {
        Some(p) => {
            let lookup = |k: &str| {
                env.iter()
                    .find(|(name, _)| *name == k)
                    .map(|(_, v)| v.clone())
                    .or_else(|| std::env::var(k).ok())
            };
            corvid_cni::skel::run_with(p, &lookup, stdin, &mut out)
        }
        None => {
            let program = Path::new(CNI_PATH).join(&plugin);
            let running = |source| CallError::Run {
                program: program.clone(),
                source,
            };
            let mut child = Command::new(&program)
                .envs(env.iter().map(|(k, v)| (*k, v)))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .map_err(running)?;
            if let Some(mut input) = child.stdin.take() {
                let _ = input.write_all(stdin);
            }
            let output = child.wait_with_output().map_err(running)?;
            out = output.stdout;
            output.status.code().unwrap_or(1)
        }
    };
    if code != 0 {
        return Err(CallError::Plugin {
            plugin,
            output: String::from_utf8_lossy(&out).trim().to_string(),
        });
    }
    match action {
        Action::Add => Ok(invoke::kurma_result(&out, entry)?.to_string().into_bytes()),
        Action::Del => Ok(Vec::new()),
    }
}

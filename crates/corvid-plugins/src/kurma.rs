//! The plugin side of Kurma, for corvid's plugin image: `/opt/network/add` and `del` as
//! a CNI call of the plugin the network's `type` names (corvid's own in process, any
//! other from CNI_PATH), and `/opt/network/netplugin`, the container's main process.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};

use corvid_kurma::invoke::{self, Action, Call};

/// Where the image keeps the CNI plugins.
pub const CNI_PATH: &str = "/opt/cni/bin";

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
        Err(message) => {
            eprintln!("{message}");
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
) -> Result<Vec<u8>, String> {
    let call = Call::parse(action, args).map_err(|e| e.to_string())?;
    let plugin = invoke::plugin_type(entry).map_err(|e| e.to_string())?;
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
            let mut child = Command::new(&program)
                .envs(env.iter().map(|(k, v)| (*k, v)))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .map_err(|e| format!("running {}: {e}", program.display()))?;
            if let Some(mut input) = child.stdin.take() {
                let _ = input.write_all(stdin);
            }
            let output = child
                .wait_with_output()
                .map_err(|e| format!("running {}: {e}", program.display()))?;
            out = output.stdout;
            output.status.code().unwrap_or(1)
        }
    };
    if code != 0 {
        return Err(format!(
            "{plugin}: {}",
            String::from_utf8_lossy(&out).trim()
        ));
    }
    match action {
        Action::Add => invoke::kurma_result(&out, entry)
            .map(|r| r.to_string().into_bytes())
            .map_err(|e| e.to_string()),
        Action::Del => Ok(Vec::new()),
    }
}

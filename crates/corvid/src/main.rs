//! The corvid command line.

use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage:
  corvid cni install [--dir DIR] [--from BINARY]
      install the CNI plugins (bridge, host-local, loopback) into DIR (default /opt/cni/bin);
      BINARY defaults to the corvid-plugins beside this corvid";

fn fail(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("corvid: {msg}");
    ExitCode::from(2)
}

fn cni_install(mut args: impl Iterator<Item = String>) -> ExitCode {
    let mut dir = PathBuf::from(corvid_plugins::install::DEFAULT_BIN_DIR);
    let mut from = None;
    while let Some(arg) = args.next() {
        let value = match arg.as_str() {
            "--dir" | "--from" => match args.next() {
                Some(v) => v,
                None => return fail(format!("{arg} needs a value\n{USAGE}")),
            },
            _ => return fail(format!("unknown argument {arg}\n{USAGE}")),
        };
        if arg == "--dir" {
            dir = value.into();
        } else {
            from = Some(PathBuf::from(value));
        }
    }
    let from = match from {
        Some(f) => f,
        None => match std::env::current_exe() {
            Ok(exe) => exe.with_file_name(corvid_plugins::install::BINARY_NAME),
            Err(e) => return fail(format!("cannot find my own executable: {e}")),
        },
    };
    match corvid_plugins::install::install(&from, &dir) {
        Ok(made) => {
            for p in made {
                println!("{}", p.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    match (args.next().as_deref(), args.next().as_deref()) {
        (Some("cni"), Some("install")) => cni_install(args),
        (Some("help" | "--help" | "-h"), _) | (None, _) => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        _ => fail(format!("unknown command\n{USAGE}")),
    }
}

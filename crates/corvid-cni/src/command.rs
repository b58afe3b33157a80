//! The CNI command: what CNI_COMMAND names, for the plugin side and the runtime side alike.

use std::fmt;

use crate::error::{Error, ErrorCode};

/// A CNI command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Attach the container.
    Add,
    /// Detach the container; succeeds when nothing is left.
    Del,
    /// Verify the container's network against `prevResult`.
    Check,
    /// Report the supported versions.
    Version,
    /// Release everything not in `cni.dev/valid-attachments`.
    Gc,
    /// Report whether ADD can be served now.
    Status,
}

impl Command {
    const ALL: [Command; 6] = [
        Command::Add,
        Command::Del,
        Command::Check,
        Command::Version,
        Command::Gc,
        Command::Status,
    ];

    /// Parses CNI_COMMAND.
    pub fn parse(s: &str) -> Result<Command, Error> {
        Command::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| {
                Error::new(
                    ErrorCode::InvalidEnvironment,
                    format!("unknown CNI_COMMAND \"{s}\""),
                )
                .with_details("expected ADD, DEL, CHECK, VERSION, GC or STATUS")
            })
    }

    /// The CNI_COMMAND value.
    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Version => "VERSION",
            Command::Gc => "GC",
            Command::Status => "STATUS",
        }
    }

    /// The environment variables the spec requires for this command.
    pub(crate) fn required_env(self) -> &'static [&'static str] {
        match self {
            Command::Add | Command::Check => {
                &["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"]
            }
            Command::Del => &["CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"],
            Command::Gc | Command::Status => &["CNI_PATH"],
            Command::Version => &[],
        }
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_parses_back_from_its_name() {
        for c in Command::ALL {
            assert_eq!(Command::parse(c.as_str()).unwrap(), c);
        }
        assert_eq!(Command::parse("add").unwrap_err().code, 4);
    }
}

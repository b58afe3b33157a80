//! CNI errors: the well-known codes and the error JSON a plugin prints.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The spec's well-known error codes (below 100) and those every corvid plugin shares; a
/// plugin's own codes live with the plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum ErrorCode {
    /// 1: the configuration's CNI version is not supported, or a result cannot be converted.
    IncompatibleVersion = 1,
    /// 2: a field of the configuration is not supported.
    UnsupportedField = 2,
    /// 3: the container (its network namespace) is unknown or does not exist.
    UnknownContainer = 3,
    /// 4: an environment variable is missing or invalid.
    InvalidEnvironment = 4,
    /// 5: an I/O operation failed.
    Io = 5,
    /// 6: stdin or a result could not be decoded.
    Decoding = 6,
    /// 7: the network configuration is invalid.
    InvalidNetworkConfig = 7,
    /// 11: a transient condition; the runtime should try again later.
    TryAgainLater = 11,
    /// 50: STATUS: the plugin cannot serve an ADD now.
    PluginNotAvailable = 50,
    /// 51: STATUS: the plugin cannot serve an ADD and existing containers are degraded.
    PluginNotAvailableDegraded = 51,
    /// 100: no free address is left in the range set.
    AddressExhausted = 100,
    /// 101: a requested address is taken or outside every range.
    AddressUnavailable = 101,
    /// 102: the interface name is already taken in the container's namespace.
    InterfaceExists = 102,
    /// 103: the kernel refused a network operation.
    Kernel = 103,
    /// 104: CHECK found the container's network different from the result.
    CheckFailed = 104,
    /// 105: a delegated plugin could not be run or gave no valid answer.
    Delegate = 105,
    /// 999: a failure inside the plugin itself (the reference plugins' generic code).
    Internal = 999,
}

impl From<ErrorCode> for u32 {
    fn from(c: ErrorCode) -> u32 {
        c as u32
    }
}

/// A CNI error as the spec prints it: `{"cniVersion", "code", "msg", "details"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Error {
    /// The numeric code; below 100 the spec's, 100 and up corvid's.
    pub code: u32,
    /// A short message.
    pub msg: String,
    /// A longer explanation, may be empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub details: String,
}

impl Error {
    /// An error with a code (a well-known one or a plugin's own) and a message.
    pub fn new(code: impl Into<u32>, msg: impl Into<String>) -> Error {
        Error {
            code: code.into(),
            msg: msg.into(),
            details: String::new(),
        }
    }

    /// The same error with details attached.
    pub fn with_details(mut self, details: impl Into<String>) -> Error {
        self.details = details.into();
        self
    }

    /// The error JSON in the given CNI version.
    pub fn to_json(&self, cni_version: &str) -> serde_json::Value {
        let mut v = serde_json::json!({
            "cniVersion": cni_version,
            "code": self.code,
            "msg": self.msg,
        });
        if !self.details.is_empty() {
            v["details"] = self.details.clone().into();
        }
        v
    }

    /// This error with the step it happened in before its message.
    pub fn during(self, step: &str) -> Error {
        Error {
            msg: format!("{step}: {}", self.msg),
            ..self
        }
    }

    /// The outcome of a teardown that went on past every failed step: success when
    /// nothing failed, otherwise the first failure's code with every failure's message.
    pub fn all(failures: Vec<Error>) -> Result<(), Error> {
        let mut failures = failures.into_iter();
        let Some(first) = failures.next() else {
            return Ok(());
        };
        Err(failures.fold(first, |acc, e| Error {
            msg: format!("{}; {}", acc.msg, e.msg),
            details: [acc.details, e.details]
                .into_iter()
                .filter(|d| !d.is_empty())
                .collect::<Vec<_>>()
                .join("; "),
            ..acc
        }))
    }

    /// Reads an error a delegated plugin printed; `None` when the text is not error JSON.
    pub fn from_plugin_output(out: &[u8]) -> Option<Error> {
        let e: Error = serde_json::from_slice(out).ok()?;
        (e.code != 0).then_some(e)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.msg)?;
        if !self.details.is_empty() {
            write!(f, ": {}", self.details)?;
        }
        write!(f, " (code {})", self.code)
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_json_has_the_spec_fields() {
        let e = Error::new(ErrorCode::InvalidNetworkConfig, "bad").with_details("why");
        let v = e.to_json("1.0.0");
        assert_eq!(
            v,
            serde_json::json!({"cniVersion":"1.0.0","code":7,"msg":"bad","details":"why"})
        );
        let plain = Error::new(ErrorCode::Io, "x").to_json("0.4.0");
        assert!(plain.get("details").is_none());
    }

    #[test]
    fn a_teardown_reports_every_failure_with_the_first_code() {
        assert_eq!(Error::all(Vec::new()), Ok(()));
        let e = Error::all(vec![
            Error::new(ErrorCode::Kernel, "gone").during("delete veth cvp1"),
            Error::new(ErrorCode::Io, "busy").with_details("lock"),
        ])
        .unwrap_err();
        assert_eq!(e.code, 103);
        assert_eq!(e.msg, "delete veth cvp1: gone; busy");
        assert_eq!(e.details, "lock");
    }

    #[test]
    fn reads_plugin_errors_back() {
        let e = Error::from_plugin_output(br#"{"cniVersion":"1.0.0","code":11,"msg":"later"}"#);
        assert_eq!(e.unwrap().code, 11);
        assert!(Error::from_plugin_output(b"garbage").is_none());
        assert!(Error::from_plugin_output(br#"{"ips":[]}"#).is_none());
    }
}

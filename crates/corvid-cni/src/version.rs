//! CNI specification versions and what each one allows.

use crate::error::{Error, ErrorCode};
use std::fmt;

/// A CNI specification version this library speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Version {
    /// 0.1.0: the `ip4`/`ip6` result.
    V0_1_0,
    /// 0.2.0: adds VERSION.
    V0_2_0,
    /// 0.3.0: `interfaces`/`ips` results and plugin chaining.
    V0_3_0,
    /// 0.3.1: `ip` renamed `ips`.
    V0_3_1,
    /// 0.4.0: CHECK, and DEL receives `prevResult`.
    V0_4_0,
    /// 1.0.0: no `version` in IP entries.
    V1_0_0,
    /// 1.1.0: GC and STATUS, more route and interface fields.
    V1_1_0,
}

/// Every version this library speaks, oldest first.
pub const ALL: [Version; 7] = [
    Version::V0_1_0,
    Version::V0_2_0,
    Version::V0_3_0,
    Version::V0_3_1,
    Version::V0_4_0,
    Version::V1_0_0,
    Version::V1_1_0,
];

impl Version {
    /// The newest version this library speaks.
    pub const CURRENT: Version = Version::V1_1_0;

    /// Parses a version string such as "0.4.0"; anything else is an incompatible version.
    pub fn parse(s: &str) -> Result<Version, Error> {
        ALL.into_iter().find(|v| v.as_str() == s).ok_or_else(|| {
            Error::new(
                ErrorCode::IncompatibleVersion,
                format!("unsupported CNI version \"{s}\""),
            )
            .with_details(format!("supported versions: {}", supported_list()))
        })
    }

    /// The version as the spec writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Version::V0_1_0 => "0.1.0",
            Version::V0_2_0 => "0.2.0",
            Version::V0_3_0 => "0.3.0",
            Version::V0_3_1 => "0.3.1",
            Version::V0_4_0 => "0.4.0",
            Version::V1_0_0 => "1.0.0",
            Version::V1_1_0 => "1.1.0",
        }
    }

    /// True for the versions whose results use the `ip4`/`ip6` form.
    pub fn is_legacy_result(self) -> bool {
        self < Version::V0_3_0
    }

    /// True when the spec allows the CHECK command.
    pub fn allows_check(self) -> bool {
        self >= Version::V0_4_0
    }

    /// True when the spec allows the GC and STATUS commands.
    pub fn allows_gc_and_status(self) -> bool {
        self >= Version::V1_1_0
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The supported versions as a comma-separated list, for messages.
pub fn supported_list() -> String {
    ALL.map(Version::as_str).join(", ")
}

/// The VERSION command's answer: `{"cniVersion", "supportedVersions"}`.
pub fn version_info() -> serde_json::Value {
    serde_json::json!({
        "cniVersion": Version::CURRENT.as_str(),
        "supportedVersions": ALL.map(Version::as_str),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_supported_version_and_orders_them() {
        for (i, v) in ALL.iter().enumerate() {
            assert_eq!(Version::parse(v.as_str()).unwrap(), *v);
            if i > 0 {
                assert!(ALL[i - 1] < *v);
            }
        }
    }

    #[test]
    fn unknown_version_is_code_1() {
        for bad in ["0.5.0", "2.0.0", "", "1.0", "v1.0.0"] {
            let e = Version::parse(bad).unwrap_err();
            assert_eq!(e.code, 1, "{bad}");
        }
    }

    #[test]
    fn command_gates() {
        assert!(!Version::V0_3_1.allows_check());
        assert!(Version::V0_4_0.allows_check());
        assert!(!Version::V1_0_0.allows_gc_and_status());
        assert!(Version::V1_1_0.allows_gc_and_status());
    }
}

//! CNI_ARGS: `K=V;K=V` pairs passed by the runtime.

use crate::error::{Error, ErrorCode};

/// The parsed CNI_ARGS, in the order given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniArgs(pub Vec<(String, String)>);

impl CniArgs {
    /// Parses `K=V;K=V`; an empty string gives no pairs, a pair without `=` is code 4.
    pub fn parse(s: &str) -> Result<CniArgs, Error> {
        let mut pairs = Vec::new();
        for part in s.split(';').filter(|p| !p.is_empty()) {
            let (k, v) = part.split_once('=').ok_or_else(|| {
                Error::new(ErrorCode::InvalidEnvironment, "invalid CNI_ARGS")
                    .with_details(format!("pair \"{part}\" has no '='"))
            })?;
            if k.is_empty() {
                return Err(
                    Error::new(ErrorCode::InvalidEnvironment, "invalid CNI_ARGS")
                        .with_details(format!("pair \"{part}\" has an empty key")),
                );
            }
            pairs.push((k.to_string(), v.to_string()));
        }
        Ok(CniArgs(pairs))
    }

    /// The value of a key; keys are matched exactly, as runtimes send them.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Refuses a key `plugin` does not read (code 4), as the reference's plugins do
    /// unless `IgnoreUnknown` is 1 or true (which runtimes such as the kubelet send).
    pub fn only(&self, plugin: &str, known: &[&str]) -> Result<(), Error> {
        let ignore = self
            .get("IgnoreUnknown")
            .is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
        match self
            .0
            .iter()
            .find(|(k, _)| k != "IgnoreUnknown" && !known.contains(&k.as_str()))
        {
            Some((k, _)) if !ignore => Err(Error::new(
                ErrorCode::InvalidEnvironment,
                format!("{plugin}: unknown CNI_ARGS key \"{k}\" (set IgnoreUnknown=1 to pass it)"),
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pairs_in_any_order() {
        let a = CniArgs::parse("IgnoreUnknown=1;K8S_POD_NAME=web;IP=10.0.0.5,fd00::5").unwrap();
        assert_eq!(a.get("K8S_POD_NAME"), Some("web"));
        assert_eq!(a.get("IP"), Some("10.0.0.5,fd00::5"));
        assert_eq!(a.get("missing"), None);
        assert_eq!(CniArgs::parse("").unwrap().0.len(), 0);
        assert_eq!(CniArgs::parse("A=1;").unwrap().0.len(), 1);
    }

    #[test]
    fn malformed_pairs_are_code_4() {
        assert_eq!(CniArgs::parse("A=1;B").unwrap_err().code, 4);
        assert_eq!(CniArgs::parse("=x").unwrap_err().code, 4);
    }
}

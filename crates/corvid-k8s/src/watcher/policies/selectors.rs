//! Label selectors as the API server reads them, and the peers of a NetworkPolicy rule
//! reduced to a canonical form: two policies that name the same pods name one group.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::Serialize;

/// A pod's or a namespace's labels.
pub type Labels = BTreeMap<String, String>;

/// A label selector in canonical form: keys and values sorted, so that equal selectors
/// written differently compare (and hash into IDs) equal.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Selector {
    /// `matchLabels`.
    labels: BTreeMap<String, String>,
    /// `matchExpressions`: key, operator, sorted values.
    expressions: Vec<(String, Operator, Vec<String>)>,
}

/// A `matchExpressions` operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Operator {
    /// The label's value is one of the values.
    In,
    /// The label is absent or its value none of the values.
    NotIn,
    /// The label is present.
    Exists,
    /// The label is absent.
    DoesNotExist,
}

impl Selector {
    /// The selector that matches everything (`{}`).
    pub fn everything() -> Selector {
        Selector::default()
    }

    /// `s` in canonical form; an unknown operator is an error the API server would have
    /// refused.
    pub fn from_k8s(s: &LabelSelector) -> Result<Selector, String> {
        let mut expressions = Vec::new();
        for e in s.match_expressions.iter().flatten() {
            let op = match e.operator.as_str() {
                "In" => Operator::In,
                "NotIn" => Operator::NotIn,
                "Exists" => Operator::Exists,
                "DoesNotExist" => Operator::DoesNotExist,
                other => return Err(format!("unknown selector operator {other:?}")),
            };
            let mut values = e.values.clone().unwrap_or_default();
            values.sort();
            values.dedup();
            expressions.push((e.key.clone(), op, values));
        }
        expressions.sort();
        expressions.dedup();
        Ok(Selector {
            labels: s.match_labels.clone().unwrap_or_default(),
            expressions,
        })
    }

    /// Whether `labels` satisfy every term.
    pub fn matches(&self, labels: &Labels) -> bool {
        self.labels.iter().all(|(k, v)| labels.get(k) == Some(v))
            && self.expressions.iter().all(|(k, op, values)| {
                let got = labels.get(k);
                match op {
                    Operator::In => got.is_some_and(|v| values.contains(v)),
                    Operator::NotIn => got.is_none_or(|v| !values.contains(v)),
                    Operator::Exists => got.is_some(),
                    Operator::DoesNotExist => got.is_none(),
                }
            })
    }
}

/// Which namespaces a peer's pods are in.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Namespaces {
    /// The policy's own (a peer with only `podSelector`).
    Named(String),
    /// Those whose labels match (`namespaceSelector`).
    Matching(Selector),
}

/// The pods a rule's peer names: a group the matching pods join.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Peer {
    /// Their namespaces.
    pub namespaces: Namespaces,
    /// Their labels.
    pub pods: Selector,
}

impl Peer {
    /// Whether a pod of `namespace` (whose labels are `namespace_labels`, when known)
    /// with `labels` is one of them.
    pub fn matches(
        &self,
        namespace: &str,
        namespace_labels: Option<&Labels>,
        labels: &Labels,
    ) -> bool {
        let in_namespace = match &self.namespaces {
            Namespaces::Named(n) => n == namespace,
            Namespaces::Matching(s) => namespace_labels.is_some_and(|l| s.matches(l)),
        };
        in_namespace && self.pods.matches(labels)
    }

    /// The text the peer's group ID derives from: equal peers, equal IDs.
    pub fn key(&self) -> String {
        serde_json::to_string(self).expect("a peer serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn selector(v: serde_json::Value) -> Selector {
        Selector::from_k8s(&serde_json::from_value(v).unwrap()).unwrap()
    }

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn selectors_match_as_the_api_server_matches() {
        let s = selector(json!({"matchLabels": {"app": "web"}, "matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["a", "b"]},
            {"key": "env", "operator": "NotIn", "values": ["prod"]},
            {"key": "team", "operator": "Exists"},
            {"key": "legacy", "operator": "DoesNotExist"}]}));
        let mut l = labels(&[("app", "web"), ("tier", "b"), ("team", "x")]);
        assert!(s.matches(&l));
        l.insert("env".into(), "dev".into());
        assert!(s.matches(&l));
        for (k, v) in [
            ("env", "prod"),
            ("legacy", "1"),
            ("tier", "c"),
            ("app", "db"),
        ] {
            let mut m = l.clone();
            m.insert(k.into(), v.into());
            assert!(!s.matches(&m), "{k}={v}");
        }
        let mut m = l.clone();
        m.remove("team");
        assert!(!s.matches(&m));
        assert!(Selector::everything().matches(&Labels::new()));
        let bad = serde_json::from_value(
            json!({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}),
        )
        .unwrap();
        assert!(Selector::from_k8s(&bad).is_err());
    }

    #[test]
    fn equal_selectors_written_differently_are_one_peer() {
        let a = selector(json!({"matchExpressions": [
            {"key": "t", "operator": "In", "values": ["b", "a"]},
            {"key": "u", "operator": "Exists"}]}));
        let b = selector(json!({"matchExpressions": [
            {"key": "u", "operator": "Exists"},
            {"key": "t", "operator": "In", "values": ["a", "b", "a"]}]}));
        let peer = |pods| Peer {
            namespaces: Namespaces::Named("n".into()),
            pods,
        };
        assert_eq!(peer(a.clone()).key(), peer(b).key());
        let other = Peer {
            namespaces: Namespaces::Matching(Selector::everything()),
            pods: a,
        };
        assert_ne!(peer(Selector::everything()).key(), other.key());
    }

    #[test]
    fn a_namespace_selector_needs_the_namespace_labels() {
        let p = Peer {
            namespaces: Namespaces::Matching(selector(json!({"matchLabels": {"team": "x"}}))),
            pods: Selector::everything(),
        };
        let ns = labels(&[("team", "x")]);
        assert!(p.matches("a", Some(&ns), &Labels::new()));
        assert!(!p.matches("a", None, &Labels::new()));
        assert!(!p.matches("a", Some(&Labels::new()), &Labels::new()));
    }
}

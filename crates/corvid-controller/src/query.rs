//! Neutron's list query language: attribute filters (repeat a key for OR), tag filters,
//! `fields=`, `sort_key`/`sort_dir`, and `limit`/`marker` pagination with `*_links`.

use std::cmp::Ordering;

use serde_json::{json, Map, Value};

use crate::error::NeutronError;

/// A parsed list query.
#[derive(Debug, Default)]
pub struct ListQuery {
    /// Attribute filters: attribute and the values any of which may match.
    pub filters: Vec<(String, Vec<String>)>,
    fields: Vec<String>,
    limit: Option<usize>,
    marker: Option<String>,
    sort: Vec<(String, bool)>,
    page_reverse: bool,
    tags: Vec<String>,
    tags_any: Vec<String>,
    not_tags: Vec<String>,
    not_tags_any: Vec<String>,
    pairs: Vec<(String, String)>,
}

/// Splits a raw query string into decoded pairs.
pub fn pairs(raw: Option<&str>) -> Vec<(String, String)> {
    form_urlencoded::parse(raw.unwrap_or("").as_bytes())
        .into_owned()
        .collect()
}

fn split_tags(v: &str) -> impl Iterator<Item = String> + '_ {
    v.split(',').filter(|t| !t.is_empty()).map(str::to_string)
}

impl ListQuery {
    /// Parses a raw query string.
    pub fn parse(raw: Option<&str>) -> Result<ListQuery, NeutronError> {
        let mut q = ListQuery {
            pairs: pairs(raw),
            ..ListQuery::default()
        };
        let mut dirs = Vec::new();
        for (k, v) in q.pairs.clone() {
            match k.as_str() {
                "fields" => q.fields.extend(split_tags(&v)),
                "limit" => {
                    let n: usize = v.parse().map_err(|_| {
                        NeutronError::bad_request(format!(
                            "Limit must be an integer 0 or greater and not '{v}'"
                        ))
                    })?;
                    q.limit = (n > 0).then_some(n);
                }
                "marker" => q.marker = Some(v),
                "sort_key" => q.sort.push((v, true)),
                "sort_dir" => match v.as_str() {
                    "asc" | "desc" => dirs.push(v == "asc"),
                    _ => {
                        return Err(NeutronError::bad_request(format!(
                            "Sort direction {v} must be asc or desc"
                        )))
                    }
                },
                "page_reverse" => q.page_reverse = v.eq_ignore_ascii_case("true"),
                "tags" => q.tags.extend(split_tags(&v)),
                "tags-any" => q.tags_any.extend(split_tags(&v)),
                "not-tags" => q.not_tags.extend(split_tags(&v)),
                "not-tags-any" => q.not_tags_any.extend(split_tags(&v)),
                _ => match q.filters.iter_mut().find(|(a, _)| *a == k) {
                    Some((_, vals)) => vals.push(v),
                    None => q.filters.push((k, vec![v])),
                },
            }
        }
        for (i, asc) in dirs.into_iter().enumerate() {
            if let Some(s) = q.sort.get_mut(i) {
                s.1 = asc;
            }
        }
        Ok(q)
    }

    /// Values asked for one attribute, if it is filtered on.
    pub fn filter(&self, attr: &str) -> Option<&[String]> {
        self.filters
            .iter()
            .find(|(a, _)| a == attr)
            .map(|(_, v)| v.as_slice())
    }

    /// Whether `obj` passes every filter.
    pub fn matches(&self, obj: &Value) -> bool {
        let tags: Vec<&str> = obj["tags"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let has = |t: &String| tags.contains(&t.as_str());
        self.tags.iter().all(has)
            && (self.tags_any.is_empty() || self.tags_any.iter().any(has))
            && (self.not_tags.is_empty() || !self.not_tags.iter().all(has))
            && !self.not_tags_any.iter().any(has)
            && self
                .filters
                .iter()
                .all(|(attr, vals)| vals.iter().any(|v| value_matches(&obj[attr.as_str()], v)))
    }

    /// Sorts, pages and projects the matching objects into the list answer.
    pub fn answer(&self, mut objs: Vec<Value>, plural: &str, path: &str) -> Value {
        let keys: Vec<(String, bool)> = if self.sort.is_empty() {
            vec![("id".into(), true)]
        } else {
            self.sort.clone()
        };
        objs.sort_by(|a, b| {
            for (k, asc) in &keys {
                let o = compare(&a[k.as_str()], &b[k.as_str()]);
                if o != Ordering::Equal {
                    return if *asc { o } else { o.reverse() };
                }
            }
            compare(&a["id"], &b["id"])
        });
        let mut links = Vec::new();
        if let Some(limit) = self.limit {
            let pos = self
                .marker
                .as_ref()
                .and_then(|m| objs.iter().position(|o| o["id"] == **m));
            let (start, end) = match (pos, self.page_reverse) {
                (Some(p), true) => (p.saturating_sub(limit), p),
                (Some(p), false) => (p + 1, (p + 1 + limit).min(objs.len())),
                (None, _) => (0, limit.min(objs.len())),
            };
            let more_after = end < objs.len();
            let more_before = start > 0;
            objs = objs.drain(start..end).collect();
            let link = |rel: &str, marker: &Value, reverse: bool| {
                let mut q: Vec<String> = self
                    .pairs
                    .iter()
                    .filter(|(k, _)| k != "marker" && k != "page_reverse")
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                q.push(format!("marker={}", marker.as_str().unwrap_or("")));
                if reverse {
                    q.push("page_reverse=True".into());
                }
                json!({"rel": rel, "href": format!("{path}?{}", q.join("&"))})
            };
            if let (Some(last), true) = (objs.last(), more_after || self.page_reverse) {
                links.push(link("next", &last["id"], false));
            }
            if let (Some(first), true) = (objs.first(), more_before || self.marker.is_some()) {
                links.push(link("previous", &first["id"], true));
            }
        }
        let objs: Vec<Value> = if self.fields.is_empty() {
            objs
        } else {
            objs.into_iter().map(|o| project(o, &self.fields)).collect()
        };
        let mut out = Map::new();
        out.insert(plural.to_string(), Value::Array(objs));
        if !links.is_empty() {
            out.insert(format!("{plural}_links"), Value::Array(links));
        }
        Value::Object(out)
    }
}

/// Keeps only `fields` of an object.
pub fn project(obj: Value, fields: &[String]) -> Value {
    match obj {
        Value::Object(mut m) => {
            m.retain(|k, _| fields.iter().any(|f| f == k));
            Value::Object(m)
        }
        other => other,
    }
}

/// `fields=` of a show request.
pub fn fields_of(raw: Option<&str>) -> Vec<String> {
    pairs(raw)
        .into_iter()
        .filter(|(k, _)| k == "fields")
        .flat_map(|(_, v)| split_tags(&v).collect::<Vec<_>>())
        .collect()
}

fn compare(a: &Value, b: &Value) -> Ordering {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x
            .as_f64()
            .partial_cmp(&y.as_f64())
            .unwrap_or(Ordering::Equal),
        (Value::String(x), Value::String(y)) => x.cmp(y),
        (Value::Bool(x), Value::Bool(y)) => x.cmp(y),
        (Value::Null, Value::Null) => Ordering::Equal,
        (Value::Null, _) => Ordering::Less,
        (_, Value::Null) => Ordering::Greater,
        _ => a.to_string().cmp(&b.to_string()),
    }
}

/// Neutron's filter matching: strings exactly, booleans case-insensitively, lists by
/// membership, and `fixed_ips=ip_address=X` / `subnet_id=Y` inside address lists.
fn value_matches(attr: &Value, want: &str) -> bool {
    match attr {
        Value::String(s) => s == want,
        Value::Bool(b) => want.eq_ignore_ascii_case(if *b { "true" } else { "false" }),
        Value::Number(n) => n.to_string() == want,
        Value::Null => want.is_empty() || want == "None",
        Value::Array(items) => match want.split_once('=') {
            Some((k, v)) => items.iter().any(|i| i[k].as_str() == Some(v)),
            None => items.iter().any(|i| i.as_str() == Some(want)),
        },
        Value::Object(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn objs() -> Vec<Value> {
        vec![
            json!({"id": "a", "name": "x", "tags": ["red"], "admin_state_up": true,
                   "fixed_ips": [{"subnet_id": "s", "ip_address": "10.0.0.5"}]}),
            json!({"id": "b", "name": "y", "tags": ["red", "blue"], "admin_state_up": false,
                   "fixed_ips": []}),
            json!({"id": "c", "name": "x", "tags": [], "admin_state_up": true, "fixed_ips": []}),
        ]
    }

    fn ids(q: &str) -> Vec<String> {
        let q = ListQuery::parse(Some(q)).unwrap();
        let kept: Vec<Value> = objs().into_iter().filter(|o| q.matches(o)).collect();
        q.answer(kept, "ports", "/v2.0/ports")["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["id"].as_str().unwrap_or("").to_string())
            .collect()
    }

    #[test]
    fn filters_follow_neutron() {
        assert_eq!(ids("name=x"), ["a", "c"]);
        assert_eq!(ids("name=x&name=y"), ["a", "b", "c"]);
        assert_eq!(ids("admin_state_up=False"), ["b"]);
        assert_eq!(ids("fixed_ips=ip_address%3D10.0.0.5"), ["a"]);
        assert_eq!(ids("tags=red,blue"), ["b"]);
        assert_eq!(ids("tags-any=blue,red"), ["a", "b"]);
        assert_eq!(ids("not-tags=red,blue"), ["a", "c"]);
        assert_eq!(ids("not-tags-any=blue"), ["a", "c"]);
        assert_eq!(ids("sort_key=name&sort_dir=desc"), ["b", "a", "c"]);
    }

    #[test]
    fn pages_walk_forward_with_links() {
        let q = ListQuery::parse(Some("limit=2")).unwrap();
        let page = q.answer(objs(), "ports", "/v2.0/ports");
        assert_eq!(page["ports"].as_array().unwrap().len(), 2);
        let next = page["ports_links"][0]["href"].as_str().unwrap();
        assert!(next.ends_with("marker=b"), "{next}");
        let q = ListQuery::parse(Some("limit=2&marker=b")).unwrap();
        let page = q.answer(objs(), "ports", "/v2.0/ports");
        assert_eq!(page["ports"][0]["id"], "c");
        assert_eq!(page["ports_links"][0]["rel"], "previous");
        assert!(ListQuery::parse(Some("limit=x")).is_err());
    }

    #[test]
    fn fields_project() {
        let q = ListQuery::parse(Some("fields=id&fields=name")).unwrap();
        let page = q.answer(objs(), "ports", "/v2.0/ports");
        assert_eq!(page["ports"][0], json!({"id": "a", "name": "x"}));
    }
}

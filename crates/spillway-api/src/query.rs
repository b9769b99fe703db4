//! The query strings of the API, one struct each: the manager deserialises them
//! (`axum::extract::Query`, unknown fields refused) and the callers encode them with
//! `encode`, so both sides name the same fields. `encode` writes the fields in their
//! declared order, leaves out the absent ones, and gives "" when none is present.

use crate::model::StageScope;
use serde::Deserialize;
use std::fmt::Display;

/// `GET /stages`: the stages of an instance, of a session, in a state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageListQuery {
    pub instance: Option<u64>,
    pub session: Option<u64>,
    /// Text, not `StageState`: the manager answers an unknown state with the list of
    /// valid ones instead of serde's message.
    pub state: Option<String>,
}

/// `GET /stages/{id}`: wait up to `wait` seconds for the stage to end.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaitQuery {
    pub wait: Option<u64>,
}

/// `GET /instances/{id}/stage_counts`: the counts of a path or a tree, waiting up to
/// `wait` seconds for nothing to be pending.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CountsQuery {
    pub path: String,
    pub scope: Option<StageScope>,
    pub wait: Option<u64>,
}

/// `GET /instances/{id}/stage_failures`: a page of failure records, in path order
/// after the cursor `after`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailuresQuery {
    pub after: Option<String>,
    pub limit: Option<u32>,
}

/// `DELETE /sessions/{id}` and `/instances/{id}`: with `hurry`, pending stage-outs
/// are dropped instead of waited for.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DestroyQuery {
    pub hurry: Option<bool>,
}

/// `GET /agents/{node}/work`: the agent's long poll.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkQuery {
    /// The version of the agent's last answer: wait until something changes.
    pub version: Option<u64>,
    /// Longest wait, seconds.
    pub wait: Option<u64>,
}

/// Builds `?k=v&k=v`, values percent-encoded (`escape_query`).
#[derive(Default)]
struct Encoder(String);

impl Encoder {
    fn pair(&mut self, key: &str, value: Option<impl Display>) -> &mut Self {
        if let Some(v) = value {
            self.0.push(if self.0.is_empty() { '?' } else { '&' });
            self.0.push_str(key);
            self.0.push('=');
            self.0.push_str(&escape_query(&v.to_string()));
        }
        self
    }

    fn done(&mut self) -> String {
        std::mem::take(&mut self.0)
    }
}

impl StageListQuery {
    pub fn encode(&self) -> String {
        Encoder::default()
            .pair("instance", self.instance)
            .pair("session", self.session)
            .pair("state", self.state.as_deref())
            .done()
    }
}

impl WaitQuery {
    pub fn encode(&self) -> String {
        Encoder::default().pair("wait", self.wait).done()
    }
}

impl CountsQuery {
    pub fn encode(&self) -> String {
        Encoder::default()
            .pair("path", Some(&self.path))
            .pair("scope", self.scope.map(scope_word))
            .pair("wait", self.wait)
            .done()
    }
}

impl FailuresQuery {
    pub fn encode(&self) -> String {
        Encoder::default()
            .pair("after", self.after.as_deref())
            .pair("limit", self.limit)
            .done()
    }
}

impl DestroyQuery {
    pub fn encode(&self) -> String {
        Encoder::default().pair("hurry", self.hurry).done()
    }
}

impl WorkQuery {
    pub fn encode(&self) -> String {
        Encoder::default()
            .pair("version", self.version)
            .pair("wait", self.wait)
            .done()
    }
}

/// `StageScope` as its serde name (the manager deserialises it from the query).
fn scope_word(s: StageScope) -> &'static str {
    match s {
        StageScope::File => "file",
        StageScope::Tree => "tree",
    }
}

/// Percent-encode a query value: everything but RFC 3986's unreserved characters and
/// `/` (paths stay readable in logs; `/` means nothing special inside a query).
pub fn escape_query(s: &str) -> String {
    escape(s, b"-_.~/")
}

/// Percent-encode a path segment (a pool or node name): everything but RFC 3986's
/// unreserved characters. Names the manager accepts are plain (letters, digits,
/// `_.-`), but a typo may hold `/` or `?`; escaped, it reaches the manager as the wrong
/// name and gets a clear "no such" answer instead of another route.
pub fn escape_segment(s: &str) -> String {
    escape(s, b"-_.~")
}

fn escape(s: &str, keep: &[u8]) -> String {
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        if b.is_ascii_alphanumeric() || keep.contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes() {
        assert_eq!(escape_query("/a b&c=d%"), "/a%20b%26c%3Dd%25");
        assert_eq!(escape_segment("wlm_pool"), "wlm_pool");
        assert_eq!(escape_segment("a/b?c d"), "a%2Fb%3Fc%20d");
    }

    #[test]
    fn encodes_in_field_order_without_absent_fields() {
        assert_eq!(StageListQuery::default().encode(), "");
        let q = StageListQuery {
            instance: Some(3),
            session: None,
            state: Some("deferred".into()),
        };
        assert_eq!(q.encode(), "?instance=3&state=deferred");
        let c = CountsQuery {
            path: "/x y".into(),
            scope: Some(StageScope::Tree),
            wait: Some(5),
        };
        assert_eq!(c.encode(), "?path=/x%20y&scope=tree&wait=5");
        let f = FailuresQuery {
            after: Some(String::new()),
            limit: Some(64),
        };
        assert_eq!(f.encode(), "?after=&limit=64");
        assert_eq!(DestroyQuery { hurry: Some(true) }.encode(), "?hurry=true");
        assert_eq!(DestroyQuery::default().encode(), "");
        let w = WorkQuery {
            version: Some(7),
            wait: Some(25),
        };
        assert_eq!(w.encode(), "?version=7&wait=25");
        assert_eq!(WaitQuery { wait: Some(30) }.encode(), "?wait=30");
    }

    #[test]
    fn scope_words_are_serde_names() {
        for s in [StageScope::File, StageScope::Tree] {
            assert_eq!(
                serde_json::to_value(s).ok(),
                Some(serde_json::Value::from(scope_word(s)))
            );
        }
    }
}

//! `--json`: the manager's answer as received, only re-indented.
//!
//! The answer is kept as raw text (`serde_json::value::RawValue`) rather than parsed into
//! a `serde_json::Value`, whose maps sort their keys: users should see fields in the
//! manager's order (`id` first) and numbers exactly as sent.

use serde_json::value::RawValue;

/// Re-indent JSON text the way `serde_json::to_string_pretty` lays it out (two spaces,
/// `"key": value`, empty containers as `[]` and `{}`), leaving every token as it is.
/// The text must be valid JSON; it always is here, because it went through serde_json
/// on its way in.
pub fn pretty(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len() * 2);
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    let mut chars = raw.chars().peekable();
    let newline = |out: &mut String, depth: usize| {
        out.push('\n');
        out.extend(std::iter::repeat_n("  ", depth));
    };
    while let Some(c) = chars.next() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                out.push(c);
            }
            '{' | '[' => {
                while chars.peek().is_some_and(|n| n.is_whitespace()) {
                    chars.next();
                }
                let close = if c == '{' { '}' } else { ']' };
                out.push(c);
                if chars.peek() == Some(&close) {
                    chars.next();
                    out.push(close);
                } else {
                    depth += 1;
                    newline(&mut out, depth);
                }
            }
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                newline(&mut out, depth);
                out.push(c);
            }
            ',' => {
                out.push(',');
                newline(&mut out, depth);
            }
            ':' => out.push_str(": "),
            c if c.is_whitespace() => {}
            c => out.push(c),
        }
    }
    out.push('\n');
    out
}

/// Several list answers (`{"pools":[...]}`, `{"sessions":[...]}`) as one object with
/// each answer's members in turn, for `dwstat most --json`. List answers have one
/// member each, so answer order is member order.
pub fn merge(answers: &[&RawValue]) -> Result<String, String> {
    let mut members = Vec::new();
    for a in answers {
        let map: std::collections::BTreeMap<String, Box<RawValue>> = serde_json::from_str(a.get())
            .map_err(|e| format!("unexpected answer from the manager: {e}"))?;
        for (k, v) in map {
            let key = serde_json::to_string(&k).map_err(|e| e.to_string())?;
            members.push(format!("{key}:{}", v.get()));
        }
    }
    Ok(format!("{{{}}}", members.join(",")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pretty_matches_serde_json_layout() {
        let raw = r#"{"a":[1,2,{"b":"x, y: {z}","c":[]}],"d":{},"e":"q\"[,"}"#;
        let v: serde_json::Value = serde_json::from_str(raw).unwrap();
        // keys are already sorted, so serde_json's own layout is the reference
        assert_eq!(
            pretty(raw),
            serde_json::to_string_pretty(&v).unwrap() + "\n"
        );
    }

    #[test]
    fn pretty_keeps_field_order() {
        assert_eq!(
            pretty(r#"{ "id": 3, "capacity": 10 }"#),
            "{\n  \"id\": 3,\n  \"capacity\": 10\n}\n"
        );
    }

    #[test]
    fn merges_list_answers() {
        let a = RawValue::from_string(r#"{"pools":[{"id":"p"}]}"#.into()).unwrap();
        let b = RawValue::from_string(r#"{"sessions":[]}"#.into()).unwrap();
        assert_eq!(
            merge(&[&a, &b]).unwrap(),
            r#"{"pools":[{"id":"p"}],"sessions":[]}"#
        );
    }
}

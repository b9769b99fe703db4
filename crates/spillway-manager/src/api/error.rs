//! API errors: every failure is a JSON `{"error": ..., "choices": [...]}` with a 4xx
//! status for anything the caller can fix; 500 only for the manager's own faults.

use crate::db::DbError;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use spillway_api::ErrorBody;

/// The longest error message the API answers, in bytes: a safety net behind `cut` for
/// texts made by libraries (serde, axum) that may quote input of their own.
pub(super) const MESSAGE_MAX: usize = 1024;

use crate::echo::{cut, cut_to, LIBRARY_TEXT_MAX};

/// `message` cut to `MESSAGE_MAX` bytes (on a character boundary), `…` marking a cut.
fn bounded(mut message: String) -> String {
    if message.len() > MESSAGE_MAX {
        let mut at = MESSAGE_MAX;
        while !message.is_char_boundary(at) {
            at -= 1;
        }
        message.truncate(at);
        message.push('…');
    }
    message
}

#[derive(Debug)]
pub struct ApiErr {
    pub status: StatusCode,
    pub message: String,
    pub choices: Option<Vec<String>>,
}

impl ApiErr {
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiErr {
        ApiErr {
            status,
            message: message.into(),
            choices: None,
        }
    }

    pub fn bad(message: impl Into<String>) -> ApiErr {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn forbidden(message: impl Into<String>) -> ApiErr {
        Self::new(StatusCode::FORBIDDEN, message)
    }

    pub fn internal(message: impl Into<String>) -> ApiErr {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    /// A JSON body serde refused. For an unknown enum value the valid ones are listed
    /// in `choices` (serde says "expected one of `a`, `b`").
    pub fn from_json(e: &str) -> ApiErr {
        // serde lists the valid values as "expected one of `a`, `b`, `c`" or, for two,
        // "expected `a` or `b`".
        let choices = e
            .split_once("unknown variant")
            .or_else(|| e.split_once("unknown field"))
            // The last "expected": the input quoted before it may hold the word too.
            .and_then(|(_, rest)| rest.rsplit_once("expected "))
            .map(|(_, list)| {
                // serde's own list of valid names (from the types, not the input).
                let list = list.strip_prefix("one of ").unwrap_or(list);
                let list = list.split(" at line ").next().unwrap_or(list);
                list.split('`')
                    .skip(1)
                    .step_by(2)
                    .take(64)
                    .map(cut)
                    .collect::<Vec<_>>()
            });
        ApiErr {
            status: StatusCode::BAD_REQUEST,
            message: format!("invalid request body: {}", cut_to(e, LIBRARY_TEXT_MAX)),
            choices: choices.filter(|c| !c.is_empty()),
        }
    }
}

impl From<DbError> for ApiErr {
    fn from(e: DbError) -> ApiErr {
        let status = match &e {
            DbError::NotFound(_) => StatusCode::NOT_FOUND,
            DbError::Conflict(_) | DbError::NoSpace(_) => StatusCode::CONFLICT,
            DbError::Invalid(_) => StatusCode::BAD_REQUEST,
            DbError::Forbidden(_) => StatusCode::FORBIDDEN,
            DbError::Sql(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        if status == StatusCode::INTERNAL_SERVER_ERROR {
            tracing::error!("{e}");
        }
        ApiErr::new(status, e.to_string())
    }
}

impl IntoResponse for ApiErr {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: bounded(self.message),
            choices: self.choices,
        };
        (self.status, Json(body)).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::echo::{quoted, ECHO_MAX};

    #[test]
    fn cut_bounds_echoed_input() {
        assert_eq!(cut("short"), "short");
        assert_eq!(quoted("a\"b"), "\"a\\\"b\"");
        let exact = "x".repeat(ECHO_MAX);
        assert_eq!(cut(&exact), exact);
        let big = "é".repeat(1 << 20);
        let c = cut(&big);
        assert_eq!(c.chars().count(), ECHO_MAX + 1);
        assert!(c.ends_with('…'));
        let q = quoted(&"y".repeat(1 << 20));
        assert_eq!(q, format!("{:?}…", "y".repeat(ECHO_MAX)));
        // The last net: any message is at most MESSAGE_MAX bytes (+ the mark).
        let m = bounded("ü".repeat(MESSAGE_MAX));
        assert!(m.len() <= MESSAGE_MAX + '…'.len_utf8() && m.ends_with('…'));
        assert_eq!(bounded("ok".into()), "ok");
        // A serde message quoting a 1 MB unknown variant stays short.
        let body = format!(
            r#"{{"instance":1,"type":"{}","access_mode":"stripe"}}"#,
            "z".repeat(1 << 20)
        );
        let e = serde_json::from_str::<spillway_api::NewConfiguration>(&body)
            .unwrap_err()
            .to_string();
        assert!(ApiErr::from_json(&e).message.len() < 1024);
    }

    #[test]
    fn choices_from_serde() {
        let e = serde_json::from_str::<spillway_api::NewConfiguration>(
            r#"{"instance":1,"type":"scatch","access_mode":"stripe"}"#,
        )
        .unwrap_err()
        .to_string();
        let a = ApiErr::from_json(&e);
        assert_eq!(
            a.choices,
            Some(vec!["scratch".into(), "cache".into(), "swap".into()])
        );
        let e = serde_json::from_str::<spillway_api::NewInstance>(
            r#"{"session":1,"capacity":1,"policy":"fast"}"#,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            ApiErr::from_json(&e).choices,
            Some(vec!["bandwidth".into(), "isolation".into()])
        );
        assert_eq!(ApiErr::from_json("expected value at line 1").choices, None);
    }
}

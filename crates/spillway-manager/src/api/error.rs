//! API errors: every failure is a JSON `{"error": ..., "choices": [...]}` with a 4xx
//! status for anything the caller can fix; 500 only for the manager's own faults.

use crate::db::DbError;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use spillway_api::ErrorBody;

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
            .and_then(|(_, rest)| rest.split_once("expected "))
            .map(|(_, list)| {
                let list = list.strip_prefix("one of ").unwrap_or(list);
                let list = list.split(" at line ").next().unwrap_or(list);
                list.split('`')
                    .skip(1)
                    .step_by(2)
                    .map(String::from)
                    .collect::<Vec<_>>()
            });
        ApiErr {
            status: StatusCode::BAD_REQUEST,
            message: format!("invalid request body: {e}"),
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
            error: self.message,
            choices: self.choices,
        };
        (self.status, Json(body)).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

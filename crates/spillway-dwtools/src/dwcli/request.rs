//! What a create, update or rm sends (method, path, JSON body), built without a
//! manager so the tests can check it, and `send`, which makes the one request and
//! prints its answer as JSON or as the command's summary line.

use crate::connect::{Answer, Failure, Manager};
use crate::json;
use serde_json::Value;

/// HTTP method of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Post,
    Patch,
    Delete,
}

/// What a create, update or rm sends: method, path, JSON body.
#[derive(Debug, PartialEq)]
pub struct Request {
    pub method: Method,
    pub path: String,
    pub body: Option<Value>,
}

fn to_json<T: serde::Serialize>(t: &T) -> Value {
    // The request types are plain structs of strings, numbers and enums, which always
    // serialise; Null would make the manager answer with a clear error anyway.
    serde_json::to_value(t).unwrap_or(Value::Null)
}

/// A create: `body` posted to the collection at `path`.
pub(super) fn post<T: serde::Serialize>(path: &str, body: &T) -> Request {
    Request {
        method: Method::Post,
        path: path.to_string(),
        body: Some(to_json(body)),
    }
}

/// An update: `body` patched onto the object at `path`.
pub(super) fn patch<T: serde::Serialize>(path: String, body: &T) -> Request {
    Request {
        method: Method::Patch,
        path,
        body: Some(to_json(body)),
    }
}

/// A removal of the object at `path`.
pub(super) fn delete(path: String) -> Request {
    Request {
        method: Method::Delete,
        path,
        body: None,
    }
}

/// Send one request; the answer as JSON or as its summary line.
pub(super) fn send(
    m: &Manager,
    req: &Request,
    json: bool,
    summary: impl FnOnce(&Answer) -> Result<String, Failure>,
) -> Result<String, Failure> {
    let body = req.body.as_ref().unwrap_or(&Value::Null);
    let answer = match req.method {
        Method::Post => m.post(&req.path, body)?,
        Method::Patch => m.patch(&req.path, body)?,
        Method::Delete => m.delete(&req.path)?,
    };
    if json {
        Ok(json::pretty(answer.raw()))
    } else {
        summary(&answer)
    }
}

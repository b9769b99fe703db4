//! What the tests of `dwcli`'s commands share: a command line parsed, the request it
//! sends, its usage error, a fixture object as a manager's answer.

use super::*;
use crate::connect::Answer;
use serde_json::value::RawValue;
use serde_json::Value;

pub(super) fn parse(line: &str) -> Result<Cli, clap::Error> {
    Cli::try_parse_from(line.split_whitespace())
}

pub(super) fn ok(line: &str) -> Cli {
    parse(line).unwrap_or_else(|e| panic!("{line}: {e}"))
}

/// The request a command line sends.
pub(super) fn req(line: &str) -> Request {
    match ok(line).verb {
        Verb::Create { what } => create_request(&what),
        Verb::Update { what } => update_request(&what),
        Verb::Rm { what } => rm_request(&what),
        Verb::Ls { .. } => panic!("{line}: ls sends no body"),
        Verb::Stage { .. } => panic!("{line}: see stage_command_lines"),
    }
}

pub(super) fn post(path: &str, body: Value) -> Request {
    Request {
        method: Method::Post,
        path: path.into(),
        body: Some(body),
    }
}

/// The usage error of a command line, as text; its exit code must be 2.
pub(super) fn usage_error(line: &str) -> String {
    let e = parse(line).expect_err(line);
    assert_eq!(e.exit_code(), 2, "{line}: {e}");
    e.to_string()
}

/// One object of a fixture list as the answer to a create.
pub(super) fn answer(fixture: &str, key: &str, i: usize) -> Answer {
    let v: Value = serde_json::from_str(fixture).unwrap();
    Answer(RawValue::from_string(v[key][i].to_string()).unwrap())
}

//! Reaching the manager: the client configuration file (the MUNGE-authenticated client
//! is `ApiClient::munge`), answers kept as raw JSON for `--json`, and how a failure is
//! told to the user.

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::value::RawValue;
use spillway_api::config::ClientConfig;
use spillway_api::{ApiClient, ApiError};
use std::path::Path;
use std::time::Duration;

/// Why a command failed. Usage errors exit 2 (as clap's do), everything else 1.
#[derive(Debug)]
pub enum Failure {
    Usage(String),
    Api(ApiError),
    Other(String),
}

impl From<ApiError> for Failure {
    fn from(e: ApiError) -> Failure {
        Failure::Api(e)
    }
}

impl From<String> for Failure {
    fn from(e: String) -> Failure {
        Failure::Other(e)
    }
}

impl Failure {
    pub fn exit_code(&self) -> i32 {
        match self {
            Failure::Usage(_) => 2,
            _ => 1,
        }
    }

    /// The lines for stderr, each starting with `prog: `. The manager's `choices` (the
    /// valid values of a field it refused) get a line of their own.
    pub fn report(&self, prog: &str) -> String {
        match self {
            Failure::Api(ApiError::Status {
                message, choices, ..
            }) => {
                let mut s = format!("{prog}: {message}\n");
                if let Some(c) = choices.as_ref().filter(|c| !c.is_empty()) {
                    s.push_str(&format!("{prog}: valid choices: {}\n", c.join(", ")));
                }
                s
            }
            Failure::Api(e) => format!("{prog}: {e}\n"),
            Failure::Usage(m) | Failure::Other(m) => format!("{prog}: {m}\n"),
        }
    }
}

/// Longest a dwstat request may take, connecting included. dwstat only reads one
/// list per table, which the manager answers from its database without waiting on
/// storage servers; a manager that takes longer than this is not going to answer.
pub const STAT_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest a dwcli request may take. Creating an instance allocates its fragments
/// inside the request, which can take longer than a read.
pub const CLI_TIMEOUT: Duration = Duration::from_secs(60);

/// The manager's client, as the configuration file at `config` (or `$SPILLWAY_CONFIG`,
/// or /etc/spillway/spillway.conf) says.
pub fn client(config: Option<&Path>, timeout: Duration) -> Result<Manager, Failure> {
    let cfg = ClientConfig::load(&ClientConfig::locate(config))?;
    Ok(Manager {
        api: ApiClient::munge(&cfg, timeout)?,
    })
}

/// The manager, answering raw JSON: `--json` prints it as received, tables and
/// summaries parse it into the API's types.
pub struct Manager {
    api: ApiClient,
}

/// An answer: its raw text, parsed on demand.
pub struct Answer(pub Box<RawValue>);

impl Answer {
    pub fn raw(&self) -> &str {
        self.0.get()
    }

    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, Failure> {
        serde_json::from_str(self.raw())
            .map_err(|e| Failure::Other(format!("unexpected answer from the manager: {e}")))
    }
}

impl Manager {
    /// The typed client underneath (the job phases use it directly).
    pub fn api(&self) -> &ApiClient {
        &self.api
    }

    pub fn get(&self, path: &str) -> Result<Answer, Failure> {
        Ok(Answer(self.api.get(path)?))
    }

    pub fn post<B: Serialize>(&self, path: &str, body: &B) -> Result<Answer, Failure> {
        Ok(Answer(self.api.post(path, body)?))
    }

    pub fn patch<B: Serialize>(&self, path: &str, body: &B) -> Result<Answer, Failure> {
        Ok(Answer(self.api.patch(path, body)?))
    }

    pub fn delete(&self, path: &str) -> Result<Answer, Failure> {
        Ok(Answer(self.api.delete(path)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_manager_message_and_choices() {
        let f = Failure::Api(ApiError::Status {
            status: 400,
            message: "invalid request body: unknown variant `scatch`".into(),
            choices: Some(vec!["scratch".into(), "cache".into(), "swap".into()]),
        });
        assert_eq!(f.exit_code(), 1);
        assert_eq!(
            f.report("dwcli"),
            "dwcli: invalid request body: unknown variant `scatch`\n\
             dwcli: valid choices: scratch, cache, swap\n"
        );
        let f = Failure::Api(ApiError::Status {
            status: 404,
            message: "no pool \"x\"".into(),
            choices: None,
        });
        assert_eq!(f.report("dwstat"), "dwstat: no pool \"x\"\n");
        assert_eq!(Failure::Usage("u".into()).exit_code(), 2);
    }

    #[test]
    fn unreadable_config_is_an_error_not_a_panic() {
        let e = client(Some(Path::new("/nonexistent/spillway.conf")), STAT_TIMEOUT)
            .err()
            .map(|f| f.report("dwstat"))
            .unwrap_or_default();
        assert!(
            e.starts_with("dwstat: cannot read /nonexistent/spillway.conf"),
            "{e}"
        );
    }
}

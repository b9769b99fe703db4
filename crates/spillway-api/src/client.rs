//! HTTPS client of the manager: trusts only the site CA, sends a fresh MUNGE credential
//! with every request (munged refuses a replayed one), and turns 4xx/5xx answers into
//! `ApiError::Status` with the manager's message.

use crate::config::ClientConfig;
use crate::model::ErrorBody;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::path::Path;
use std::time::Duration;
use ureq::http::Response;
use ureq::tls::{Certificate, RootCerts, TlsConfig};
use ureq::Body;

/// The header with which an admin asks the manager to authorise a request as another
/// user (its value: the uid, decimal). The manager refuses it (403) from anyone else.
pub const ACT_AS_HEADER: &str = "X-Spillway-As-Uid";

/// Makes one credential per request (e.g. `munge_encode`).
pub type CredentialSource = Box<dyn Fn() -> Result<String, String> + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The manager answered with an error status.
    #[error("{message}")]
    Status {
        status: u16,
        message: String,
        choices: Option<Vec<String>>,
    },
    /// No answer (connection refused, TLS failure, timeout).
    #[error("cannot reach the manager at {url}: {detail}")]
    Unreachable { url: String, detail: String },
    /// An answer that is not what the API promises.
    #[error("unexpected answer from the manager: {0}")]
    Protocol(String),
    #[error("{0}")]
    Local(String),
}

impl ApiError {
    pub fn status(&self) -> Option<u16> {
        match self {
            ApiError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

pub struct ApiClient {
    base: String,
    agent: ureq::Agent,
    credential: CredentialSource,
}

/// Read a PEM bundle of CA certificates.
pub fn load_ca(path: &Path) -> Result<Vec<Certificate<'static>>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("cannot read CA {}: {e}", path.display()))?;
    let mut certs = Vec::new();
    for item in ureq::tls::parse_pem(&pem) {
        match item {
            Ok(ureq::tls::PemItem::Certificate(c)) => certs.push(c),
            Ok(_) => {}
            Err(e) => return Err(format!("CA {}: {e}", path.display())),
        }
    }
    if certs.is_empty() {
        return Err(format!("CA {}: no certificate in it", path.display()));
    }
    Ok(certs)
}

impl ApiClient {
    /// `base`: `https://host:port`. `timeout`: the longest a request may take.
    pub fn new(
        base: &str,
        ca: &Path,
        credential: CredentialSource,
        timeout: Duration,
    ) -> Result<ApiClient, ApiError> {
        let certs = load_ca(ca).map_err(ApiError::Local)?;
        let tls = TlsConfig::builder()
            .root_certs(RootCerts::new_with_certs(&certs))
            .build();
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .tls_config(tls)
            .http_status_as_error(false)
            .timeout_global(Some(timeout))
            .timeout_connect(Some(Duration::from_secs(5)))
            .build()
            .into();
        Ok(ApiClient {
            base: base.trim_end_matches('/').to_string(),
            agent,
            credential,
        })
    }

    /// The client every command and daemon uses: the manager and CA the client
    /// configuration names, a fresh MUNGE credential (of this process's user) per
    /// request — munged refuses a replayed one.
    pub fn munge(cfg: &ClientConfig, timeout: Duration) -> Result<ApiClient, ApiError> {
        let munge = spillway_munge::Munge::new(cfg.munge_socket.clone());
        let credential: CredentialSource = Box::new(move || {
            munge
                .encode(b"")
                .map_err(|e| format!("cannot get a MUNGE credential: {e}"))
        });
        ApiClient::new(&cfg.manager_url, &cfg.ca_file, credential, timeout)
    }

    fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    fn auth(&self) -> Result<String, ApiError> {
        let cred = (self.credential)().map_err(ApiError::Local)?;
        Ok(format!("MUNGE cred={cred}"))
    }

    fn unreachable(&self, e: ureq::Error) -> ApiError {
        ApiError::Unreachable {
            url: self.base.clone(),
            detail: e.to_string(),
        }
    }

    fn finish<T: DeserializeOwned>(&self, resp: Response<Body>) -> Result<T, ApiError> {
        let status = resp.status().as_u16();
        let text = resp
            .into_body()
            .with_config()
            .limit(256 << 20)
            .read_to_string()
            .map_err(|e| ApiError::Protocol(e.to_string()))?;
        if status >= 400 {
            let (message, choices) = match serde_json::from_str::<ErrorBody>(&text) {
                Ok(b) => (b.error, b.choices),
                Err(_) => (format!("HTTP {status}: {}", text.trim()), None),
            };
            return Err(ApiError::Status {
                status,
                message,
                choices,
            });
        }
        serde_json::from_str(&text).map_err(|e| ApiError::Protocol(format!("{e}: {text}")))
    }

    pub fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ApiError> {
        self.get_as(None, path)
    }

    /// GET as the user `as_uid` (`ACT_AS_HEADER`; the credential's user must be an admin).
    pub fn get_as<T: DeserializeOwned>(
        &self,
        as_uid: Option<u32>,
        path: &str,
    ) -> Result<T, ApiError> {
        let mut req = self
            .agent
            .get(&self.url(path))
            .header("Authorization", &self.auth()?);
        if let Some(u) = as_uid {
            req = req.header(ACT_AS_HEADER, &u.to_string());
        }
        let resp = req.call().map_err(|e| self.unreachable(e))?;
        self.finish(resp)
    }

    pub fn delete<T: DeserializeOwned>(&self, path: &str) -> Result<T, ApiError> {
        let resp = self
            .agent
            .delete(&self.url(path))
            .header("Authorization", &self.auth()?)
            .call()
            .map_err(|e| self.unreachable(e))?;
        self.finish(resp)
    }

    /// A request with a JSON body: `method` POST, PATCH or PUT (anything else is PUT),
    /// as the user `as_uid` if given (`ACT_AS_HEADER`).
    pub fn send_as<B: Serialize, T: DeserializeOwned>(
        &self,
        as_uid: Option<u32>,
        method: &str,
        path: &str,
        body: &B,
    ) -> Result<T, ApiError> {
        let url = self.url(path);
        let req = match method {
            "POST" => self.agent.post(&url),
            "PATCH" => self.agent.patch(&url),
            _ => self.agent.put(&url),
        };
        let mut req = req.header("Authorization", &self.auth()?);
        if let Some(u) = as_uid {
            req = req.header(ACT_AS_HEADER, &u.to_string());
        }
        let resp = req.send_json(body).map_err(|e| self.unreachable(e))?;
        self.finish(resp)
    }

    fn send<B: Serialize, T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: &B,
    ) -> Result<T, ApiError> {
        self.send_as(None, method, path, body)
    }

    pub fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ApiError> {
        self.send("POST", path, body)
    }

    pub fn patch<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ApiError> {
        self.send("PATCH", path, body)
    }

    pub fn put<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ApiError> {
        self.send("PUT", path, body)
    }
}

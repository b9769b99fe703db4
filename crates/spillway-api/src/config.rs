//! `key = value` configuration files: one syntax for the manager, the agent and the
//! command line. `#` starts a comment; unknown keys are errors naming the line, so a typo
//! never silently keeps a default.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Where the command line and the agent find the manager, unless told otherwise.
pub const DEFAULT_CLIENT_CONFIG: &str = "/etc/spillway/spillway.conf";

/// Parse `text` into key → value, accepting only `known` keys.
pub fn parse(text: &str, known: &[&str]) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            return Err(format!("line {}: expected `key = value`", n + 1));
        };
        let (k, v) = (k.trim(), v.trim());
        if !known.contains(&k) {
            return Err(format!(
                "line {}: unknown key `{k}` (known: {})",
                n + 1,
                known.join(", ")
            ));
        }
        if out.insert(k.to_string(), v.to_string()).is_some() {
            return Err(format!("line {}: `{k}` given twice", n + 1));
        }
    }
    Ok(out)
}

pub fn read(path: &Path, known: &[&str]) -> Result<BTreeMap<String, String>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    parse(&text, known).map_err(|e| format!("{}: {e}", path.display()))
}

/// What a client of the manager (command line, agent) needs to reach it.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// `https://host:port`
    pub manager_url: String,
    /// PEM file of the CA that signed the manager's certificate.
    pub ca_file: PathBuf,
    /// munged's socket; None: libmunge's default.
    pub munge_socket: Option<PathBuf>,
}

pub const CLIENT_KEYS: &[&str] = &["manager_url", "ca_file", "munge_socket"];

impl ClientConfig {
    pub fn from_map(map: &BTreeMap<String, String>) -> Result<ClientConfig, String> {
        let url = map
            .get("manager_url")
            .ok_or("manager_url is not set")?
            .trim_end_matches('/')
            .to_string();
        if !url.starts_with("https://") {
            return Err(format!("manager_url must start with https:// (got {url})"));
        }
        Ok(ClientConfig {
            manager_url: url,
            ca_file: PathBuf::from(map.get("ca_file").ok_or("ca_file is not set")?),
            munge_socket: map.get("munge_socket").map(PathBuf::from),
        })
    }

    pub fn load(path: &Path) -> Result<ClientConfig, String> {
        Self::from_map(&read(path, CLIENT_KEYS)?).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// `--config`, else `$SPILLWAY_CONFIG`, else the default path.
    pub fn locate(explicit: Option<&Path>) -> PathBuf {
        if let Some(p) = explicit {
            return p.to_path_buf();
        }
        match std::env::var_os("SPILLWAY_CONFIG") {
            Some(p) if !p.is_empty() => PathBuf::from(p),
            _ => PathBuf::from(DEFAULT_CLIENT_CONFIG),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects() {
        let m = parse("a = 1 # c\n\n b=two words \n", &["a", "b"]).unwrap();
        assert_eq!(m["a"], "1");
        assert_eq!(m["b"], "two words");
        assert!(parse("c = 1", &["a"])
            .unwrap_err()
            .contains("unknown key `c`"));
        assert!(parse("a", &["a"]).unwrap_err().contains("line 1"));
        assert!(parse("a=1\na=2", &["a"]).unwrap_err().contains("twice"));
    }

    #[test]
    fn client_config_needs_https() {
        let m = parse("manager_url = http://x\nca_file = /c", CLIENT_KEYS).unwrap();
        assert!(ClientConfig::from_map(&m).is_err());
        let m = parse("manager_url = https://x:1/\nca_file = /c", CLIENT_KEYS).unwrap();
        assert_eq!(
            ClientConfig::from_map(&m).unwrap().manager_url,
            "https://x:1"
        );
    }
}

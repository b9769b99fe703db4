//! The instance descriptor: everything a client needs to mount an instance. Today
//! `spillway cluster up` writes it; the manager hands the same document out later.

use serde::{Deserialize, Serialize};
use std::path::Path;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct InstanceDescriptor {
    /// Instance id, as the servers know it.
    pub instance: u64,
    /// Data-plane addresses (`host:port`) of the instance's servers, in fragment order.
    /// The order is part of the placement function: never reorder a live instance.
    pub servers: Vec<String>,
    /// Instance size in bytes (the sum of its fragments' capacities).
    pub capacity: u64,
    /// Default stripe size in bytes for new files.
    pub stripe_size: u32,
    /// Hex-encoded credential that the servers require in the connection handshake.
    pub credential: String,
    /// A cache instance (docs/cache.md): its namespace is a PFS directory's, served by
    /// its server 0 alone, so every directory entry is that server's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cache: bool,
    /// A load-balanced instance (docs/cache.md §6): read-only, every server holding
    /// every file whole; a client reads from one, chosen by its node's name, and goes
    /// on to the next when that one is down (`spillway_placement::replica_order`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ldbal: bool,
    /// A load-balanced instance: the server this node reads from first, assigned by
    /// the manager (`spillway_placement::replica_of_rank`); None: by the node name's
    /// hash (`replica_of`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<u16>,
}

#[derive(Debug)]
pub enum DescriptorError {
    Io(std::io::Error),
    Parse(String),
    Invalid(String),
}

impl std::fmt::Display for DescriptorError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DescriptorError::Io(e) => write!(f, "cannot read instance descriptor: {e}"),
            DescriptorError::Parse(e) => write!(f, "instance descriptor is not valid JSON: {e}"),
            DescriptorError::Invalid(e) => write!(f, "instance descriptor is invalid: {e}"),
        }
    }
}

impl std::error::Error for DescriptorError {}

/// The most servers one instance may span (the home index of an inode is 16 bits).
pub const MAX_SERVERS: usize = 4096;

impl InstanceDescriptor {
    pub fn load(path: &Path) -> Result<InstanceDescriptor, DescriptorError> {
        let text = std::fs::read_to_string(path).map_err(DescriptorError::Io)?;
        Self::parse(&text)
    }

    pub fn parse(text: &str) -> Result<InstanceDescriptor, DescriptorError> {
        let d: InstanceDescriptor =
            serde_json::from_str(text).map_err(|e| DescriptorError::Parse(e.to_string()))?;
        d.validate()?;
        Ok(d)
    }

    pub fn validate(&self) -> Result<(), DescriptorError> {
        if self.servers.is_empty() {
            return Err(DescriptorError::Invalid("no servers".into()));
        }
        if self.servers.len() > MAX_SERVERS {
            return Err(DescriptorError::Invalid(format!(
                "more than {MAX_SERVERS} servers"
            )));
        }
        if self.stripe_size == 0 || !self.stripe_size.is_multiple_of(4096) {
            return Err(DescriptorError::Invalid(
                "stripe_size must be a non-zero multiple of 4096".into(),
            ));
        }
        if self.stripe_size > crate::tunables::MAX_STRIPE_SIZE {
            return Err(DescriptorError::Invalid(format!(
                "stripe_size must be at most {}",
                crate::tunables::MAX_STRIPE_SIZE
            )));
        }
        if decode_hex(&self.credential).is_none() {
            return Err(DescriptorError::Invalid("credential must be hex".into()));
        }
        Ok(())
    }

    pub fn credential_bytes(&self) -> Vec<u8> {
        decode_hex(&self.credential).unwrap_or_default()
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

pub fn encode_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| s.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> InstanceDescriptor {
        InstanceDescriptor {
            instance: 7,
            servers: vec!["127.0.0.1:1".into(), "127.0.0.1:2".into()],
            capacity: 1 << 30,
            stripe_size: 8 << 20,
            credential: encode_hex(b"secret"),
            cache: false,
            ldbal: false,
            replica: None,
        }
    }

    #[test]
    fn round_trips_through_json() {
        let d = sample();
        assert_eq!(InstanceDescriptor::parse(&d.to_json()).unwrap(), d);
        assert_eq!(d.credential_bytes(), b"secret");
    }

    #[test]
    fn rejects_bad_documents() {
        assert!(InstanceDescriptor::parse("{").is_err());
        assert!(InstanceDescriptor::parse(r#"{"instance":1}"#).is_err());
        let mut d = sample();
        d.stripe_size = 1000;
        assert!(d.validate().is_err());
        let mut d = sample();
        d.servers.clear();
        assert!(d.validate().is_err());
        let mut d = sample();
        d.credential = "zz".into();
        assert!(d.validate().is_err());
        let text = sample()
            .to_json()
            .replace("\"instance\"", "\"bogus\": 1, \"instance\"");
        assert!(InstanceDescriptor::parse(&text).is_err());
    }
}

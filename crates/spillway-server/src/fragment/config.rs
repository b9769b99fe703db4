//! `fragment.json`: who this fragment is (FORMAT.md). Written once at creation.

use crate::error::{fs, StoreError, StoreResult};
use serde::{Deserialize, Serialize};
use spillway_types::descriptor::{decode_hex, encode_hex, MAX_SERVERS};
use spillway_types::tunables::MAX_STRIPE_SIZE;
use spillway_types::{Errno, ServerIndex};
use spillway_wire::FragmentCreateReq;
use std::io::Write;
use std::path::Path;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FragmentConfig {
    pub instance: u64,
    pub index: u16,
    pub peers: Vec<String>,
    pub capacity: u64,
    /// Hex of the credential.
    pub credential: String,
    pub stripe_size: u32,
}

impl FragmentConfig {
    /// The config a create request describes, if it is a valid one.
    pub(crate) fn from_request(req: &FragmentCreateReq) -> StoreResult<FragmentConfig> {
        let c = FragmentConfig {
            instance: req.instance,
            index: req.index,
            peers: req.peers.clone(),
            capacity: req.capacity,
            credential: encode_hex(&req.credential),
            stripe_size: req.stripe_size,
        };
        c.validate().map_err(|_| fs(Errno::EINVAL))?;
        Ok(c)
    }

    fn validate(&self) -> Result<(), String> {
        if self.peers.is_empty() || self.peers.len() > MAX_SERVERS {
            return Err(format!(
                "{} peers (1..={MAX_SERVERS} allowed)",
                self.peers.len()
            ));
        }
        if usize::from(self.index) >= self.peers.len() {
            return Err(format!(
                "index {} outside {} peers",
                self.index,
                self.peers.len()
            ));
        }
        if self.stripe_size == 0
            || !self.stripe_size.is_multiple_of(4096)
            || self.stripe_size > MAX_STRIPE_SIZE
        {
            return Err(format!("bad stripe size {}", self.stripe_size));
        }
        // An empty credential would let anyone in.
        if decode_hex(&self.credential).is_none_or(|c| c.is_empty()) {
            return Err("credential missing or not hex".into());
        }
        Ok(())
    }

    pub(crate) fn count(&self) -> u16 {
        self.peers.len() as u16
    }

    pub(crate) fn server_index(&self) -> ServerIndex {
        ServerIndex(self.index)
    }

    pub(crate) fn credential_bytes(&self) -> Vec<u8> {
        decode_hex(&self.credential).unwrap_or_default()
    }

    pub(crate) fn load(path: &Path) -> StoreResult<FragmentConfig> {
        let text = std::fs::read_to_string(path)?;
        let c: FragmentConfig = serde_json::from_str(&text)
            .map_err(|e| StoreError::Corrupt(format!("{}: {e}", path.display())))?;
        c.validate()
            .map_err(|e| StoreError::Corrupt(format!("{}: {e}", path.display())))?;
        Ok(c)
    }

    /// Write and fsync (the caller renames the directory into place afterwards). Mode
    /// 0600 from its creation on: the file holds the instance secret.
    pub(crate) fn save(&self, path: &Path) -> StoreResult<()> {
        use std::os::unix::fs::OpenOptionsExt;
        let text =
            serde_json::to_string_pretty(self).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(spillway_types::files::PRIVATE_FILE_MODE)
            .open(path)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req() -> FragmentCreateReq {
        FragmentCreateReq {
            instance: 7,
            index: 1,
            peers: vec!["a:1".into(), "b:2".into()],
            capacity: 1 << 30,
            credential: b"secret".to_vec(),
            stripe_size: 1 << 20,
            root_uid: 0,
            root_gid: 0,
            root_mode: 0o755,
        }
    }

    #[test]
    fn round_trips_and_validates() {
        let dir = tempfile::tempdir().unwrap();
        let c = FragmentConfig::from_request(&req()).unwrap();
        assert_eq!(c.credential_bytes(), b"secret");
        assert_eq!(c.count(), 2);
        let p = dir.path().join("fragment.json");
        c.save(&p).unwrap();
        assert_eq!(FragmentConfig::load(&p).unwrap(), c);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "fragment.json holds the instance secret");
        std::fs::write(&p, "{").unwrap();
        assert!(FragmentConfig::load(&p).is_err());
        for bad in [
            FragmentCreateReq { index: 2, ..req() },
            FragmentCreateReq {
                peers: vec![],
                ..req()
            },
            FragmentCreateReq {
                stripe_size: 100,
                ..req()
            },
            FragmentCreateReq {
                credential: vec![],
                ..req()
            },
        ] {
            assert_eq!(
                FragmentConfig::from_request(&bad).unwrap_err().errno(),
                Errno::EINVAL
            );
        }
    }
}

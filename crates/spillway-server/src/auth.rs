//! Credentials: the server's admin key and the constant-time comparison every
//! handshake uses (so the time a refusal takes tells nothing about the secret).

use spillway_types::descriptor::{decode_hex, encode_hex};
use std::io::Read;
use std::path::Path;

/// Bytes of the admin key.
pub(crate) const ADMIN_KEY_LEN: usize = 32;

/// Compare two byte strings in time that depends only on their lengths.
pub(crate) fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    // black_box keeps the optimiser from turning the fold into an early-exit compare.
    std::hint::black_box(diff) == 0
}

/// `n` bytes from the kernel's CSPRNG.
pub(crate) fn random_bytes(n: usize) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; n];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(buf)
}

/// Load `root/admin.key`, creating it (mode 0600) with a fresh random key if absent.
/// A present but malformed key is an error: replacing it would lock out the admin tool
/// that holds the old one.
pub(crate) fn load_or_create_admin_key(root: &Path) -> Result<Vec<u8>, String> {
    let path = root.join("admin.key");
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            // A key an older version (or a hand) left readable by others becomes 0600.
            spillway_types::files::make_private(&path)
                .map_err(|e| format!("cannot make {} private: {e}", path.display()))?;
            return decode_hex(text.trim())
                .filter(|k| k.len() == ADMIN_KEY_LEN)
                .ok_or_else(|| {
                    format!(
                        "{}: not {} hex-encoded bytes",
                        path.display(),
                        ADMIN_KEY_LEN
                    )
                });
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    }
    let key = random_bytes(ADMIN_KEY_LEN).map_err(|e| format!("cannot get random bytes: {e}"))?;
    // Written under a temporary name and renamed, so a crash never leaves a torn key.
    spillway_types::files::write_atomic(&path, encode_hex(&key).as_bytes(), 0o600)
        .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    tracing::info!("created admin key {}", path.display());
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn constant_time_compare() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"ab"));
        assert!(ct_eq(b"", b""));
    }

    #[test]
    fn admin_key_is_created_once_and_private() {
        let dir = tempfile::tempdir().unwrap();
        let k1 = load_or_create_admin_key(dir.path()).unwrap();
        assert_eq!(k1.len(), ADMIN_KEY_LEN);
        let k2 = load_or_create_admin_key(dir.path()).unwrap();
        assert_eq!(k1, k2);
        let meta = std::fs::metadata(dir.path().join("admin.key")).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let text = std::fs::read_to_string(dir.path().join("admin.key")).unwrap();
        assert_eq!(text.len(), 64);
        std::fs::write(dir.path().join("admin.key"), "zz").unwrap();
        assert!(load_or_create_admin_key(dir.path()).is_err());
    }
}

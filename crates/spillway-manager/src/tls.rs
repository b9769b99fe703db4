//! The manager's HTTPS identity: a site CA and a server certificate signed by it,
//! generated once at install (`spillway tls init`), and the rustls setup that serves it.

use std::path::Path;

/// Names and addresses the generated certificate is valid for, besides those given:
/// this host's name, `localhost` and the loopback addresses.
fn default_names() -> Vec<String> {
    let mut names = vec!["localhost".to_string(), "127.0.0.1".into(), "::1".into()];
    if let Ok(h) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
        let h = h.trim();
        if !h.is_empty() && !names.iter().any(|n| n == h) {
            names.push(h.to_string());
        }
    }
    names
}

fn write_file(path: &Path, text: &str, mode: u32) -> Result<(), String> {
    spillway_types::files::write_atomic(path, text.as_bytes(), mode)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Files written by `init` in `dir`.
pub const CA_CERT: &str = "ca.pem";
pub const CA_KEY: &str = "ca.key";
pub const SERVER_CERT: &str = "manager.pem";
pub const SERVER_KEY: &str = "manager.key";

/// Create `dir/{ca.pem,ca.key,manager.pem,manager.key}` unless they exist (an existing
/// CA is kept: clients already trust it). Keys are written mode 0600.
pub fn init(dir: &Path, extra_names: &[String]) -> Result<bool, String> {
    if dir.join(SERVER_CERT).exists() && dir.join(SERVER_KEY).exists() && dir.join(CA_CERT).exists()
    {
        // Keys an older version or a hand left readable by others become 0600; the
        // certificates stay readable (clients need the CA).
        for key in [CA_KEY, SERVER_KEY] {
            let p = dir.join(key);
            spillway_types::files::make_private(&p)
                .map_err(|e| format!("cannot make {} private: {e}", p.display()))?;
        }
        return Ok(false);
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let err = |e: rcgen::Error| format!("certificate generation failed: {e}");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(err)?;
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "Spillway site CA");
    ca_params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    ca_params.not_after = rcgen::date_time_ymd(2099, 1, 1);
    let ca_key = rcgen::KeyPair::generate().map_err(err)?;
    let ca = ca_params.self_signed(&ca_key).map_err(err)?;

    let mut names = default_names();
    for n in extra_names {
        if !names.contains(n) {
            names.push(n.clone());
        }
    }
    let mut params = rcgen::CertificateParams::new(names).map_err(err)?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "Spillway manager");
    params.not_after = rcgen::date_time_ymd(2099, 1, 1);
    let key = rcgen::KeyPair::generate().map_err(err)?;
    let cert = params.signed_by(&key, &ca, &ca_key).map_err(err)?;

    write_file(&dir.join(CA_KEY), &ca_key.serialize_pem(), 0o600)?;
    write_file(&dir.join(CA_CERT), &ca.pem(), 0o644)?;
    write_file(&dir.join(SERVER_KEY), &key.serialize_pem(), 0o600)?;
    write_file(&dir.join(SERVER_CERT), &cert.pem(), 0o644)?;
    Ok(true)
}

/// rustls needs one process-wide crypto provider; ring is the one built in.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_once() {
        let d = tempfile::tempdir().unwrap();
        assert!(init(d.path(), &["node7".into()]).unwrap());
        let first = std::fs::read(d.path().join(CA_CERT)).unwrap();
        assert!(!init(d.path(), &[]).unwrap());
        assert_eq!(std::fs::read(d.path().join(CA_CERT)).unwrap(), first);
        use std::os::unix::fs::PermissionsExt;
        let m = std::fs::metadata(d.path().join(SERVER_KEY)).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o600);
        // A key left 0644 is repaired at the next init; the CA stays readable.
        let key = d.path().join(SERVER_KEY);
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(!init(d.path(), &[]).unwrap());
        let m = std::fs::metadata(&key).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o600);
        let m = std::fs::metadata(d.path().join(CA_CERT)).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o644);
    }
}

//! `spillway stripes PATH`: which server holds each stripe of a file (and `spillway
//! setstripe`, which sets them). The client answers the placement (virtual xattr
//! `user.spillway.layout`); when the caller may read the instance descriptor, the
//! servers are asked how many bytes each stripe holds.

use serde::Deserialize;
use spillway_placement::Layout;
use spillway_types::{InodeNo, InstanceDescriptor, StripeIndex, Tunables};
use spillway_wire::messages::StripeInfoReq;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

#[derive(Deserialize)]
struct LayoutDoc {
    instance: u64,
    ino: u64,
    size: u64,
    stripe_size: u32,
    stripe_width: u16,
    servers: Vec<String>,
    descriptor: PathBuf,
}

fn read_layout(path: &Path) -> Result<LayoutDoc, String> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 64 << 10];
    // SAFETY: valid path and buffer with its true length.
    let n = unsafe {
        libc::getxattr(
            c.as_ptr(),
            c"user.spillway.layout".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        return Err(format!(
            "{}: not a file on a Spillway mount ({e})",
            path.display()
        ));
    }
    buf.truncate(n as usize);
    serde_json::from_slice(&buf).map_err(|e| format!("unexpected layout document: {e}"))
}

pub fn show(path: &Path, json: bool) -> Result<(), String> {
    let doc = read_layout(path)?;
    let n = doc.servers.len() as u16;
    let layout = Layout::of(InodeNo(doc.ino), doc.stripe_size, doc.stripe_width, n);
    let count = doc.size.div_ceil(u64::from(doc.stripe_size));
    // Bytes per stripe: from the servers when we may read the descriptor, else derived
    // from the file size.
    let mut stored: Option<std::collections::HashMap<u64, u64>> = None;
    if let Ok(desc) = InstanceDescriptor::load(&doc.descriptor) {
        if desc.instance == doc.instance {
            let inst =
                spillway_client::Instance::new(desc, &Tunables::default(), "spillway-stripes");
            let mut m = std::collections::HashMap::new();
            for s in layout.servers() {
                let ep = inst.server(s).map_err(|e| e.to_string())?;
                let r = ep
                    .call(&StripeInfoReq {
                        ino: InodeNo(doc.ino),
                    })
                    .map_err(|e| format!("server {}: {e}", s.0))?;
                for st in r.stripes {
                    m.insert(st.stripe, st.len);
                }
            }
            stored = Some(m);
        }
    }
    let mut rows = Vec::new();
    for k in 0..count {
        let s = layout.server_of(StripeIndex(k));
        let logical = (doc.size - k * u64::from(doc.stripe_size)).min(u64::from(doc.stripe_size));
        let bytes = match &stored {
            Some(m) => m.get(&k).copied().unwrap_or(0),
            None => logical,
        };
        rows.push((k, s.0, doc.servers[usize::from(s.0)].clone(), bytes));
    }
    if json {
        let v: Vec<_> = rows
            .iter()
            .map(|(k, s, a, b)| serde_json::json!({"stripe": k, "server": s, "address": a, "bytes": b}))
            .collect();
        println!(
            "{}",
            serde_json::json!({"size": doc.size, "stripe_size": doc.stripe_size, "stripes": v})
        );
        return Ok(());
    }
    for (k, s, a, b) in rows {
        println!("stripe {k} server {s} {a} bytes {b}");
    }
    Ok(())
}

/// Set one of the client's stripe-control attributes on `path`.
pub fn set(path: &Path, name: &str, value: u64) -> Result<(), String> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    let n = std::ffi::CString::new(name).map_err(|e| e.to_string())?;
    let v = value.to_string();
    // SAFETY: valid NUL-terminated strings and a buffer with its true length.
    let r = unsafe { libc::setxattr(c.as_ptr(), n.as_ptr(), v.as_ptr().cast(), v.len(), 0) };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        let why = match e.raw_os_error() {
            Some(libc::EBUSY) => "the file already holds data".to_string(),
            Some(libc::EINVAL) => {
                "invalid value (size: multiple of 4 KiB up to 64 MiB; width: 0..=servers)"
                    .to_string()
            }
            _ => e.to_string(),
        };
        return Err(format!(
            "{}: cannot set {name}={value}: {why}",
            path.display()
        ));
    }
    Ok(())
}

/// `spillway setstripe`: the stripe size and/or width of an empty file or of a
/// directory, then the result as `show` prints it.
pub fn setstripe(path: &Path, size: Option<&str>, width: Option<u16>) -> Result<(), String> {
    if size.is_none() && width.is_none() {
        return Err("give --size and/or --width".into());
    }
    if let Some(s) = size {
        let bytes = crate::args::size_arg("--size", s)?;
        set(path, "user.spillway.stripe_size", bytes)?;
    }
    if let Some(w) = width {
        set(path, "user.spillway.stripe_width", u64::from(w))?;
    }
    show(path, false)
}

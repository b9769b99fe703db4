//! Bounds on what the job tools take in and give back.
//!
//! `dw_wlm_cli` (as the SlurmUser) and `spillway run` (often as root) read files that
//! name comes from outside: the job script, Slurm's node lists. A file is read only if
//! it is a regular file, and never more than a fixed limit of it: a `--job /dev/zero`,
//! a FIFO or a 10 GB file is refused at once with a message, instead of eating memory
//! or hanging. Error messages echo at most [`MAX_SHOWN`] characters of a value: a
//! 10 MB bad value must not come back whole (Slurm stores and shows the tool's output).

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// Slurm's own limit on a batch script (`max_script_size`, 4 MiB by default).
pub const MAX_SCRIPT_BYTES: u64 = 4 << 20;
/// A node list: a host name (at most 64 bytes) per line for a few hundred thousand
/// nodes, far more than any machine has.
pub const MAX_NODE_LIST_BYTES: u64 = 16 << 20;
/// Characters of an outside value shown in an error message.
pub const MAX_SHOWN: usize = 100;
/// An unquoted word (a path, mostly) in an error message is cut beyond this.
pub const MAX_SHOWN_WORD: usize = 200;

/// The whole of the regular file `path` (`what` names it in messages), refused if it
/// is not a regular file or holds more than `limit` bytes.
///
/// Opened with `O_NONBLOCK` (a FIFO cannot hang the open; cleared meaning on regular
/// files) and `O_NOCTTY`; the type is checked on the open descriptor (`fstat`), so a
/// file swapped after a check of the path cannot slip through; reading stops at
/// `limit + 1` bytes whatever the size said (a file that grows meanwhile, or one whose
/// size lies, like those in /proc).
pub fn read_regular(path: &Path, limit: u64, what: &str) -> Result<Vec<u8>, String> {
    let shown = shown_path(path);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| format!("cannot read {what} {shown}: {e}"))?;
    read_open(f, limit, what, &shown)
}

/// [`read_regular`] on a file already open (`shown` names it in messages).
pub fn read_open(f: File, limit: u64, what: &str, shown: &str) -> Result<Vec<u8>, String> {
    let meta = f
        .metadata()
        .map_err(|e| format!("cannot read {what} {shown}: {e}"))?;
    let kind = meta.file_type();
    if !kind.is_file() {
        let is = if kind.is_dir() {
            "a directory"
        } else if kind.is_char_device() || kind.is_block_device() {
            "a device"
        } else if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_socket() {
            "a socket"
        } else {
            "not a regular file"
        };
        return Err(format!("{what} {shown} is {is}, not a regular file"));
    }
    let too_big = || format!("{what} {shown} is larger than {limit} bytes, the most read; refused");
    if meta.len() > limit {
        return Err(too_big());
    }
    let mut out = Vec::with_capacity(meta.len() as usize);
    f.take(limit + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("cannot read {what} {shown}: {e}"))?;
    if out.len() as u64 > limit {
        return Err(too_big());
    }
    Ok(out)
}

/// A path as shown in a message: lossy UTF-8, cut like any other value.
pub fn shown_path(path: &Path) -> String {
    cut(&path.to_string_lossy(), MAX_SHOWN_WORD)
}

/// `v` in quotes (Rust's `{:?}` form), at most [`MAX_SHOWN`] characters of it, then `…`.
pub fn shown(v: &str) -> String {
    match v.char_indices().nth(MAX_SHOWN) {
        None => format!("{v:?}"),
        Some((i, _)) => format!("{:?}…", &v[..i]),
    }
}

/// At most `max` characters of `s`, then `…` if anything was left off.
pub fn cut(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => s.to_string(),
        Some((i, _)) => format!("{}…", &s[..i]),
    }
}

/// An error message with every long value in it cut: a quoted string (`"..."`, as
/// `{:?}` writes it) longer than [`MAX_SHOWN`] characters keeps its first ones and `…`;
/// an unquoted run of non-blank characters longer than [`MAX_SHOWN_WORD`] likewise.
/// Applied where a tool's message leaves it, so no site that formats a value can
/// forget to cut it.
pub fn cut_values(msg: &str) -> String {
    let mut out = String::with_capacity(msg.len().min(4096));
    let mut chars = msg.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '"' {
            // A quoted value: up to the closing quote that is not escaped.
            let mut escaped = false;
            out.push('"');
            let mut closed = false;
            for (n, c) in chars.by_ref().enumerate() {
                if !escaped && c == '"' {
                    closed = true;
                    break;
                }
                escaped = !escaped && c == '\\';
                if n < MAX_SHOWN {
                    out.push(c);
                } else if n == MAX_SHOWN {
                    out.push('…');
                }
            }
            if closed {
                out.push('"');
            }
        } else if c.is_whitespace() {
            out.push(c);
        } else {
            // An unquoted word.
            let mut n = 1usize;
            out.push(c);
            while let Some(&d) = chars.peek() {
                if d.is_whitespace() || d == '"' {
                    break;
                }
                chars.next();
                if n < MAX_SHOWN_WORD {
                    out.push(d);
                } else if n == MAX_SHOWN_WORD {
                    out.push('…');
                }
                n += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn tmp(name: &str) -> std::path::PathBuf {
        let d =
            std::env::temp_dir().join(format!("spillway-jobs-input-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&d);
        d
    }

    #[test]
    fn a_small_regular_file_is_read_whole() {
        let p = tmp("small");
        std::fs::write(&p, b"#!/bin/sh\n#DW swap 1GiB\n").unwrap();
        assert_eq!(
            read_regular(&p, MAX_SCRIPT_BYTES, "the job script").unwrap(),
            b"#!/bin/sh\n#DW swap 1GiB\n"
        );
        // Exactly at the limit: accepted; one byte more: refused.
        assert_eq!(read_regular(&p, 24, "x").unwrap().len(), 24);
        let e = read_regular(&p, 23, "the job script").unwrap_err();
        assert!(e.contains("larger than 23 bytes"), "{e}");
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn devices_fifos_and_directories_are_refused_without_reading() {
        let e =
            read_regular(Path::new("/dev/zero"), MAX_SCRIPT_BYTES, "the job script").unwrap_err();
        assert!(e.contains("is a device, not a regular file"), "{e}");
        let e = read_regular(Path::new("/"), MAX_SCRIPT_BYTES, "the job script").unwrap_err();
        assert!(e.contains("is a directory"), "{e}");
        let p = tmp("fifo");
        let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // No writer: a blocking open would hang here.
        let e = read_regular(&p, MAX_SCRIPT_BYTES, "the job script").unwrap_err();
        assert!(e.contains("is a FIFO"), "{e}");
        std::fs::remove_file(&p).unwrap();
        let e = read_regular(Path::new("/nonexistent/x"), 10, "the node list").unwrap_err();
        assert!(
            e.starts_with("cannot read the node list /nonexistent/x"),
            "{e}"
        );
    }

    #[test]
    fn a_file_growing_past_the_limit_is_cut_at_limit_plus_one() {
        // /proc files say size 0 and give more: reading stops at the limit anyway.
        let e = read_regular(Path::new("/proc/self/maps"), 16, "x").unwrap_err();
        assert!(e.contains("larger than 16 bytes"), "{e}");
        let p = tmp("grow");
        let mut f = File::create(&p).unwrap();
        f.write_all(&[b'a'; 100]).unwrap();
        let r = File::open(&p).unwrap();
        f.write_all(&[b'b'; 100]).unwrap();
        let e = read_open(r, 150, "x", "p").unwrap_err();
        assert!(e.contains("larger than 150"), "{e}");
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn values_are_shown_cut() {
        assert_eq!(shown("abc"), "\"abc\"");
        let long = "x".repeat(10 << 20);
        let s = shown(&long);
        assert_eq!(s, format!("\"{}\"…", "x".repeat(MAX_SHOWN)));
        // Multi-byte characters are cut on a character boundary.
        assert_eq!(shown(&"é".repeat(150)).chars().count(), MAX_SHOWN + 3);
        assert_eq!(cut("abcdef", 3), "abc…");
        assert_eq!(cut("abc", 3), "abc");
    }

    #[test]
    fn messages_have_their_long_values_cut() {
        let v = "9".repeat(10 << 20);
        let m = format!("line 2: jobdw: capacity={v:?} is not a size; give e.g. 10GiB");
        let c = cut_values(&m);
        assert!(c.len() < 200 + MAX_SHOWN, "{}", c.len());
        assert_eq!(
            c,
            format!(
                "line 2: jobdw: capacity=\"{}…\" is not a size; give e.g. 10GiB",
                "9".repeat(MAX_SHOWN)
            )
        );
        // Escaped quotes stay inside their value.
        let m = format!("{:?} tail", format!("a\"{}", "b".repeat(300)));
        let c = cut_values(&m);
        assert!(c.ends_with("…\" tail"), "{c}");
        // Unquoted words: cut beyond MAX_SHOWN_WORD; short ones untouched.
        let m = format!("unknown directive #DW {} (known: jobdw)", "z".repeat(5000));
        let c = cut_values(&m);
        assert!(
            c.contains(&format!("{}…", "z".repeat(MAX_SHOWN_WORD))),
            "{c}"
        );
        assert!(c.ends_with(" (known: jobdw)"), "{c}");
        let plain = "line 1: the directive holds the control character '\\u{1}'\nline 2: x";
        assert_eq!(cut_values(plain), plain);
        // An unterminated quote does not swallow the message.
        assert_eq!(cut_values("a \"bc"), "a \"bc");
    }
}

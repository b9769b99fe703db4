//! Finding the directive lines of a job script.
//!
//! Slurm (spec §1.7.1) reads only the script's **leading comment block**: lines are split
//! on `\n` with empty lines skipped, and the first line that does not start with `#` ends
//! the block. In it, a line whose first three characters are `#DW` or `#BB` is a
//! directive; a directive ending in `\` continues on the next line, which must carry the
//! same prefix (removed when the two are joined).
//!
//! Cray's tool read the whole file, and real scripts put `#DW stage_out` lines after
//! their commands. We read the whole file too, with the same rules, and record for each
//! directive whether it lies in the leading block (what Slurm sees and charges for); the
//! job checks (`job.rs`) decide what may live outside it.

use crate::error::{ScriptError, ScriptErrors};

/// `#DW` (DataWarp's own directives) or `#BB` (Slurm's persistent create/destroy).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prefix {
    Dw,
    Bb,
}

impl Prefix {
    pub fn as_str(self) -> &'static str {
        match self {
            Prefix::Dw => "#DW",
            Prefix::Bb => "#BB",
        }
    }

    fn of(line: &[u8]) -> Option<Prefix> {
        match line.get(..3) {
            Some(b"#DW") => Some(Prefix::Dw),
            Some(b"#BB") => Some(Prefix::Bb),
            _ => None,
        }
    }
}

/// One directive: its prefix and text after the prefix, continuation lines joined with
/// a space.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawDirective {
    /// 1-based number of its first line in the script.
    pub line: usize,
    pub prefix: Prefix,
    pub text: String,
    /// In the leading comment block (Slurm sees it).
    pub leading: bool,
}

/// The most a script may hold: Slurm's own limit (4 MiB by default); a directive is a
/// line, so this bounds the work a hostile file can cause.
pub const MAX_SCRIPT_BYTES: usize = crate::input::MAX_SCRIPT_BYTES as usize;
/// A directive longer than this (after joining continuations) is refused.
pub const MAX_DIRECTIVE_BYTES: usize = 64 << 10;

/// The directives of `script`, or every line that is wrong.
pub fn directives(script: &[u8]) -> Result<Vec<RawDirective>, ScriptErrors> {
    if script.len() > MAX_SCRIPT_BYTES {
        return Err(ScriptErrors::one(ScriptError::whole(format!(
            "the script is {} bytes; at most {MAX_SCRIPT_BYTES} are read",
            script.len()
        ))));
    }
    // Slurm stores the batch script with its terminating NUL.
    let end = script
        .iter()
        .rposition(|&b| b != 0)
        .map(|i| i + 1)
        .unwrap_or(0);
    let mut out: Vec<RawDirective> = Vec::new();
    let mut errors = Vec::new();
    let mut leading = true;
    // The directive being continued: its index in `out`.
    let mut open: Option<usize> = None;
    for (i, raw) in script[..end].split(|&b| b == b'\n').enumerate() {
        let lineno = i + 1;
        if raw.is_empty() {
            // strtok skips empty lines: they neither end the block nor a continuation.
            continue;
        }
        if raw[0] != b'#' {
            leading = false;
        }
        let Some(prefix) = Prefix::of(raw) else {
            if let Some(k) = open.take() {
                errors.push(ScriptError::at(
                    lineno,
                    format!(
                        "the {} line {} ends in \\ but this line does not start with {}",
                        out[k].prefix.as_str(),
                        out[k].line,
                        out[k].prefix.as_str()
                    ),
                ));
            }
            continue;
        };
        let Ok(text) = std::str::from_utf8(&raw[3..]) else {
            errors.push(ScriptError::at(lineno, "the directive is not valid UTF-8"));
            open = None;
            continue;
        };
        if text.ends_with('\r') {
            errors.push(ScriptError::at(
                lineno,
                "the line ends in a DOS line break (\\r\\n); convert the script with dos2unix",
            ));
            open = None;
            continue;
        }
        if let Some(c) = text.chars().find(|c| c.is_control() && *c != '\t') {
            errors.push(ScriptError::at(
                lineno,
                format!("the directive holds the control character {c:?}"),
            ));
            open = None;
            continue;
        }
        let (body, continues) = match text.strip_suffix('\\') {
            Some(b) => (b, true),
            None => (text, false),
        };
        match open {
            Some(k) if out[k].prefix != prefix => {
                errors.push(ScriptError::at(
                    lineno,
                    format!(
                        "continues the {} line {} with {}: a continuation must keep the prefix",
                        out[k].prefix.as_str(),
                        out[k].line,
                        prefix.as_str()
                    ),
                ));
                open = None;
                continue;
            }
            Some(k) => {
                let d = &mut out[k];
                d.text.push(' ');
                d.text.push_str(body.trim_start());
                if d.text.len() > MAX_DIRECTIVE_BYTES {
                    errors.push(ScriptError::at(
                        d.line,
                        format!("the directive is longer than {MAX_DIRECTIVE_BYTES} bytes"),
                    ));
                    d.text.truncate(0);
                    open = None;
                    continue;
                }
            }
            None if body.len() > MAX_DIRECTIVE_BYTES => {
                errors.push(ScriptError::at(
                    lineno,
                    format!("the directive is longer than {MAX_DIRECTIVE_BYTES} bytes"),
                ));
                open = None;
                continue;
            }
            None => {
                out.push(RawDirective {
                    line: lineno,
                    prefix,
                    text: body.to_string(),
                    leading,
                });
            }
        }
        open = continues.then(|| out.len() - 1);
    }
    if let Some(k) = open {
        errors.push(ScriptError::at(
            out[k].line,
            "the directive ends in \\ but the script ends there",
        ));
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(ScriptErrors(errors))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(s: &str) -> Vec<(usize, Prefix, String, bool)> {
        directives(s.as_bytes())
            .unwrap()
            .into_iter()
            .map(|d| (d.line, d.prefix, d.text, d.leading))
            .collect()
    }

    #[test]
    fn leading_block_and_later_lines() {
        let s = "#!/bin/bash\n#SBATCH -N 1\n\n#DW jobdw capacity=1GiB\n#BB create_persistent name=a\necho hi\n#DW stage_out type=file\n";
        assert_eq!(
            texts(s),
            vec![
                (4, Prefix::Dw, " jobdw capacity=1GiB".into(), true),
                (5, Prefix::Bb, " create_persistent name=a".into(), true),
                (7, Prefix::Dw, " stage_out type=file".into(), false),
            ]
        );
    }

    #[test]
    fn continuations_join_and_must_keep_the_prefix() {
        let s = "#!/bin/sh\n#DW jobdw type=scratch \\\n#DW    capacity=1GiB\n#DW swap 1GiB\n";
        assert_eq!(
            texts(s),
            vec![
                (
                    2,
                    Prefix::Dw,
                    " jobdw type=scratch  capacity=1GiB".into(),
                    true
                ),
                (4, Prefix::Dw, " swap 1GiB".into(), true),
            ]
        );
        let e = directives(b"#DW jobdw \\\n#BB capacity=1GiB\n").unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
        let e = directives(b"#DW jobdw \\\n# comment\n").unwrap_err();
        assert!(e.to_string().contains("does not start with #DW"), "{e}");
        let e = directives(b"#DW jobdw \\").unwrap_err();
        assert!(e.to_string().contains("script ends"), "{e}");
    }

    #[test]
    fn long_directives_and_scripts_are_refused() {
        let line = format!("#DW jobdw capacity={}\n", "9".repeat(MAX_DIRECTIVE_BYTES));
        let e = directives(line.as_bytes()).unwrap_err();
        assert!(e.to_string().contains("longer than"), "{e}");
        let big = vec![b'#'; MAX_SCRIPT_BYTES + 1];
        let e = directives(&big).unwrap_err();
        assert!(e.to_string().contains("at most"), "{e}");
    }

    #[test]
    fn trailing_nuls_dos_breaks_and_bytes() {
        assert_eq!(texts("#DW swap 1GiB\n\0").len(), 1);
        let e = directives(b"#DW swap 1GiB\r\n").unwrap_err();
        assert!(e.to_string().contains("dos2unix"), "{e}");
        let e = directives(b"#DW swap \xff\n").unwrap_err();
        assert!(e.to_string().contains("UTF-8"), "{e}");
        // Non-directive lines may hold anything.
        assert!(directives(b"#!/bin/sh\necho \xc3\x28\r\n")
            .unwrap()
            .is_empty());
    }
}

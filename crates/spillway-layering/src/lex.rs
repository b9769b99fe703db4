//! Blanking out what is not code: comments (line, block, nested block, doc) and the
//! contents of string, byte-string, raw-string and char literals become spaces, so that
//! a path mentioned in a comment or a message is not taken for a dependency. Newlines
//! are kept, so a line number in the blanked text is a line number in the file.

/// `src` with comments and literals replaced by spaces (newlines kept).
pub fn blank(src: &str) -> String {
    let c: Vec<char> = src.chars().collect();
    let mut out: Vec<char> = Vec::with_capacity(c.len());
    let mut i = 0;
    while i < c.len() {
        let prev_ident = i > 0 && is_ident_char(c[i - 1]);
        if c[i] == '/' && c.get(i + 1) == Some(&'/') {
            let end = c[i..]
                .iter()
                .position(|&x| x == '\n')
                .map_or(c.len(), |p| i + p);
            blank_range(&c, i, end, &mut out);
            i = end;
        } else if c[i] == '/' && c.get(i + 1) == Some(&'*') {
            let end = block_comment_end(&c, i);
            blank_range(&c, i, end, &mut out);
            i = end;
        } else if c[i] == '"' {
            let end = quoted_end(&c, i + 1, '"');
            blank_range(&c, i, end, &mut out);
            i = end;
        } else if let Some(end) = (!prev_ident).then(|| prefixed_string_end(&c, i)).flatten() {
            blank_range(&c, i, end, &mut out);
            i = end;
        } else if c[i] == '\'' {
            match char_literal_end(&c, i) {
                Some(end) => {
                    blank_range(&c, i, end, &mut out);
                    i = end;
                }
                // A lifetime or a label: code.
                None => {
                    out.push(c[i]);
                    i += 1;
                }
            }
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out.into_iter().collect()
}

pub(crate) fn is_ident_char(ch: char) -> bool {
    ch.is_alphanumeric() || ch == '_'
}

fn blank_range(c: &[char], from: usize, to: usize, out: &mut Vec<char>) {
    out.extend(
        c[from..to]
            .iter()
            .map(|&x| if x == '\n' { '\n' } else { ' ' }),
    );
}

/// End (exclusive) of the block comment opening at `i`; block comments nest.
fn block_comment_end(c: &[char], i: usize) -> usize {
    let mut depth = 0usize;
    let mut j = i;
    while j < c.len() {
        if c[j] == '/' && c.get(j + 1) == Some(&'*') {
            depth += 1;
            j += 2;
        } else if c[j] == '*' && c.get(j + 1) == Some(&'/') {
            depth -= 1;
            j += 2;
            if depth == 0 {
                return j;
            }
        } else {
            j += 1;
        }
    }
    c.len()
}

/// End (exclusive) of a literal whose body starts at `j` and ends at `close`, with
/// backslash escapes.
fn quoted_end(c: &[char], mut j: usize, close: char) -> usize {
    while j < c.len() {
        if c[j] == '\\' {
            j += 2;
        } else if c[j] == close {
            return j + 1;
        } else {
            j += 1;
        }
    }
    c.len()
}

/// `b"…"`, `c"…"`, `r"…"`, `r#"…"#`, `br#"…"#`, `cr"…"` starting at `i`, if one does.
/// `r#ident` (a raw identifier) is not a string.
fn prefixed_string_end(c: &[char], i: usize) -> Option<usize> {
    let mut j = i;
    if c[j] == 'b' || c[j] == 'c' {
        j += 1;
    }
    let raw = c.get(j) == Some(&'r');
    if raw {
        j += 1;
    }
    if j == i {
        return None;
    }
    if !raw {
        return (c.get(j) == Some(&'"')).then(|| quoted_end(c, j + 1, '"'));
    }
    let hashes = c[j..].iter().take_while(|&&x| x == '#').count();
    j += hashes;
    if c.get(j) != Some(&'"') {
        return None;
    }
    j += 1;
    while j < c.len() {
        if c[j] == '"'
            && c[j + 1..]
                .iter()
                .take(hashes)
                .filter(|&&x| x == '#')
                .count()
                == hashes
        {
            return Some(j + 1 + hashes);
        }
        j += 1;
    }
    Some(c.len())
}

/// End (exclusive) of the char literal at `i` (`'a'`, `'\n'`, `'\u{7f}'`, `b'x'` is
/// handled as `b` then this), or None for a lifetime or label (`'a`, `'static`).
fn char_literal_end(c: &[char], i: usize) -> Option<usize> {
    match c.get(i + 1) {
        Some('\\') => Some(quoted_end(c, i + 1, '\'')),
        Some(_) if c.get(i + 2) == Some(&'\'') => Some(i + 3),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::blank;

    #[test]
    fn comments_become_spaces_and_lines_stay() {
        let src = "use a; // use b;\n/* use c;\n /* nested */ use d; */ use e;\n";
        let out = blank(src);
        assert_eq!(out.lines().count(), src.lines().count());
        assert!(out.contains("use a;"));
        assert!(!out.contains("use b") && !out.contains("use c") && !out.contains("use d"));
        assert!(out.contains("use e;"));
        assert_eq!(out.len(), src.len());
    }

    #[test]
    fn doc_comments_are_comments() {
        let out = blank("//! see crate::x::Y\n/// and crate::z\nfn f() {}\n");
        assert!(!out.contains("crate::"));
        assert!(out.contains("fn f() {}"));
    }

    #[test]
    fn strings_and_chars_are_blanked() {
        let src = r####"let s = "crate::a \" crate::b"; let r = r##"crate::c "# crate::d"##;
let b = b"crate::e"; let q = '"'; let e = '\''; let u = '\u{22}'; crate::kept::X;"####;
        let out = blank(src);
        for gone in ["crate::a", "crate::b", "crate::c", "crate::d", "crate::e"] {
            assert!(!out.contains(gone), "{gone} in {out}");
        }
        assert!(out.contains("crate::kept::X;"));
    }

    #[test]
    fn lifetimes_and_raw_idents_are_code() {
        let out = blank("fn f<'a>(x: &'a str) -> &'static str { r#type::crate_x(x) }");
        assert!(out.contains("<'a>") && out.contains("&'static str"));
        assert!(out.contains("r#type::crate_x"));
    }

    #[test]
    fn identifiers_ending_in_r_or_b_before_a_string() {
        // `bar"…"` is not valid Rust, but `for"x"` must not turn `r` into a prefix.
        let out = blank("let b = foo(bar); m!(for\"x\" crate::y)");
        assert!(out.contains("foo(bar)") && out.contains("crate::y"));
    }
}

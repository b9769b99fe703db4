//! Rust source (already blanked by `lex`) as a flat list of tokens with line numbers,
//! and the removal of `#[cfg(test)]` items: test code may import anything, so it is no
//! part of the layering.

use crate::lex::{blank, is_ident_char};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tok {
    /// An identifier or keyword; `r#type` is `type`, `$crate` is `$crate`.
    Ident(String),
    /// `::`
    PathSep,
    /// `->`
    Arrow,
    /// Any other single character (`{`, `}`, `;`, `,`, `*`, `#`, `.`, …).
    Punct(char),
    /// A number or a lifetime: present so that neighbours are not taken as adjacent.
    Other,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    pub tok: Tok,
    pub line: u32,
}

impl Token {
    pub fn ident(&self) -> Option<&str> {
        match &self.tok {
            Tok::Ident(s) => Some(s),
            _ => None,
        }
    }

    pub fn is_ident(&self, s: &str) -> bool {
        self.ident() == Some(s)
    }

    pub fn is_punct(&self, ch: char) -> bool {
        self.tok == Tok::Punct(ch)
    }
}

/// A source file's tokens, test items removed. `test_file` is set when the whole file is
/// test-only (`#![cfg(test)]`); `test_mods` names the `#[cfg(test)] mod x;` files it
/// declares, which are then test-only too.
#[derive(Debug, Default)]
pub struct Tokens {
    pub toks: Vec<Token>,
    pub test_file: bool,
    pub test_mods: Vec<String>,
}

/// Tokens of `src`, comments, literals and `#[cfg(test)]` items removed.
pub fn tokenize(src: &str) -> Tokens {
    strip_test_items(raw_tokens(&blank(src)))
}

fn raw_tokens(text: &str) -> Vec<Token> {
    let c: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut line = 1u32;
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == 'r'
            && c.get(i + 1) == Some(&'#')
            && c.get(i + 2).is_some_and(|&x| is_ident_char(x))
        {
            let end = ident_end(&c, i + 2);
            out.push(Token {
                tok: Tok::Ident(c[i + 2..end].iter().collect()),
                line,
            });
            i = end;
        } else if ch == '$' && c.get(i + 1).is_some_and(|&x| is_ident_char(x)) {
            let end = ident_end(&c, i + 1);
            out.push(Token {
                tok: Tok::Ident(c[i..end].iter().collect()),
                line,
            });
            i = end;
        } else if ch.is_ascii_digit() {
            let end = ident_end(&c, i);
            out.push(Token {
                tok: Tok::Other,
                line,
            });
            i = end;
        } else if is_ident_char(ch) {
            let end = ident_end(&c, i);
            out.push(Token {
                tok: Tok::Ident(c[i..end].iter().collect()),
                line,
            });
            i = end;
        } else if ch == '\'' {
            // A lifetime or label (char literals were blanked): one token.
            i = ident_end(&c, i + 1);
            out.push(Token {
                tok: Tok::Other,
                line,
            });
        } else if ch == ':' && c.get(i + 1) == Some(&':') {
            out.push(Token {
                tok: Tok::PathSep,
                line,
            });
            i += 2;
        } else if ch == '-' && c.get(i + 1) == Some(&'>') {
            out.push(Token {
                tok: Tok::Arrow,
                line,
            });
            i += 2;
        } else {
            out.push(Token {
                tok: Tok::Punct(ch),
                line,
            });
            i += 1;
        }
    }
    out
}

fn ident_end(c: &[char], mut i: usize) -> usize {
    while i < c.len() && is_ident_char(c[i]) {
        i += 1;
    }
    i
}

/// Whether `t[i..]` is `#[cfg(test)]` (outer) or `#![cfg(test)]` (inner); returns the
/// index after it and whether it was inner.
fn cfg_test_at(t: &[Token], i: usize) -> Option<(usize, bool)> {
    if !t[i].is_punct('#') {
        return None;
    }
    let inner = t.get(i + 1).is_some_and(|x| x.is_punct('!'));
    let j = i + 1 + usize::from(inner);
    let want = [
        Tok::Punct('['),
        Tok::Ident("cfg".into()),
        Tok::Punct('('),
        Tok::Ident("test".into()),
        Tok::Punct(')'),
        Tok::Punct(']'),
    ];
    let found = t.get(j..j + want.len())?;
    if !found.iter().zip(&want).all(|(x, w)| x.tok == *w) {
        return None;
    }
    Some((j + want.len(), inner))
}

/// Index after the bracketed group opening at `i` (`(`, `[` or `{`), nesting counted.
pub(crate) fn group_end(t: &[Token], i: usize) -> usize {
    let mut depth = 0i32;
    for (j, x) in t.iter().enumerate().skip(i) {
        match x.tok {
            Tok::Punct('(' | '[' | '{') => depth += 1,
            Tok::Punct(')' | ']' | '}') => {
                depth -= 1;
                if depth == 0 {
                    return j + 1;
                }
            }
            _ => {}
        }
    }
    t.len()
}

/// Index after the item starting at `i`: the first `;` outside brackets, or the end of
/// the first `{…}` block (a `mod`, `fn`, `impl` body).
fn item_end(t: &[Token], mut i: usize) -> usize {
    while i < t.len() {
        match t[i].tok {
            Tok::Punct(';') => return i + 1,
            Tok::Punct('{') => return group_end(t, i),
            Tok::Punct('(' | '[') => i = group_end(t, i),
            _ => i += 1,
        }
    }
    t.len()
}

fn strip_test_items(t: Vec<Token>) -> Tokens {
    let mut out = Tokens::default();
    let mut i = 0;
    while i < t.len() {
        let Some((mut j, inner)) = cfg_test_at(&t, i) else {
            out.toks.push(t[i].clone());
            i += 1;
            continue;
        };
        if inner {
            out.test_file = true;
            out.toks.clear();
            return out;
        }
        // Further attributes on the same item.
        while t.get(j).is_some_and(|x| x.is_punct('#'))
            && t.get(j + 1).is_some_and(|x| x.is_punct('['))
        {
            j = group_end(&t, j + 1);
        }
        let end = item_end(&t, j);
        if let Some(name) = declared_file_mod(&t[j..end]) {
            out.test_mods.push(name);
        }
        i = end;
    }
    out
}

/// `[pub] mod name;` → `name`.
fn declared_file_mod(item: &[Token]) -> Option<String> {
    let m = item.iter().position(|x| x.is_ident("mod"))?;
    let name = item.get(m + 1)?.ident()?;
    item.get(m + 2)?.is_punct(';').then(|| name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idents(t: &Tokens) -> Vec<&str> {
        t.toks.iter().filter_map(Token::ident).collect()
    }

    #[test]
    fn paths_and_lines() {
        let t = tokenize("use crate::a;\n\nfn f() -> u8 { 1 }");
        assert_eq!(t.toks[1].tok, Tok::Ident("crate".into()));
        assert_eq!(t.toks[2].tok, Tok::PathSep);
        assert!(t.toks.iter().any(|x| x.tok == Tok::Arrow && x.line == 3));
    }

    #[test]
    fn cfg_test_items_are_dropped() {
        let src = "use a::b;\n#[cfg(test)]\nmod tests {\n use crate::x;\n fn g() { if y { } }\n}\n\
                   #[cfg(test)]\n#[path = \"t.rs\"]\nmod more;\n#[cfg(test)]\nuse crate::z;\nfn keep() {}\n";
        let t = tokenize(src);
        assert_eq!(idents(&t), ["use", "a", "b", "fn", "keep"]);
        assert_eq!(t.test_mods, ["more"]);
        assert!(!t.test_file);
    }

    #[test]
    fn inner_cfg_test_makes_a_test_file() {
        let t = tokenize("//! tests\n#![cfg(test)]\nuse crate::x;\n");
        assert!(t.test_file);
        assert!(t.toks.is_empty());
    }

    #[test]
    fn other_cfgs_stay() {
        let t = tokenize("#[cfg(target_os = \"linux\")]\nuse crate::x;\n");
        assert!(idents(&t).contains(&"x"));
    }

    #[test]
    fn raw_idents_and_macro_crate() {
        let t = tokenize("r#type $crate::codec 'a 1u8");
        assert_eq!(idents(&t), ["type", "$crate", "codec"]);
    }
}

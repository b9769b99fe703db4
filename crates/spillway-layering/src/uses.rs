//! `use` declarations as lists of leaves: `pub use a::{b, c::{d as e, self}, f::*};`
//! is `a::b` (b), `a::c::d` (e), `a::c` (c) and the glob `a::f::*`, each with the line
//! its last segment is on, and whether the declaration re-exports (`pub`, `pub(crate)`…).

use crate::tokens::{Tok, Token};

/// One imported path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UseLeaf {
    /// The path as written (`crate`, `super`, `self` and all), without a trailing `self`.
    pub segs: Vec<String>,
    /// The name it is bound to (`as` alias or the last segment); None for a glob.
    pub name: Option<String>,
    pub line: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UseDecl {
    /// Any visibility (`pub`, `pub(crate)`, `pub(super)`, `pub(in …)`).
    pub public: bool,
    pub leaves: Vec<UseLeaf>,
    /// Token index just after the closing `;`.
    pub end: usize,
}

/// The use declaration whose `use` keyword is `t[i]`.
pub fn parse_use(t: &[Token], i: usize) -> UseDecl {
    let public = is_public_before(t, i);
    let mut leaves = Vec::new();
    let mut k = i + 1;
    if t.get(k).is_some_and(|x| x.tok == Tok::PathSep) {
        // `use ::std::x;` — a crate from outside; the leaf still starts with its name.
        k += 1;
    }
    k = tree(t, k, &[], &mut leaves);
    // Skip whatever did not parse, up to the end of the declaration.
    while k < t.len() && !t[k].is_punct(';') {
        k += 1;
    }
    UseDecl {
        public,
        leaves,
        end: (k + 1).min(t.len()),
    }
}

/// Whether the `use` at `i` has a visibility: `pub` or `pub( … )` just before it.
fn is_public_before(t: &[Token], i: usize) -> bool {
    if i == 0 {
        return false;
    }
    if t[i - 1].is_ident("pub") {
        return true;
    }
    if !t[i - 1].is_punct(')') {
        return false;
    }
    // Walk back over `( … )` to see `pub`.
    let mut j = i - 1;
    while j > 0 && !t[j].is_punct('(') {
        j -= 1;
    }
    j > 0 && t[j - 1].is_ident("pub")
}

/// Parses one use tree at `k` under `prefix`, appending leaves; returns the index after.
fn tree(t: &[Token], mut k: usize, prefix: &[String], leaves: &mut Vec<UseLeaf>) -> usize {
    let mut segs: Vec<String> = prefix.to_vec();
    loop {
        let Some(tok) = t.get(k) else { return k };
        match &tok.tok {
            Tok::Punct('{') => return group(t, k, &segs, leaves),
            Tok::Punct('*') => {
                leaves.push(UseLeaf {
                    segs,
                    name: None,
                    line: tok.line,
                });
                return k + 1;
            }
            Tok::Ident(s) => {
                segs.push(s.clone());
                let line = tok.line;
                k += 1;
                if t.get(k).is_some_and(|x| x.tok == Tok::PathSep) {
                    k += 1;
                    continue;
                }
                let mut name = None;
                if t.get(k).is_some_and(|x| x.is_ident("as")) {
                    name = t.get(k + 1).and_then(Token::ident).map(str::to_string);
                    k += 2;
                }
                if segs.last().is_some_and(|s| s == "self") {
                    segs.pop();
                }
                let name = name.or_else(|| segs.last().cloned());
                if !segs.is_empty() {
                    leaves.push(UseLeaf { segs, name, line });
                }
                return k;
            }
            _ => return k,
        }
    }
}

/// `{ tree, tree, … }` at `k` under `prefix`; returns the index after the `}`.
fn group(t: &[Token], mut k: usize, prefix: &[String], leaves: &mut Vec<UseLeaf>) -> usize {
    k += 1;
    while let Some(tok) = t.get(k) {
        if tok.is_punct('}') {
            return k + 1;
        }
        if tok.is_punct(',') {
            k += 1;
            continue;
        }
        let next = tree(t, k, prefix, leaves);
        if next == k {
            // Not a tree: give up on this group rather than loop.
            return k;
        }
        k = next;
    }
    k
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::tokenize;

    fn leaves(src: &str) -> (bool, Vec<(String, Option<String>, u32)>) {
        let t = tokenize(src).toks;
        let i = t.iter().position(|x| x.is_ident("use")).expect("a use");
        let d = parse_use(&t, i);
        let l = d
            .leaves
            .into_iter()
            .map(|l| (l.segs.join("::"), l.name, l.line))
            .collect();
        (d.public, l)
    }

    fn named(p: &str, n: &str, line: u32) -> (String, Option<String>, u32) {
        (p.to_string(), Some(n.to_string()), line)
    }

    #[test]
    fn simple_and_alias() {
        assert_eq!(leaves("use crate::a::B;").1, [named("crate::a::B", "B", 1)]);
        assert_eq!(
            leaves("use std::io::Result as R;").1,
            [named("std::io::Result", "R", 1)]
        );
    }

    #[test]
    fn grouped_and_nested_braces_over_lines() {
        let (public, l) = leaves("use crate::a::{\n    b,\n    c::{d as e, self},\n    f::*,\n};");
        assert!(!public);
        assert_eq!(
            l,
            [
                named("crate::a::b", "b", 2),
                named("crate::a::c::d", "e", 3),
                named("crate::a::c", "c", 3),
                ("crate::a::f".to_string(), None, 4),
            ]
        );
    }

    #[test]
    fn visibility() {
        assert!(leaves("pub use a::b;").0);
        assert!(leaves("pub(crate) use a::b;").0);
        assert!(leaves("pub(in crate::x) use a::b;").0);
        assert!(!leaves("fn f() {} use a::b;").0);
    }

    #[test]
    fn super_super_and_leading_colons() {
        assert_eq!(
            leaves("use super::super::x::Y;").1,
            [named("super::super::x::Y", "Y", 1)]
        );
        assert_eq!(leaves("use ::std::fmt;").1, [named("std::fmt", "fmt", 1)]);
        assert_eq!(
            leaves("use {a::b, c};").1,
            [named("a::b", "b", 1), named("c", "c", 1)]
        );
    }

    #[test]
    fn comments_inside_a_use() {
        let (_, l) = leaves("use crate::{/* crate::gone, */ a, // crate::also_gone\n b};");
        assert_eq!(l, [named("crate::a", "a", 1), named("crate::b", "b", 2)]);
    }

    #[test]
    fn end_is_after_semicolon() {
        let t = tokenize("use a::{b, c}; fn f() {}").toks;
        let d = parse_use(&t, 0);
        assert!(t[d.end].is_ident("fn"));
    }
}

//! One compiled target (a lib, a main, a bin) as the checks see it: its files and the
//! module each defines, every module's children, items and imports, and every path the
//! non-test code names (`use` leaves, and `crate::`/`self::`/`super::`/`spillway_*::`/
//! child-module paths in code). `resolve` turns such a path into the file that defines
//! what it names, following re-exports and imports, or into a path in another crate.

use crate::tokens::{tokenize, Tok, Token};
use crate::uses::{parse_use, UseLeaf};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module's path from the crate root (`[]` is the root).
pub type ModPath = Vec<String>;

#[derive(Debug)]
pub struct SourceFile {
    /// As given to `load` (joined under the crate root's directory).
    pub path: PathBuf,
    pub module: ModPath,
    /// Identifiers used outside `use` declarations: whether a re-exported name is also
    /// used by the file itself.
    pub code_idents: BTreeSet<String>,
}

#[derive(Debug, Default)]
pub struct Module {
    pub file: usize,
    pub children: BTreeSet<String>,
    /// Items defined at module level (and `#[macro_export]` macros at the root), with
    /// the file that defines them.
    pub items: BTreeMap<String, usize>,
    /// Module-level `use` leaves: what a path through this module may be re-exported as.
    pub imports: Vec<UseLeaf>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefKind {
    /// A `use` leaf; `public` for re-exports.
    Use { public: bool },
    /// A path in code.
    Code,
}

/// A path named by non-test code.
#[derive(Debug, Clone)]
pub struct Ref {
    pub file: usize,
    /// The module whose code names it (an inline `mod x { … }` counts).
    pub scope: ModPath,
    pub leaf: UseLeaf,
    pub kind: RefKind,
}

/// What a path names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    /// Something defined in this file of the target (a module's file for a module).
    File(usize),
    /// A path into another crate: its name as code spells it (`spillway_wire`, `std`),
    /// and the segments after it.
    External(String, Vec<String>),
    /// `$crate` paths in macros, and paths the model cannot follow.
    Unknown,
}

#[derive(Debug, Default)]
pub struct Target {
    pub files: Vec<SourceFile>,
    pub modules: BTreeMap<ModPath, Module>,
    pub refs: Vec<Ref>,
}

/// What a name found in a module is.
#[derive(Debug, Clone)]
enum Found {
    Module(ModPath),
    Item(usize),
    External(String, Vec<String>),
}

/// Lookups through imports may loop (`use super::*` both ways); they stop here.
const MAX_DEPTH: usize = 16;

impl Target {
    /// Reads the target whose root file is `root` (`src/lib.rs`, `src/main.rs`,
    /// `src/bin/x.rs`), following `mod x;` declarations through `read`. Files that are
    /// test-only (`#[cfg(test)] mod x;`, `#![cfg(test)]`) are left out.
    pub fn load(root: &Path, read: &dyn Fn(&Path) -> Option<String>) -> Result<Target, String> {
        let mut t = Target::default();
        let root_dir = root.parent().unwrap_or(Path::new("")).to_path_buf();
        let mut queue: Vec<(PathBuf, ModPath, PathBuf)> =
            vec![(root.to_path_buf(), vec![], root_dir)];
        while let Some((path, module, child_dir)) = queue.pop() {
            let src = read(&path).ok_or_else(|| format!("cannot read {}", path.display()))?;
            let toks = tokenize(&src);
            if toks.test_file {
                if let Some((name, parent)) = module.split_last() {
                    if let Some(m) = t.modules.get_mut(parent) {
                        m.children.remove(name);
                    }
                }
                continue;
            }
            let file = t.files.len();
            t.files.push(SourceFile {
                path,
                module: module.clone(),
                code_idents: BTreeSet::new(),
            });
            t.modules.entry(module.clone()).or_default().file = file;
            for (name, m, dir) in t.scan(file, &toks.toks, &toks.test_mods, &child_dir) {
                let flat = dir.join(format!("{name}.rs"));
                let nested = dir.join(&name).join("mod.rs");
                let (p, d) = if read(&flat).is_some() {
                    (flat, dir.join(&name))
                } else {
                    (nested, dir.join(&name))
                };
                queue.push((p, m, d));
            }
        }
        Ok(t)
    }

    /// Records what file `file` defines, imports and names; returns the file modules it
    /// declares (name, module path, directory of their own children).
    fn scan(
        &mut self,
        file: usize,
        toks: &[Token],
        test_mods: &[String],
        child_dir: &Path,
    ) -> Vec<(String, ModPath, PathBuf)> {
        let file_module = self.files[file].module.clone();
        // (module, brace depth of its body, directory of its file children)
        let mut scopes: Vec<(ModPath, i32, PathBuf)> =
            vec![(file_module, 0, child_dir.to_path_buf())];
        let mut pending: Option<(ModPath, PathBuf)> = None;
        let mut depth = 0i32;
        let mut declared = Vec::new();
        let mut code_idents = BTreeSet::new();
        let mut i = 0;
        while i < toks.len() {
            let (scope, body, dir) = scopes.last().cloned().unwrap_or_default();
            let at_module_level = depth == body;
            match &toks[i].tok {
                Tok::Punct('{') => {
                    depth += 1;
                    if let Some((m, d)) = pending.take() {
                        scopes.push((m, depth, d));
                    }
                }
                Tok::Punct('}') => {
                    depth -= 1;
                    if scopes.len() > 1 && depth < body {
                        scopes.pop();
                    }
                }
                Tok::Ident(kw) if kw == "use" => {
                    let d = parse_use(toks, i);
                    for leaf in d.leaves {
                        if at_module_level {
                            self.module_mut(&scope).imports.push(leaf.clone());
                        }
                        self.refs.push(Ref {
                            file,
                            scope: scope.clone(),
                            leaf,
                            kind: RefKind::Use { public: d.public },
                        });
                    }
                    i = d.end;
                    continue;
                }
                Tok::Ident(kw)
                    if kw == "mod" && toks.get(i + 1).is_some_and(|x| x.ident().is_some()) =>
                {
                    let name = toks[i + 1].ident().unwrap_or_default().to_string();
                    let mut m = scope.clone();
                    m.push(name.clone());
                    let inline = toks.get(i + 2).is_some_and(|x| x.is_punct('{'));
                    if inline {
                        self.module_mut(&m).file = file;
                        self.module_mut(&scope).children.insert(name.clone());
                        pending = Some((m, dir.join(&name)));
                    } else if !test_mods.contains(&name) {
                        self.module_mut(&scope).children.insert(name.clone());
                        declared.push((name, m, dir.clone()));
                    }
                    i += 2;
                    continue;
                }
                Tok::Ident(kw) if at_module_level && is_item_keyword(kw) => {
                    if let Some(name) = item_name(toks, i) {
                        let exported = kw == "macro_rules" && is_macro_export(toks, i);
                        let owner = if exported { vec![] } else { scope.clone() };
                        self.module_mut(&owner).items.entry(name).or_insert(file);
                    }
                }
                Tok::Ident(s) => {
                    code_idents.insert(s.clone());
                    if let Some((leaf, end)) = code_path(toks, i) {
                        code_idents.extend(leaf.segs.iter().cloned());
                        self.refs.push(Ref {
                            file,
                            scope: scope.clone(),
                            leaf,
                            kind: RefKind::Code,
                        });
                        i = end;
                        continue;
                    }
                }
                _ => {}
            }
            i += 1;
        }
        self.files[file].code_idents = code_idents;
        declared
    }

    fn module_mut(&mut self, m: &[String]) -> &mut Module {
        self.modules.entry(m.to_vec()).or_default()
    }

    /// The file of module `m` (the root's file if `m` is not known).
    pub fn module_file(&self, m: &[String]) -> usize {
        self.modules.get(m).map_or(0, |x| x.file)
    }

    /// What `segs`, named in module `scope`, refers to.
    pub fn resolve(&self, scope: &[String], segs: &[String]) -> Resolved {
        match self.find(scope, segs, 0) {
            Some(Found::Module(m)) => Resolved::File(self.module_file(&m)),
            Some(Found::Item(f)) => Resolved::File(f),
            Some(Found::External(k, s)) => Resolved::External(k, s),
            None => Resolved::Unknown,
        }
    }

    fn find(&self, scope: &[String], segs: &[String], depth: usize) -> Option<Found> {
        let (first, rest) = segs.split_first()?;
        if depth > MAX_DEPTH || first.starts_with('$') {
            return None;
        }
        match first.as_str() {
            "crate" => self.walk(vec![], rest, depth),
            "self" => self.walk(scope.to_vec(), rest, depth),
            "super" => {
                let mut m = scope.to_vec();
                m.pop();
                self.find_from(m, rest, depth)
            }
            _ => match self.lookup(scope, first, depth) {
                Some(found) => self.then(found, rest, depth),
                None => Some(Found::External(first.clone(), rest.to_vec())),
            },
        }
    }

    /// `super::super::x` after the first `super` has been taken.
    fn find_from(&self, m: ModPath, rest: &[String], depth: usize) -> Option<Found> {
        match rest.split_first() {
            Some((s, more)) if s == "super" => {
                let mut up = m;
                up.pop();
                self.find_from(up, more, depth)
            }
            _ => self.walk(m, rest, depth),
        }
    }

    /// Continues a path from a module.
    fn walk(&self, m: ModPath, rest: &[String], depth: usize) -> Option<Found> {
        let Some((seg, _)) = rest.split_first() else {
            return Some(Found::Module(m));
        };
        match self.lookup(&m, seg, depth) {
            Some(found) => self.then(found, &rest[1..], depth),
            // A name the model did not see defined (an enum variant, a macro-made item):
            // it lives in the module's file.
            None => Some(Found::Item(self.module_file(&m))),
        }
    }

    /// Continues a path after its first name was found.
    fn then(&self, found: Found, rest: &[String], depth: usize) -> Option<Found> {
        match found {
            Found::Module(c) => self.walk(c, rest, depth),
            Found::Item(f) => Some(Found::Item(f)),
            Found::External(k, mut s) => {
                s.extend(rest.iter().cloned());
                Some(Found::External(k, s))
            }
        }
    }

    /// `name` as seen inside module `m`: a child module, an item, a named import or
    /// something a glob import brings.
    fn lookup(&self, m: &[String], name: &str, depth: usize) -> Option<Found> {
        let module = self.modules.get(m)?;
        if module.children.contains(name) {
            let mut c = m.to_vec();
            c.push(name.to_string());
            if self.modules.contains_key(&c) {
                return Some(Found::Module(c));
            }
        }
        if let Some(&f) = module.items.get(name) {
            return Some(Found::Item(f));
        }
        // An import's path is written relative to `m` (or to the parent, for `super`).
        for imp in &module.imports {
            if imp.name.as_deref() == Some(name) {
                return self.find(m, &imp.segs, depth + 1);
            }
        }
        for imp in module.imports.iter().filter(|x| x.name.is_none()) {
            if let Some(Found::Module(src)) = self.find(m, &imp.segs, depth + 1) {
                if src.as_slice() != m {
                    if let Some(f) = self.lookup(&src, name, depth + 1) {
                        return Some(f);
                    }
                }
            }
        }
        None
    }
}

fn is_item_keyword(kw: &str) -> bool {
    matches!(
        kw,
        "fn" | "struct" | "enum" | "union" | "trait" | "type" | "const" | "static" | "macro_rules"
    )
}

/// The name an item keyword at `i` defines (`const fn f` → `f`, `macro_rules! m` → `m`).
fn item_name(toks: &[Token], i: usize) -> Option<String> {
    let mut j = i + 1;
    if toks[i].is_ident("macro_rules") {
        if !toks.get(j)?.is_punct('!') {
            return None;
        }
        j += 1;
    }
    let name = toks.get(j)?.ident()?;
    if is_item_keyword(name) || name == "unsafe" || name == "mut" || name == "extern" {
        // `const fn`, `const unsafe fn`, `static mut X`: the next keyword names it.
        return if name == "mut" {
            toks.get(j + 1)?.ident().map(str::to_string)
        } else {
            None
        };
    }
    Some(name.to_string())
}

/// Whether the `macro_rules!` at `i` carries `#[macro_export]` (among the attributes
/// just before it).
fn is_macro_export(toks: &[Token], i: usize) -> bool {
    toks[i.saturating_sub(12)..i]
        .iter()
        .any(|x| x.is_ident("macro_export"))
}

/// A path in code starting at `i`, if it is one the model follows: `crate::`, `self::`,
/// `super::`, `spillway_*::` or a lowercase name (a child module, an imported module)
/// followed by `::`. Returns the leaf and the index after the path.
fn code_path(toks: &[Token], i: usize) -> Option<(UseLeaf, usize)> {
    let first = toks[i].ident()?;
    if i > 0 && matches!(toks[i - 1].tok, Tok::PathSep | Tok::Punct('.')) {
        return None;
    }
    if !first.starts_with(|c: char| c.is_ascii_lowercase() || c == '_') || first.starts_with('$') {
        return None;
    }
    let mut segs = vec![first.to_string()];
    let mut line = toks[i].line;
    let mut j = i + 1;
    while toks.get(j).is_some_and(|x| x.tok == Tok::PathSep) {
        let Some(next) = toks.get(j + 1).and_then(Token::ident) else {
            break;
        };
        segs.push(next.to_string());
        line = toks[j + 1].line;
        j += 2;
    }
    if segs.len() < 2 {
        return None;
    }
    let name = segs.last().cloned();
    Some((UseLeaf { segs, name, line }, j))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A target made of in-memory files (`path`, text), from `src/lib.rs`.
    pub(crate) fn target(files: &[(&str, &str)]) -> Target {
        let map: BTreeMap<PathBuf, String> = files
            .iter()
            .map(|(p, s)| (PathBuf::from(p), s.to_string()))
            .collect();
        Target::load(Path::new("src/lib.rs"), &|p| map.get(p).cloned()).expect("loads")
    }

    fn file_of(t: &Target, r: Resolved) -> String {
        match r {
            Resolved::File(f) => t.files[f].path.display().to_string(),
            other => format!("{other:?}"),
        }
    }

    fn segs(p: &str) -> Vec<String> {
        p.split("::").map(str::to_string).collect()
    }

    fn sample() -> Target {
        target(&[
            (
                "src/lib.rs",
                "pub mod a;\nmod b;\npub use a::x::Thing;\npub const TOP: u8 = 1;\n",
            ),
            (
                "src/a/mod.rs",
                "pub mod x;\npub use self::x::*;\npub struct AItem;\n",
            ),
            (
                "src/a/x.rs",
                "pub struct Thing;\npub fn helper() {}\nmacro_rules! local { () => {} }\n",
            ),
            (
                "src/b.rs",
                "use crate::Thing;\nuse super::a::{self, x::helper};\nuse spillway_wire::Conn;\n\
                 pub mod inner { use super::super::TOP; pub fn f() {} }\n\
                 #[cfg(test)]\nmod tests;\n\
                 fn g() { crate::a::AItem; inner::f(); let s = \"crate::gone\"; }\n",
            ),
            ("src/b/tests.rs", "use crate::everything;"),
        ])
    }

    #[test]
    fn files_and_modules() {
        let t = sample();
        let mut paths: Vec<String> = t
            .files
            .iter()
            .map(|f| f.path.display().to_string())
            .collect();
        paths.sort();
        assert_eq!(
            paths,
            ["src/a/mod.rs", "src/a/x.rs", "src/b.rs", "src/lib.rs"]
        );
        assert!(t.modules.contains_key(&segs("b::inner")));
        assert!(!t.modules[&vec!["b".to_string()]].children.contains("tests"));
    }

    #[test]
    fn resolves_through_reexports_and_globs() {
        let t = sample();
        let root: Vec<String> = vec![];
        assert_eq!(
            file_of(&t, t.resolve(&root, &segs("crate::Thing"))),
            "src/a/x.rs"
        );
        assert_eq!(
            file_of(&t, t.resolve(&root, &segs("crate::a::Thing"))),
            "src/a/x.rs"
        );
        assert_eq!(
            file_of(&t, t.resolve(&root, &segs("crate::a::AItem"))),
            "src/a/mod.rs"
        );
        assert_eq!(
            file_of(&t, t.resolve(&root, &segs("crate::a"))),
            "src/a/mod.rs"
        );
        assert_eq!(
            file_of(&t, t.resolve(&root, &segs("crate::TOP"))),
            "src/lib.rs"
        );
        let b = segs("b::inner");
        assert_eq!(
            file_of(&t, t.resolve(&b, &segs("super::super::TOP"))),
            "src/lib.rs"
        );
        assert_eq!(
            file_of(&t, t.resolve(&b, &segs("super::a::x::helper"))),
            "src/a/x.rs"
        );
        assert_eq!(
            t.resolve(&segs("b"), &segs("spillway_wire::Conn")),
            Resolved::External("spillway_wire".into(), segs("Conn"))
        );
        // A name imported from another crate, used through the importing module.
        assert_eq!(
            t.resolve(&segs("b"), &segs("self::Conn::new")),
            Resolved::External("spillway_wire".into(), segs("Conn::new"))
        );
    }

    #[test]
    fn refs_from_code_and_uses_not_from_tests_or_strings() {
        let t = sample();
        let b = t
            .files
            .iter()
            .position(|f| f.path == Path::new("src/b.rs"))
            .expect("b.rs");
        let named: Vec<String> = t
            .refs
            .iter()
            .filter(|r| r.file == b)
            .map(|r| r.leaf.segs.join("::"))
            .collect();
        assert_eq!(
            named,
            [
                "crate::Thing",
                "super::a",
                "super::a::x::helper",
                "spillway_wire::Conn",
                "super::super::TOP",
                "crate::a::AItem",
                "inner::f",
            ]
        );
        let inner = t
            .refs
            .iter()
            .find(|r| r.leaf.segs[0] == "super" && r.leaf.segs.len() == 3);
        assert_eq!(inner.map(|r| r.scope.clone()), Some(segs("b::inner")));
    }

    #[test]
    fn macro_export_lives_at_the_root() {
        let t = target(&[
            ("src/lib.rs", "pub mod codec;\npub mod messages;\n"),
            (
                "src/codec.rs",
                "#[macro_export]\nmacro_rules! wire_struct { () => {} }\n",
            ),
            ("src/messages.rs", "use crate::wire_struct;\n"),
        ]);
        assert_eq!(
            file_of(&t, t.resolve(&[], &segs("crate::wire_struct"))),
            "src/codec.rs"
        );
    }
}

//! A target's file → file dependencies: an edge from each file to each file whose items
//! it names (after re-exports are followed to where things are defined). Two kinds of
//! naming are not dependencies: a `mod x;` declaration (the module tree is not an
//! import), and a re-export (`pub use x::Y`) the file does not itself use, as a facade
//! `mod.rs` re-exports its children without depending on them.

use crate::graph::Graph;
use crate::model::{ModPath, RefKind, Resolved, Target};

/// Where a dependency is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Site {
    pub line: u32,
    /// The path as written (`crate::purge::PurgeWaker`).
    pub path: String,
}

pub fn file_graph(t: &Target) -> Graph<Site> {
    let mut g = Graph::new(t.files.len());
    for r in &t.refs {
        if let RefKind::Use { public: true } = r.kind {
            let used = r
                .leaf
                .name
                .as_ref()
                .is_some_and(|n| t.files[r.file].code_idents.contains(n));
            if !used {
                continue;
            }
        }
        if let Resolved::File(to) = t.resolve(&r.scope, &r.leaf.segs) {
            g.add(
                r.file,
                to,
                Site {
                    line: r.leaf.line,
                    path: r.leaf.segs.join("::"),
                },
            );
        }
    }
    g
}

/// One step of an import cycle among the parts of a module: part `part` (a child
/// module, with everything below it) depends on the next part, as written in `file` at
/// `site`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub part: String,
    pub file: usize,
    pub site: Site,
}

/// An import cycle among the parts of module `module` (its child modules, each taken
/// with everything below it), as a closed chain of steps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cycle {
    pub module: ModPath,
    pub steps: Vec<Step>,
}

/// The import cycles of a target, module by module. Within a module, the parts (child
/// modules with their subtrees) must depend on each other without a cycle; the
/// module's own file is not a part: it declares and uses its parts, and they see its
/// items through `super::`, which is how a module split into files looks, not a tangle.
/// So `conn.rs ↔ messages.rs` (two parts of the crate root) is a cycle, and so is
/// `fragment/ → purge.rs → registry.rs → fragment/`; `stage/mod.rs ↔ stage/x.rs` is not.
pub fn cycles(t: &Target) -> Vec<Cycle> {
    let files = file_graph(t);
    let edges = files.edges_within(&(0..t.files.len()).collect::<Vec<_>>());
    let mut out = Vec::new();
    for m in t.modules.keys() {
        let part_of = |f: usize| {
            let fm = &t.files[f].module;
            (fm.len() > m.len() && fm.starts_with(m)).then(|| fm[m.len()].clone())
        };
        let mut parts: Vec<String> = (0..t.files.len()).filter_map(part_of).collect();
        parts.sort();
        parts.dedup();
        if parts.len() < 2 {
            continue;
        }
        let index = |p: &String| parts.binary_search(p).ok();
        let mut g = Graph::new(parts.len());
        for (from, to, site) in &edges {
            let (Some(a), Some(b)) = (part_of(*from), part_of(*to)) else {
                continue;
            };
            if let (Some(a), Some(b)) = (index(&a), index(&b)) {
                g.add(a, b, (*from, site.clone()));
            }
        }
        for comp in g.cyclic_components() {
            let steps = g
                .cycle_in(&comp)
                .into_iter()
                .map(|(a, _, (file, site))| Step {
                    part: parts[a].clone(),
                    file,
                    site,
                })
                .collect();
            out.push(Cycle {
                module: m.clone(),
                steps,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::cycles;
    use crate::model::tests::target;
    use crate::model::Target;

    fn chains(t: &Target) -> Vec<String> {
        cycles(t)
            .iter()
            .map(|c| {
                let steps: Vec<String> = c
                    .steps
                    .iter()
                    .map(|s| format!("{}:{}", t.files[s.file].path.display(), s.site.line))
                    .collect();
                format!("[{}] {}", c.module.join("::"), steps.join(" → "))
            })
            .collect()
    }

    #[test]
    fn a_cycle_through_three_files() {
        // The shape of server/fragment → purge → registry → fragment.
        let t = target(&[
            ("src/lib.rs", "mod fragment;\nmod purge;\nmod registry;\n"),
            (
                "src/fragment/mod.rs",
                "mod allocs;\nuse crate::purge::PurgeWaker;\npub struct Fragment;\n",
            ),
            ("src/fragment/allocs.rs", "use crate::fragment::Fragment;\n"),
            (
                "src/purge.rs",
                "pub struct PurgeWaker;\nfn f() { crate::registry::Registry::get(); }\n",
            ),
            (
                "src/registry.rs",
                "use crate::fragment::Fragment;\npub struct Registry;\n",
            ),
        ]);
        assert_eq!(
            chains(&t),
            ["[] src/fragment/mod.rs:2 → src/purge.rs:2 → src/registry.rs:1"]
        );
    }

    #[test]
    fn facade_reexports_and_mod_declarations_are_not_dependencies() {
        let t = target(&[
            ("src/lib.rs", "mod x;\nmod y;\n"),
            ("src/x.rs", "pub use crate::y::{Y, Z};\npub struct X;\n"),
            (
                "src/y.rs",
                "pub struct Y;\npub struct Z;\nfn f() { crate::x::X; }\n",
            ),
        ]);
        assert!(chains(&t).is_empty());
    }

    #[test]
    fn a_reexport_the_file_also_uses_is_a_dependency() {
        let t = target(&[
            ("src/lib.rs", "mod x;\nmod y;\n"),
            (
                "src/x.rs",
                "pub use crate::y::Y;\npub struct X;\nfn g(_: Y) {}\n",
            ),
            ("src/y.rs", "pub struct Y;\nfn f() { crate::x::X; }\n"),
        ]);
        assert_eq!(chains(&t), ["[] src/x.rs:1 → src/y.rs:2"]);
    }

    #[test]
    fn a_module_file_is_a_hub_its_parts_are_not() {
        let t = target(&[
            ("src/lib.rs", "mod data;\n"),
            (
                "src/data/mod.rs",
                "mod allocs;\nmod a;\nmod b;\nmod c;\npub struct Store;\nfn f() { allocs::start(); c::C; }\n",
            ),
            ("src/data/allocs.rs", "use super::Store;\npub fn start() {}\n"),
            // c → a through the parent's file is fine; a ↔ b directly is not.
            ("src/data/c.rs", "pub struct C;\nfn h() { super::a::A; }\n"),
            ("src/data/a.rs", "use super::b::B;\nuse super::Store;\npub struct A;\n"),
            ("src/data/b.rs", "pub struct B;\nfn g() { super::a::A; }\n"),
        ]);
        assert_eq!(chains(&t), ["[data] src/data/a.rs:1 → src/data/b.rs:2"]);
    }

    #[test]
    fn a_part_and_another_subtree() {
        // a/x.rs → a/mod.rs (allowed inside `a`), but a/ ↔ b.rs is a cycle at the root.
        let t = target(&[
            ("src/lib.rs", "mod a;\nmod b;\n"),
            (
                "src/a/mod.rs",
                "mod x;\npub struct A;\nfn f() { crate::b::B; }\n",
            ),
            ("src/a/x.rs", "use super::A;\npub struct X;\n"),
            ("src/b.rs", "pub struct B;\nuse crate::a::x::X;\n"),
        ]);
        assert_eq!(chains(&t), ["[] src/a/mod.rs:3 → src/b.rs:2"]);
    }

    #[test]
    fn test_modules_do_not_count() {
        let t = target(&[
            (
                "src/lib.rs",
                "pub mod a;\npub struct Top;\n#[cfg(test)]\nmod tests { use crate::a::A; }\n",
            ),
            ("src/a.rs", "use crate::Top;\npub struct A;\n"),
        ]);
        assert!(chains(&t).is_empty());
    }
}

//! The layering rules of docs/layering.md, checked against the sources as they are.
//! Each rule is one test; a failure names the file and line to change and the rule it
//! breaks. The tables at the top are the part to edit when the plan itself changes
//! (a new crate, a module moving between the site and development sides); a test at
//! the bottom fails when a table names something that no longer exists, so that a
//! rename cannot turn a rule off quietly.

use spillway_layering::deps;
use spillway_layering::model::{ModPath, Resolved, Target};
use spillway_layering::tokens::{tokenize, Tok, Token};
use spillway_layering::workspace::{self, Crate};
use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

// ---------------------------------------------------------------------------------------
// The plan.

/// Rule a: crate layers, lowest first. A crate's `[dependencies]` name only workspace
/// crates of lower layers, so crates of one layer are independent of each other.
const LAYERS: &[&[&str]] = &[
    // Foundations: the domain's types, MUNGE credentials.
    &["spillway-types", "spillway-munge"],
    // The two protocols and the pure placement functions: the control plane's REST
    // API (types and client), the data plane's wire, where stripes and entries live.
    &["spillway-api", "spillway-wire", "spillway-placement"],
    // Built on one protocol each: the burst-buffer job phases (on the API), the typed
    // data-plane calls (on the wire).
    &["spillway-jobs", "spillway-stubs"],
    // The programs' libraries, none using another.
    &[
        "spillway-manager",
        "spillway-dwtools",
        "spillway-server",
        "spillway-client",
    ],
    // The `spillway` binary, which puts them together.
    &["spillway-cli"],
];

/// Crates outside the product (checks): they depend on no workspace crate at all.
const TOOLING: &[&str] = &["spillway-layering"];

/// Rule b: the storage modules of the server, which must not speak the wire.
const STORAGE: (&str, &[&str]) = ("spillway-server", &["meta"]);

/// Rule c: what the client may name from `spillway_wire`: the messages (requests the
/// stubs take, replies they return, flag constants), and the handles of calls a stub
/// has already sent. Not a connection: without one a call cannot be started.
const CLIENT_WIRE_MODULES: &[&str] = &["messages"];
const CLIENT_WIRE_ITEMS: &[&str] = &["PendingCall", "OwnedCall", "CallError"];
/// The wire's connection types: a stub method returning one hands out the transport.
const CONNECTION_TYPES: &[&str] = &["Conn", "Endpoint"];

/// Rule d: in `spillway-cli`, modules (paths from the crate root, a prefix covers its
/// submodules) and the modules they must not name: what a site runs (`site`) never
/// needs the development commands (`dev`), and the operating-system layer (`sys`)
/// knows no command. `main.rs` (dispatch) and `args` are on neither side.
const CLI_RULES: &[(&str, &[&str])] = &[("site", &["dev"]), ("sys", &["site", "dev"])];

// ---------------------------------------------------------------------------------------
// Reading the workspace.

/// The workspace checked: this one, or the one `SPILLWAY_LAYERING_ROOT` names (to check
/// another checkout, e.g. an older commit, with these rules).
fn root() -> PathBuf {
    std::env::var_os("SPILLWAY_LAYERING_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
}

fn crates() -> Vec<Crate> {
    workspace::load(&root()).unwrap_or_else(|e| panic!("reading the workspace: {e}"))
}

fn find<'a>(all: &'a [Crate], name: &str) -> &'a Crate {
    all.iter()
        .find(|c| c.manifest.name == name)
        .unwrap_or_else(|| panic!("no crate {name} under crates/ (docs/layering.md names it)"))
}

fn lib(c: &Crate) -> &Target {
    c.lib()
        .unwrap_or_else(|| panic!("{} has no src/lib.rs", c.manifest.name))
}

fn starts_with(m: &[String], prefix: &str) -> bool {
    let p: Vec<&str> = prefix.split("::").collect();
    m.len() >= p.len() && m.iter().zip(&p).all(|(a, b)| a == b)
}

fn module_name(m: &[String]) -> String {
    if m.is_empty() {
        "crate root".to_string()
    } else {
        m.join("::")
    }
}

/// Fails the test with every problem, one a line, under the rule's name.
fn report(rule: &str, problems: Vec<String>) {
    let problems: Vec<String> = problems
        .into_iter()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    assert!(
        problems.is_empty(),
        "\n{rule}\nbroken at {} place(s) (docs/layering.md says why):\n  {}\n",
        problems.len(),
        problems.join("\n  ")
    );
}

/// A use of another crate's item: where first, as written, the path inside that crate,
/// and how many more times the file names the same item.
struct ExtUse {
    file: usize,
    line: u32,
    written: String,
    inside: Vec<String>,
    more: usize,
}

impl ExtUse {
    fn more(&self) -> String {
        match self.more {
            0 => String::new(),
            n => format!(" (and {n} more use(s) in the file)"),
        }
    }
}

/// The non-test uses by `t` of crate `ext`'s items (`spillway_wire`), one per file and
/// item (`setattr::MODE` and `setattr::UID` are both the item `setattr`), at its first
/// line. Paths through this crate's own re-exports of `ext` count.
fn uses_of(t: &Target, ext: &str) -> Vec<ExtUse> {
    let mut by_item: BTreeMap<(usize, String), ExtUse> = BTreeMap::new();
    for r in &t.refs {
        let Resolved::External(k, inside) = t.resolve(&r.scope, &r.leaf.segs) else {
            continue;
        };
        if k != ext {
            continue;
        }
        let item = inside
            .iter()
            .find(|s| *s != "messages")
            .cloned()
            .unwrap_or_default();
        let u = ExtUse {
            file: r.file,
            line: r.leaf.line,
            written: r.leaf.segs.join("::"),
            inside,
            more: 0,
        };
        match by_item.entry((r.file, item)) {
            Entry::Vacant(v) => {
                v.insert(u);
            }
            Entry::Occupied(mut o) => {
                let more = o.get().more + 1;
                if u.line < o.get().line {
                    o.insert(u);
                }
                o.get_mut().more = more;
            }
        }
    }
    by_item.into_values().collect()
}

fn tokens_of(path: &Path) -> Vec<Token> {
    let src =
        fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    tokenize(&src).toks
}

// ---------------------------------------------------------------------------------------
// The rules.

#[test]
fn a_crates_depend_only_on_lower_layers() {
    let layer_of = |name: &str| LAYERS.iter().position(|l| l.contains(&name));
    let all = crates();
    let names: BTreeSet<&str> = all.iter().map(|c| c.manifest.name.as_str()).collect();
    let mut problems = Vec::new();
    for c in &all {
        let me = c.manifest.name.as_str();
        let mine = layer_of(me);
        if mine.is_none() && !TOOLING.contains(&me) {
            problems.push(format!(
                "{}:1: {me} is in no layer: add it to LAYERS in crates/spillway-layering/tests/layering.rs and to docs/layering.md",
                c.manifest_path().display()
            ));
            continue;
        }
        for (dep, line) in &c.manifest.deps {
            if !names.contains(dep.as_str()) {
                continue;
            }
            let allowed = match (mine, layer_of(dep)) {
                (Some(m), Some(d)) => d < m,
                _ => false,
            };
            if !allowed {
                let show =
                    |l: Option<usize>| l.map_or("tooling".to_string(), |l| format!("layer {l}"));
                problems.push(format!(
                    "{}:{line}: {me} ({}) depends on {dep} ({}); a crate depends only on crates of lower layers",
                    c.manifest_path().display(),
                    show(mine),
                    show(layer_of(dep)),
                ));
            }
        }
    }
    report(
        "rule a: crates depend only on crates in lower layers",
        problems,
    );
}

#[test]
fn b_storage_does_not_speak_the_wire() {
    let all = crates();
    let server = lib(find(&all, STORAGE.0));
    let mut problems = Vec::new();
    for u in uses_of(server, "spillway_wire") {
        let f = &server.files[u.file];
        if STORAGE.1.iter().any(|p| starts_with(&f.module, p)) {
            problems.push(format!(
                "{}:{}: names {}{}; the store (module {}) takes domain types and typed arguments, not wire messages",
                f.path.display(),
                u.line,
                u.written,
                u.more(),
                module_name(&f.module)
            ));
        }
    }
    report("rule b: storage does not speak the wire", problems);
}

/// The signatures of target `t`'s `pub fn`s (methods included): name, the identifiers
/// of the parameters, the identifiers of the return type.
fn pub_fn_signatures(t: &Target) -> Vec<(String, Vec<String>, Vec<String>)> {
    let mut out = Vec::new();
    for f in &t.files {
        let toks = tokens_of(&f.path);
        for i in 0..toks.len() {
            if !(toks[i].is_ident("fn")
                && toks[..i].iter().rev().take(4).any(|x| x.is_ident("pub")))
            {
                continue;
            }
            let Some(name) = toks.get(i + 1).and_then(Token::ident) else {
                continue;
            };
            let (mut params, mut ret) = (Vec::new(), Vec::new());
            let mut in_ret = false;
            for x in &toks[i + 2..] {
                match &x.tok {
                    Tok::Punct('{' | ';') => break,
                    Tok::Arrow => in_ret = true,
                    Tok::Ident(s) if s == "where" => break,
                    Tok::Ident(s) if in_ret => ret.push(s.clone()),
                    Tok::Ident(s) => params.push(s.clone()),
                    _ => {}
                }
            }
            out.push((name.to_string(), params, ret));
        }
    }
    out
}

#[test]
fn c_the_client_reaches_servers_only_through_the_stubs() {
    let all = crates();
    let client = lib(find(&all, "spillway-client"));
    let wire = lib(find(&all, "spillway-wire"));
    let stubs = lib(find(&all, "spillway-stubs"));
    let mut problems = Vec::new();

    // 1. What the client names from the wire: messages and call handles only.
    for u in uses_of(client, "spillway_wire") {
        let item = u.inside.last().map(String::as_str).unwrap_or_default();
        let mut path = vec!["crate".to_string()];
        path.extend(u.inside.iter().cloned());
        let ok = match wire.resolve(&[], &path) {
            Resolved::File(f) => {
                CLIENT_WIRE_MODULES
                    .iter()
                    .any(|m| starts_with(&wire.files[f].module, m))
                    || CLIENT_WIRE_ITEMS.contains(&item)
            }
            // Another crate's item, re-exported by the wire.
            Resolved::External(..) | Resolved::Unknown => true,
        };
        if !ok {
            problems.push(format!(
                "{}:{}: names {}{}, the wire's transport; the client calls servers through spillway_stubs::Instance",
                client.files[u.file].path.display(),
                u.line,
                u.written,
                u.more()
            ));
        }
    }

    // 2. Stub methods that hand out a connection are not called from the client.
    let signatures = pub_fn_signatures(stubs);
    let handing_out: BTreeSet<String> = signatures
        .iter()
        .filter(|(_, _, ret)| ret.iter().any(|t| CONNECTION_TYPES.contains(&t.as_str())))
        .map(|(n, _, _)| n.clone())
        .collect();
    // 3. Requests no stub method takes are not built by the client: it would be
    //    speaking the wire itself.
    let taken: BTreeSet<&str> = signatures
        .iter()
        .flat_map(|(_, p, _)| p.iter().map(String::as_str))
        .collect();
    // The requests are declared through macros (`wire_struct!(XxxReq { … })`): every
    // `…Req` name in the message modules is one.
    let requests: BTreeSet<String> = wire
        .files
        .iter()
        .filter(|f| {
            CLIENT_WIRE_MODULES
                .iter()
                .any(|p| starts_with(&f.module, p))
        })
        .flat_map(|f| tokens_of(&f.path))
        .filter_map(|x| x.ident().map(str::to_string))
        .filter(|n| {
            n.ends_with("Req")
                && n.starts_with(|c: char| c.is_ascii_uppercase())
                && !taken.contains(n.as_str())
        })
        .collect();
    for f in &client.files {
        let toks = tokens_of(&f.path);
        for (i, x) in toks.iter().enumerate() {
            let Some(name) = x.ident() else { continue };
            let prev = i.checked_sub(1).map(|p| &toks[p]);
            let next = toks.get(i + 1);
            if prev.is_some_and(|p| p.is_punct('.'))
                && next.is_some_and(|n| n.is_punct('('))
                && handing_out.contains(name)
            {
                problems.push(format!(
                    "{}:{}: calls .{name}(), a stub method that hands out a connection; add the call the client needs to spillway_stubs",
                    f.path.display(),
                    x.line
                ));
            }
            let in_type = prev.is_some_and(|p| {
                p.tok == Tok::Arrow
                    || ["impl", "for", "struct", "enum", "union", "trait", "dyn"]
                        .iter()
                        .any(|k| p.is_ident(k))
            });
            if requests.contains(name) && next.is_some_and(|n| n.is_punct('{')) && !in_type {
                problems.push(format!(
                    "{}:{}: builds a {name}, which no spillway_stubs method takes; the request is the stubs' to build",
                    f.path.display(),
                    x.line
                ));
            }
        }
    }
    report(
        "rule c: the client reaches servers only through the stubs",
        problems,
    );
}

#[test]
fn d_site_code_does_not_depend_on_development_commands() {
    let all = crates();
    let cli = find(&all, "spillway-cli");
    let mut problems = Vec::new();
    for t in &cli.targets {
        for r in &t.refs {
            let from = &t.files[r.file];
            let Some((side, banned)) = CLI_RULES.iter().find(|(p, _)| starts_with(&from.module, p))
            else {
                continue;
            };
            let Resolved::File(to) = t.resolve(&r.scope, &r.leaf.segs) else {
                continue;
            };
            let to = &t.files[to];
            if let Some(b) = banned.iter().find(|b| starts_with(&to.module, b)) {
                problems.push(format!(
                    "{}:{}: module {} names {}, defined in {} ({}); `{side}` must not use `{b}`: move what both need to a module both may use",
                    from.path.display(),
                    r.leaf.line,
                    module_name(&from.module),
                    r.leaf.segs.join("::"),
                    module_name(&to.module),
                    to.path.display()
                ));
            }
        }
    }
    report(
        "rule d: site-run CLI code does not depend on development commands",
        problems,
    );
}

#[test]
fn e_no_file_level_import_cycles() {
    let mut problems = Vec::new();
    for c in &crates() {
        for t in &c.targets {
            for cycle in deps::cycles(t) {
                let steps: Vec<String> = cycle
                    .steps
                    .iter()
                    .map(|s| {
                        format!(
                            "{}:{} names {}",
                            t.files[s.file].path.display(),
                            s.site.line,
                            s.site.path
                        )
                    })
                    .collect();
                let parts: Vec<&str> = cycle.steps.iter().map(|s| s.part.as_str()).collect();
                let module = if cycle.module.is_empty() {
                    format!("{} (crate root)", c.ident())
                } else {
                    format!("{}::{}", c.ident(), cycle.module.join("::"))
                };
                let first = parts.first().copied().unwrap_or_default();
                problems.push(format!(
                    "in {module}, parts {} → {first}: {}",
                    parts.join(" → "),
                    steps.join(", then ")
                ));
            }
        }
    }
    report(
        "rule e: no import cycles among the parts (child modules) of any module",
        problems,
    );
}

// ---------------------------------------------------------------------------------------
// The tables above still name what exists.

#[test]
fn tables_name_what_exists() {
    let all = crates();
    let mut problems = Vec::new();
    for name in LAYERS.iter().flat_map(|l| l.iter()).chain(TOOLING) {
        if !all.iter().any(|c| c.manifest.name == *name) {
            problems.push(format!(
                "LAYERS/TOOLING name {name}, which is not a crate under crates/"
            ));
        }
    }
    let modules_of = |t: &Target| -> Vec<ModPath> { t.modules.keys().cloned().collect() };
    let exists = |mods: &[ModPath], p: &str| mods.iter().any(|m| starts_with(m, p));
    let server = modules_of(lib(find(&all, STORAGE.0)));
    for p in STORAGE.1 {
        if !exists(&server, p) {
            problems.push(format!(
                "STORAGE names module {p}, which {} does not have",
                STORAGE.0
            ));
        }
    }
    let wire = modules_of(lib(find(&all, "spillway-wire")));
    for p in CLIENT_WIRE_MODULES {
        if !exists(&wire, p) {
            problems.push(format!(
                "CLIENT_WIRE_MODULES names module {p}, which spillway-wire does not have"
            ));
        }
    }
    let cli: Vec<ModPath> = find(&all, "spillway-cli")
        .targets
        .iter()
        .flat_map(modules_of)
        .collect();
    for (side, banned) in CLI_RULES {
        for p in std::iter::once(side).chain(banned.iter()) {
            if !exists(&cli, p) {
                problems.push(format!(
                    "CLI_RULES names module {p}, which spillway-cli does not have"
                ));
            }
        }
    }
    report(
        "the rule tables of tests/layering.rs name modules and crates that exist",
        problems,
    );
}

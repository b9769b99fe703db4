//! The grammar of one directive (spec §3): `#DW jobdw`, `persistentdw`, `swap`,
//! `stage_in`, `stage_out`, and Slurm's `#BB create_persistent` / `destroy_persistent`.
//! Tokens are separated by white space; every token but a command's positional word is
//! `key=value`, each key at most once. Values are checked here; how directives fit
//! together (one job instance, stage paths naming an instance of the job, what this
//! site supports) is `job.rs`'s business.

use crate::error::ScriptError;
use crate::script::{Prefix, RawDirective};
use std::collections::BTreeMap;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InstanceType {
    /// Explicit staging.
    Scratch,
    /// Transparent read-ahead and write-behind over a PFS directory.
    Cache,
}

impl InstanceType {
    pub fn as_str(self) -> &'static str {
        match self {
            InstanceType::Scratch => "scratch",
            InstanceType::Cache => "cache",
        }
    }
}

/// The access modes a directive asks for (`access_mode=striped,private`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AccessModes {
    /// One namespace shared by the job's nodes, files striped over the servers.
    pub striped: bool,
    /// One namespace per compute node.
    pub private: bool,
    /// Load-balanced: read-only replicas, each node reads one.
    pub ldbal: bool,
}

impl AccessModes {
    pub const STRIPED: AccessModes = AccessModes {
        striped: true,
        private: false,
        ldbal: false,
    };
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobDw {
    pub kind: InstanceType,
    pub access: AccessModes,
    /// Bytes asked for (before the pool's granularity rounds it up).
    pub capacity: u64,
    pub pool: Option<String>,
    /// The PFS directory a cache instance shows.
    pub pfs: Option<String>,
    /// Spillway's own key: the instance's stripe size (bytes, a power of two).
    pub stripe_size: Option<u32>,
    /// A cache instance's policies (absent: the defaults, docs/cache.md).
    pub policy: CachePolicy,
}

/// The cache policies a `#DW jobdw type=cache` may set: `modified_threshold=<size>`,
/// `read_ahead=<size>`, `sync_on_close=yes|no`, `sync_to_pfs=yes|no` (spec §3: the
/// paper's policies; the key spelling is inferred, the values DataWarp's yes/no).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CachePolicy {
    pub modified_threshold: Option<u64>,
    pub read_ahead: Option<u64>,
    pub sync_on_close: Option<bool>,
    pub sync_to_pfs: Option<bool>,
}

impl CachePolicy {
    fn is_empty(&self) -> bool {
        *self == CachePolicy::default()
    }
}

/// Which way a stage line copies, and what it names: the manager's own types.
pub use spillway_api::{StageDirection, StageType as StageKind};

/// A `stage_in` or `stage_out` line, its paths as written (`$DW_*` not yet expanded).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StageLine {
    pub direction: StageDirection,
    pub kind: StageKind,
    pub source: String,
    pub destination: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreatePersistent {
    pub name: String,
    pub capacity: u64,
    pub access: AccessModes,
    pub kind: InstanceType,
    pub pool: Option<String>,
    /// A cache's PFS directory (`pfs=`, required for `type=cache`).
    pub pfs: Option<String>,
    /// A cache's policies.
    pub policy: CachePolicy,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Directive {
    JobDw(JobDw),
    PersistentDw { name: String },
    Swap { bytes: u64, pool: Option<String> },
    Stage(StageLine),
    CreatePersistent(CreatePersistent),
    DestroyPersistent { name: String, hurry: bool },
}

/// A directive with the line it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Located {
    pub line: usize,
    /// In the script's leading comment block (what Slurm reads).
    pub leading: bool,
    pub directive: Directive,
}

/// Parse one directive.
pub fn parse(raw: &RawDirective) -> Result<Located, ScriptError> {
    let err = |m: String| ScriptError::at(raw.line, m);
    if !raw.text.is_empty() && !raw.text.starts_with([' ', '\t']) {
        return Err(err(format!(
            "{}{}: put a space between {} and the command",
            raw.prefix.as_str(),
            raw.text.split_whitespace().next().unwrap_or(""),
            raw.prefix.as_str()
        )));
    }
    let mut words = raw.text.split_whitespace();
    let Some(command) = words.next() else {
        return Err(err(format!("{} with no command", raw.prefix.as_str())));
    };
    let args: Vec<&str> = words.collect();
    let directive = match (raw.prefix, command) {
        (Prefix::Dw, "jobdw") => jobdw(&args),
        (Prefix::Dw, "persistentdw") => persistentdw(&args),
        (Prefix::Dw, "swap") => swap(&args),
        (Prefix::Dw, "stage_in") => stage(StageDirection::In, &args),
        (Prefix::Dw, "stage_out") => stage(StageDirection::Out, &args),
        (Prefix::Bb, "create_persistent") => create_persistent(&args),
        (Prefix::Bb, "destroy_persistent") => destroy_persistent(&args),
        (Prefix::Dw, "create_persistent" | "destroy_persistent") => Err(format!(
            "#DW {command} is refused by Slurm; write #BB {command}"
        )),
        (Prefix::Bb, "jobdw" | "persistentdw" | "swap" | "stage_in" | "stage_out") => Err(
            format!("#BB {command}: #BB is for create_persistent and destroy_persistent; write #DW {command}"),
        ),
        (Prefix::Dw, other) => Err(format!(
            "unknown directive #DW {other} (known: jobdw, persistentdw, swap, stage_in, stage_out)"
        )),
        (Prefix::Bb, other) => Err(format!(
            "unknown directive #BB {other} (known: create_persistent, destroy_persistent)"
        )),
    }
    .map_err(err)?;
    Ok(Located {
        line: raw.line,
        leading: raw.leading,
        directive,
    })
}

/// The `key=value` tokens of a directive, checked against the keys it knows. Tokens
/// without `=` are returned apart, in order (the caller decides if it takes any).
struct Pairs<'a> {
    map: BTreeMap<&'a str, &'a str>,
    words: Vec<&'a str>,
}

impl<'a> Pairs<'a> {
    fn new(command: &str, args: &[&'a str], known: &[&str]) -> Result<Pairs<'a>, String> {
        let mut map = BTreeMap::new();
        let mut words = Vec::new();
        for tok in args {
            let Some((k, v)) = tok.split_once('=') else {
                words.push(*tok);
                continue;
            };
            if !known.contains(&k) {
                return Err(format!(
                    "{command}: unknown key {k:?} (known: {})",
                    known.join(", ")
                ));
            }
            if v.is_empty() {
                return Err(format!("{command}: {k}= has no value"));
            }
            if map.insert(k, v).is_some() {
                return Err(format!("{command}: {k}= is given twice"));
            }
        }
        Ok(Pairs { map, words })
    }

    fn get(&self, k: &str) -> Option<&'a str> {
        self.map.get(k).copied()
    }

    fn need(&self, command: &str, k: &str) -> Result<&'a str, String> {
        self.get(k)
            .ok_or_else(|| format!("{command}: missing {k}="))
    }

    fn no_words(&self, command: &str) -> Result<(), String> {
        match self.words.first() {
            None => Ok(()),
            Some(w) => Err(format!("{command}: {w:?} is not a key=value pair")),
        }
    }
}

fn jobdw(args: &[&str]) -> Result<Directive, String> {
    const C: &str = "jobdw";
    let p = Pairs::new(
        C,
        args,
        &[
            "type",
            "access_mode",
            "capacity",
            "pool",
            "pfs",
            "stripe_size",
            "modified_threshold",
            "read_ahead",
            "sync_on_close",
            "sync_to_pfs",
        ],
    )?;
    p.no_words(C)?;
    let kind = match p.get("type") {
        None => InstanceType::Scratch,
        Some(t) => instance_type(C, t)?,
    };
    let access = match p.get("access_mode") {
        None => AccessModes::STRIPED,
        Some(a) => access_modes(C, a)?,
    };
    let capacity = capacity(C, p.need(C, "capacity")?)?;
    let pool = p.get("pool").map(|v| pool_name(C, v)).transpose()?;
    let (pfs, policy) = cache_settings(C, &p, kind, access)?;
    let stripe_size = p
        .get("stripe_size")
        .map(|v| stripe_size(C, v))
        .transpose()?;
    Ok(Directive::JobDw(JobDw {
        kind,
        access,
        capacity,
        pool,
        pfs,
        stripe_size,
        policy,
    }))
}

/// The keys of a cache instance (`pfs=` and the policies), for `jobdw` and
/// `create_persistent` alike: a cache needs its directory and is never private; a
/// scratch instance takes none of them.
fn cache_settings(
    c: &str,
    p: &Pairs<'_>,
    kind: InstanceType,
    access: AccessModes,
) -> Result<(Option<String>, CachePolicy), String> {
    let pfs = p.get("pfs").map(|v| pfs_path(c, "pfs", v)).transpose()?;
    match kind {
        InstanceType::Cache => {
            if access.private {
                return Err(format!(
                    "{c}: access_mode=private is not possible on a cache instance (a cache shows one PFS directory, which every node shares); use striped or ldbal"
                ));
            }
            if pfs.is_none() {
                return Err(format!(
                    "{c}: type=cache needs pfs=<the PFS directory to cache>"
                ));
            }
        }
        InstanceType::Scratch => {
            if pfs.is_some() {
                return Err(format!(
                    "{c}: pfs= is for type=cache; a scratch instance is staged with #DW stage_in and stage_out"
                ));
            }
        }
    }
    let policy = CachePolicy {
        modified_threshold: p
            .get("modified_threshold")
            .map(|v| {
                spillway_api::size::parse_size(v)
                    .map_err(|e| format!("{c}: modified_threshold: {e}"))
            })
            .transpose()?,
        read_ahead: p.get("read_ahead").map(|v| read_ahead(c, v)).transpose()?,
        sync_on_close: p
            .get("sync_on_close")
            .map(|v| yes_no(c, "sync_on_close", v))
            .transpose()?,
        sync_to_pfs: p
            .get("sync_to_pfs")
            .map(|v| yes_no(c, "sync_to_pfs", v))
            .transpose()?,
    };
    if kind == InstanceType::Scratch && !policy.is_empty() {
        return Err(format!(
            "{c}: modified_threshold, read_ahead, sync_on_close and sync_to_pfs are cache policies, for type=cache"
        ));
    }
    Ok((pfs, policy))
}

/// The keys `cache_settings` reads.
const CACHE_KEYS: [&str; 5] = [
    "pfs",
    "modified_threshold",
    "read_ahead",
    "sync_on_close",
    "sync_to_pfs",
];

fn read_ahead(c: &str, v: &str) -> Result<u64, String> {
    let n = spillway_api::size::parse_size(v).map_err(|e| format!("{c}: read_ahead: {e}"))?;
    if n > 1 << 30 {
        return Err(format!("{c}: read_ahead={v} is more than 1GiB"));
    }
    Ok(n)
}

/// DataWarp's booleans: yes/no (true/false and 1/0 taken too).
fn yes_no(c: &str, k: &str, v: &str) -> Result<bool, String> {
    match v.to_ascii_lowercase().as_str() {
        "yes" | "true" | "1" => Ok(true),
        "no" | "false" | "0" => Ok(false),
        _ => Err(format!("{c}: {k}={v:?} is not yes or no")),
    }
}

fn persistentdw(args: &[&str]) -> Result<Directive, String> {
    const C: &str = "persistentdw";
    let p = Pairs::new(C, args, &["name"])?;
    p.no_words(C)?;
    let name = persistent_name(C, p.need(C, "name")?)?;
    Ok(Directive::PersistentDw { name })
}

fn swap(args: &[&str]) -> Result<Directive, String> {
    const C: &str = "swap";
    let p = Pairs::new(C, args, &["pool"])?;
    let size = match p.words.as_slice() {
        [s] => *s,
        [] => return Err(format!("{C}: missing the size (e.g. #DW swap 10GiB)")),
        [_, extra, ..] => return Err(format!("{C}: unexpected {extra:?} after the size")),
    };
    let bytes = capacity(C, size)?;
    let pool = p.get("pool").map(|v| pool_name(C, v)).transpose()?;
    Ok(Directive::Swap { bytes, pool })
}

fn stage(direction: StageDirection, args: &[&str]) -> Result<Directive, String> {
    let c = match direction {
        StageDirection::In => "stage_in",
        StageDirection::Out => "stage_out",
    };
    let p = Pairs::new(c, args, &["type", "source", "destination"])?;
    p.no_words(c)?;
    let kind = match p.need(c, "type")? {
        "file" => StageKind::File,
        "directory" => StageKind::Directory,
        "list" => StageKind::List,
        other => {
            return Err(format!(
                "{c}: type={other:?} is not one of file, directory, list"
            ))
        }
    };
    let source = p.need(c, "source")?.to_string();
    let destination = p.need(c, "destination")?.to_string();
    Ok(Directive::Stage(StageLine {
        direction,
        kind,
        source,
        destination,
    }))
}

fn create_persistent(args: &[&str]) -> Result<Directive, String> {
    const C: &str = "create_persistent";
    let mut keys = vec!["name", "capacity", "access", "access_mode", "type", "pool"];
    keys.extend(CACHE_KEYS);
    let p = Pairs::new(C, args, &keys)?;
    p.no_words(C)?;
    let name = persistent_name(C, p.need(C, "name")?)?;
    let capacity = capacity(C, p.need(C, "capacity")?)?;
    let access = match (p.get("access"), p.get("access_mode")) {
        (Some(_), Some(_)) => return Err(format!("{C}: give access= or access_mode=, not both")),
        (Some(a), None) | (None, Some(a)) => access_modes(C, a)?,
        (None, None) => AccessModes::STRIPED,
    };
    if access.private {
        return Err(format!(
            "{C}: access=private is for job instances (one namespace per compute node of one job); a persistent instance is striped or ldbal"
        ));
    }
    let kind = match p.get("type") {
        None => InstanceType::Scratch,
        Some(t) => instance_type(C, t)?,
    };
    // Slurm passes none of these keys to create_persistent: setup reads them from
    // the job script (docs/cache.md, "Persistent cache instances through Slurm").
    let (pfs, policy) = cache_settings(C, &p, kind, access)?;
    let pool = p.get("pool").map(|v| pool_name(C, v)).transpose()?;
    Ok(Directive::CreatePersistent(CreatePersistent {
        name,
        capacity,
        access,
        kind,
        pool,
        pfs,
        policy,
    }))
}

fn destroy_persistent(args: &[&str]) -> Result<Directive, String> {
    const C: &str = "destroy_persistent";
    let p = Pairs::new(C, args, &["name"])?;
    let hurry = match p.words.as_slice() {
        [] => false,
        ["hurry"] => true,
        [w, ..] => {
            return Err(format!(
                "{C}: {w:?} is neither a key=value pair nor the word hurry"
            ))
        }
    };
    let name = persistent_name(C, p.need(C, "name")?)?;
    Ok(Directive::DestroyPersistent { name, hurry })
}

// ------------------------------------------------------------------------- values

fn instance_type(c: &str, v: &str) -> Result<InstanceType, String> {
    match v {
        "scratch" => Ok(InstanceType::Scratch),
        "cache" => Ok(InstanceType::Cache),
        other => Err(format!("{c}: type={other:?} is not one of scratch, cache")),
    }
}

fn access_modes(c: &str, v: &str) -> Result<AccessModes, String> {
    let mut a = AccessModes::default();
    for m in v.split(',') {
        match m {
            "striped" => a.striped = true,
            "private" => a.private = true,
            // `ldbalance` is Slurm's spelling, `loadbalance` the DataWarp paper's.
            "ldbal" | "ldbalance" | "loadbalance" => a.ldbal = true,
            "" => return Err(format!("{c}: empty access mode in {v:?}")),
            other => {
                return Err(format!(
                    "{c}: access mode {other:?} is not one of striped, private, ldbal"
                ))
            }
        }
    }
    if a.ldbal && (a.striped || a.private) {
        return Err(format!(
            "{c}: ldbal (read-only replicas) cannot be combined with striped or private"
        ));
    }
    Ok(a)
}

/// A size as Slurm reads it, but strict: Slurm turns `3.5TB` into 3 bytes and an
/// unknown unit into bytes without a word; we refuse both, and sizes in nodes.
fn capacity(c: &str, v: &str) -> Result<u64, String> {
    let unit = v.trim_start_matches(|ch: char| ch.is_ascii_digit());
    if matches!(unit.to_ascii_lowercase().as_str(), "n" | "node" | "nodes") && unit.len() < v.len()
    {
        return Err(format!(
            "{c}: capacity in nodes ({v}) is not supported; give bytes, e.g. 200GiB"
        ));
    }
    let n = spillway_api::size::parse_size(v).map_err(|e| format!("{c}: {e}"))?;
    if n == 0 {
        return Err(format!("{c}: the size must be more than 0"));
    }
    Ok(n)
}

fn stripe_size(c: &str, v: &str) -> Result<u32, String> {
    let n = spillway_api::size::parse_size(v).map_err(|e| format!("{c}: stripe_size: {e}"))?;
    let ok = n.is_power_of_two() && (64 << 10..=1 << 30).contains(&n);
    if !ok {
        return Err(format!(
            "{c}: stripe_size={v} must be a power of two from 64KiB to 1GiB"
        ));
    }
    Ok(n as u32)
}

fn pool_name(c: &str, v: &str) -> Result<String, String> {
    let ok = v.len() <= 64
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
        && !v.starts_with(['.', '-']);
    if ok {
        Ok(v.to_string())
    } else {
        Err(format!(
            "{c}: pool={v:?} is not a pool name (1 to 64 of A-Z a-z 0-9 _ . -)"
        ))
    }
}

/// Persistent names are global and become part of a variable name
/// (`DW_PERSISTENT_STRIPED_<name>`); names of digits only are job ids.
fn persistent_name(c: &str, v: &str) -> Result<String, String> {
    if v.starts_with(|ch: char| ch.is_ascii_digit()) {
        return Err(format!(
            "{c}: name={v:?} starts with a digit; names of digits are job ids, so a persistent name must start with a letter"
        ));
    }
    let ok = v.len() <= 64
        && v.starts_with(|ch: char| ch.is_ascii_alphabetic() || ch == '_')
        && v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if ok {
        Ok(v.to_string())
    } else {
        Err(format!(
            "{c}: name={v:?} is not a persistent name (1 to 64 of A-Z a-z 0-9 _, not starting with a digit, so that $DW_PERSISTENT_STRIPED_<name> is a variable name)"
        ))
    }
}

/// A PFS path: absolute, no `$` (variables name instance paths only).
fn pfs_path(c: &str, key: &str, v: &str) -> Result<String, String> {
    if !v.starts_with('/') {
        return Err(format!("{c}: {key}={v:?} must be an absolute path"));
    }
    if v.contains('$') {
        return Err(format!(
            "{c}: {key}={v:?}: $ variables name instance paths, not PFS paths"
        ));
    }
    Ok(v.to_string())
}

#[cfg(test)]
mod tests;

//! A whole job script checked: its directives fit together, every stage path names an
//! instance the job has, and it asks only for what Spillway provides. The result,
//! [`JobSpec`], is what every burst-buffer phase works from; each phase parses the
//! script again (Slurm hands it to every call), so the phases never keep state of
//! their own.
//!
//! Where directives may stand: Slurm reads only the leading comment block (spec
//! §1.7.1), so an instance or persistent-buffer directive below the first command
//! would be neither scheduled nor charged by Slurm: it is refused. Stage lines may
//! stand anywhere, as with Cray's tool (real scripts put `stage_out` after their
//! commands).

use crate::directive::{
    self, CreatePersistent, Directive, InstanceType, JobDw, Located, StageDirection, StageKind,
};
use crate::error::{ScriptError, ScriptErrors};
use crate::script;
use spillway_api::stage_path::{StagePath, StagePathError};

/// The instance a `$DW_*` path names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// `$DW_JOB_STRIPED`: the job instance's shared namespace.
    JobStriped,
    /// `$DW_PERSISTENT_STRIPED_<name>`.
    Persistent(String),
}

/// A path inside an instance: which instance, and the absolute path within it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstancePath {
    pub target: Target,
    /// `/` for the instance's root; no `.`/`..` components, no repeated or trailing `/`.
    pub path: String,
}

/// One stage line, its paths resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stage {
    pub line: usize,
    pub direction: StageDirection,
    pub kind: StageKind,
    /// The PFS side (source of a stage-in, destination of a stage-out).
    pub pfs: String,
    /// The instance side.
    pub instance: InstancePath,
}

/// The job instance of a `#DW jobdw` line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobInstance {
    pub line: usize,
    pub spec: JobDw,
}

/// Everything a job script asks of the burst buffer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobSpec {
    pub instance: Option<JobInstance>,
    /// `#DW persistentdw` names, in script order.
    pub persistent: Vec<String>,
    pub stage_in: Vec<Stage>,
    pub stage_out: Vec<Stage>,
    pub create: Vec<CreatePersistent>,
    /// `#BB destroy_persistent`: (name, hurry).
    pub destroy: Vec<(String, bool)>,
}

impl JobSpec {
    /// Parse and check a job script. Every wrong line is reported, each with its number.
    pub fn parse(script: &[u8]) -> Result<JobSpec, ScriptErrors> {
        let raw = script::directives(script)?;
        let mut errors = Vec::new();
        let mut located = Vec::new();
        for r in &raw {
            match directive::parse(r) {
                Ok(l) => located.push(l),
                Err(e) => errors.push(e),
            }
        }
        let spec = assemble(&located, &mut errors);
        if errors.is_empty() {
            Ok(spec)
        } else {
            errors.sort_by_key(|e| e.line);
            Err(ScriptErrors(errors))
        }
    }

    /// Does the job use any burst buffer at all?
    pub fn is_empty(&self) -> bool {
        *self == JobSpec::default()
    }
}

fn assemble(located: &[Located], errors: &mut Vec<ScriptError>) -> JobSpec {
    let mut spec = JobSpec::default();
    let mut stage_lines = Vec::new();
    for l in located {
        let at = |m: String| ScriptError::at(l.line, m);
        let command = match &l.directive {
            Directive::JobDw(_) => Some("#DW jobdw"),
            Directive::PersistentDw { .. } => Some("#DW persistentdw"),
            Directive::Swap { .. } => Some("#DW swap"),
            Directive::CreatePersistent(_) => Some("#BB create_persistent"),
            Directive::DestroyPersistent { .. } => Some("#BB destroy_persistent"),
            Directive::Stage(_) => None,
        };
        if let (Some(c), false) = (command, l.leading) {
            errors.push(at(format!(
                "{c} stands after the script's first command: Slurm reads directives only from the comment block at the top, so it would neither schedule nor charge this; move it up"
            )));
            continue;
        }
        match &l.directive {
            Directive::JobDw(j) => {
                if let Some(prev) = &spec.instance {
                    errors.push(at(format!(
                        "a second #DW jobdw: line {} already asks for the job's instance (one per job; ask for the sum)",
                        prev.line
                    )));
                    continue;
                }
                spec.instance = Some(JobInstance {
                    line: l.line,
                    spec: j.clone(),
                });
            }
            Directive::PersistentDw { name } => {
                if spec.persistent.contains(name) {
                    errors.push(at(format!(
                        "persistentdw name={name} is given twice"
                    )));
                } else {
                    spec.persistent.push(name.clone());
                }
            }
            Directive::Swap { .. } => errors.push(at(
                "#DW swap is not supported: Spillway's mounts are FUSE file systems, which the kernel cannot swap to"
                    .into(),
            )),
            Directive::CreatePersistent(c) => {
                if spec.create.iter().any(|o| o.name == c.name) {
                    errors.push(at(format!(
                        "create_persistent name={} is given twice",
                        c.name
                    )));
                } else {
                    spec.create.push(c.clone());
                }
            }
            Directive::DestroyPersistent { name, hurry } => {
                if spec.destroy.iter().any(|(n, _)| n == name) {
                    errors.push(at(format!(
                        "destroy_persistent name={name} is given twice"
                    )));
                } else {
                    spec.destroy.push((name.clone(), *hurry));
                }
            }
            Directive::Stage(_) => stage_lines.push(l),
        }
    }
    // Stage paths name instances: resolve them once every instance line is known.
    for l in stage_lines {
        let Directive::Stage(s) = &l.directive else {
            continue;
        };
        match resolve_stage(&spec, s) {
            Ok((pfs, instance)) => {
                let stage = Stage {
                    line: l.line,
                    direction: s.direction,
                    kind: s.kind,
                    pfs,
                    instance,
                };
                match s.direction {
                    StageDirection::In => spec.stage_in.push(stage),
                    StageDirection::Out => spec.stage_out.push(stage),
                }
            }
            Err(m) => errors.push(ScriptError::at(l.line, m)),
        }
    }
    spec
}

fn resolve_stage(
    spec: &JobSpec,
    s: &directive::StageLine,
) -> Result<(String, InstancePath), String> {
    let c = match s.direction {
        StageDirection::In => "stage_in",
        StageDirection::Out => "stage_out",
    };
    if s.kind == StageKind::List {
        return Err(format!(
            "{c}: type=list is not supported in job scripts yet; write one stage_{} line per file, or stage a directory",
            if s.direction == StageDirection::In { "in" } else { "out" }
        ));
    }
    let (pfs_key, pfs, dw_key, dw) = match s.direction {
        StageDirection::In => ("source", &s.source, "destination", &s.destination),
        StageDirection::Out => ("destination", &s.destination, "source", &s.source),
    };
    let pfs = pfs_side(c, pfs_key, pfs)?;
    let instance = instance_side(spec, c, dw_key, dw)?;
    if s.kind == StageKind::File && (instance.path == "/" || pfs == "/") {
        return Err(format!(
            "{c}: type=file names a whole instance or the PFS root; use type=directory, or name the file"
        ));
    }
    Ok((pfs, instance))
}

fn pfs_side(c: &str, key: &str, v: &str) -> Result<String, String> {
    if v.starts_with('$') {
        return Err(format!(
            "{c}: {key}={v} names an instance, but the {key} of a {c} is on the PFS (an absolute path)"
        ));
    }
    if !v.starts_with('/') {
        return Err(format!("{c}: {key}={v:?} must be an absolute PFS path"));
    }
    if v.contains('$') {
        return Err(format!(
            "{c}: {key}={v:?}: $ variables name instance paths only"
        ));
    }
    normalise(c, key, v)
}

/// `$DW_JOB_STRIPED/x`, `${DW_JOB_STRIPED}/x`, `$DW_PERSISTENT_STRIPED_<name>/x`.
fn instance_side(spec: &JobSpec, c: &str, key: &str, v: &str) -> Result<InstancePath, String> {
    let Some(rest) = v.strip_prefix('$') else {
        return Err(format!(
            "{c}: {key}={v:?} must be an instance path: start it with $DW_JOB_STRIPED or $DW_PERSISTENT_STRIPED_<name>"
        ));
    };
    let (var, tail) = if let Some(braced) = rest.strip_prefix('{') {
        let Some(end) = braced.find('}') else {
            return Err(format!("{c}: {key}={v:?}: unclosed ${{"));
        };
        (&braced[..end], &braced[end + 1..])
    } else {
        let end = rest
            .find(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_'))
            .unwrap_or(rest.len());
        (&rest[..end], &rest[end..])
    };
    if !(tail.is_empty() || tail.starts_with('/')) {
        return Err(format!(
            "{c}: {key}={v:?}: ${var} must be followed by / or nothing"
        ));
    }
    let target = if var == "DW_JOB_LDBAL" {
        match &spec.instance {
            Some(i) if i.spec.access.ldbal && i.spec.kind != InstanceType::Cache => {
                Target::JobStriped
            }
            Some(_) => {
                return Err(format!(
                    "{c}: {key}={v} names $DW_JOB_LDBAL, but the job instance is not a load-balanced scratch instance (access_mode=ldbal)"
                ))
            }
            None => {
                return Err(format!(
                    "{c}: {key}={v} names $DW_JOB_LDBAL, but the script has no #DW jobdw line"
                ))
            }
        }
    } else if var == "DW_JOB_STRIPED" {
        match &spec.instance {
            Some(i) if i.spec.access.ldbal && i.spec.kind != InstanceType::Cache => {
                return Err(format!(
                    "{c}: {key}={v} names $DW_JOB_STRIPED, but the job instance is load-balanced (access_mode=ldbal): its path is $DW_JOB_LDBAL"
                ))
            }
            Some(i) if i.spec.access.private && !i.spec.access.striped => {
                return Err(format!(
                    "{c}: {key}={v} names $DW_JOB_STRIPED, but the job instance is private only (ask for access_mode=striped,private to stage)"
                ))
            }
            Some(i) if i.spec.kind == InstanceType::Cache => {
                return Err(format!(
                    "{c}: the job instance is a cache of {}: its data moves between the PFS and the cache on demand, so it is not staged",
                    i.spec.pfs.as_deref().unwrap_or("its PFS directory")
                ))
            }
            Some(_) => Target::JobStriped,
            None => {
                return Err(format!(
                    "{c}: {key}={v} names $DW_JOB_STRIPED, but the script has no #DW jobdw line"
                ))
            }
        }
    } else if let Some(name) = var
        .strip_prefix("DW_PERSISTENT_STRIPED_")
        .or_else(|| var.strip_prefix("DW_PERSISTENT_LDBAL_"))
    {
        // A load-balanced persistent instance's variable is DW_PERSISTENT_LDBAL_<name>
        // (phases/mounts.rs); either names the instance here.
        if !spec.persistent.iter().any(|n| n == name) {
            return Err(format!(
                "{c}: {key}={v} names the persistent instance {name:?}, but the script has no #DW persistentdw name={name} line"
            ));
        }
        Target::Persistent(name.to_string())
    } else if var == "DW_JOB_PRIVATE" {
        return Err(format!(
            "{c}: {key}={v}: private namespaces exist only on compute nodes while the job runs; stage through $DW_JOB_STRIPED"
        ));
    } else if var.starts_with("DW_") {
        return Err(format!(
            "{c}: {key}={v}: unknown variable ${var} (stage paths use $DW_JOB_STRIPED or $DW_PERSISTENT_STRIPED_<name>)"
        ));
    } else {
        return Err(format!(
            "{c}: {key}={v}: ${var} is not a DataWarp variable; only $DW_JOB_STRIPED and $DW_PERSISTENT_STRIPED_<name> are expanded"
        ));
    };
    let path = if tail.is_empty() {
        "/".to_string()
    } else {
        normalise(c, key, tail)?
    };
    Ok(InstancePath { target, path })
}

/// A stage path as the script wrote it, in normal form ([`StagePath::exact`]: repeated
/// and trailing `/` collapse; `.` and `..` are refused, as a stage path says exactly
/// where it goes).
fn normalise(c: &str, key: &str, v: &str) -> Result<String, String> {
    StagePath::exact(v).map(String::from).map_err(|e| match e {
        StagePathError::Dot | StagePathError::DotDot => {
            format!("{c}: {key}={v:?}: . and .. are not allowed in stage paths")
        }
        // Callers hand over absolute paths only; `exact` has no limits of its own.
        StagePathError::NotAbsolute
        | StagePathError::TooLong
        | StagePathError::Nul
        | StagePathError::NameTooLong => format!("{c}: {key}={v:?} {e}"),
    })
}

#[cfg(test)]
mod tests;

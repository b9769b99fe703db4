//! A failed stage told in the script's own words: instance paths as the script wrote
//! them (`$DW_JOB_STRIPED/input.dat`), not as the manager stores them (`/input.dat`,
//! a path inside the instance that exists nowhere on the user's nodes).

use crate::job::{InstancePath, Stage as StageLine, Target};
use spillway_api::stage_path::at_or_under;
use spillway_api::{Stage, StageDirection as Dir};

/// `$DW_JOB_STRIPED/a/b` for the instance path `/a/b` of `target` (its root: the bare
/// variable).
pub fn instance_path(target: &Target, path: &str) -> String {
    let var = match target {
        Target::JobStriped => "$DW_JOB_STRIPED".to_string(),
        Target::Persistent(name) => format!("$DW_PERSISTENT_STRIPED_{name}"),
    };
    if path == "/" || path.is_empty() {
        var
    } else {
        format!("{var}{path}")
    }
}

impl InstancePath {
    /// This path as a script writes it (`$DW_JOB_STRIPED/in`).
    pub fn shown(&self) -> String {
        instance_path(&self.target, &self.path)
    }
}

/// A path of a failed stage, shown: a path on the instance side of `line` as a `$DW_*`
/// path, a PFS path as it is.
pub fn stage_path(line: &StageLine, p: &str) -> String {
    if at_or_under(p, &line.pfs) || !at_or_under(p, &line.instance.path) {
        return p.to_string();
    }
    instance_path(&line.instance.target, p)
}

/// `line N: stage_in SRC -> DST: stage ID failed: WHY`, every path as the script wrote
/// it.
pub fn stage_failure(line: &StageLine, s: &Stage) -> String {
    let why = match &s.error {
        Some(e) if !e.path.is_empty() => {
            let shown = stage_path(line, &e.path);
            e.message.replace(&e.path, &shown)
        }
        Some(e) => e.message.clone(),
        None => format!("it ended {}", s.state.as_str()),
    };
    let (c, src, dst) = match s.direction {
        Dir::In => ("stage_in", line.pfs.clone(), line.instance.shown()),
        Dir::Out => ("stage_out", line.instance.shown(), line.pfs.clone()),
    };
    format!(
        "line {}: {c} {src} -> {dst}: stage {} {}: {why}",
        line.line,
        s.id,
        s.state.as_str()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::JobSpec;

    fn line(script: &str) -> StageLine {
        let spec = JobSpec::parse(script.as_bytes()).expect("valid");
        spec.stage_in
            .into_iter()
            .chain(spec.stage_out)
            .next()
            .expect("a stage line")
    }

    #[test]
    fn instance_paths_are_shown_as_written() {
        let l = line(
            "#DW jobdw capacity=1GiB\n#DW stage_out type=directory source=$DW_JOB_STRIPED/out destination=/pfs/u/out\n",
        );
        assert_eq!(l.instance.shown(), "$DW_JOB_STRIPED/out");
        assert_eq!(stage_path(&l, "/out/a/b"), "$DW_JOB_STRIPED/out/a/b");
        assert_eq!(stage_path(&l, "/pfs/u/out/a"), "/pfs/u/out/a");
        assert_eq!(stage_path(&l, "/outside"), "/outside");

        let l = line(
            "#DW persistentdw name=db\n#DW stage_in type=file source=/pfs/u/in.dat destination=$DW_PERSISTENT_STRIPED_db/input.dat\n",
        );
        assert_eq!(
            stage_path(&l, "/input.dat"),
            "$DW_PERSISTENT_STRIPED_db/input.dat"
        );
        assert_eq!(stage_path(&l, "/pfs/u/in.dat"), "/pfs/u/in.dat");

        // A stage of the instance root: every path but the PFS side's is inside it.
        let l = line(
            "#DW jobdw capacity=1GiB\n#DW stage_in type=directory source=/pfs/u/in destination=$DW_JOB_STRIPED\n",
        );
        assert_eq!(l.instance.shown(), "$DW_JOB_STRIPED");
        assert_eq!(stage_path(&l, "/x"), "$DW_JOB_STRIPED/x");
        assert_eq!(stage_path(&l, "/pfs/u/in/x"), "/pfs/u/in/x");
    }
}

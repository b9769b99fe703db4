//! `dwcli stage`: stage data between the PFS and an instance, follow and change stages
//! (docs/staging.md, docs/cli.md).
//!
//! Exit status of every `dwcli stage` command: 0 success (for `wait`, and `in`/`out`
//! with `--wait`: the stage completed), 1 the stage failed (each failed file is
//! printed), 2 it was terminated, revoked or dropped, 3 bad usage or any other error
//! (the manager refused, could not be reached, or the wait timed out).

use crate::connect::{Failure, Manager};
use crate::format;
use crate::json;
use crate::render::{errno_name, stages as stages_table};
use clap::{ArgGroup, Args, Subcommand};
use spillway_api::model::*;
use spillway_api::paths;
use spillway_api::query::{FailuresQuery, StageListQuery, WaitQuery};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Subcommand, Debug, PartialEq)]
pub enum StageCmd {
    /// Stage data in: from the PFS into an instance
    In(StageArgs),
    /// Stage data out: from an instance to the PFS
    Out(StageArgs),
    /// Show a stage, an instance's stages, or every stage you may see
    Status {
        /// A stage id
        #[arg(value_name = "ID", conflicts_with = "instance")]
        id: Option<u64>,
        #[arg(long, value_name = "INST-ID")]
        instance: Option<u64>,
    },
    /// Wait for a stage to end, showing its progress
    Wait {
        #[arg(value_name = "ID")]
        id: u64,
        /// Give up after this many seconds (exit 3) [default: wait for the end]
        #[arg(long, value_name = "S")]
        timeout: Option<u64>,
    },
    /// Terminate a queued, deferred or running stage
    Cancel {
        #[arg(value_name = "ID")]
        id: u64,
    },
    /// Cancel a deferred stage-out
    Revoke {
        #[arg(value_name = "ID")]
        id: u64,
    },
    /// Run a deferred stage-out now
    Activate {
        #[arg(value_name = "ID")]
        id: u64,
    },
}

#[derive(Args, Debug, PartialEq)]
#[command(group(ArgGroup::new("kind").required(true).args(["file", "directory", "list"])))]
pub struct StageArgs {
    /// The instance staged into or out of
    #[arg(long, value_name = "INST-ID")]
    pub instance: u64,
    /// SOURCE and DESTINATION are files
    #[arg(long)]
    pub file: bool,
    /// SOURCE and DESTINATION are directories (the destination must exist)
    #[arg(long)]
    pub directory: bool,
    /// Pairs of files from FILE: one `source destination` per line, `#` comments
    #[arg(long, value_name = "FILE")]
    pub list: Option<PathBuf>,
    /// stage in: the PFS path; stage out: the instance path (absolute from its root)
    #[arg(
        value_name = "SOURCE",
        required_unless_present = "list",
        conflicts_with = "list"
    )]
    pub source: Option<String>,
    /// stage in: the instance path; stage out: the PFS path
    #[arg(
        value_name = "DESTINATION",
        required_unless_present = "list",
        conflicts_with = "list"
    )]
    pub destination: Option<String>,
    /// Stage out when the session is torn down (job end) instead of now
    #[arg(long)]
    pub defer: bool,
    /// Run the stage as this uid (admins only)
    #[arg(long, value_name = "UID")]
    pub owner: Option<u32>,
    /// Wait for the stage to end, showing its progress (exit status as `wait`)
    #[arg(long)]
    pub wait: bool,
    /// With --wait: give up after this many seconds
    #[arg(long, value_name = "S", requires = "wait")]
    pub timeout: Option<u64>,
}

/// A PFS path as the manager wants it: absolute (a relative one is taken from the
/// current directory).
fn pfs_abs(p: &str) -> String {
    if p.starts_with('/') {
        return p.to_string();
    }
    match std::env::current_dir() {
        Ok(d) => d.join(p).to_string_lossy().into_owned(),
        Err(_) => p.to_string(),
    }
}

/// The pairs of a list file: one `source destination` per line (separated by blanks;
/// paths cannot hold blanks), `#` starts a comment, blank lines are ignored.
pub fn parse_list(text: &str, what: &str) -> Result<Vec<StagePair>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            [s, d] => out.push(StagePair {
                source: s.to_string(),
                destination: d.to_string(),
            }),
            _ => {
                return Err(format!(
                    "{what}:{}: expected `source destination`, got {} word(s)",
                    n + 1,
                    words.len()
                ))
            }
        }
    }
    if out.is_empty() {
        return Err(format!("{what}: no pairs in it"));
    }
    Ok(out)
}

/// The body of `POST /stages` for `dwcli stage in|out`.
pub fn new_stage(
    direction: StageDirection,
    a: &StageArgs,
    list_text: Option<&str>,
) -> Result<NewStage, Failure> {
    if a.defer && direction == StageDirection::In {
        return Err(Failure::Usage(
            "--defer is for stage-outs only (a stage-in runs now)".into(),
        ));
    }
    // The PFS side of a pair: source for in, destination for out.
    let fix = |s: &str, d: &str| match direction {
        StageDirection::In => StagePair {
            source: pfs_abs(s),
            destination: d.to_string(),
        },
        StageDirection::Out => StagePair {
            source: s.to_string(),
            destination: pfs_abs(d),
        },
    };
    let (kind, source, destination, pairs) = match (&a.list, list_text) {
        (Some(path), Some(text)) => {
            let pairs = parse_list(text, &path.display().to_string()).map_err(Failure::Usage)?;
            (
                StageType::List,
                String::new(),
                String::new(),
                pairs
                    .iter()
                    .map(|p| fix(&p.source, &p.destination))
                    .collect(),
            )
        }
        _ => {
            let (Some(s), Some(d)) = (&a.source, &a.destination) else {
                return Err(Failure::Usage("SOURCE and DESTINATION are required".into()));
            };
            let p = fix(s, d);
            (
                if a.directory {
                    StageType::Directory
                } else {
                    StageType::File
                },
                p.source,
                p.destination,
                Vec::new(),
            )
        }
    };
    Ok(NewStage {
        instance: a.instance,
        direction,
        kind,
        source,
        destination,
        pairs,
        when: a.defer.then_some(StageWhen::JobEnd),
        owner: a.owner,
    })
}

fn out(s: &str) {
    let mut o = std::io::stdout().lock();
    let _ = o.write_all(s.as_bytes());
    let _ = o.flush();
}

fn is_tty() -> bool {
    // SAFETY: isatty only inspects the descriptor.
    unsafe { libc::isatty(1) == 1 }
}

/// Exit status for a stage that ended in `state`.
pub fn exit_of(state: StageState) -> u8 {
    match state {
        StageState::Complete => 0,
        StageState::Failed => 1,
        _ => 2,
    }
}

/// `files 1200/5000 bytes 75MiB/312.5MiB` (`?` totals before the enumeration).
pub fn progress_words(s: &Stage) -> String {
    let (ft, bt) = if s.enumerated {
        (s.files_total.to_string(), format::size(s.bytes_total))
    } else {
        ("?".into(), "?".into())
    };
    format!(
        "files {}/{ft} bytes {}/{bt}",
        s.files_done,
        format::size(s.bytes_done)
    )
}

/// The terminal's progress bar: `[######----] 1200/5000 files 75MiB/312.5MiB 12MiB/s`.
pub fn bar(s: &Stage, rate: f64) -> String {
    const W: usize = 24;
    let frac = if s.enumerated && s.bytes_total > 0 {
        s.bytes_done as f64 / s.bytes_total as f64
    } else if s.enumerated && s.files_total > 0 {
        s.files_done as f64 / s.files_total as f64
    } else {
        0.0
    };
    let full = ((frac.clamp(0.0, 1.0)) * W as f64).round() as usize;
    let (ft, bt) = if s.enumerated {
        (s.files_total.to_string(), format::size(s.bytes_total))
    } else {
        ("?".into(), "?".into())
    };
    format!(
        "stage {} {} [{}{}] {}/{ft} files {}/{bt} {}/s",
        s.id,
        s.state.as_str(),
        "#".repeat(full),
        "-".repeat(W - full),
        s.files_done,
        format::size(s.bytes_done),
        format::size(rate.max(0.0) as u64)
    )
}

/// The failed files of stage `s` (its instance's failure records that belong to it),
/// one line each: `<path>: <ERRNO>: <message>`; the stage's own error when no file
/// record names it.
fn failure_lines(m: &Manager, s: &Stage) -> Result<String, Failure> {
    let mut lines = String::new();
    let mut after = String::new();
    let mut n = 0usize;
    loop {
        let q = paths::stage_failures(
            s.instance,
            &FailuresQuery {
                after: Some(after.clone()),
                limit: Some(1000),
            },
        );
        // The instance may be gone (a stage-out at teardown): then only the stage's
        // own error is left to print.
        let Ok(a) = m.get(&q) else { break };
        let f: StageFailures = a.parse()?;
        for x in f.failures.iter().filter(|x| x.stage == s.id) {
            lines.push_str(&format!(
                "{}: {}: {}\n",
                x.path,
                errno_name(x.errno),
                x.message
            ));
            n += 1;
        }
        match f.failures.last() {
            Some(l) if f.more && n < 100_000 => after = l.path.clone(),
            _ => break,
        }
    }
    if lines.is_empty() {
        if let Some(e) = &s.error {
            lines = format!("{}: {}: {}\n", e.path, errno_name(e.errno), e.message);
        }
    }
    Ok(lines)
}

/// Follow stage `id` to its end: a progress bar on a terminal, else a line whenever
/// the progress changes. Returns the exit status.
pub fn wait(m: &Manager, id: u64, timeout: Option<u64>, json_out: bool) -> Result<u8, Failure> {
    let tty = !json_out && is_tty();
    let start = Instant::now();
    let limit = timeout.map(Duration::from_secs);
    let mut first_bytes: Option<u64> = None;
    let mut last_line = String::new();
    loop {
        let elapsed = start.elapsed();
        let left = limit.map(|l| l.saturating_sub(elapsed));
        let w = left.map(|l| l.as_secs().clamp(0, 2)).unwrap_or(2);
        let a = m.get(&paths::stage_waiting(id, &WaitQuery { wait: Some(w) }))?;
        let s: Stage = a.parse()?;
        let base = *first_bytes.get_or_insert(s.bytes_done);
        let secs = start.elapsed().as_secs_f64().max(0.001);
        let rate = s.bytes_done.saturating_sub(base) as f64 / secs;
        if s.state.ended() {
            if tty {
                out("\r\x1b[K");
            }
            if json_out {
                out(&json::pretty(a.raw()));
            } else {
                out(&format!(
                    "stage {id} {}: {}\n",
                    s.state.as_str(),
                    progress_words(&s)
                ));
                if s.state == StageState::Failed {
                    out(&failure_lines(m, &s)?);
                }
            }
            return Ok(exit_of(s.state));
        }
        if tty {
            out(&format!("\r{}\x1b[K", bar(&s, rate)));
        } else if !json_out {
            let line = format!("stage {id} {}: {}", s.state.as_str(), progress_words(&s));
            if line != last_line {
                out(&format!("{line} rate {}/s\n", format::size(rate as u64)));
                last_line = line;
            }
        }
        if left.is_some_and(|l| l.is_zero()) {
            if tty {
                out("\n");
            }
            return Err(Failure::Other(format!(
                "stage {id} has not ended after {} s (it is {})",
                timeout.unwrap_or(0),
                s.state.as_str()
            )));
        }
    }
}

/// Run one `dwcli stage` command, printing as it goes. The exit status.
pub fn run(m: &Manager, cmd: &StageCmd, json_out: bool) -> Result<u8, Failure> {
    match cmd {
        StageCmd::In(a) | StageCmd::Out(a) => {
            let dir = if matches!(cmd, StageCmd::In(_)) {
                StageDirection::In
            } else {
                StageDirection::Out
            };
            let text = match &a.list {
                Some(p) => Some(read_list(p)?),
                None => None,
            };
            let body = new_stage(dir, a, text.as_deref())?;
            let ans = m.post(paths::STAGES, &body)?;
            let s: Stage = ans.parse()?;
            if a.wait {
                if !json_out {
                    out(&created_line(&s));
                }
                return wait(m, s.id, a.timeout, json_out);
            }
            out(&if json_out {
                json::pretty(ans.raw())
            } else {
                created_line(&s)
            });
            Ok(0)
        }
        StageCmd::Status { id, instance } => {
            let (path, one) = match (id, instance) {
                (Some(id), _) => (paths::stage(*id), true),
                (None, instance) => (
                    paths::stages_where(&StageListQuery {
                        instance: *instance,
                        ..Default::default()
                    }),
                    false,
                ),
            };
            let a = m.get(&path)?;
            if json_out {
                out(&json::pretty(a.raw()));
                return Ok(0);
            }
            let list: Vec<Stage> = if one {
                vec![a.parse()?]
            } else {
                #[derive(serde::Deserialize)]
                struct L {
                    stages: Vec<Stage>,
                }
                a.parse::<L>()?.stages
            };
            out(&stages_table(&list));
            Ok(0)
        }
        StageCmd::Wait { id, timeout } => wait(m, *id, *timeout, json_out),
        StageCmd::Cancel { id } | StageCmd::Revoke { id } | StageCmd::Activate { id } => {
            let (word, action) = match cmd {
                StageCmd::Cancel { .. } => ("cancel", StageAction::Terminate),
                StageCmd::Revoke { .. } => ("revoke", StageAction::Revoke),
                _ => ("activate", StageAction::Activate),
            };
            let a = m.patch(&paths::stage(*id), &StageUpdate { action })?;
            if json_out {
                out(&json::pretty(a.raw()));
            } else {
                let s: Stage = a.parse()?;
                out(&format!(
                    "{word} stage {} state={}\n",
                    s.id,
                    s.state.as_str()
                ));
            }
            Ok(0)
        }
    }
}

fn read_list(p: &Path) -> Result<String, Failure> {
    std::fs::read_to_string(p)
        .map_err(|e| Failure::Usage(format!("cannot read the list {}: {e}", p.display())))
}

/// `created stage <id> instance=<id> direction=<in|out> type=<type> state=<state>`.
pub fn created_line(s: &Stage) -> String {
    format!(
        "created stage {} instance={} direction={} type={} state={}\n",
        s.id,
        s.instance,
        s.direction.as_str(),
        s.kind.as_str(),
        s.state.as_str()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_files() {
        let l = parse_list(
            "# pairs\n/pfs/a /in/a\n\n  /pfs/b\t/in/b   # trailing comment\n",
            "l",
        )
        .unwrap();
        assert_eq!(l.len(), 2);
        assert_eq!(l[1].source, "/pfs/b");
        assert_eq!(l[1].destination, "/in/b");
        assert!(parse_list("/a /b /c\n", "l")
            .unwrap_err()
            .contains("l:1: expected"));
        assert!(parse_list("# nothing\n\n", "l")
            .unwrap_err()
            .contains("no pairs"));
    }

    fn stage(state: StageState, enumerated: bool) -> Stage {
        Stage {
            id: 7,
            instance: 3,
            session: 2,
            owner: 1000,
            direction: StageDirection::In,
            kind: StageType::Directory,
            when: StageWhen::Immediate,
            source: "/pfs/in".into(),
            destination: "/in".into(),
            pairs: vec![],
            state,
            files_total: 5000,
            files_done: 1200,
            files_failed: 0,
            bytes_total: 320 << 20,
            bytes_done: 80 << 20,
            enumerated,
            error: None,
            server: Some("bb1".into()),
            created: 1,
            started: 2,
            finished: 0,
        }
    }

    #[test]
    fn progress_text() {
        let s = stage(StageState::Running, true);
        assert_eq!(progress_words(&s), "files 1200/5000 bytes 80MiB/320MiB");
        assert_eq!(
            bar(&s, (12 << 20) as f64),
            "stage 7 running [######------------------] 1200/5000 files 80MiB/320MiB 12MiB/s"
        );
        let s = stage(StageState::Running, false);
        assert_eq!(progress_words(&s), "files 1200/? bytes 80MiB/?");
        assert_eq!(exit_of(StageState::Complete), 0);
        assert_eq!(exit_of(StageState::Failed), 1);
        assert_eq!(exit_of(StageState::Dropped), 2);
        assert_eq!(exit_of(StageState::Revoked), 2);
        assert_eq!(exit_of(StageState::Terminated), 2);
    }

    #[test]
    fn table_of_stages() {
        let mut s = stage(StageState::Failed, true);
        s.error = Some(StageError {
            path: "/in/x".into(),
            errno: 13,
            message: "/in/x: permission denied".into(),
        });
        let mut q = stage(StageState::Queued, false);
        q.id = 8;
        q.server = None;
        q.files_done = 0;
        q.bytes_done = 0;
        assert_eq!(
            stages_table(&[s, q]),
            "stage inst owner dir type      state  files     failed bytes        server\n\
             7     3    1000  in  directory failed 1200/5000 0      80MiB/320MiB bb1\n\
             8     3    1000  in  directory queued 0/?       0      0B/?         -\n\
             stage 7 failed: /in/x: EACCES: /in/x: permission denied\n"
        );
    }
}

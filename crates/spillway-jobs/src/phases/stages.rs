//! `data_in` and `data_out`: the script's stage lines as stages of the manager, run by
//! the storage servers as the job's owner, and waited for. A stage the phase already
//! started (a repeated call) is waited for, not started twice.

use super::lookup::{wait_built, Job, PersistentUse};
use super::{PhaseError, PhaseResult};
use crate::job::{JobSpec, Stage as StageLine, Target};
use spillway_api::query::StageListQuery;
use spillway_api::{
    ApiClient, NewStage, Stage, StageAction, StageDirection as Dir, StageState, StageUpdate,
    StageWhen,
};

/// How long one poll for a stage's end waits at the manager (it answers sooner when
/// the stage ends).
const STAGE_POLL_SECS: u64 = 30;

/// The manager's request for one stage line into or out of `instance`.
pub(super) fn stage_request(
    s: &StageLine,
    instance: u64,
    owner: u32,
    when: Option<StageWhen>,
) -> NewStage {
    let (source, destination) = match s.direction {
        Dir::In => (s.pfs.clone(), s.instance.path.clone()),
        Dir::Out => (s.instance.path.clone(), s.pfs.clone()),
    };
    NewStage {
        instance,
        direction: s.direction,
        kind: s.kind,
        source,
        destination,
        pairs: Vec::new(),
        when,
        owner: Some(owner),
    }
}

/// The latest stage this job made like `want` (same instance, direction, type, paths
/// and owner, made since `since`), in whatever state.
fn latest_like(api: &ApiClient, want: &NewStage, since: i64) -> PhaseResult<Option<Stage>> {
    let all = api.list_stages(&StageListQuery {
        instance: Some(want.instance),
        ..Default::default()
    })?;
    Ok(all.into_iter().rev().find(|s| {
        s.direction == want.direction
            && s.kind == want.kind
            && s.source == want.source
            && s.destination == want.destination
            && Some(s.owner) == want.owner
            && s.created >= since
    }))
}

/// The stage `want` describes: the one this job already made, unless that one failed
/// or was given up (then a new one: a repeated phase retries), or None when the job's
/// owner revoked it (a revoked stage-out is not run behind their back).
pub(super) fn ensure_stage(
    api: &ApiClient,
    want: &NewStage,
    since: i64,
) -> PhaseResult<Option<Stage>> {
    match latest_like(api, want, since)? {
        Some(s) if s.state == StageState::Revoked => Ok(None),
        Some(s)
            if !matches!(
                s.state,
                StageState::Failed | StageState::Terminated | StageState::Dropped
            ) =>
        {
            Ok(Some(s))
        }
        _ => Ok(Some(api.create_stage(want)?)),
    }
}

/// Wait for a stage to end; Ok when it completed, Failed naming the file and the reason
/// (paths as the script wrote them: `shown`).
fn wait_stage(api: &ApiClient, id: u64, line: &StageLine) -> PhaseResult<Stage> {
    loop {
        let s = api.stage_waiting(id, STAGE_POLL_SECS)?;
        if !s.state.ended() {
            continue;
        }
        if s.state == StageState::Complete {
            return Ok(s);
        }
        return Err(PhaseError::Failed(super::shown::stage_failure(line, &s)));
    }
}

/// The instance a stage line names, for this job.
fn target_instance(api: &ApiClient, job: &Job, t: &Target) -> PhaseResult<(u64, i64)> {
    match t {
        Target::JobStriped => {
            let i = job.instance.as_ref().ok_or_else(|| {
                PhaseError::Failed(format!(
                    "session {} has no job instance (was setup run?)",
                    job.session.id
                ))
            })?;
            Ok((i.id, job.session.created))
        }
        Target::Persistent(name) => {
            let p = PersistentUse::find(api, name)?;
            // Stages of a persistent instance outlive jobs: only this job's count.
            Ok((p.instance.id, job.session.created))
        }
    }
}

fn summary(done: &[Stage]) -> String {
    let files: u64 = done.iter().map(|s| s.files_done).sum();
    let bytes: u64 = done.iter().map(|s| s.bytes_done).sum();
    format!("{} stage(s), {files} file(s), {bytes} bytes", done.len())
}

/// Stage in: the job instance built, then every stage_in line, started together and
/// waited for. The first failure is reported (the others still run to their end).
pub fn data_in(api: &ApiClient, spec: &JobSpec, token: &str) -> PhaseResult<String> {
    let job = Job::find(api, token)?;
    if let Some(i) = &job.instance {
        wait_built(api, i.id)?;
    }
    let mut started = Vec::new();
    for s in &spec.stage_in {
        let (iid, since) = target_instance(api, &job, &s.instance.target)?;
        if iid != job.instance.as_ref().map_or(0, |i| i.id) {
            wait_built(api, iid)?;
        }
        let want = stage_request(s, iid, job.session.owner, None);
        let st = ensure_stage(api, &want, since).map_err(|e| in_line(e, s.line, "stage_in"))?;
        if let Some(st) = st {
            started.push((st.id, s));
        }
    }
    let done = wait_all(api, &started)?;
    Ok(format!("staged in: {}", summary(&done)))
}

/// Stage out: the job instance's deferred stage-outs activated, stage-outs of
/// persistent instances started, all waited for.
pub fn data_out(api: &ApiClient, spec: &JobSpec, token: &str) -> PhaseResult<String> {
    let job = Job::find(api, token)?;
    let mut started = Vec::new();
    let mut revoked = 0;
    for s in &spec.stage_out {
        let (iid, since) = target_instance(api, &job, &s.instance.target)?;
        let when = match s.instance.target {
            Target::JobStriped => Some(StageWhen::JobEnd),
            Target::Persistent(_) => None,
        };
        let want = stage_request(s, iid, job.session.owner, when);
        let st = ensure_stage(api, &want, since).map_err(|e| in_line(e, s.line, "stage_out"))?;
        let Some(mut st) = st else {
            revoked += 1;
            continue;
        };
        if st.state == StageState::Deferred {
            st = api.update_stage(
                st.id,
                &StageUpdate {
                    action: StageAction::Activate,
                },
            )?;
        }
        started.push((st.id, s));
    }
    let done = wait_all(api, &started)?;
    let mut said = format!("staged out: {}", summary(&done));
    if revoked > 0 {
        said.push_str(&format!("; {revoked} revoked by the job, not run"));
    }
    Ok(said)
}

/// An error of one stage line, naming the line; one the manager may get over (it
/// restarting) stays what it is, so that `spillway run` can ask again.
fn in_line(e: PhaseError, line: usize, c: &str) -> PhaseError {
    if e.is_transient() {
        return e;
    }
    PhaseError::Failed(format!("line {line}: {c}: {e}"))
}

fn wait_all(api: &ApiClient, started: &[(u64, &StageLine)]) -> PhaseResult<Vec<Stage>> {
    let mut done = Vec::new();
    let mut first_err = None;
    for &(id, line) in started {
        match wait_stage(api, id, line) {
            Ok(s) => done.push(s),
            Err(e) if first_err.is_none() => first_err = Some(e),
            Err(_) => {}
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(done),
    }
}

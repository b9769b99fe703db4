//! What a job's teardown says of its stage-outs (docs/jobs.md, "When a stage-out does
//! not complete"): Slurm 22.05 marks a job only through a failing call
//! (`FAIL_BURST_BUFFER_OP`, the reason `BurstBufferOperation`, the output in the job's
//! reason text and SystemComment), so a teardown whose session lost a stage-out the
//! job owed to the PFS fails once, after the session is gone. Slurm then runs the
//! teardown again, which finds no session (`token not found`: success) and releases
//! the buffer as always; the job keeps the reason.
//!
//! A stage-out is *lost* when the latest stage of its paths (a repeated `data_out`
//! retries a failed one) ended `failed`, or `dropped` by a hurried teardown after it
//! had started copying or when the job had asked for it at once (libdatawarp's
//! immediate stage-outs). A deferred stage-out a hurry dropped before it ever ran is
//! what `hurry` means (no stage-out) and only listed; a stage the job itself
//! terminated was its own decision (`dwstat stages` shows it).

use spillway_api::query::StageListQuery;
use spillway_api::{ApiClient, ApiError, Stage, StageDirection, StageState, StageWhen};
use std::collections::BTreeMap;

/// The lost stage-outs of `stages` (one session's), oldest first.
pub(super) fn lost(stages: Vec<Stage>) -> Vec<Stage> {
    let mut latest: BTreeMap<(u64, String, String, String), Stage> = BTreeMap::new();
    for s in stages
        .into_iter()
        .filter(|s| s.direction == StageDirection::Out)
    {
        let pairs = serde_json::to_string(&s.pairs).unwrap_or_default();
        let key = (s.instance, s.source.clone(), s.destination.clone(), pairs);
        match latest.get(&key) {
            Some(old) if old.id > s.id => {}
            _ => {
                latest.insert(key, s);
            }
        }
    }
    let mut out: Vec<Stage> = latest
        .into_values()
        .filter(|s| match s.state {
            StageState::Failed => true,
            StageState::Dropped => s.started > 0 || s.when == StageWhen::Immediate,
            _ => false,
        })
        .collect();
    out.sort_by_key(|s| s.id);
    out
}

/// The lost stage-outs of session `session`, as the manager has them now.
pub(super) fn of_session(api: &ApiClient, session: u64) -> Result<Vec<Stage>, ApiError> {
    let all = api.list_stages(&StageListQuery {
        session: Some(session),
        ..Default::default()
    })?;
    Ok(lost(all))
}

/// One line per lost stage-out, for Slurm's reason text.
pub(super) fn describe(lost: &[Stage]) -> String {
    lost.iter()
        .map(|s| {
            let what = if s.pairs.is_empty() {
                format!("{} -> {}", s.source, s.destination)
            } else {
                format!("{} files", s.pairs.len())
            };
            let why = s
                .error
                .as_ref()
                .map(|e| format!("{}: {}", e.path, e.message))
                .unwrap_or_else(|| "no reason recorded".into());
            format!("stage-out {} ({what}) {}: {why}", s.id, s.state.as_str())
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stage(id: u64, state: &str, when: &str, started: i64, src: &str) -> Stage {
        serde_json::from_value(serde_json::json!({
            "id": id, "instance": 3, "session": 2, "owner": 1000,
            "direction": "out", "type": "file", "when": when,
            "source": src, "destination": "/pfs/x", "pairs": [],
            "state": state, "files_total": 1, "files_done": 0, "files_failed": 0,
            "bytes_total": 0, "bytes_done": 0, "enumerated": true,
            "error": null, "server": null,
            "created": 1, "started": started, "finished": 2
        }))
        .expect("a stage")
    }

    #[test]
    fn only_stage_outs_the_job_owed_and_did_not_get_count() {
        let all = vec![
            stage(1, "failed", "job_end", 5, "/a"),
            stage(2, "complete", "job_end", 5, "/a"), // a retry completed /a
            stage(3, "failed", "immediate", 5, "/b"),
            stage(4, "dropped", "job_end", 0, "/c"), // never ran: what hurry means
            stage(5, "dropped", "job_end", 9, "/d"), // dropped while copying
            stage(6, "dropped", "immediate", 0, "/e"), // the job asked for it at once
            stage(7, "terminated", "immediate", 9, "/f"), // the job's own decision
            stage(8, "revoked", "job_end", 0, "/g"),
        ];
        let ids: Vec<u64> = lost(all).iter().map(|s| s.id).collect();
        assert_eq!(ids, [3, 5, 6]);
        let text = describe(&lost(vec![stage(5, "dropped", "job_end", 9, "/d")]));
        assert!(
            text.contains("stage-out 5 (/d -> /pfs/x) dropped"),
            "{text}"
        );
        assert!(!text.contains("token not found") && !text.contains("No matching session"));
    }
}

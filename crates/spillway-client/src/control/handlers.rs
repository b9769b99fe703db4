//! What each control request does once decoded: the manager's answer (through the REST
//! bridge, `rest.rs`) turned into the fields libdatawarp reads. Paths arrive here as
//! instance paths, except where a handler says otherwise; a failure of the manager
//! becomes its errno and message (`api_errno`).

use super::codec::{Action, Answer, Direction, Scope, StageKind, When, IOC_BUF_LEN};
use super::rest::{api_errno, Manager, NewStage};
use super::Control;
use serde_json::Value;
use spillway_api::ApiError;
use spillway_types::Errno;

/// Failures asked of the manager per `failures` request.
const FAILURES_PAGE: u32 = 512;

/// A handler's outcome: the error side is an answer too (an errno and its message).
pub(super) type Handled = Result<Answer, Answer>;

fn api_answer(e: ApiError) -> Answer {
    Answer::err(api_errno(&e), e.to_string())
}

fn int(v: &Value, key: &str) -> Result<i64, Answer> {
    v.get(key).and_then(Value::as_i64).ok_or_else(|| {
        Answer::err(
            Errno(libc::EIO),
            format!("the manager's answer lacks an integer `{key}`: {v}"),
        )
    })
}

fn dec(n: i64) -> Vec<u8> {
    n.to_string().into_bytes()
}

impl Control {
    /// Create a stage owned by the caller; answers its id.
    pub(super) fn stage(
        &self,
        m: &Manager<'_>,
        direction: Direction,
        kind: StageKind,
        when: When,
        pairs: &[(String, String)],
    ) -> Handled {
        let (source, destination, list) = match (kind, pairs) {
            (StageKind::List, _) => ("", "", pairs),
            (_, [(s, d)]) => (s.as_str(), d.as_str(), &[][..]),
            _ => return Err(Answer::err(Errno::EINVAL, "one source and one destination")),
        };
        let v = m
            .create_stage(&NewStage {
                direction,
                kind,
                when,
                source,
                destination,
                pairs: list,
            })
            .map_err(api_answer)?;
        Ok(Answer::ok(vec![dec(int(&v, "id")?)]))
    }

    /// complete, pending, deferred, failed, started (0/1) at `path`.
    pub(super) fn counts(
        &self,
        m: &Manager<'_>,
        scope: Scope,
        path: &str,
        wait_secs: Option<u32>,
    ) -> Handled {
        let v = m.stage_counts(scope, path, wait_secs).map_err(api_answer)?;
        let started = v.get("started").and_then(Value::as_bool).ok_or_else(|| {
            Answer::err(Errno(libc::EIO), format!("no `started` in the answer: {v}"))
        })?;
        Ok(Answer::ok(vec![
            dec(int(&v, "complete")?),
            dec(int(&v, "pending")?),
            dec(int(&v, "deferred")?),
            dec(int(&v, "failed")?),
            dec(i64::from(started)),
        ]))
    }

    /// `0` once nothing is pending at `path` (the manager waits up to `timeout_ms`,
    /// rounded up to seconds), else `-EAGAIN`; `-EINVAL` where no stage ever started.
    pub(super) fn wait(
        &self,
        m: &Manager<'_>,
        scope: Scope,
        path: &str,
        timeout_ms: u32,
    ) -> Handled {
        let secs = timeout_ms.div_ceil(1000);
        let c = self.counts(m, scope, path, (secs > 0).then_some(secs))?;
        // complete, pending, deferred, failed, started
        if c.fields.get(4).map(Vec::as_slice) != Some(b"1") {
            return Err(Answer::err(
                Errno::EINVAL,
                format!("no stage was ever started on {path}"),
            ));
        }
        if c.fields.get(1).map(Vec::as_slice) == Some(b"0") {
            Ok(Answer::ok(vec![b"0".to_vec()]))
        } else {
            Err(Answer::err(Errno(libc::EAGAIN), "stages still pending"))
        }
    }

    /// Terminate, revoke or activate the stages at `path` through the manager's
    /// `stage_actions`, as the caller: a user acts only on stages of instances they own
    /// (the manager's check), root on any. Answers how many stages it touched.
    pub(super) fn action(
        &self,
        m: &Manager<'_>,
        action: Action,
        scope: Scope,
        path: &str,
    ) -> Handled {
        let v = m.stage_actions(action, scope, path).map_err(api_answer)?;
        let n = v
            .get("stages")
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        Ok(Answer::ok(vec![dec(n as i64)]))
    }

    /// Set the stage concurrency; answers the value the manager took (it clamps).
    pub(super) fn concurrency(&self, m: &Manager<'_>, value: u32) -> Handled {
        let v = m.set_stage_concurrency(value).map_err(api_answer)?;
        Ok(Answer::ok(vec![dec(int(&v, "stage_concurrency")?)]))
    }

    /// Failed files of the instance after the mount path `after` ("": from the start),
    /// in path order. A mount of one directory answers only the failures below it:
    /// they are one run in path order (every path that starts with `dir/`), from the
    /// cursor `dir/` to the first path that does not start with it.
    pub(super) fn failures(&self, m: &Manager<'_>, after: &str) -> Handled {
        let cursor = match (after, self.root.is_instance_root()) {
            ("", true) => String::new(),
            ("", false) => format!("{}/", self.root.path()),
            (a, _) => self.root.inst_path(a),
        };
        let v = m
            .stage_failures(&cursor, FAILURES_PAGE)
            .map_err(api_answer)?;
        let list = v.get("failures").and_then(Value::as_array).ok_or_else(|| {
            Answer::err(
                Errno(libc::EIO),
                format!("no `failures` in the answer: {v}"),
            )
        })?;
        let mut more = v.get("more").and_then(Value::as_bool).unwrap_or(false);
        // Room for the result and `more`; then as many entries as fit. The cursor of
        // the next request is the last path answered, so a cut page loses nothing.
        let mut room = IOC_BUF_LEN - 3 - 2;
        let mut fields = vec![Vec::new()];
        for f in list {
            let Some(path) = f.get("path").and_then(Value::as_str) else {
                continue;
            };
            let Some(path) = self.root.mount_path(path) else {
                // Past the mount's directory: nothing further is ours.
                more = false;
                break;
            };
            if path.contains('\0') {
                continue;
            }
            let errno = f.get("errno").and_then(Value::as_i64).unwrap_or(0).abs();
            let errno = if errno == 0 {
                i64::from(libc::EIO)
            } else {
                errno
            };
            let e = format!("-{errno}");
            let need = path.len() + 1 + e.len() + 1;
            if need > room {
                more = true;
                break;
            }
            room -= need;
            fields.push(path.as_bytes().to_vec());
            fields.push(e.into_bytes());
        }
        fields[0] = if more { b"1".to_vec() } else { b"0".to_vec() };
        Ok(Answer::ok(fields))
    }
}

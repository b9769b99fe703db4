//! Who destroys a persistent instance: `#BB destroy_persistent name=<n>` reaches this
//! tool as `teardown --token <n> --job <SSL>/hash.H/job.<id>/script [--hurry]` (spec
//! §1.3, call 15), run as the SlurmUser, an admin on the manager. Slurm checks the
//! owner itself (spec §3.6), but this tool does not lend the job its own rights: it
//! finds the job's user and tears down only for the instance's owner
//! (`phases::teardown_for`).
//!
//! The job is the `job.<id>` component of `--job` (Slurm always builds that path for
//! this call); its user is what slurmctld says: `scontrol show job <id> -o`, field
//! `UserId=name(uid)`. Jobs of root or of the SlurmUser itself act as admins (Slurm lets
//! both destroy any instance). If the user cannot be found, nothing is destroyed.
//!
//! A `--job` that names no Slurm job is someone running the tool by hand: root acts as
//! an admin (explicitly, by running it); anyone else acts as themselves.

use std::path::Path;
use std::process::Command;

#[derive(Debug, PartialEq, Eq)]
pub(super) enum Destroyer {
    /// May destroy any instance (root, or a job of root or of the SlurmUser).
    Admin,
    /// May destroy only this user's instances.
    User(u32),
}

/// Who the persistent teardown with this `--job` acts for.
pub(super) fn destroyer(job: &str) -> Result<Destroyer, String> {
    // SAFETY: getuid and geteuid cannot fail.
    let (me, slurm_user) = unsafe { (libc::getuid(), libc::geteuid()) };
    let Some(id) = slurm_job_id(job) else {
        return Ok(if me == 0 {
            Destroyer::Admin
        } else {
            Destroyer::User(me)
        });
    };
    let uid = job_user(id)?;
    Ok(if uid == 0 || uid == slurm_user {
        Destroyer::Admin
    } else {
        Destroyer::User(uid)
    })
}

/// The job id of Slurm's `<SSL>/hash.H/job.<id>/script`, if `job` is such a path.
pub(super) fn slurm_job_id(job: &str) -> Option<u32> {
    let p = Path::new(job);
    if p.file_name()? != "script" {
        return None;
    }
    let dir = p.parent()?.file_name()?.to_str()?;
    let id = dir.strip_prefix("job.")?;
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    id.parse().ok()
}

/// The uid of job `id`, from slurmctld.
fn job_user(id: u32) -> Result<u32, String> {
    let refuse = |why: String| {
        format!("cannot tell whose job {id} is ({why}); refusing to destroy a persistent instance for it")
    };
    let out = Command::new("scontrol")
        .args(["show", "job", &id.to_string(), "-o"])
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| refuse(format!("scontrol: {e}")))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(refuse(format!(
            "scontrol show job {id}: {}",
            spillway_jobs::input::cut(err.trim(), 200)
        )));
    }
    user_id_field(&text, id).ok_or_else(|| refuse(format!("no UserId in scontrol show job {id}")))
}

/// `UserId=name(uid)` (or `UserId=uid` when the name is unknown) of the record of job
/// `id` in `scontrol show job -o` output (a line per record; an array job shows its
/// tasks, all of one user).
pub(super) fn user_id_field(text: &str, id: u32) -> Option<u32> {
    let want = format!("JobId={id}");
    let line = text
        .lines()
        .find(|l| l.split_whitespace().any(|w| w == want))
        .or_else(|| text.lines().find(|l| l.starts_with("JobId=")))?;
    let v = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("UserId="))?;
    let num = match v.rsplit_once('(') {
        Some((_, rest)) => rest.strip_suffix(')')?,
        None => v,
    };
    num.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurm_job_paths() {
        assert_eq!(
            slurm_job_id("/var/spool/slurmctld/hash.3/job.13/script"),
            Some(13)
        );
        assert_eq!(
            slurm_job_id("/s/hash.0/job.4294967290/script"),
            Some(4294967290)
        );
        for p in [
            "/s/burst_buffer_script",
            "/s/hash.3/job.13/script2",
            "/s/hash.3/job./script",
            "/s/hash.3/job.1a/script",
            "/s/hash.3/job.99999999999/script",
            "/home/u/pjob/script",
            "script",
            "",
        ] {
            assert_eq!(slurm_job_id(p), None, "{p}");
        }
    }

    #[test]
    fn user_ids_from_scontrol() {
        let rec = "JobId=13 JobName=x UserId=spwtest(1001) GroupId=spwtest(1001) MCS_label=N/A\n";
        assert_eq!(user_id_field(rec, 13), Some(1001));
        assert_eq!(
            user_id_field("JobId=7 UserId=4242 GroupId=1\n", 7),
            Some(4242)
        );
        let two = "JobId=20 ArrayJobId=20 UserId=a(1001)\nJobId=21 ArrayJobId=20 UserId=a(1001)\n";
        assert_eq!(user_id_field(two, 21), Some(1001));
        assert_eq!(
            user_id_field("slurm_load_jobs error: Invalid job id specified\n", 9),
            None
        );
        assert_eq!(user_id_field("JobId=9 UserId=a(b)\n", 9), None);
    }
}

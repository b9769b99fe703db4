//! `spillway run job.sh`: a `#DW` job script run on this site without Slurm, through
//! the same phases Slurm drives with `dw_wlm_cli` (`spillway_jobs::phases`), each
//! printed as it goes: validate, setup, stage in, paths, pre-run, the script itself
//! (as its user, with the `DW_*` variables), post-run, stage out, teardown.
//!
//! Failures: a phase before the script fails → teardown with hurry (nothing ran, so
//! nothing is owed). The script failing does not stop the phases after it (DataWarp
//! stages out whatever a job left). A failed stage-out keeps the session and its
//! instance, and says how to retry or give up: nothing owed to the PFS is dropped
//! without the user saying so.

mod as_user;
mod private;
mod retry;

// Progress lines: dropped, never a panic, when stdout is closed (`sys/pipe.rs`).
use crate::say;

use crate::args::RunArgs;
use spillway_api::ApiClient;
use spillway_jobs::input;
use spillway_jobs::phases::{self, PhaseError, SetupRequest, Teardown};
use spillway_jobs::JobSpec;
use spillway_types::identity::{self, Identity, Passwd};
use std::ffi::CString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Tokens of `spillway run` jobs start here: far beyond Slurm's job ids (at most
/// 0x03FFFFFF), so that both can share a site.
const TOKEN_BASE: u64 = 1_000_000_000_000;

/// The job's user: name, uid, primary gid, home (`dir`), shell.
type User = Passwd;

fn user_named(name: &str) -> Result<User, String> {
    Passwd::by_name(name)
        .map_err(|e| format!("cannot look up user {}: {e}", input::shown(name)))?
        .ok_or_else(|| format!("no user {}", input::shown(name)))
}

/// This process runs as root: it reads the script as the job's user and hands the
/// job its files through descriptors only.
fn privileged() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The job script, read with the job's user's own permissions (root reads it as the
/// user: a symlink to, or a copy of, a file the user may not read is refused), a
/// regular file of at most Slurm's script limit (4 MiB).
fn read_script(path: &std::path::Path, user: &User) -> Result<Vec<u8>, String> {
    const WHAT: &str = "the job script";
    if !privileged() {
        return input::read_regular(path, input::MAX_SCRIPT_BYTES, WHAT);
    }
    let id = Identity::of(user)?;
    as_user::read_as(&id, path, input::MAX_SCRIPT_BYTES, WHAT)
        .map_err(|e| format!("{e} (read as {}, the job's user)", user.name))
}

/// Who the job runs as: `--user`, else the caller, else (root) the user sudo came
/// from. Never root: Slurm refuses burst buffers to uid 0, and so do we.
fn job_user(arg: Option<&str>) -> Result<User, String> {
    // SAFETY: getuid cannot fail.
    let me = unsafe { libc::getuid() };
    let name = match arg {
        Some(n) => n.to_string(),
        None if me != 0 => std::env::var("USER").map_err(|_| "give --user NAME".to_string())?,
        None => match std::env::var("SUDO_USER") {
            Ok(u) if u != "root" && !u.is_empty() => u,
            _ => {
                return Err(
                    "give --user NAME: a job runs as an unprivileged user (Slurm refuses burst buffers to root too)"
                        .into(),
                )
            }
        },
    };
    let u = user_named(&name)?;
    if u.uid == 0 {
        return Err("a job does not run as root (as with Slurm); give --user NAME".into());
    }
    if me != 0 && u.uid != me {
        return Err(format!(
            "only root runs a job as another user (you are uid {me})"
        ));
    }
    Ok(u)
}

fn step(name: &str) {
    say!("==> {name}");
}

fn took(t: Instant) -> String {
    format!("({:.2} s)", t.elapsed().as_secs_f64())
}

/// A fresh token: no session may have it.
fn fresh_token(api: &ApiClient) -> Result<String, String> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    for k in 0..100 {
        let t = (TOKEN_BASE + (now % TOKEN_BASE) + k).to_string();
        if phases::find_session(api, &t)
            .map_err(|e| e.to_string())?
            .is_none()
        {
            return Ok(t);
        }
    }
    Err("no free token found; give --token".into())
}

pub fn run(a: RunArgs) -> Result<i32, String> {
    step("validate");
    let user = job_user(a.user.as_deref())?;
    let text = read_script(&a.script, &user)?;
    let spec =
        JobSpec::parse(&text).map_err(|e| format!("{}:\n{e}", input::shown_path(&a.script)))?;
    say!(
        "    {}: {} stage-in(s), {} stage-out(s){}{}; runs as {} (uid {})",
        a.script.display(),
        spec.stage_in.len(),
        spec.stage_out.len(),
        spec.instance
            .as_ref()
            .map(|i| format!(", a job instance of {} bytes", i.spec.capacity))
            .unwrap_or_default(),
        if spec.persistent.is_empty() {
            String::new()
        } else {
            format!(", persistent {}", spec.persistent.join(" "))
        },
        user.name,
        user.uid
    );
    let cfg_path = spillway_api::config::ClientConfig::locate(a.config.as_deref());
    // The job's own dwstat/dwcli reach this same site.
    let site_config = std::fs::canonicalize(&cfg_path).unwrap_or(cfg_path.clone());
    let cfg = spillway_api::config::ClientConfig::load(&cfg_path)?;
    let api = ApiClient::munge(&cfg, Duration::from_secs(60)).map_err(|e| e.to_string())?;
    // A request no pool can ever hold is refused now, before anything is made.
    if spec.instance.is_some() || !spec.create.is_empty() {
        let pools = retry::phase("validate", || Ok(phases::fits::pool_totals(&api)?))
            .map_err(|e| input::cut_values(&e.to_string()))?;
        phases::fits::check(&spec, &pools)
            .map_err(|e| format!("{}:\n{e}", input::shown_path(&a.script)))?;
    }
    let token = match a.token.clone() {
        Some(t) => t,
        None => fresh_token(&api)?,
    };
    let nodes = if a.nodes.is_empty() {
        vec![crate::sys::host::hostname()]
    } else {
        a.nodes.clone()
    };
    // Long values in a phase's message are cut, as dw_wlm_cli cuts them.
    let fail = |e: PhaseError| input::cut_values(&e.to_string());

    // Everything before the script: on failure, tear down in a hurry.
    let before = || -> Result<Vec<(String, String)>, String> {
        for c in &spec.create {
            step(&format!("create persistent {}", c.name));
            let t = Instant::now();
            let p = phases::NewPersistent::of(c, user.uid);
            say!(
                "    {} {}",
                retry::phase("create persistent", || phases::create_persistent(&api, &p))
                    .map_err(fail)?,
                took(t)
            );
        }
        for (name, hurry) in &spec.destroy {
            step(&format!("destroy persistent {name}"));
            let t = Instant::now();
            // For the job's user only: whoever runs `spillway run` lends it no right
            // over other users' instances.
            match retry::phase("destroy persistent", || {
                phases::teardown_for(&api, name, *hurry, user.uid)
            })
            .map_err(fail)?
            {
                Teardown::NotFound => say!("    no persistent instance {name} {}", took(t)),
                Teardown::Done { session, .. } => {
                    say!("    session {session} torn down {}", took(t))
                }
            }
        }
        step("setup");
        let t = Instant::now();
        let req = SetupRequest {
            token: token.clone(),
            owner: user.uid,
            group: user.gid,
            capacity: None,
            nodes: nodes.clone(),
            creator: "spillway-run".into(),
        };
        say!(
            "    {} {}",
            retry::phase("setup", || phases::setup(&api, &spec, &req)).map_err(fail)?,
            took(t)
        );
        step("stage in");
        let t = Instant::now();
        say!(
            "    {} {}",
            retry::phase("stage in", || phases::data_in(&api, &spec, &token)).map_err(fail)?,
            took(t)
        );
        step("paths");
        let vars = retry::phase("paths", || phases::paths(&api, &spec, &token)).map_err(fail)?;
        for (k, v) in &vars {
            say!("    {k}={v}");
        }
        step("pre-run");
        let t = Instant::now();
        say!(
            "    {} {}",
            retry::phase("pre-run", || phases::pre_run(&api, &spec, &token, &nodes))
                .map_err(fail)?,
            took(t)
        );
        Ok(vars)
    };
    let vars = match before() {
        Ok(v) => v,
        Err(e) => {
            say!("    FAILED: {e}");
            step("teardown (hurry: the job did not run)");
            match retry::phase("teardown", || phases::teardown_for(&api, &token, true, user.uid)) {
                Ok(_) => say!("    done"),
                // `--token` named another user's session: not the job's to tear down.
                Err(PhaseError::Refused(m)) => say!("    nothing torn down: {m}"),
                Err(t) => say!(
                    "    FAILED: {t}; the session of token {token} is left: remove it with `dwcli rm session <id>` (dwstat sessions)"
                ),
            }
            return Err(e);
        }
    };

    step(&format!("run {} as {}", a.script.display(), user.name));
    let t = Instant::now();
    // A script that cannot even start is a failed job: the phases after it still run.
    let status = match run_script(&a, &text, &user, &token, &vars, &site_config) {
        Ok(s) => s,
        Err(e) => {
            say!("    FAILED: {e}");
            127
        }
    };
    say!("    exit status {status} {}", took(t));

    step("post-run");
    let t = Instant::now();
    if let Err(e) = retry::phase("post-run", || phases::post_run(&api, &token)) {
        say!("    FAILED: {e}");
        say!(
            "    the session of token {token} is kept (its stage-outs are still owed): `dwstat sessions` shows it; `dwcli rm session <id>` tears it down and runs them"
        );
        return Err(format!("post-run failed: {e}"));
    }
    say!("    done {}", took(t));
    step("stage out");
    let t = Instant::now();
    match retry::phase("stage out", || phases::data_out(&api, &spec, &token)) {
        Ok(s) => say!("    {s} {}", took(t)),
        Err(e) => {
            say!("    FAILED: {e}");
            say!(
                "    the session of token {token} and its instance are kept so that the data is not lost: \
                 stage it out by hand (dwcli stage), then `dwcli rm session <id>` (dwstat sessions shows the id)"
            );
            return Err(format!("stage-out failed: {e}"));
        }
    }
    step("teardown");
    let t = Instant::now();
    match retry::phase("teardown", || {
        phases::teardown_for(&api, &token, false, user.uid)
    })
    .map_err(fail)?
    {
        Teardown::NotFound => say!("    nothing to tear down {}", took(t)),
        Teardown::Done { session, .. } => say!("    session {session} torn down {}", took(t)),
    }
    Ok(status)
}

/// Run the script as `user`, as Slurm would: a private copy of it executed (its `#!`
/// line chooses the interpreter, /bin/sh without one), a clean environment with the
/// user's identity and the job's `DW_*` variables. Returns its exit status (128+N
/// for a signal).
fn run_script(
    a: &RunArgs,
    text: &[u8],
    user: &User,
    token: &str,
    vars: &[(String, String)],
    site_config: &std::path::Path,
) -> Result<i32, String> {
    let priv_ = privileged();
    let dir = private::JobDir::make(token, priv_.then_some((user.uid, user.gid)), text)?;
    let copy = dir.script().to_path_buf();
    let mut cmd = if text.starts_with(b"#!") {
        Command::new(&copy)
    } else {
        let mut c = Command::new("/bin/sh");
        c.arg(&copy);
        c
    };
    cmd.args(&a.args);
    let cwd = match &a.chdir {
        Some(d) => d.clone(),
        None => std::env::current_dir().unwrap_or_else(|_| PathBuf::from(&user.dir)),
    };
    if !priv_ {
        cmd.current_dir(&cwd);
    }
    cmd.env_clear();
    for k in ["PATH", "TERM", "LANG", "LC_ALL", "TZ"] {
        if let Ok(v) = std::env::var(k) {
            cmd.env(k, v);
        }
    }
    if std::env::var_os("PATH").is_none() {
        cmd.env("PATH", "/usr/local/bin:/usr/bin:/bin");
    }
    cmd.env("HOME", &user.dir)
        .env("USER", &user.name)
        .env("LOGNAME", &user.name)
        .env("SHELL", &user.shell)
        .env("SPILLWAY_JOB_ID", token)
        .env("SPILLWAY_CONFIG", site_config);
    for (k, v) in vars {
        cmd.env(k, v);
    }
    if priv_ {
        // Looked up now: between fork and exec only async-signal-safe calls may run
        // (initgroups would read the group database there).
        let groups = identity::groups_of(&user.name, user.gid)?;
        let dir = CString::new(cwd.as_os_str().as_encoded_bytes())
            .map_err(|_| format!("bad directory {}", cwd.display()))?;
        let (uid, gid) = (user.uid, user.gid);
        // SAFETY: between fork and exec, in the child only, async-signal-safe calls:
        // its supplementary groups, then its gid, then its uid; then the working
        // directory, entered with the user's own permissions.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setgroups(groups.len(), groups.as_ptr()) != 0
                    || libc::setgid(gid) != 0
                    || libc::setuid(uid) != 0
                    || libc::chdir(dir.as_ptr()) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let status = cmd
        .status()
        .map_err(|e| format!("cannot run {} as {}: {e}", a.script.display(), user.name))?;
    drop(dir);
    use std::os::unix::process::ExitStatusExt;
    Ok(status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)))
}

//! `dw_wlm_cli`: the program Slurm's `burst_buffer/datawarp` plugin runs for every
//! burst-buffer operation (`GetSysState` in burst_buffer.conf), as the SlurmUser. It
//! is a thin front end: argv (`args`), the 30-second polls (`polls`), and the job
//! phases of `spillway_jobs::phases`, which keep no state of their own.
//!
//! Output rules Slurm imposes (spec §1.1, §8): stdout and stderr reach Slurm as one
//! text, so this program writes **only to stdout** and never to stderr; the polls and
//! `real_size` print exactly one JSON object. Exit 0 is success, 1 failure (Slurm
//! shows the output to the user or in the job's reason).

mod args;
mod owner;
mod polls;
mod stageouts;

use owner::{destroyer, Destroyer};

use crate::connect::{client, Failure};
use args::{ArgError, Call};
use spillway_api::{AccessMode, ApiClient, ConfigType};
use spillway_jobs::phases::{self, PhaseError, SetupRequest, Teardown};
use spillway_jobs::{input, JobSpec};
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

/// Longest one request to the manager may take: a stage's long poll asks for 30 s.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// How a call ended: the text for stdout and whether it succeeded.
struct Outcome {
    ok: bool,
    text: String,
}

impl Outcome {
    fn ok(text: impl Into<String>) -> Outcome {
        Outcome {
            ok: true,
            text: text.into(),
        }
    }
    fn fail(text: impl Into<String>) -> Outcome {
        Outcome {
            ok: false,
            text: text.into(),
        }
    }
}

pub fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let out = run(&args);
    let mut stdout = std::io::stdout().lock();
    // A failure's text echoes what it was given: long values are cut (a 10 MB bad
    // value must not come back whole; Slurm stores and shows this text).
    let mut text = if out.ok {
        out.text
    } else {
        input::cut_values(&out.text)
    };
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    // Nothing can be said if stdout is gone; the exit status still tells.
    let _ = stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush());
    if out.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn run(args: &[String]) -> Outcome {
    let call = match Call::parse(args) {
        Ok(c) => c,
        Err(e) => return Outcome::fail(format!("dw_wlm_cli: {e}")),
    };
    match dispatch(&call) {
        Ok(o) => o,
        Err(e) => Outcome::fail(format!("dw_wlm_cli: {}: {e}", call.function)),
    }
}

/// Errors of one call, as one message.
#[derive(Debug)]
struct Error(String);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<ArgError> for Error {
    fn from(e: ArgError) -> Self {
        Error(e.to_string())
    }
}
impl From<String> for Error {
    fn from(e: String) -> Self {
        Error(e)
    }
}
impl From<spillway_api::ApiError> for Error {
    fn from(e: spillway_api::ApiError) -> Self {
        Error(e.to_string())
    }
}
impl From<PhaseError> for Error {
    fn from(e: PhaseError) -> Self {
        Error(e.to_string())
    }
}
impl From<Failure> for Error {
    fn from(f: Failure) -> Self {
        Error(f.report("dw_wlm_cli").trim_end().to_string())
    }
}

fn manager() -> Result<crate::connect::Manager, Error> {
    Ok(client(None, REQUEST_TIMEOUT)?)
}

/// The job script Slurm names with `--job`, checked. Its problems are the user's
/// (`job_process` shows them at submit), one per line. Only a regular file of at most
/// Slurm's own script limit (4 MiB) is read.
fn script(call: &Call) -> Result<JobSpec, Error> {
    let path = call.need("--job")?;
    let bytes = input::read_regular(Path::new(path), input::MAX_SCRIPT_BYTES, "the job script")?;
    JobSpec::parse(&bytes).map_err(|e| Error(e.to_string()))
}

/// How long `job_process` asks the manager for the pools' sizes: it runs inside
/// Slurm's submit RPC (`ValidateTimeout`, 5 s by default).
const SUBMIT_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// Refuse a job asking for more than its pool holds in total: Slurm would keep it
/// pending forever (`BurstBufferResources`). The pools' sizes are two database reads
/// of the manager; if it does not answer in time the job is let through (its script
/// is valid; Slurm then keeps it waiting and `setup` says why).
fn fits_pools(spec: &JobSpec) -> Result<(), Error> {
    if spec.instance.is_none() && spec.create.is_empty() {
        return Ok(());
    }
    let Ok(m) = client(None, SUBMIT_CHECK_TIMEOUT) else {
        return Ok(());
    };
    match phases::fits::pool_totals(m.api()) {
        Ok(pools) => phases::fits::check(spec, &pools).map_err(|e| Error(e.to_string())),
        Err(_) => Ok(()),
    }
}

fn uid(call: &Call, opt: &str) -> Result<u32, Error> {
    let v = call.need(opt)?;
    v.parse()
        .map_err(|_| Error(format!("{opt} {} is not a numeric id", input::shown(v))))
}

fn dispatch(call: &Call) -> Result<Outcome, Error> {
    // Submit-time check: local only (it runs inside the submit RPC, 5 s).
    if call.function == "job_process" {
        let spec = script(call)?;
        fits_pools(&spec)?;
        return Ok(Outcome::ok(""));
    }
    let m = manager()?;
    let api = m.api();
    let out = match call.function.as_str() {
        "pools" => Outcome::ok(polls::pools(api)?),
        "show_instances" => Outcome::ok(polls::instances(api)?),
        "show_sessions" => Outcome::ok(polls::sessions(api)?),
        "show_configurations" => Outcome::ok(polls::configurations(api)?),
        "setup" => {
            let spec = script(call)?;
            let (pool, bytes) = args::capacity(call.need("--capacity")?)?;
            let req = SetupRequest {
                token: call.need("--token")?.to_string(),
                owner: uid(call, "--user")?,
                group: uid(call, "--groupid")?,
                capacity: Some((pool, bytes)),
                nodes: args::nodes(call)?,
                creator: "SLURM".into(),
            };
            Outcome::ok(phases::setup(api, &spec, &req)?)
        }
        "data_in" => {
            no_session_is_done(phases::data_in(api, &script(call)?, call.need("--token")?))?
        }
        "data_out" => {
            no_session_is_done(phases::data_out(api, &script(call)?, call.need("--token")?))?
        }
        "real_size" => real_size(api, call.need("--token")?)?,
        "paths" => {
            let spec = script(call)?;
            let vars = phases::paths(api, &spec, call.need("--token")?)?;
            write_pathfile(call.need("--pathfile")?, &vars)?;
            Outcome::ok("job_file_valid True")
        }
        "pre_run" => {
            let spec = script(call)?;
            let nodes = args::nodes(call)?;
            Outcome::ok(phases::pre_run(api, &spec, call.need("--token")?, &nodes)?)
        }
        "post_run" => Outcome::ok(phases::post_run(api, call.need("--token")?)?),
        "teardown" => {
            let token = call.need("--token")?;
            let hurry = call.flag("--hurry");
            let job = token.bytes().all(|b| b.is_ascii_digit());
            let done = if job {
                // A job's own teardown: Slurm chose the token (the job id) and made the
                // session for the job's user at setup.
                phases::teardown(api, token, hurry)?
            } else {
                // `#BB destroy_persistent name=<token>`: only for the instance's owner.
                match destroyer(call.need("--job")?)? {
                    Destroyer::Admin => phases::teardown(api, token, hurry)?,
                    Destroyer::User(uid) => phases::teardown_for(api, token, hurry, uid)?,
                }
            };
            let (session, mut said) = match done {
                Teardown::NotFound => {
                    return Ok(Outcome::ok(format!(
                        "token not found: No matching session for token {token}"
                    )))
                }
                Teardown::Done { session, dropped } if dropped.is_empty() => {
                    (session, format!("session {session} torn down"))
                }
                Teardown::Done { session, dropped } => (session, format!(
                    "session {session} torn down; with --hurry, these stage-outs were dropped and their data did NOT reach the PFS: stages {dropped:?}"
                )),
            };
            // A job's stage-out that did not reach the PFS fails the teardown once, so
            // that Slurm marks the job (stageouts.rs); the session is gone already, so
            // Slurm's retry answers `token not found` and the buffer is released.
            let lost = if job {
                stageouts::of_session(api, session)?
            } else {
                Vec::new()
            };
            if lost.is_empty() {
                Outcome::ok(said)
            } else {
                said.push_str(&format!(
                    "; {} stage-out(s) of the job did not complete, their destinations keep their old content or stay absent: {}",
                    lost.len(),
                    stageouts::describe(&lost)
                ));
                Outcome::fail(said)
            }
        }
        "create_persistent" => create_persistent(api, call)?,
        other => Outcome::fail(format!("invalid function {other:?}")),
    };
    Ok(out)
}

/// data_in and data_out of a job that has no session (a `#BB`-only job, or one torn
/// down already): Slurm counts `No matching session` as success.
fn no_session_is_done(r: Result<String, PhaseError>) -> Result<Outcome, Error> {
    match r {
        Ok(s) => Ok(Outcome::ok(s)),
        Err(e @ PhaseError::NoSession(_)) => Ok(Outcome::ok(e.to_string())),
        Err(e) => Err(e.into()),
    }
}

fn real_size(api: &ApiClient, token: &str) -> Result<Outcome, Error> {
    let job = phases::Job::find(api, token)?;
    let bytes = job.instance.map_or(0, |i| i.capacity.bytes);
    // Strict JSON: Slurm does not fix this one up.
    Ok(Outcome::ok(
        serde_json::json!({"token": token, "capacity": bytes, "units": "bytes"}).to_string(),
    ))
}

/// `NAME=value` lines, nothing else: Slurm takes each line verbatim, and a blank line
/// would cost the last variable (spec §1.8).
fn write_pathfile(path: &str, vars: &[(String, String)]) -> Result<(), Error> {
    let mut text = String::new();
    for (k, v) in vars {
        if v.contains('\n') || k.contains(['\n', '=']) {
            return Err(Error(format!(
                "refusing to write {k:?}={v:?} to the path file"
            )));
        }
        text.push_str(&format!("{k}={v}\n"));
    }
    std::fs::write(path, text).map_err(|e| Error(format!("cannot write {path}: {e}")))
}

fn create_persistent(api: &ApiClient, call: &Call) -> Result<Outcome, Error> {
    let name = call.need("-t")?.to_string();
    let owner = uid(call, "-u")?;
    let (pool, bytes) = args::capacity(call.need("-C")?)?;
    if bytes == 0 {
        return Err(Error(format!(
            "-C {:?}: the capacity must be more than 0",
            call.need("-C")?
        )));
    }
    let access = match call.get("-a") {
        None | Some("striped") | Some("stripe") => AccessMode::Stripe,
        Some("ldbal") | Some("ldbalance") | Some("loadbalance") => AccessMode::Ldbal,
        Some(a) => {
            return Err(Error(format!(
                "-a {a:?}: a persistent instance is striped or ldbal"
            )))
        }
    };
    let kind = match call.get("-T") {
        None | Some("scratch") => ConfigType::Scratch,
        Some("cache") => ConfigType::Cache,
        Some(t) => return Err(Error(format!("-T {t:?}: scratch or cache"))),
    };
    // Slurm passes no PFS directory: a cache's configuration is made at the job's
    // setup (phases::configure_persistent_caches).
    let p = phases::NewPersistent {
        name,
        owner,
        pool,
        bytes,
        access,
        kind,
        pfs: None,
        policy: Default::default(),
    };
    Ok(Outcome::ok(phases::create_persistent(api, &p)?))
}

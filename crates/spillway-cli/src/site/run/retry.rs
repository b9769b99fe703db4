//! `spillway run` rides out a brief manager restart: a phase that could not reach the
//! manager, or got a 5xx from it, is run again after a pause, for at most `RETRY_FOR`
//! since its first such failure. Every phase can be repeated (it finds the job again
//! from its token and waits for the stages it already started instead of starting
//! them twice: `spillway_jobs::phases`), so asking again is safe. A refusal (4xx), a
//! failed stage or mount is never retried.

use crate::say;
use spillway_jobs::phases::PhaseResult;
use std::time::{Duration, Instant};

/// How long a phase keeps asking a manager that does not answer.
pub const RETRY_FOR: Duration = Duration::from_secs(60);
const FIRST_PAUSE: Duration = Duration::from_millis(250);
const LONGEST_PAUSE: Duration = Duration::from_secs(8);

/// Run `f` (phase `what`) until it succeeds, fails for good, or the manager stayed
/// unreachable for `RETRY_FOR`.
pub fn phase<T>(what: &str, f: impl FnMut() -> PhaseResult<T>) -> PhaseResult<T> {
    retrying(what, RETRY_FOR, f)
}

fn retrying<T>(
    what: &str,
    budget: Duration,
    mut f: impl FnMut() -> PhaseResult<T>,
) -> PhaseResult<T> {
    let mut first_failure: Option<Instant> = None;
    let mut pause = FIRST_PAUSE;
    loop {
        match f() {
            Err(e) if e.is_transient() => {
                let since = *first_failure.get_or_insert_with(Instant::now);
                if since.elapsed() + pause > budget {
                    return Err(e);
                }
                say!(
                    "    the manager did not answer ({e}); {what} again in {:.2} s",
                    pause.as_secs_f64()
                );
                std::thread::sleep(pause);
                pause = (pause * 2).min(LONGEST_PAUSE);
            }
            r => return r,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_api::ApiError;
    use spillway_jobs::phases::PhaseError;

    fn unreachable() -> PhaseError {
        PhaseError::Api(ApiError::Unreachable {
            url: "https://m:1".into(),
            detail: "connection refused".into(),
        })
    }

    fn status(s: u16) -> PhaseError {
        PhaseError::Api(ApiError::Status {
            status: s,
            message: format!("HTTP {s}"),
            choices: None,
        })
    }

    #[test]
    fn unreachable_and_5xx_are_asked_again() {
        let mut n = 0;
        let r = retrying("x", Duration::from_secs(5), || {
            n += 1;
            match n {
                1 => Err(unreachable()),
                2 => Err(status(503)),
                _ => Ok(n),
            }
        });
        assert_eq!(r.unwrap(), 3);
    }

    #[test]
    fn refusals_and_failures_are_not() {
        let kinds: [fn() -> PhaseError; 6] = [
            || status(400),
            || status(404),
            || status(409),
            || PhaseError::Failed("stage failed".into()),
            || PhaseError::Refused("not yours".into()),
            || PhaseError::Api(ApiError::Protocol("bad".into())),
        ];
        for make in kinds {
            let mut n = 0;
            let r: PhaseResult<()> = retrying("x", Duration::from_secs(5), || {
                n += 1;
                Err(make())
            });
            assert!(r.is_err());
            assert_eq!(n, 1, "{}", make());
        }
    }

    #[test]
    fn the_budget_bounds_it() {
        let t = Instant::now();
        let mut n = 0;
        let r: PhaseResult<()> = retrying("x", Duration::from_millis(900), || {
            n += 1;
            Err(unreachable())
        });
        assert!(r.unwrap_err().is_transient());
        // 250 + 500 ms of pauses fit in 0.9 s; the next (1 s) does not.
        assert_eq!(n, 3);
        assert!(t.elapsed() < Duration::from_millis(1500));
    }
}

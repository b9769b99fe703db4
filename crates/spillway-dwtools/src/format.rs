//! How single values look in a table cell: times, booleans, sizes, lists and empty text.
//!
//! Every cell is one word (no empty cells), because users cut these tables with `awk`
//! and `grep`: an empty cell would shift every column after it.

use spillway_api::size::human;

/// The clock times are shown in. The tools use local time (DataWarp and Slurm's
/// `CreateTime=` do); tests use UTC so that golden strings do not depend on the machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Zone {
    Local,
    Utc,
}

/// Epoch seconds as `YYYY-MM-DDTHH:MM:SS` (ISO 8601 without zone, the form Slurm prints
/// for `CreateTime=`): sortable as text, one word, no decimals.
pub fn time(epoch: i64, zone: Zone) -> String {
    let (y, mo, d, h, mi, s) = match zone {
        Zone::Utc => utc_fields(epoch),
        Zone::Local => local_fields(epoch).unwrap_or_else(|| utc_fields(epoch)),
    };
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}")
}

/// `never` for 0 (no expiration), else the time.
pub fn expiration(epoch: i64, zone: Zone) -> String {
    if epoch == 0 {
        "never".to_string()
    } else {
        time(epoch, zone)
    }
}

pub fn boolean(b: bool) -> &'static str {
    if b {
        "true"
    } else {
        "false"
    }
}

/// Text as is, `-` when empty (see the module comment).
pub fn text(s: &str) -> String {
    if s.is_empty() {
        "-".to_string()
    } else {
        s.to_string()
    }
}

/// A byte count humanised like dwstat (`7.28TiB`, `1GiB`).
pub fn size(bytes: u64) -> String {
    human(bytes)
}

/// `granules` × `granularity` bytes as a size. Saturates rather than wraps: a pool
/// larger than 16 EiB is not real, and a wrong small number would be worse than a
/// visibly huge one.
pub fn granules(granules: u64, granularity: u64) -> String {
    human(granules.saturating_mul(granularity))
}

type Fields = (i64, u32, u32, u32, u32, u32);

fn utc_fields(epoch: i64) -> Fields {
    let days = epoch.div_euclid(86_400);
    let secs = epoch.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    (
        y,
        m,
        d,
        (secs / 3600) as u32,
        (secs / 60 % 60) as u32,
        (secs % 60) as u32,
    )
}

/// The C library's local time (honours `TZ` and /etc/localtime). None if it cannot
/// represent the instant.
fn local_fields(epoch: i64) -> Option<Fields> {
    // time_t is i64 here but 32 bits on some targets, where the conversion can fail.
    #[allow(clippy::useless_conversion)]
    let t: libc::time_t = epoch.try_into().ok()?;
    // SAFETY: an all-zero `tm` is a valid value (integers and a null zone pointer).
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are to live locals; localtime_r is the thread-safe variant
    // and writes only into `tm`.
    let r = unsafe { libc::localtime_r(&t, &mut tm) };
    if r.is_null() {
        return None;
    }
    Some((
        i64::from(tm.tm_year) + 1900,
        (tm.tm_mon + 1) as u32,
        tm.tm_mday as u32,
        tm.tm_hour as u32,
        tm.tm_min as u32,
        // A leap second (60) is shown as is: it is what the C library says.
        tm.tm_sec as u32,
    ))
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar
/// (Howard Hinnant's `civil_from_days`), so UTC needs no C library call.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_times() {
        assert_eq!(time(0, Zone::Utc), "1970-01-01T00:00:00");
        assert_eq!(time(1_795_313_400, Zone::Utc), "2026-11-22T02:10:00");
        // leap day and the turn of a century that is a leap year
        assert_eq!(time(951_782_400, Zone::Utc), "2000-02-29T00:00:00");
        assert_eq!(time(4_107_542_399, Zone::Utc), "2100-02-28T23:59:59");
        assert_eq!(time(-1, Zone::Utc), "1969-12-31T23:59:59");
    }

    #[test]
    fn local_time_has_the_same_shape() {
        let t = time(1_795_313_400, Zone::Local);
        assert_eq!(t.len(), 19, "{t}");
        assert_eq!(&t[4..5], "-");
        assert_eq!(&t[10..11], "T");
        // minutes and seconds do not depend on the zone for whole-hour and half-hour
        // zones; seconds never do
        assert_eq!(&t[17..], "00");
    }

    #[test]
    fn expiration_never() {
        assert_eq!(expiration(0, Zone::Utc), "never");
        assert_eq!(expiration(86_400, Zone::Utc), "1970-01-02T00:00:00");
    }

    #[test]
    fn cells() {
        assert_eq!(boolean(true), "true");
        assert_eq!(boolean(false), "false");
        assert_eq!(text(""), "-");
        assert_eq!(text("refdb"), "refdb");
        assert_eq!(size(1 << 30), "1GiB");
        assert_eq!(granules(7452, 1 << 30), "7.28TiB");
        assert_eq!(granules(u64::MAX, 2), human(u64::MAX));
    }
}

//! Option values as people type them, checked while parsing the command line so that a
//! bad value is a usage error (exit 2) that names the option, before any request.

use spillway_api::model::{AccessMode, ConfigType, Policy};
use spillway_api::size::parse_size;

/// A size: `200GiB`, `1TB`, `65536` (`spillway_api::size::parse_size`; decimals are
/// refused rather than truncated).
pub fn size(s: &str) -> Result<u64, String> {
    parse_size(s)
}

/// A stripe size: a size that fits the API's 32-bit field. The manager checks the
/// rest (a multiple of 4 KiB, its maximum) and says so.
pub fn stripe_size(s: &str) -> Result<u32, String> {
    let n = parse_size(s)?;
    u32::try_from(n).map_err(|_| format!("stripe size {s:?} is too large (at most 4GiB - 1)"))
}

/// Mode bits in octal, as chmod takes them: `0755`, `755`, `1777`.
pub fn octal_mode(s: &str) -> Result<u32, String> {
    let t = s.trim();
    let digits = t.strip_prefix("0o").unwrap_or(t);
    if digits.is_empty() || !digits.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
        return Err(format!(
            "not an octal mode: {s:?} (expected e.g. 0755 or 755)"
        ));
    }
    match u32::from_str_radix(digits, 8) {
        Ok(m) if m <= 0o7777 => Ok(m),
        _ => Err(format!("mode {s:?} is out of range (at most 07777)")),
    }
}

/// DataWarp's access modes and the names job scripts use for them.
pub fn access_mode(s: &str) -> Result<AccessMode, String> {
    match s.trim() {
        "stripe" | "striped" => Ok(AccessMode::Stripe),
        "private" => Ok(AccessMode::Private),
        "ldbal" | "load_balanced" => Ok(AccessMode::Ldbal),
        _ => Err(format!(
            "unknown access mode {s:?} (choices: stripe, striped, private, ldbal, load_balanced)"
        )),
    }
}

pub fn config_type(s: &str) -> Result<ConfigType, String> {
    match s.trim() {
        "scratch" => Ok(ConfigType::Scratch),
        "cache" => Ok(ConfigType::Cache),
        "swap" => Ok(ConfigType::Swap),
        _ => Err(format!(
            "unknown configuration type {s:?} (choices: scratch, cache, swap)"
        )),
    }
}

/// DataWarp's booleans: yes or no (true/false and 1/0 taken too).
pub fn yes_no(s: &str) -> Result<bool, String> {
    match s.to_ascii_lowercase().as_str() {
        "yes" | "true" | "1" => Ok(true),
        "no" | "false" | "0" => Ok(false),
        _ => Err(format!("{s:?} is not yes or no")),
    }
}

pub fn policy(s: &str) -> Result<Policy, String> {
    Policy::parse(s.trim())
        .ok_or_else(|| format!("unknown policy {s:?} (choices: bandwidth, isolation)"))
}

/// A comma-separated host list: `nid00001,nid00002`. An empty string is the empty
/// list (to take every client node out of a session); an empty name inside a list is
/// a typo and refused.
pub fn hosts(s: &str) -> Result<HostList, String> {
    if s.trim().is_empty() {
        return Ok(HostList(Vec::new()));
    }
    s.split(',')
        .map(|h| {
            let h = h.trim();
            if h.is_empty() {
                Err(format!("empty host name in {s:?}"))
            } else {
                Ok(h.to_string())
            }
        })
        .collect::<Result<_, _>>()
        .map(HostList)
}

/// The hosts of one `--hosts` option (one value, commas inside; clap would otherwise
/// take a `Vec` field as a repeated option).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostList(pub Vec<String>);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(size("1GiB"), Ok(1 << 30));
        assert!(size("3.5TB").unwrap_err().contains("decimal"));
        assert_eq!(stripe_size("8M"), Ok(8 << 20));
        assert!(stripe_size("4GiB").unwrap_err().contains("too large"));
    }

    #[test]
    fn octal_modes() {
        assert_eq!(octal_mode("0755"), Ok(0o755));
        assert_eq!(octal_mode("755"), Ok(0o755));
        assert_eq!(octal_mode("1777"), Ok(0o1777));
        assert_eq!(octal_mode("0o700"), Ok(0o700));
        assert!(octal_mode("0758")
            .unwrap_err()
            .contains("not an octal mode"));
        assert!(octal_mode("rwx").is_err());
        assert!(octal_mode("").is_err());
        assert!(octal_mode("-755").is_err());
        assert!(octal_mode("17777").unwrap_err().contains("out of range"));
        assert!(octal_mode("77777777777777777777777").is_err());
    }

    #[test]
    fn access_modes() {
        assert_eq!(access_mode("stripe"), Ok(AccessMode::Stripe));
        assert_eq!(access_mode("striped"), Ok(AccessMode::Stripe));
        assert_eq!(access_mode("private"), Ok(AccessMode::Private));
        assert_eq!(access_mode("ldbal"), Ok(AccessMode::Ldbal));
        assert_eq!(access_mode("load_balanced"), Ok(AccessMode::Ldbal));
        assert!(access_mode("shared").unwrap_err().contains("choices"));
    }

    #[test]
    fn types_and_policies() {
        assert_eq!(config_type("scratch"), Ok(ConfigType::Scratch));
        assert_eq!(config_type("swap"), Ok(ConfigType::Swap));
        assert!(config_type("scatch").is_err());
        assert_eq!(policy("isolation"), Ok(Policy::Isolation));
        assert!(policy("fast").is_err());
    }

    #[test]
    fn host_lists() {
        let ab = HostList(vec!["a".to_string(), "b".to_string()]);
        assert_eq!(hosts("a,b"), Ok(ab.clone()));
        assert_eq!(hosts(" a , b "), Ok(ab));
        assert_eq!(hosts(""), Ok(HostList(vec![])));
        assert!(hosts("a,,b").is_err());
    }
}

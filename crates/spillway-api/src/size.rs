//! Byte counts as people write them and as `dwstat` prints them: the one size parser of
//! every Spillway tool (`spillway cluster up`, `local up`, `setstripe`, `dwcli`,
//! `dw_wlm_cli`, `#DW` directives, `manager.conf`).
//!
//! Input follows Slurm's `bb_get_size_num` and DataWarp's capacity units
//! (`../shared/spec/datawarp-compat.md` §1.7.4): an unsigned decimal integer, then an
//! optional unit, case-insensitive, optionally after blanks:
//!
//! | unit | bytes |
//! |---|---|
//! | none, `B` | 1 |
//! | `K` `KiB`, `M` `MiB`, `G` `GiB`, `T` `TiB`, `P` `PiB` | powers of 1024 |
//! | `KB`, `MB`, `GB`, `TB`, `PB` | powers of 1000 |
//!
//! So `4G` = `4GiB` = 4·2^30 and `4GB` = 4·10^9. Refused, with a message: decimals
//! (Slurm reads `3.5TB` as 3 bytes; we say so instead), signs, unknown units (Slurm
//! silently reads them as bytes), an empty string, and values beyond 2^64−1.

/// Bytes per unit; `None` for a unit this parser does not know.
fn multiplier(unit: &str) -> Option<u64> {
    Some(match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "K" | "KIB" => 1 << 10,
        "M" | "MIB" => 1 << 20,
        "G" | "GIB" => 1 << 30,
        "T" | "TIB" => 1 << 40,
        "P" | "PIB" => 1 << 50,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        "PB" => 1_000_000_000_000_000,
        _ => return None,
    })
}

pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(format!(
            "not a size: {s:?} (expected e.g. 200GiB, 1TB, 65536)"
        ));
    }
    if unit.starts_with(['.', ',']) {
        return Err(format!(
            "decimal sizes are not accepted: {s:?} (write e.g. 3584GiB for 3.5TiB)"
        ));
    }
    let n: u64 = num
        .parse()
        .map_err(|_| format!("size out of range: {s:?}"))?;
    let mult = multiplier(unit.trim_start()).ok_or_else(|| {
        format!(
            "unknown size unit {:?} in {s:?} (use K/KiB, M/MiB, G/GiB, T/TiB, P/PiB for powers of 1024, KB, MB, GB, TB, PB for powers of 1000)",
            unit.trim_start()
        )
    })?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("size out of range: {s:?}"))
}

/// `dwstat`'s humanised size: the largest binary unit not above the value, with no
/// decimals when exact (`1GiB`) and two otherwise (`7.28TiB`).
pub fn human(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut u = 0;
    while u + 1 < UNITS.len() && n >= 1u64 << (10 * (u + 1)) {
        u += 1;
    }
    let scale = 1u64 << (10 * u);
    if n.is_multiple_of(scale) {
        format!("{}{}", n / scale, UNITS[u])
    } else {
        format!("{:.2}{}", n as f64 / scale as f64, UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const KI: u64 = 1 << 10;
    const MI: u64 = 1 << 20;
    const GI: u64 = 1 << 30;
    const TI: u64 = 1 << 40;
    const PI: u64 = 1 << 50;

    #[test]
    fn the_table() {
        let ok: &[(&str, u64)] = &[
            ("0", 0),
            ("65536", 65536),
            ("7B", 7),
            ("7b", 7),
            ("1K", KI),
            ("1k", KI),
            ("1KiB", KI),
            ("1kib", KI),
            ("1KB", 1_000),
            ("1kb", 1_000),
            ("512M", 512 * MI),
            ("512MiB", 512 * MI),
            ("512MB", 512_000_000),
            ("4G", 4 * GI),
            ("4g", 4 * GI),
            ("4GiB", 4 * GI),
            ("4GIB", 4 * GI),
            ("4GB", 4_000_000_000),
            ("4gb", 4_000_000_000),
            ("2T", 2 * TI),
            ("2TiB", 2 * TI),
            ("1TB", 1_000_000_000_000),
            ("3P", 3 * PI),
            ("3PiB", 3 * PI),
            ("3PB", 3_000_000_000_000_000),
            ("200GiB", 200 * GI),
            (" 8GiB ", 8 * GI),
            ("8 GiB", 8 * GI),
            ("007M", 7 * MI),
            ("16383PiB", 16383 * PI),
            ("18446744073709551615", u64::MAX),
        ];
        for (s, want) in ok {
            assert_eq!(parse_size(s), Ok(*want), "{s:?}");
        }
        let bad: &[(&str, &str)] = &[
            ("", "not a size"),
            ("   ", "not a size"),
            ("G", "not a size"),
            ("GiB", "not a size"),
            ("-1", "not a size"),
            ("+1", "not a size"),
            ("3.5TB", "decimal"),
            ("1.5G", "decimal"),
            ("1,5G", "decimal"),
            ("5X", "unknown size unit"),
            ("2N", "unknown size unit"),
            ("1 G iB", "unknown size unit"),
            ("1Gi", "unknown size unit"),
            ("1iB", "unknown size unit"),
            ("1GiBs", "unknown size unit"),
            ("1e9", "unknown size unit"),
            ("0x10", "unknown size unit"),
            ("4ＧiB", "unknown size unit"),
            ("16384PiB", "out of range"),
            ("18446744073709551616", "out of range"),
            ("99999999999999999999999", "out of range"),
        ];
        for (s, want) in bad {
            let e = parse_size(s).expect_err(s);
            assert!(e.contains(want), "{s:?}: {e}");
        }
    }

    #[test]
    fn humanises_like_dwstat() {
        assert_eq!(human(0), "0B");
        assert_eq!(human(1 << 30), "1GiB");
        assert_eq!(human(8_004_400_000_000), "7.28TiB");
        assert_eq!(human(1536), "1.50KiB");
        assert_eq!(human(200 << 30), "200GiB");
        assert_eq!(human(u64::MAX), "16384.00PiB");
    }

    proptest! {
        /// Outside input: any text gives a size or a message, never a panic.
        #[test]
        fn any_text_is_answered(s in "\\PC{0,24}") {
            let _ = parse_size(&s);
        }

        /// Text shaped like a size, with every unit spelling and case.
        #[test]
        fn sizes_like_text(n in 0u64..1u64 << 40,
                           unit in "(|b|B|k|K|kib|KiB|kb|KB|m|MiB|mb|MB|g|G|gib|GiB|GB|gb|t|TiB|TB|p|PiB|PB)",
                           blank in "( ?)") {
            let s = format!("{n}{blank}{unit}");
            let m = multiplier(&unit).expect("a known unit");
            match n.checked_mul(m) {
                Some(want) => prop_assert_eq!(parse_size(&s), Ok(want)),
                None => prop_assert!(parse_size(&s).unwrap_err().contains("out of range")),
            }
        }

        /// What `human` prints exactly (no decimals) reads back as the same size.
        #[test]
        fn exact_human_reads_back(n in any::<u64>()) {
            let h = human(n);
            if !h.contains('.') {
                prop_assert_eq!(parse_size(&h), Ok(n));
            }
        }

        /// A binary unit is 1024 times the one below it, whatever the case.
        #[test]
        fn binary_and_decimal_units(n in 0u64..1 << 20) {
            prop_assert_eq!(parse_size(&format!("{n}m")), Ok(n * MI));
            prop_assert_eq!(parse_size(&format!("{n}MiB")), Ok(n * MI));
            prop_assert_eq!(parse_size(&format!("{n}mb")), Ok(n * 1_000_000));
        }
    }
}

//! Byte counts as people write them and as `dwstat` prints them.
//!
//! Input follows Slurm and DataWarp: `K`/`KiB`, `M`/`MiB`, `G`/`GiB`, `T`/`TiB`, `P`/`PiB`
//! are powers of 1024; `KB`, `MB`, `GB`, `TB`, `PB` powers of 1000; a bare number is bytes.
//! Decimals are refused (Slurm reads `3.5TB` as 3 bytes; we say so instead).

pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(format!(
            "not a size: {s:?} (expected e.g. 200GiB, 1TB, 65536)"
        ));
    }
    if unit.starts_with('.') {
        return Err(format!(
            "decimal sizes are not accepted: {s:?} (write e.g. 3584GiB for 3.5TiB)"
        ));
    }
    let n: u64 = num
        .parse()
        .map_err(|_| format!("size out of range: {s:?}"))?;
    let mult: u64 = match unit.trim().to_ascii_uppercase().as_str() {
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
        other => {
            return Err(format!(
                "unknown size unit {other:?} in {s:?} (use KiB, MiB, GiB, TiB, PiB, or KB..PB)"
            ))
        }
    };
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

    #[test]
    fn parses_and_refuses() {
        assert_eq!(parse_size("4GiB").unwrap(), 4 << 30);
        assert_eq!(parse_size("4G").unwrap(), 4 << 30);
        assert_eq!(parse_size("1TB").unwrap(), 1_000_000_000_000);
        assert_eq!(parse_size("65536").unwrap(), 65536);
        assert!(parse_size("3.5TB").unwrap_err().contains("decimal"));
        assert!(parse_size("G").is_err());
        assert!(parse_size("5X").is_err());
        assert!(parse_size("99999999999PiB").is_err());
    }

    #[test]
    fn humanises_like_dwstat() {
        assert_eq!(human(0), "0B");
        assert_eq!(human(1 << 30), "1GiB");
        assert_eq!(human(8_004_400_000_000), "7.28TiB");
        assert_eq!(human(1536), "1.50KiB");
        assert_eq!(human(200 << 30), "200GiB");
    }
}

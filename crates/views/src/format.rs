//! Number formatting shared by the human-readable views.

/// Binary units with three significant digits: `1.50 MiB`, `812 B`.
pub fn bytes(value: u64) -> String {
    memgap_model::human_bytes(value)
}

/// Thousands separated: `1,000,000`.
pub fn count(value: u64) -> String {
    let digits = value.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

pub fn seconds(value: f64) -> String {
    if value < 1.0 { format!("{:.0} ms", value * 1000.0) } else { format!("{value:.2} s") }
}

/// Which moment a view shows and why: "at 2.41 s (periodic snapshot), the
/// largest gap between RSS and the live heap; --at peak|end|SECONDS for
/// others"; without a chosen moment, the time and kind of snapshot.
pub fn moment(moment: Option<&memgap_model::Moment>, seconds: f64, snapshot_reason: &str) -> String {
    match moment {
        Some(m) => format!("at {seconds:.2} s ({snapshot_reason} snapshot), {}; --at {} for others", m.reason, m.others()),
        None => format!("at {seconds:.2} s ({snapshot_reason} snapshot)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(bytes(812), "812 B");
        assert_eq!(bytes(1536), "1.50 KiB");
        assert_eq!(bytes(32 << 20), "32.0 MiB");
        assert_eq!(bytes(300 << 30), "300 GiB");
        assert_eq!(count(1_000_000), "1,000,000");
        assert_eq!(count(999), "999");
        assert_eq!(seconds(0.25), "250 ms");
    }
}

//! Times as people read them: a kernel's median as "845 us" or "1.23 ms"
//! rather than `8.45e-4`, a job's wall time as "1 min 12 s". Both the
//! terminal tables and the HTML page use these, so a figure reads the same
//! everywhere.

/// A short duration (a kernel's median run time) with three significant
/// digits in the unit that keeps it between 1 and 1000: `12.3 ns`,
/// `845 us`, `1.23 ms`, `2.50 s`; a minute or more as [`wall_time`].
/// Not a finite non-negative number: `-`.
pub fn seconds(value: f64) -> String {
    if !value.is_finite() || value < 0.0 {
        return "-".to_string();
    }
    if value == 0.0 {
        return "0 s".to_string();
    }
    if value >= 60.0 {
        return wall_time(value);
    }
    let (scaled, unit) = if value >= 1.0 {
        (value, "s")
    } else if value >= 1e-3 {
        (value * 1e3, "ms")
    } else if value >= 1e-6 {
        (value * 1e6, "us")
    } else {
        (value * 1e9, "ns")
    };
    format!("{} {unit}", three_digits(scaled))
}

/// `scaled` (1 <= x < 1000, or below 1 ns) with three significant digits.
fn three_digits(scaled: f64) -> String {
    // 999.7 us prints as "1000 us": one digit more, still readable.
    if scaled >= 100.0 {
        format!("{scaled:.0}")
    } else if scaled >= 10.0 {
        format!("{scaled:.1}")
    } else {
        format!("{scaled:.2}")
    }
}

/// A job's wall time: `0.4 s`, `12.3 s`, `1 min 12 s`, `2 h 05 min`.
/// Not a finite non-negative number: `-`.
pub fn wall_time(value: f64) -> String {
    if !value.is_finite() || value < 0.0 {
        return "-".to_string();
    }
    if value < 60.0 {
        return format!("{value:.1} s");
    }
    let total = value.round() as u64;
    let (hours, minutes, secs) = (total / 3600, (total % 3600) / 60, total % 60);
    if hours > 0 {
        format!("{hours} h {minutes:02} min")
    } else {
        format!("{minutes} min {secs} s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_take_the_unit_that_keeps_them_readable() {
        assert_eq!(seconds(8.441e-4), "844 us");
        assert_eq!(seconds(1.234e-3), "1.23 ms");
        assert_eq!(seconds(2.5), "2.50 s");
        assert_eq!(seconds(0.0456), "45.6 ms");
        assert_eq!(seconds(1.2e-8), "12.0 ns");
        assert_eq!(seconds(0.0), "0 s");
        assert_eq!(seconds(72.0), "1 min 12 s");
        assert_eq!(seconds(f64::NAN), "-");
        assert_eq!(seconds(-1.0), "-");
    }

    #[test]
    fn wall_times_read_in_minutes_and_hours() {
        assert_eq!(wall_time(0.42), "0.4 s");
        assert_eq!(wall_time(59.94), "59.9 s");
        assert_eq!(wall_time(72.4), "1 min 12 s");
        assert_eq!(wall_time(7_500.0), "2 h 05 min");
        assert_eq!(wall_time(f64::INFINITY), "-");
    }
}

//! Durations as logs show them: two significant digits and a unit ("1.2ms", "340µs", "2.5s").

use std::time::Duration;

/// `d` rounded for a log line.
pub fn round(d: Duration) -> String {
    let ns = d.as_nanos() as f64;
    let (v, unit) = match ns {
        n if n < 1e3 => (n, "ns"),
        n if n < 1e6 => (n / 1e3, "µs"),
        n if n < 1e9 => (n / 1e6, "ms"),
        n => (n / 1e9, "s"),
    };
    if v < 10.0 {
        format!("{v:.1}{unit}")
    } else {
        format!("{v:.0}{unit}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_to_a_readable_figure() {
        assert_eq!(round(Duration::from_nanos(1_234_567)), "1.2ms");
        assert_eq!(round(Duration::from_micros(340)), "340µs");
        assert_eq!(round(Duration::from_millis(2_500)), "2.5s");
        assert_eq!(round(Duration::from_nanos(15_400_000)), "15ms");
    }
}

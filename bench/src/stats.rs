//! Summaries of repeated measurements: the median resists the outliers that interrupts and
//! the other load of a shared machine cause; min and max show how wide the spread was.

/// Median, min and max of a set of measurements.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Summary {
    /// Summarises `xs`; NaN everywhere when it is empty.
    pub fn of(xs: &[f64]) -> Self {
        let sorted = sorted(xs);
        Summary {
            median: median_of_sorted(&sorted),
            min: sorted.first().copied().unwrap_or(f64::NAN),
            max: sorted.last().copied().unwrap_or(f64::NAN),
        }
    }
}

/// The median of `xs` (mean of the two middle values for an even count); NaN when empty.
pub fn median(xs: &[f64]) -> f64 {
    median_of_sorted(&sorted(xs))
}

fn sorted(xs: &[f64]) -> Vec<f64> {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    v
}

fn median_of_sorted(v: &[f64]) -> f64 {
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Relative change from `from` to `to` (0.05 is 5% more).
pub fn growth(from: f64, to: f64) -> f64 {
    to / from - 1.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[7.0]), 7.0);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn median_ignores_one_outlier() {
        assert_eq!(median(&[10.0, 11.0, 10.5, 1000.0, 10.2]), 10.5);
    }

    #[test]
    fn summary_min_max() {
        let s = Summary::of(&[5.0, 2.0, 9.0, 4.0]);
        assert_eq!(s, Summary { median: 4.5, min: 2.0, max: 9.0 });
        assert!(Summary::of(&[]).min.is_nan());
    }

    #[test]
    fn growth_is_relative() {
        assert!((growth(100.0, 105.0) - 0.05).abs() < 1e-12);
        assert!((growth(100.0, 95.0) + 0.05).abs() < 1e-12);
    }
}

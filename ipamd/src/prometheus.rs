//! Prometheus text exposition, written by hand: the daemon's and the cluster's handful
//! of series do not justify a metrics crate, but they should be written one way.

use std::fmt::{Display, Write};

/// The HELP and TYPE lines that open the family of series `name`.
pub(crate) fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// A family of one unlabelled series.
pub(crate) fn single(out: &mut String, name: &str, kind: &str, help: &str, value: impl Display) {
    family(out, name, kind, help);
    let _ = writeln!(out, "{name} {value}");
}

/// The series of one histogram: `buckets` are (upper bound in seconds, observations at
/// or below it), cumulative; `labels` (`verb="allocate"`, or empty) go on every series.
pub(crate) fn histogram(
    out: &mut String,
    name: &str,
    labels: &str,
    buckets: impl IntoIterator<Item = (f64, u64)>,
    count: u64,
    sum_seconds: f64,
) {
    let sep = if labels.is_empty() { "" } else { "," };
    for (le, n) in buckets {
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{le}\"}} {n}");
    }
    let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {count}");
    let braced = if labels.is_empty() {
        String::new()
    } else {
        format!("{{{labels}}}")
    };
    let _ = writeln!(out, "{name}_sum{braced} {sum_seconds}");
    let _ = writeln!(out, "{name}_count{braced} {count}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_series_with_and_without_labels() {
        let mut out = String::new();
        histogram(&mut out, "h", "verb=\"a\"", [(0.5, 1), (1.0, 2)], 3, 2.5);
        histogram(&mut out, "e", "", [(0.005, 0)], 0, 0.0);
        assert_eq!(
            out,
            "h_bucket{verb=\"a\",le=\"0.5\"} 1\nh_bucket{verb=\"a\",le=\"1\"} 2\n\
             h_bucket{verb=\"a\",le=\"+Inf\"} 3\nh_sum{verb=\"a\"} 2.5\nh_count{verb=\"a\"} 3\n\
             e_bucket{le=\"0.005\"} 0\ne_bucket{le=\"+Inf\"} 0\ne_sum 0\ne_count 0\n"
        );
    }
}

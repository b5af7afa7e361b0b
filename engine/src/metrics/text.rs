//! The Prometheus text exposition format, version 0.0.4: the bytes a scrape
//! of `/metrics` returns. It knows nothing of where figures come from; the
//! registry and the ring's figures write through it, so escaping and the
//! `# HELP` / `# TYPE` lines are right in one place.
//!
//! The format, in short: per family a `# HELP name text` line, a
//! `# TYPE name counter|gauge|histogram` line, then its samples, one a line:
//! `name{label="value",...} 42`. In HELP text `\` and newline are escaped;
//! in label values `\`, `"` and newline are.

use std::fmt::Write as _;

/// The Content-Type of a response in this format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What a family's samples mean, its `# TYPE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Only ever goes up (it restarts from 0 with the process); names end in
    /// `_total`.
    Counter,
    /// A value now, up or down.
    Gauge,
    /// Observations counted in buckets, with `_bucket`, `_sum` and `_count`.
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// A sample's value. Whole numbers are written as integers, exactly (an f64
/// would round counters past 2^53).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    /// A count.
    U64(u64),
    /// A gauge that may go below zero.
    I64(i64),
    /// Seconds, ratios: anything fractional.
    F64(f64),
}

impl From<u64> for Value {
    fn from(v: u64) -> Value {
        Value::U64(v)
    }
}

impl From<u32> for Value {
    fn from(v: u32) -> Value {
        Value::U64(u64::from(v))
    }
}

impl From<i64> for Value {
    fn from(v: i64) -> Value {
        Value::I64(v)
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Value {
        Value::F64(v)
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Value {
        Value::U64(u64::from(v))
    }
}

/// Writes `v` as the format spells it: `+Inf`, `-Inf`, `NaN`, else Rust's
/// shortest round-trip decimal (never an exponent-less loss of digits).
pub fn write_f64(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("NaN");
    } else if v == f64::INFINITY {
        out.push_str("+Inf");
    } else if v == f64::NEG_INFINITY {
        out.push_str("-Inf");
    } else {
        // Writing to a String cannot fail.
        let _ = write!(out, "{v}");
    }
}

/// Whether `name` is a valid metric name: `[a-zA-Z_:][a-zA-Z0-9_:]*`.
pub fn is_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Whether `name` is a valid label name: `[a-zA-Z_][a-zA-Z0-9_]*`, and not
/// one of the `__` names Prometheus reserves.
pub fn is_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    !name.starts_with("__")
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Appends `text` to `out` with `\` and newline escaped (HELP text).
fn push_escaped_help(out: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// Appends `value` to `out` with `\`, `"` and newline escaped (a label value).
fn push_escaped_label_value(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// One response body being written, family by family.
#[derive(Debug, Default)]
pub struct Exposition {
    out: String,
}

impl Exposition {
    /// An empty body.
    pub fn new() -> Exposition {
        Exposition::default()
    }

    /// Starts family `name`: its `# HELP` and `# TYPE` lines. Its samples
    /// follow with [`Exposition::sample`]. Names are constants of this
    /// crate, checked by its tests; a bad one is a bug, caught in debug.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) {
        debug_assert!(is_metric_name(name), "bad metric name {name:?}");
        self.out.push_str("# HELP ");
        self.out.push_str(name);
        self.out.push(' ');
        push_escaped_help(&mut self.out, help);
        self.out.push_str("\n# TYPE ");
        self.out.push_str(name);
        self.out.push(' ');
        self.out.push_str(kind.as_str());
        self.out.push('\n');
    }

    /// One sample: `name{labels} value`. `name` is the family's, or for a
    /// histogram its `_bucket`, `_sum` or `_count` series.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl Into<Value>) {
        debug_assert!(is_metric_name(name), "bad metric name {name:?}");
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (label, value)) in labels.iter().enumerate() {
                debug_assert!(is_label_name(label), "bad label name {label:?}");
                if i > 0 {
                    self.out.push(',');
                }
                self.out.push_str(label);
                self.out.push_str("=\"");
                push_escaped_label_value(&mut self.out, value);
                self.out.push('"');
            }
            self.out.push('}');
        }
        self.out.push(' ');
        // Writing to a String cannot fail.
        match value.into() {
            Value::U64(v) => {
                let _ = write!(self.out, "{v}");
            }
            Value::I64(v) => {
                let _ = write!(self.out, "{v}");
            }
            Value::F64(v) => write_f64(&mut self.out, v),
        }
        self.out.push('\n');
    }

    /// The body written so far.
    pub fn as_str(&self) -> &str {
        &self.out
    }

    /// The finished body.
    pub fn into_string(self) -> String {
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_family_starts_with_its_help_and_type_lines() {
        let mut e = Exposition::new();
        e.family("ringfeed_x_total", Kind::Counter, "Things done.");
        e.sample("ringfeed_x_total", &[], 3u64);
        assert_eq!(
            e.as_str(),
            "# HELP ringfeed_x_total Things done.\n# TYPE ringfeed_x_total counter\nringfeed_x_total 3\n"
        );
    }

    #[test]
    fn help_text_escapes_backslash_and_newline_but_not_quotes() {
        let mut e = Exposition::new();
        e.family("g", Kind::Gauge, "a \\ b\nc \"d\"");
        assert_eq!(e.as_str(), "# HELP g a \\\\ b\\nc \"d\"\n# TYPE g gauge\n");
    }

    #[test]
    fn label_values_escape_backslash_quote_and_newline() {
        let mut e = Exposition::new();
        e.sample("g", &[("name", "a\\b\"c\nd"), ("rank", "0")], 1u64);
        assert_eq!(e.as_str(), "g{name=\"a\\\\b\\\"c\\nd\",rank=\"0\"} 1\n");
    }

    #[test]
    fn label_values_keep_other_unicode_as_it_is() {
        let mut e = Exposition::new();
        e.sample("g", &[("name", "données ✓")], 1u64);
        assert_eq!(e.as_str(), "g{name=\"données ✓\"} 1\n");
    }

    #[test]
    fn counters_past_two_to_the_53_are_written_exactly() {
        let mut e = Exposition::new();
        e.sample("c_total", &[], u64::MAX);
        e.sample("g", &[], -5i64);
        assert_eq!(e.as_str(), "c_total 18446744073709551615\ng -5\n");
    }

    #[test]
    fn floats_are_written_as_the_format_spells_them() {
        let mut s = String::new();
        for v in [0.25, 1e-9, f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 3.0] {
            write_f64(&mut s, v);
            s.push(' ');
        }
        assert_eq!(s, "0.25 0.000000001 +Inf -Inf NaN 3 ");
        // And they read back as the same number.
        assert_eq!("0.000000001".parse::<f64>().ok(), Some(1e-9));
    }

    #[test]
    fn names_follow_the_formats_grammar() {
        for ok in ["ringfeed_x_total", "a:b", "_x", "A9"] {
            assert!(is_metric_name(ok), "{ok}");
        }
        for bad in ["", "9a", "a-b", "a b", "é"] {
            assert!(!is_metric_name(bad), "{bad}");
        }
        for ok in ["rank", "_x", "le"] {
            assert!(is_label_name(ok), "{ok}");
        }
        for bad in ["", "a:b", "__name__", "9", "a-b"] {
            assert!(!is_label_name(bad), "{bad}");
        }
    }
}

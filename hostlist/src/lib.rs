//! Slurm hostlist expressions: `worker-[0-7]`, `gpu[01-04,09],login1`,
//! `rack[1-2]-n[1-3]`. Expanding turns an expression into names; compressing
//! turns names back into an expression the way Slurm's own hostlists do, so
//! that every node list Corral prints or sets in `SLURM_JOB_NODELIST` reads
//! as Slurm would print it.
//!
//! The rules, each checked against Slurm 22.05's `scontrol show hostlist`
//! and `show hostlistsorted`:
//!
//! - A name's number is its trailing run of digits only: `a1-b3` is `a1-b`
//!   and 3, so `a[1-2]-b[3-4]` compresses to `a1-b[3-4],a2-b[3-4]`.
//! - Names join a range only when each follows the last (`n1,n2` is
//!   `n[1-2]`; `n2,n1` is `n[2,1]`, and duplicates stay), with the same
//!   prefix and a compatible width: equal widths, or neither the run's
//!   last number nor the new one zero-padded (`n9,n10` is `n[9-10]`,
//!   `n8,n09` is `n[8,09]`, `n[09-99],n100` is `n[09-100]`). Ranges next to each
//!   other with one prefix share one bracket (`b1,a2,a1,b2` is
//!   `b1,a[2,1],b2`).
//! - Sorted, the names are ordered by prefix, then the width of the run
//!   they were in, then number, and joined again (`n[1-3],n[2-4]` is
//!   `n[1-2,2-3,3-4]`, `n9,n10,n08` is `n[9-10,08]`).
//! - Expressions are separated by commas or white space; empty items are
//!   skipped; a range may not descend or be empty; nothing may follow the
//!   last bracket (`n[1-2]-x` is refused; `n[1-2]x[3]` is not).
//!
//! Owns parsing only; it must never allocate without bound, so expansion is
//! capped at [`MAX_HOSTS`] names.

use std::fmt::Write as _;

/// The largest number of names one expression may expand to.
pub const MAX_HOSTS: usize = 1 << 20;

/// The most digits a name's number may have; longer runs are plain text.
const MAX_DIGITS: usize = 18;

/// Why a hostlist expression could not be expanded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostlistError {
    /// A `[` without its `]`, or a `]` without its `[`.
    #[error("unbalanced brackets in hostlist {0:?}")]
    Unbalanced(String),
    /// A range such as `[7-3]`, `[a-b]` or `[1,,2]`.
    #[error("bad range {range:?} in hostlist {expr:?}")]
    BadRange { expr: String, range: String },
    /// Expansion past [`MAX_HOSTS`] names.
    #[error("hostlist {0:?} expands to more than {MAX_HOSTS} names")]
    TooLarge(String),
    /// An empty bracket, as in `n[]`.
    #[error("empty range in hostlist {0:?}")]
    Empty(String),
    /// Text after the last bracket, as in `n[1-2]-x`.
    #[error("text after the last range in hostlist {0:?}")]
    Trailing(String),
}

/// Expands a hostlist expression into names, in the order written.
pub fn expand(expr: &str) -> Result<Vec<String>, HostlistError> {
    let mut out = Vec::new();
    for item in split_top_level(expr)? {
        expand_item(expr, item, &mut out)?;
    }
    Ok(out)
}

/// Splits on commas and white space that are not inside brackets,
/// skipping empty items.
fn split_top_level(expr: &str) -> Result<Vec<&str>, HostlistError> {
    let mut items = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in expr.char_indices() {
        match c {
            '[' if depth == 0 => depth = 1,
            '[' => return Err(HostlistError::Unbalanced(expr.to_string())),
            ']' if depth == 1 => depth = 0,
            ']' => return Err(HostlistError::Unbalanced(expr.to_string())),
            c if depth == 0 && (c == ',' || c.is_whitespace()) => {
                items.push(&expr[start..i]);
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(HostlistError::Unbalanced(expr.to_string()));
    }
    items.push(&expr[start..]);
    items.retain(|i| !i.is_empty());
    Ok(items)
}

/// One bracket group: the numbers it lists, each with its printed width
/// (the width of the range's first number, as Slurm takes it).
fn parse_ranges(expr: &str, body: &str) -> Result<Vec<(u64, usize)>, HostlistError> {
    let bad = || HostlistError::BadRange {
        expr: expr.to_string(),
        range: body.to_string(),
    };
    let mut values = Vec::new();
    for part in body.split(',') {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let digits = |s: &str| {
            !s.is_empty() && s.len() <= MAX_DIGITS && s.bytes().all(|b| b.is_ascii_digit())
        };
        if !digits(lo) || !digits(hi) {
            return Err(bad());
        }
        let (a, b): (u64, u64) = (
            lo.parse().map_err(|_| bad())?,
            hi.parse().map_err(|_| bad())?,
        );
        if a > b {
            return Err(bad());
        }
        if (b - a) as usize >= MAX_HOSTS - values.len() {
            return Err(HostlistError::TooLarge(expr.to_string()));
        }
        values.extend((a..=b).map(|v| (v, lo.len())));
    }
    Ok(values)
}

fn expand_item(expr: &str, item: &str, out: &mut Vec<String>) -> Result<(), HostlistError> {
    // Prefixes built so far; each bracket group multiplies them.
    let mut partial = vec![String::new()];
    let mut rest = item;
    let mut bracketed = false;
    while let Some(open) = rest.find('[') {
        let close = rest[open..]
            .find(']')
            .map(|c| c + open)
            .ok_or_else(|| HostlistError::Unbalanced(expr.to_string()))?;
        let literal = &rest[..open];
        let body = &rest[open + 1..close];
        if body.is_empty() {
            return Err(HostlistError::Empty(expr.to_string()));
        }
        let values = parse_ranges(expr, body)?;
        if partial.len().saturating_mul(values.len()) + out.len() > MAX_HOSTS {
            return Err(HostlistError::TooLarge(expr.to_string()));
        }
        let mut next = Vec::with_capacity(partial.len() * values.len());
        for p in &partial {
            for &(v, width) in &values {
                let mut s = String::with_capacity(p.len() + literal.len() + width.max(4));
                s.push_str(p);
                s.push_str(literal);
                let _ = write!(s, "{v:0width$}");
                next.push(s);
            }
        }
        partial = next;
        rest = &rest[close + 1..];
        bracketed = true;
    }
    if rest.contains(']') {
        return Err(HostlistError::Unbalanced(expr.to_string()));
    }
    if bracketed && !rest.is_empty() {
        return Err(HostlistError::Trailing(expr.to_string()));
    }
    for mut p in partial {
        p.push_str(rest);
        out.push(p);
    }
    Ok(())
}

/// A run of names: a prefix and, for numbered names, the numbers `lo..=hi`
/// printed `width` digits wide at least.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Range<'a> {
    prefix: &'a str,
    num: Option<(u64, u64, usize)>,
}

/// A name split into its prefix and trailing number (with the number's
/// width as written).
fn split_name(name: &str) -> (&str, Option<(u64, usize)>) {
    let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    if digits == 0 || digits > MAX_DIGITS {
        return (name, None);
    }
    let (prefix, num) = name.split_at(name.len() - digits);
    match num.parse() {
        Ok(v) => (prefix, Some((v, digits))),
        Err(_) => (name, None),
    }
}

fn decimal_digits(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 10 {
        v /= 10;
        n += 1;
    }
    n
}

/// Whether a number printed `width` wide carries leading zeros.
fn padded(v: u64, width: usize) -> bool {
    width > decimal_digits(v)
}

/// Appends one name to the runs: it extends the last run when it follows
/// it with the same prefix and a compatible width, else starts its own.
fn push<'a>(ranges: &mut Vec<Range<'a>>, prefix: &'a str, num: Option<(u64, usize)>) {
    if let (Some(last), Some((v, w))) = (ranges.last_mut(), num) {
        if let Some((_, hi, width)) = &mut last.num {
            let compatible = *width == w || (!padded(*hi, *width) && !padded(v, w));
            if last.prefix == prefix && hi.checked_add(1) == Some(v) && compatible {
                *hi = v;
                return;
            }
        }
    }
    ranges.push(Range {
        prefix,
        num: num.map(|(v, w)| (v, v, w)),
    });
}

fn runs<S: AsRef<str>>(names: &[S]) -> Vec<Range<'_>> {
    let mut ranges = Vec::new();
    for name in names {
        let (prefix, num) = split_name(name.as_ref());
        push(&mut ranges, prefix, num);
    }
    ranges
}

/// Prints runs: numbered runs next to each other with one prefix share a
/// bracket; a lone name prints bare.
fn render(ranges: &[Range<'_>]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < ranges.len() {
        if !out.is_empty() {
            out.push(',');
        }
        let r = &ranges[i];
        out.push_str(r.prefix);
        let Some((lo, hi, width)) = r.num else {
            i += 1;
            continue;
        };
        let mut j = i + 1;
        while j < ranges.len() && ranges[j].num.is_some() && ranges[j].prefix == r.prefix {
            j += 1;
        }
        if j == i + 1 && lo == hi {
            let _ = write!(out, "{lo:0width$}");
        } else {
            out.push('[');
            for (k, r) in ranges[i..j].iter().enumerate() {
                let (lo, hi, width) = r.num.expect("numbered run");
                if k > 0 {
                    out.push(',');
                }
                let _ = write!(out, "{lo:0width$}");
                if hi > lo {
                    let _ = write!(out, "-{hi:0width$}");
                }
            }
            out.push(']');
        }
        i = j;
    }
    out
}

/// Compresses names into one hostlist expression, keeping their order and
/// their duplicates, as `scontrol show hostlist` does.
pub fn compress<S: AsRef<str>>(names: &[S]) -> String {
    render(&runs(names))
}

/// Compresses names into one hostlist expression in Slurm's sorted order,
/// as `scontrol show hostlistsorted` does: names ordered by prefix, then
/// the width of the run they were in, then number, then joined again. Node lists (in
/// `squeue`, `sinfo`, `SLURM_JOB_NODELIST`) print this way.
pub fn compress_sorted<S: AsRef<str>>(names: &[S]) -> String {
    let mut hosts: Vec<(&str, Option<(u64, usize)>)> = Vec::with_capacity(names.len());
    for r in runs(names) {
        match r.num {
            None => hosts.push((r.prefix, None)),
            Some((lo, hi, w)) => hosts.extend((lo..=hi).map(|v| (r.prefix, Some((v, w))))),
        }
    }
    hosts.sort_by(|a, b| {
        let key = |n: Option<(u64, usize)>| n.map(|(v, w)| (w, v));
        a.0.as_bytes()
            .cmp(b.0.as_bytes())
            .then_with(|| key(a.1).cmp(&key(b.1)))
    });
    let mut joined = Vec::with_capacity(hosts.len());
    for (prefix, num) in hosts {
        push(&mut joined, prefix, num);
    }
    render(&joined)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_ranges_lists_and_padding() {
        assert_eq!(
            expand("worker-[0-2]").unwrap(),
            ["worker-0", "worker-1", "worker-2"]
        );
        assert_eq!(
            expand("gpu[08-10,12],login1").unwrap(),
            ["gpu08", "gpu09", "gpu10", "gpu12", "login1"]
        );
        assert_eq!(
            expand("r[1-2]-n[1-2]").unwrap(),
            ["r1-n1", "r1-n2", "r2-n1", "r2-n2"]
        );
        assert_eq!(expand("").unwrap(), Vec::<String>::new());
        // Separators as Slurm takes them: commas, white space, empty items.
        assert_eq!(expand(" n1 , n2\tn3,,").unwrap(), ["n1", "n2", "n3"]);
        // A range's width is its first number's.
        assert_eq!(expand("n[1-02]").unwrap(), ["n1", "n2"]);
        assert_eq!(expand("n[01-2]").unwrap(), ["n01", "n02"]);
        assert_eq!(expand("n[1-2]x[3]").unwrap(), ["n1x3", "n2x3"]);
    }

    #[test]
    fn rejects_malformed_expressions() {
        for (expr, want) in [
            ("a[1-2", "unbalanced"),
            ("a]1", "unbalanced"),
            ("a[3-1]", "bad range"),
            ("a[1-3,5-2]", "bad range"),
            ("a[x]", "bad range"),
            ("a[1,,2]", "bad range"),
            ("a[-2]", "bad range"),
            ("a[]", "empty range"),
            ("a[1-2]-x", "text after"),
            ("a[1-2]1", "text after"),
            ("a[0-999999999]", "more than"),
            ("a[0-1023][0-1023][0-1023]", "more than"),
        ] {
            let err = expand(expr).expect_err(expr).to_string();
            assert!(err.contains(want), "{expr}: {err}");
        }
    }

    /// Each row was printed by Slurm 22.05's `scontrol show hostlist` and
    /// `show hostlistsorted` for the expression on the left.
    #[test]
    fn compresses_as_slurm_does() {
        for (expr, list, sorted) in [
            ("n3,n1,n2", "n[3,1-2]", "n[1-3]"),
            ("n1,m1,n2", "n1,m1,n2", "m1,n[1-2]"),
            ("n1,n1", "n[1,1]", "n[1,1]"),
            ("n2,n1,n1", "n[2,1,1]", "n[1,1-2]"),
            ("n01,n2,n10", "n[01,2,10]", "n[2,01,10]"),
            ("n[1-3],n[2-4]", "n[1-3,2-4]", "n[1-2,2-3,3-4]"),
            ("n[1-3],n[1-3]", "n[1-3,1-3]", "n[1,1-2,2-3,3]"),
            ("n[1-5],n[3]", "n[1-5,3]", "n[1-3,3-5]"),
            ("n[1-4],n[2-3]", "n[1-4,2-3]", "n[1-2,2-3,3-4]"),
            ("n[1-2],n[1-2]", "n[1-2,1-2]", "n[1,1-2,2]"),
            ("n1,n1,n1", "n[1,1,1]", "n[1,1,1]"),
            ("n[01-10]", "n[01-10]", "n[01-10]"),
            ("n[1-02]", "n[1-2]", "n[1-2]"),
            ("n[01-2]", "n[01-02]", "n[01-02]"),
            ("login,login", "login,login", "login,login"),
            ("a,b,a", "a,b,a", "a,a,b"),
            ("a1b,a2b", "a1b,a2b", "a1b,a2b"),
            ("n9,n10", "n[9-10]", "n[9-10]"),
            ("n10,n9", "n[10,9]", "n[9-10]"),
            ("n09,n10", "n[09-10]", "n[09-10]"),
            ("n009,n10", "n[009,10]", "n[10,009]"),
            ("n8,n09,n10", "n[8,09-10]", "n[8,09-10]"),
            ("n9,n10,n08", "n[9-10,08]", "n[9-10,08]"),
            ("n1,n10,n2", "n[1,10,2]", "n[1-2,10]"),
            ("n10,n8,n9", "n[10,8-9]", "n[8-10]"),
            ("n100,n99", "n[100,99]", "n[99-100]"),
            ("n099,n100", "n[099-100]", "n[099-100]"),
            ("n1,n01", "n[1,01]", "n[1,01]"),
            ("n01,n1", "n[01,1]", "n[1,01]"),
            ("n[0-2],n01", "n[0-2,01]", "n[0-2,01]"),
            ("n01,n[0-2]", "n[01,0-2]", "n[0-2,01]"),
            ("n0,n00,n000", "n[0,00,000]", "n[0,00,000]"),
            ("n[001-003],n4", "n[001-003,4]", "n[4,001-003]"),
            ("n[1-3],n004", "n[1-3,004]", "n[1-3,004]"),
            ("n[098-101]", "n[098-101]", "n[098-101]"),
            ("n[09-99],n100", "n[09-100]", "n[09-100]"),
            ("n100,n[09-99]", "n[100,09-99]", "n[09-100]"),
            ("n[00-09],n10", "n[00-10]", "n[00-10]"),
            (
                "n[1-3,5],m[2],n[6-7]",
                "n[1-3,5],m2,n[6-7]",
                "m2,n[1-3,5-7]",
            ),
            ("x[1-2],x[3-4]", "x[1-4]", "x[1-4]"),
            ("n[0-1]x[2-3]", "n0x[2-3],n1x[2-3]", "n0x[2-3],n1x[2-3]"),
            (
                "a[1-2]-b[3-4]",
                "a1-b[3-4],a2-b[3-4]",
                "a1-b[3-4],a2-b[3-4]",
            ),
            (
                "n[1-2]-b[3-4],n[1-2]-b[5]",
                "n1-b[3-4],n2-b[3-4],n1-b5,n2-b5",
                "n1-b[3-5],n2-b[3-5]",
            ),
            ("b1,a2,a1,b2", "b1,a[2,1],b2", "a[1-2],b[1-2]"),
            ("n,n1", "n,n1", "n,n1"),
            ("n1,n,n2", "n1,n,n2", "n,n[1-2]"),
            ("aa1,a1", "aa1,a1", "a1,aa1"),
            ("N1,n2", "N1,n2", "N1,n2"),
            ("n-1,n-2", "n-[1-2]", "n-[1-2]"),
            ("n1.x,n2.x", "n1.x,n2.x", "n1.x,n2.x"),
            ("1,2", "[1-2]", "[1-2]"),
            ("n[5-5]", "n5", "n5"),
            ("n,,m", "n,m", "m,n"),
            ("n1 n2", "n[1-2]", "n[1-2]"),
            ("", "", ""),
        ] {
            let names = expand(expr).unwrap();
            assert_eq!(compress(&names), list, "hostlist of {expr}");
            assert_eq!(compress_sorted(&names), sorted, "hostlistsorted of {expr}");
        }
    }
}

//! Slurm hostlist expressions: `worker-[0-7]`, `gpu[01-04,09],login1`,
//! `rack[1-2]-n[1-3]`. Expanding turns an expression into names; compressing
//! turns names back into the shortest expression of that form.
//!
//! Owns parsing only; it must never allocate without bound, so expansion is
//! capped at [`MAX_HOSTS`] names.

use std::fmt::Write as _;

/// The largest number of names one expression may expand to.
pub const MAX_HOSTS: usize = 1 << 20;

/// Why a hostlist expression could not be expanded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostlistError {
    /// A `[` without its `]`, or a `]` without its `[`.
    #[error("unbalanced brackets in hostlist {0:?}")]
    Unbalanced(String),
    /// A range such as `[7-3]` or `[a-b]`.
    #[error("bad range {range:?} in hostlist {expr:?}")]
    BadRange { expr: String, range: String },
    /// Expansion past [`MAX_HOSTS`] names.
    #[error("hostlist {0:?} expands to more than {MAX_HOSTS} names")]
    TooLarge(String),
    /// An empty name, as in `a,,b` or `[]`.
    #[error("empty name in hostlist {0:?}")]
    Empty(String),
}

/// Expands a hostlist expression into names, in the order written.
pub fn expand(expr: &str) -> Result<Vec<String>, HostlistError> {
    let mut out = Vec::new();
    for item in split_top_level(expr)? {
        if item.is_empty() {
            return Err(HostlistError::Empty(expr.to_string()));
        }
        expand_item(expr, item, &mut out)?;
    }
    Ok(out)
}

/// Splits on commas that are not inside brackets.
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
            ',' if depth == 0 => {
                items.push(expr[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(HostlistError::Unbalanced(expr.to_string()));
    }
    items.push(expr[start..].trim());
    if items.len() == 1 && items[0].is_empty() {
        return Ok(Vec::new());
    }
    Ok(items)
}

/// One bracket group: the numbers it lists, each with its printed width.
fn parse_ranges(expr: &str, body: &str) -> Result<Vec<(u64, usize)>, HostlistError> {
    let bad = || HostlistError::BadRange {
        expr: expr.to_string(),
        range: body.to_string(),
    };
    let mut values = Vec::new();
    for part in body.split(',') {
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (lo.trim(), hi.trim()),
            None => (part.trim(), part.trim()),
        };
        if lo.is_empty() || hi.is_empty() || lo.len() > 18 || hi.len() > 18 {
            return Err(bad());
        }
        let width = if lo.starts_with('0') { lo.len() } else { 0 };
        let a: u64 = lo.parse().map_err(|_| bad())?;
        let b: u64 = hi.parse().map_err(|_| bad())?;
        if a > b || (b - a) as usize >= MAX_HOSTS || values.len() + ((b - a) as usize) >= MAX_HOSTS
        {
            return Err(if a > b {
                bad()
            } else {
                HostlistError::TooLarge(expr.to_string())
            });
        }
        values.extend((a..=b).map(|v| (v, width)));
    }
    Ok(values)
}

fn expand_item(expr: &str, item: &str, out: &mut Vec<String>) -> Result<(), HostlistError> {
    // Prefixes built so far; each bracket group multiplies them.
    let mut partial = vec![String::new()];
    let mut rest = item;
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
    }
    if rest.contains(']') {
        return Err(HostlistError::Unbalanced(expr.to_string()));
    }
    for mut p in partial {
        p.push_str(rest);
        out.push(p);
    }
    Ok(())
}

/// Compresses names into one hostlist expression: names sharing a prefix and
/// a numeric suffix of the same width collapse into ranges. Order of first
/// appearance of each prefix is kept; numbers within a prefix are sorted.
pub fn compress<S: AsRef<str>>(names: &[S]) -> String {
    // (prefix, width) -> numbers, kept in first-seen order.
    let mut groups: Vec<((String, usize), Vec<u64>)> = Vec::new();
    let mut plain: Vec<(usize, String)> = Vec::new();
    let mut order = 0usize;
    for name in names {
        let name = name.as_ref();
        let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        if digits == 0 || digits > 18 {
            plain.push((order, name.to_string()));
            order += 1;
            continue;
        }
        let (prefix, num) = name.split_at(name.len() - digits);
        let width = if num.starts_with('0') && num.len() > 1 {
            num.len()
        } else {
            0
        };
        let Ok(v) = num.parse::<u64>() else {
            plain.push((order, name.to_string()));
            order += 1;
            continue;
        };
        // An unpadded number as wide as a padded group's joins it (gpu10
        // after gpu08, gpu09).
        let padded_peer = (prefix.to_string(), num.len());
        let key = if width == 0 && groups.iter().any(|(k, _)| *k == padded_peer) {
            padded_peer
        } else {
            (prefix.to_string(), width)
        };
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, vs)) => vs.push(v),
            None => {
                groups.push((key, vec![v]));
                plain.push((order, String::new()));
                order += 1;
            }
        }
    }
    let mut group_iter = groups.into_iter();
    let mut parts = Vec::new();
    for (_, p) in plain {
        if !p.is_empty() {
            parts.push(p);
            continue;
        }
        let Some(((prefix, width), mut vs)) = group_iter.next() else {
            continue;
        };
        vs.sort_unstable();
        vs.dedup();
        if vs.len() == 1 {
            parts.push(format!("{prefix}{:0width$}", vs[0]));
            continue;
        }
        let mut body = String::new();
        let mut i = 0;
        while i < vs.len() {
            let mut j = i;
            while j + 1 < vs.len() && vs[j + 1] == vs[j] + 1 {
                j += 1;
            }
            if !body.is_empty() {
                body.push(',');
            }
            if i == j {
                let _ = write!(body, "{:0width$}", vs[i]);
            } else {
                let _ = write!(body, "{:0width$}-{:0width$}", vs[i], vs[j]);
            }
            i = j + 1;
        }
        parts.push(format!("{prefix}[{body}]"));
    }
    parts.join(",")
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
    }

    #[test]
    fn rejects_malformed_expressions() {
        assert!(matches!(expand("a[1-2"), Err(HostlistError::Unbalanced(_))));
        assert!(matches!(expand("a]1"), Err(HostlistError::Unbalanced(_))));
        assert!(matches!(
            expand("a[3-1]"),
            Err(HostlistError::BadRange { .. })
        ));
        assert!(matches!(
            expand("a[x]"),
            Err(HostlistError::BadRange { .. })
        ));
        assert!(matches!(expand("a,,b"), Err(HostlistError::Empty(_))));
        assert!(matches!(
            expand("a[0-999999999]"),
            Err(HostlistError::TooLarge(_))
        ));
        assert!(matches!(
            expand("a[0-1023][0-1023][0-1023]"),
            Err(HostlistError::TooLarge(_))
        ));
    }

    #[test]
    fn compress_round_trips() {
        let names = expand("worker-[0-3,7],gpu[08-10],login").unwrap();
        assert_eq!(compress(&names), "worker-[0-3,7],gpu[08-10],login");
        assert_eq!(expand(&compress(&names)).unwrap(), names);
        assert_eq!(compress(&["n1"]), "n1");
    }
}

//! Property tests: compression round-trips through expansion, and agrees
//! with a plain reference written from Slurm's rule as stated in the
//! crate's documentation (strings in, strings out, no shared code).

use corral_hostlist::{compress, compress_sorted, expand};
use proptest::prelude::*;

/// A name's prefix and its trailing digits, as written.
fn split(name: &str) -> (&str, &str) {
    let digits = name.bytes().rev().take_while(u8::is_ascii_digit).count();
    if digits == 0 || digits > 18 {
        (name, "")
    } else {
        name.split_at(name.len() - digits)
    }
}

/// One run of the reference: its prefix, for a numbered run the first
/// number as written and the last number's value, and the names in it.
struct Run {
    prefix: String,
    numbered: Option<(String, u64)>,
    names: Vec<String>,
}

/// Slurm's rule, directly: a name continues the last run when its prefix is
/// the same, its number is one more than the run's last, and either its
/// digits are as many as the run's first number's or neither it nor the
/// run's last number (printed as wide as the first) has a leading zero.
fn runs(names: &[String]) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    for name in names {
        let (prefix, digits) = split(name);
        if let (Some(last), false) = (runs.last_mut(), digits.is_empty()) {
            if let Some((first, hi)) = &mut last.numbered {
                let v: u64 = digits.parse().expect("digits");
                let hi_zero = hi.to_string().len() < first.len();
                let new_zero = digits.len() > 1 && digits.starts_with('0');
                let width_ok = first.len() == digits.len() || (!hi_zero && !new_zero);
                if last.prefix == prefix && *hi + 1 == v && width_ok {
                    *hi = v;
                    last.names.push(name.clone());
                    continue;
                }
            }
        }
        runs.push(Run {
            prefix: prefix.to_string(),
            numbered: (!digits.is_empty())
                .then(|| (digits.to_string(), digits.parse().expect("digits"))),
            names: vec![name.clone()],
        });
    }
    runs
}

/// Prints runs: numbered runs side by side with one prefix share a
/// bracket.
fn reference(names: &[String]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut bracket: Option<(String, Vec<String>)> = None;
    let close = |b: Option<(String, Vec<String>)>, parts: &mut Vec<String>| {
        if let Some((p, items)) = b {
            if items.len() == 1 && !items[0].contains('-') {
                parts.push(format!("{p}{}", items[0]));
            } else {
                parts.push(format!("{p}[{}]", items.join(",")));
            }
        }
    };
    for run in runs(names) {
        let Some((first, hi)) = run.numbered else {
            close(bracket.take(), &mut parts);
            parts.push(run.prefix);
            continue;
        };
        let item = if first.parse::<u64>().expect("digits") == hi {
            first.clone()
        } else {
            format!("{first}-{hi:0w$}", w = first.len())
        };
        match &mut bracket {
            Some((p, items)) if *p == run.prefix => items.push(item),
            _ => {
                close(bracket.take(), &mut parts);
                bracket = Some((run.prefix, vec![item]));
            }
        }
    }
    close(bracket, &mut parts);
    parts.join(",")
}

/// The sorted form by the reference: every name takes the width of the
/// first number of the run it is in, the names are ordered by prefix, then
/// that width, then number, and the reference compresses them again.
fn reference_sorted(names: &[String]) -> String {
    // (prefix, (run width, number), name)
    type Keyed = (String, Option<(usize, u64)>, String);
    let mut keyed: Vec<Keyed> = Vec::new();
    for run in runs(names) {
        for name in run.names {
            let key = run
                .numbered
                .as_ref()
                .map(|(first, _)| (first.len(), split(&name).1.parse().expect("digits")));
            keyed.push((run.prefix.clone(), key, name));
        }
    }
    keyed.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()).then(a.1.cmp(&b.1)));
    let sorted: Vec<String> = keyed.into_iter().map(|k| k.2).collect();
    reference(&sorted)
}

fn name() -> impl Strategy<Value = String> {
    let prefix = prop::sample::select(vec!["n", "m", "gpu", "a1-b", "", "N"]);
    prop_oneof![
        9 => (prefix.clone(), 0u64..140, 0usize..4).prop_map(|(p, v, w)| format!("{p}{v:0w$}")),
        1 => prefix.prop_map(|p| format!("{p}x")),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn compression_round_trips_in_order(names in prop::collection::vec(name(), 0..16)) {
        let expr = compress(&names);
        prop_assert_eq!(expand(&expr).unwrap(), names.clone(), "{}", expr);
        let sorted = compress_sorted(&names);
        let mut back = expand(&sorted).unwrap();
        let mut want = names.clone();
        back.sort();
        want.sort();
        prop_assert_eq!(back, want, "{}", sorted);
        // Sorting twice changes nothing.
        prop_assert_eq!(compress_sorted(&expand(&sorted).unwrap()), sorted);
    }

    #[test]
    fn compression_agrees_with_the_reference(names in prop::collection::vec(name(), 0..16)) {
        prop_assert_eq!(compress(&names), reference(&names));
        prop_assert_eq!(compress_sorted(&names), reference_sorted(&names));
    }

    #[test]
    fn bracket_expressions_expand_to_their_product(
        prefix in prop::sample::select(vec!["n", "rack", "a-"]),
        groups in prop::collection::vec(prop::collection::vec((0u64..50, 0u64..4, 1usize..4), 1..4), 1..3),
    ) {
        // prefix[a-b,...]-x[c-d,...]: the names are every combination.
        let mut expr = String::new();
        let mut want = vec![String::new()];
        for (g, ranges) in groups.iter().enumerate() {
            expr.push_str(if g == 0 { prefix } else { "-x" });
            let body: Vec<String> = ranges
                .iter()
                .map(|&(lo, len, w)| format!("{lo:0w$}-{:0w$}", lo + len))
                .collect();
            expr.push_str(&format!("[{}]", body.join(",")));
            let lit = if g == 0 { prefix } else { "-x" };
            want = want
                .iter()
                .flat_map(|p| {
                    ranges.iter().flat_map(move |&(lo, len, w)| {
                        (lo..=lo + len).map(move |v| format!("{p}{lit}{v:0w$}"))
                    })
                })
                .collect();
        }
        prop_assert_eq!(expand(&expr).unwrap(), want);
    }
}

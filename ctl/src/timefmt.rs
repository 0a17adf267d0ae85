//! Slurm's time formats: limits (`-t 1-02:00:00`) and the clocks squeue,
//! sinfo and scontrol print.

/// Parses a time limit in seconds: `minutes`, `minutes:seconds`,
/// `hours:minutes:seconds`, `days-hours`, `days-hours:minutes`,
/// `days-hours:minutes:seconds`. `UNLIMITED` and `infinite` give `None`.
pub fn parse_limit(s: &str) -> Result<Option<u64>, String> {
    let s = s.trim();
    let bad = || format!("invalid time limit specification: {s}");
    if s.eq_ignore_ascii_case("unlimited") || s.eq_ignore_ascii_case("infinite") {
        return Ok(None);
    }
    let num = |p: &str| -> Result<u64, String> {
        if p.is_empty() || p.len() > 9 || !p.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        p.parse().map_err(|_| bad())
    };
    let (days, rest) = match s.split_once('-') {
        Some((d, r)) => (Some(num(d)?), r),
        None => (None, s),
    };
    let parts: Vec<u64> = rest.split(':').map(num).collect::<Result<_, _>>()?;
    let secs = match (days, parts.as_slice()) {
        (None, [m]) => m * 60,
        (None, [m, s]) => m * 60 + s,
        (None, [h, m, s]) => h * 3600 + m * 60 + s,
        (Some(d), [h]) => d * 86400 + h * 3600,
        (Some(d), [h, m]) => d * 86400 + h * 3600 + m * 60,
        (Some(d), [h, m, s]) => d * 86400 + h * 3600 + m * 60 + s,
        _ => return Err(bad()),
    };
    Ok(Some(secs))
}

/// A job's time limit as sbatch and srun take it: any form of
/// [`parse_limit`], rounded up to whole minutes as Slurm records it
/// (`5:30` is 6 minutes); `0` asks for no limit.
pub fn parse_job_limit(s: &str) -> Result<Option<u64>, String> {
    Ok(match parse_limit(s)? {
        None | Some(0) => None,
        Some(secs) => Some(secs.div_ceil(60) * 60),
    })
}

/// [`elapsed`], written onto `out` (digits by hand: squeue writes one
/// for each of ten thousand jobs, and `write!` took a fifth of its
/// time for a line).
pub fn elapsed_into(out: &mut String, secs: u64) {
    let (d, h, m, s) = (secs / 86400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    let two = |out: &mut String, n: u64| {
        out.push(char::from(b'0' + (n / 10) as u8));
        out.push(char::from(b'0' + (n % 10) as u8));
    };
    if d > 0 {
        push_uint(out, d);
        out.push('-');
        two(out, h);
        out.push(':');
        two(out, m);
    } else if h > 0 {
        push_uint(out, h);
        out.push(':');
        two(out, m);
    } else {
        push_uint(out, m);
    }
    out.push(':');
    two(out, s);
}

/// Appends `n` in decimal: what `write!(out, "{n}")` writes, without
/// the formatter.
pub fn push_uint(out: &mut String, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for &d in &digits[at..] {
        out.push(char::from(d));
    }
}

/// Appends `n` in decimal, a minus before a negative one.
pub fn push_int(out: &mut String, n: i64) {
    if n < 0 {
        out.push('-');
    }
    push_uint(out, n.unsigned_abs());
}

/// A duration as squeue's `TIME` column prints it: `M:SS`, `H:MM:SS`,
/// `D-HH:MM:SS`.
pub fn elapsed(secs: u64) -> String {
    let mut out = String::with_capacity(12);
    elapsed_into(&mut out, secs);
    out
}

/// A limit as sinfo and scontrol print it: `UNLIMITED`/`infinite`, or
/// `[D-]HH:MM:SS`.
pub fn limit(secs: Option<u64>, unlimited: &str) -> String {
    match secs {
        None => unlimited.to_string(),
        Some(secs) => {
            let (d, h, m, s) = (secs / 86400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
            if d > 0 {
                format!("{d}-{h:02}:{m:02}:{s:02}")
            } else {
                format!("{h:02}:{m:02}:{s:02}")
            }
        }
    }
}

/// CPU time as sacct writes it: `[D-][HH:]MM:SS.mmm`.
pub fn cpu_time(ms: u64) -> String {
    let (s, ms) = (ms / 1000, ms % 1000);
    let (d, h, m, s) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    match (d, h) {
        (0, 0) => format!("{m:02}:{s:02}.{ms:03}"),
        (0, _) => format!("{h:02}:{m:02}:{s:02}.{ms:03}"),
        _ => format!("{d}-{h:02}:{m:02}:{s:02}.{ms:03}"),
    }
}

/// A Unix time as `YYYY-MM-DDTHH:MM:SS` (UTC; the cluster's clocks are
/// UTC), or in the format `SLURM_TIME_FORMAT` names where the command
/// opted in with [`use_env_format`].
pub fn timestamp(unix: u64) -> String {
    match DISPLAY.get() {
        Some(Display::Strftime(f)) => strftime(f, unix),
        Some(Display::Relative(now)) => relative(unix, *now),
        _ => iso(unix),
    }
}

/// [`timestamp`], written onto `out`. The last time written is kept: a
/// listing's times repeat (jobs submitted in the same second), and
/// formatting one costs more than copying it.
pub fn timestamp_into(out: &mut String, unix: u64) {
    thread_local! {
        static LAST: std::cell::RefCell<(u64, String)> =
            const { std::cell::RefCell::new((u64::MAX, String::new())) };
    }
    LAST.with(|last| {
        let mut last = last.borrow_mut();
        if last.0 != unix {
            *last = (unix, timestamp(unix));
        }
        out.push_str(&last.1);
    });
}

/// How the CLI prints times: `SLURM_TIME_FORMAT`.
enum Display {
    Standard,
    /// `relative`: today's as a clock, others by day (with the moment the
    /// command started as "now").
    Relative(u64),
    Strftime(String),
}

static DISPLAY: std::sync::OnceLock<Display> = std::sync::OnceLock::new();

/// Makes [`timestamp`] follow `SLURM_TIME_FORMAT` (`standard`,
/// `relative`, or a strftime format) for the rest of this process. The
/// CLI's commands call it; the daemons never do, so what they store is
/// always the standard form.
pub fn use_env_format(now: u64) {
    let d = match std::env::var("SLURM_TIME_FORMAT") {
        Ok(f) if f == "relative" => Display::Relative(now),
        Ok(f) if !f.is_empty() && f != "standard" => Display::Strftime(f),
        _ => Display::Standard,
    };
    let _ = DISPLAY.set(d);
}

/// A Unix time's civil parts (UTC): year, month, day, hour, minute,
/// second, weekday (0 is Sunday), day of the year (0-based).
fn civil(unix: u64) -> (i64, u32, u32, u64, u64, u64, u32, u32) {
    let days = (unix / 86400) as i64;
    let rem = unix % 86400;
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    let weekday = (days + 4).rem_euclid(7) as u32;
    let yday = (days - days_from_civil(y, 1, 1)) as u32;
    (
        y,
        m as u32,
        d as u32,
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        weekday,
        yday,
    )
}

fn iso(unix: u64) -> String {
    let (y, m, d, hh, mm, ss, _, _) = civil(unix);
    format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}")
}

const WEEKDAYS: [&str; 7] = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// The common strftime conversions, for `SLURM_TIME_FORMAT` and the date
/// line of `squeue -l` and `sinfo -l` (`%a %b %d %H:%M:%S %Y`). An
/// unknown conversion is printed as written.
pub fn strftime(fmt: &str, unix: u64) -> String {
    let (y, m, d, hh, mm, ss, wd, yd) = civil(unix);
    let mut out = String::with_capacity(fmt.len() + 16);
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&format!("{y:04}")),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('e') => out.push_str(&format!("{d:2}")),
            Some('H') => out.push_str(&format!("{hh:02}")),
            Some('I') => out.push_str(&format!("{:02}", (hh + 11) % 12 + 1)),
            Some('p') => out.push_str(if hh < 12 { "AM" } else { "PM" }),
            Some('M') => out.push_str(&format!("{mm:02}")),
            Some('S') => out.push_str(&format!("{ss:02}")),
            Some('j') => out.push_str(&format!("{:03}", yd + 1)),
            Some('a') => out.push_str(WEEKDAYS[wd as usize]),
            Some('b' | 'h') => out.push_str(MONTHS[m as usize - 1]),
            Some('F') => out.push_str(&format!("{y:04}-{m:02}-{d:02}")),
            Some('T') => out.push_str(&format!("{hh:02}:{mm:02}:{ss:02}")),
            Some('R') => out.push_str(&format!("{hh:02}:{mm:02}")),
            Some('D') => out.push_str(&format!("{m:02}/{d:02}/{:02}", y.rem_euclid(100))),
            Some('s') => out.push_str(&unix.to_string()),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Slurm's `relative` form: a clock for today, `Ystday`/`Tomorr` and a
/// clock for the days beside it, the weekday within a week, else the
/// date.
fn relative(unix: u64, now: u64) -> String {
    let (day, today) = ((unix / 86400) as i64, (now / 86400) as i64);
    match day - today {
        0 => strftime("%H:%M:%S", unix),
        -1 => strftime("Ystday %H:%M", unix),
        1 => strftime("Tomorr %H:%M", unix),
        -6..=6 => strftime("%a %H:%M", unix),
        _ => strftime("%e %b %H:%M", unix),
    }
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Parses `--begin`: `now+N[s|m|h|d]` (plain N is seconds), `HH:MM[:SS]`
/// (today, or tomorrow once past), `YYYY-MM-DD[THH:MM[:SS]]`. Times are
/// UTC.
pub fn parse_begin(s: &str, now: u64) -> Result<u64, String> {
    let bad = || format!("invalid time specification: {s}");
    let num = |p: &str| -> Result<i64, String> {
        if p.is_empty() || p.len() > 9 || !p.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        p.parse().map_err(|_| bad())
    };
    if let Some(rest) = s.strip_prefix("now+") {
        let split = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let n = num(&rest[..split])? as u64;
        let mult = match &rest[split..] {
            "" | "s" | "sec" | "seconds" => 1,
            "m" | "min" | "minutes" => 60,
            "h" | "hour" | "hours" => 3600,
            "d" | "day" | "days" => 86400,
            _ => return Err(bad()),
        };
        return Ok(now + n * mult);
    }
    if s == "now" {
        return Ok(now);
    }
    let clock = |t: &str| -> Result<i64, String> {
        let p: Vec<&str> = t.split(':').collect();
        let (h, m, sec) = match p.as_slice() {
            [h, m] => (num(h)?, num(m)?, 0),
            [h, m, sec] => (num(h)?, num(m)?, num(sec)?),
            _ => return Err(bad()),
        };
        if h > 23 || m > 59 || sec > 59 {
            return Err(bad());
        }
        Ok(h * 3600 + m * 60 + sec)
    };
    if s.contains('-') {
        let (date, time) = s.split_once('T').unwrap_or((s, "00:00"));
        let d: Vec<&str> = date.split('-').collect();
        let [y, m, d] = d.as_slice() else {
            return Err(bad());
        };
        let (y, m, d) = (num(y)?, num(m)?, num(d)?);
        if !(1..=12).contains(&m) || !(1..=31).contains(&d) {
            return Err(bad());
        }
        let t = days_from_civil(y, m, d) * 86400 + clock(time)?;
        return u64::try_from(t).map_err(|_| bad());
    }
    let today = (now / 86400) as i64 * 86400;
    let t = today + clock(s)?;
    let t = if (t as u64) < now { t + 86400 } else { t };
    u64::try_from(t).map_err(|_| bad())
}

/// `sacct -S`/`-E` times: `now[-N[unit]]`, `today`/`midnight`,
/// `HH:MM[:SS]` (today), `YYYY-MM-DD[THH:MM[:SS]]`, `MMDD[YY]`,
/// `MM/DD[/YY][-HH:MM[:SS]]`. UTC, like every time here.
pub fn parse_when(s: &str, now: u64) -> Result<u64, String> {
    let bad = || format!("invalid time specification: {s}");
    let today = now / 86400 * 86400;
    match s {
        "now" => return Ok(now),
        "today" | "midnight" => return Ok(today),
        "noon" => return Ok(today + 12 * 3600),
        "tomorrow" => return Ok(today + 86400),
        _ => {}
    }
    if let Some(rest) = s.strip_prefix("now-") {
        let later = parse_begin(&format!("now+{rest}"), 0)?;
        return Ok(now.saturating_sub(later));
    }
    if s.starts_with("now+") {
        return parse_begin(s, now);
    }
    let num = |p: &str| -> Result<i64, String> {
        if p.is_empty() || p.len() > 4 || !p.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        p.parse().map_err(|_| bad())
    };
    let year_now = timestamp(now)[..4].parse::<i64>().map_err(|_| bad())?;
    let year = |y: Option<&str>| -> Result<i64, String> {
        match y {
            None => Ok(year_now),
            Some(y) if y.len() == 2 => Ok(2000 + num(y)?),
            Some(y) => num(y),
        }
    };
    let date = |y: i64, m: i64, d: i64| -> Result<String, String> {
        if !(1..=12).contains(&m) || !(1..=31).contains(&d) {
            return Err(bad());
        }
        Ok(format!("{y:04}-{m:02}-{d:02}"))
    };
    // MM/DD[/YY][-HH:MM[:SS]]
    if s.contains('/') {
        let (day, time) = s.split_once('-').unwrap_or((s, "00:00"));
        let p: Vec<&str> = day.split('/').collect();
        let (m, d, y) = match p.as_slice() {
            [m, d] => (num(m)?, num(d)?, year(None)?),
            [m, d, y] => (num(m)?, num(d)?, year(Some(y))?),
            _ => return Err(bad()),
        };
        return parse_begin(&format!("{}T{time}", date(y, m, d)?), 0);
    }
    // MMDD[YY]
    if (s.len() == 4 || s.len() == 6) && s.bytes().all(|b| b.is_ascii_digit()) {
        let (m, d) = (num(&s[..2])?, num(&s[2..4])?);
        let y = year((s.len() == 6).then(|| &s[4..]))?;
        return parse_begin(&date(y, m, d)?, 0);
    }
    if s.contains('-') {
        return parse_begin(s, 0);
    }
    // HH:MM[:SS] today, even when that is later than now.
    let t = parse_begin(s, 0)?;
    Ok(today + t % 86400)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sacct_times() {
        let now = 1_796_000_000; // 2026-11-30T00:53:20
        let at = |s: &str| parse_when(s, now).map(timestamp);
        assert_eq!(at("now"), Ok("2026-11-30T00:53:20".into()));
        assert_eq!(at("now-1hour"), Ok("2026-11-29T23:53:20".into()));
        assert_eq!(at("now-2days"), Ok("2026-11-28T00:53:20".into()));
        assert_eq!(at("midnight"), Ok("2026-11-30T00:00:00".into()));
        assert_eq!(at("13:00"), Ok("2026-11-30T13:00:00".into()));
        assert_eq!(at("2026-11-01"), Ok("2026-11-01T00:00:00".into()));
        assert_eq!(at("2026-11-01T10:30"), Ok("2026-11-01T10:30:00".into()));
        assert_eq!(at("1101"), Ok("2026-11-01T00:00:00".into()));
        assert_eq!(at("110125"), Ok("2025-11-01T00:00:00".into()));
        assert_eq!(at("11/01"), Ok("2026-11-01T00:00:00".into()));
        assert_eq!(at("11/01/25-08:15"), Ok("2025-11-01T08:15:00".into()));
        for bad in ["yesterday-ish", "13/01", "now-5y", "1/2/3/4", "25:00"] {
            assert!(parse_when(bad, now).is_err(), "{bad}");
        }
    }

    #[test]
    fn limits_parse_in_every_slurm_form() {
        assert_eq!(parse_limit("10"), Ok(Some(600)));
        assert_eq!(parse_limit("10:30"), Ok(Some(630)));
        assert_eq!(parse_limit("1:00:00"), Ok(Some(3600)));
        assert_eq!(parse_limit("2-3"), Ok(Some(2 * 86400 + 3 * 3600)));
        assert_eq!(parse_limit("2-3:04"), Ok(Some(2 * 86400 + 3 * 3600 + 240)));
        assert_eq!(parse_limit("1-0:0:5"), Ok(Some(86405)));
        assert_eq!(parse_limit("UNLIMITED"), Ok(None));
        for bad in ["", "x", "1:2:3:4", "-5", "1--2", "1-", "99999999999"] {
            assert!(parse_limit(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn job_limits_round_up_to_whole_minutes_and_zero_is_none() {
        let m = |n: u64| Ok(Some(n * 60));
        assert_eq!(parse_job_limit("5:30"), m(6));
        assert_eq!(parse_job_limit("1-02:03:04"), m(26 * 60 + 4));
        assert_eq!(parse_job_limit("0:01"), m(1));
        assert_eq!(parse_job_limit("10"), m(10));
        assert_eq!(parse_job_limit("1:00:00"), m(60));
        assert_eq!(parse_job_limit("2-3"), m(51 * 60));
        assert_eq!(parse_job_limit("0"), Ok(None));
        assert_eq!(parse_job_limit("0:00"), Ok(None));
        assert_eq!(parse_job_limit("UNLIMITED"), Ok(None));
        assert!(parse_job_limit("soon").is_err());
    }

    proptest::proptest! {
        /// Every form Slurm takes parses to its seconds, rounded up to
        /// the minute; nothing panics on any input.
        #[test]
        fn every_limit_form_rounds_up(d in 0u64..400, h in 0u64..24, m in 0u64..60, s in 0u64..60) {
            let minutes = |secs: u64| if secs == 0 { None } else { Some(secs.div_ceil(60) * 60) };
            let hms = h * 3600 + m * 60 + s;
            for (text, secs) in [
                (format!("{m}"), m * 60),
                (format!("{m}:{s:02}"), m * 60 + s),
                (format!("{h}:{m:02}:{s:02}"), hms),
                (format!("{d}-{h}"), d * 86400 + h * 3600),
                (format!("{d}-{h}:{m:02}"), d * 86400 + h * 3600 + m * 60),
                (format!("{d}-{h:02}:{m:02}:{s:02}"), d * 86400 + hms),
            ] {
                proptest::prop_assert_eq!(parse_job_limit(&text), Ok(minutes(secs)), "{}", text);
            }
        }

        #[test]
        fn any_text_is_a_limit_or_a_refusal(text in "\\PC{0,24}") {
            let _ = parse_job_limit(&text);
        }
    }

    #[test]
    fn begin_times() {
        let now = 1_796_000_000; // 2026-11-30T00:53:20
        assert_eq!(parse_begin("now+60", now), Ok(now + 60));
        assert_eq!(parse_begin("now+2hours", now), Ok(now + 7200));
        assert_eq!(
            parse_begin("2026-11-30T01:00:00", now).map(timestamp),
            Ok("2026-11-30T01:00:00".into())
        );
        assert_eq!(
            parse_begin("2000-02-29", now).map(timestamp),
            Ok("2000-02-29T00:00:00".into())
        );
        assert_eq!(
            parse_begin("01:00", now).map(timestamp),
            Ok("2026-11-30T01:00:00".into())
        );
        assert_eq!(
            parse_begin("00:10", now).map(timestamp),
            Ok("2026-12-01T00:10:00".into())
        );
        for bad in ["soon", "now+5y", "25:00", "2026-13-01", "1-2-3-4"] {
            assert!(parse_begin(bad, now).is_err(), "{bad}");
        }
    }

    #[test]
    fn clocks_print_like_slurm() {
        assert_eq!(elapsed(0), "0:00");
        assert_eq!(elapsed(3725), "1:02:05");
        assert_eq!(elapsed(90061), "1-01:01:01");
        assert_eq!(limit(None, "infinite"), "infinite");
        assert_eq!(limit(Some(3600), "x"), "01:00:00");
        assert_eq!(limit(Some(86400 * 2), "x"), "2-00:00:00");
        assert_eq!(timestamp(0), "1970-01-01T00:00:00");
        assert_eq!(timestamp(1_796_000_000), "2026-11-30T00:53:20");
        assert_eq!(timestamp(951_782_400), "2000-02-29T00:00:00");
    }

    #[test]
    fn digits_by_hand_are_what_format_writes() {
        let mut out = String::new();
        for n in [0u64, 7, 10, 99, 100, 12_345, u64::from(u32::MAX), u64::MAX] {
            out.clear();
            push_uint(&mut out, n);
            assert_eq!(out, n.to_string());
        }
        for n in [0i64, -1, 42, -9_000, i64::MIN, i64::MAX] {
            out.clear();
            push_int(&mut out, n);
            assert_eq!(out, n.to_string());
        }
        for secs in [
            0, 5, 59, 60, 61, 3599, 3600, 3661, 86_399, 86_400, 90_061, 8_640_000,
        ] {
            out.clear();
            elapsed_into(&mut out, secs);
            assert_eq!(out, elapsed(secs), "{secs}");
            // What format! writes, the way elapsed once wrote it.
            let (d, h, m, s) = (secs / 86400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
            let want = if d > 0 {
                format!("{d}-{h:02}:{m:02}:{s:02}")
            } else if h > 0 {
                format!("{h}:{m:02}:{s:02}")
            } else {
                format!("{m}:{s:02}")
            };
            assert_eq!(out, want, "{secs}");
        }
    }
}

//! The format strings squeue and sinfo share: `-o` strings of
//! `%[.][#][width]c` codes between literal text, and `-O` lists of
//! `name[:[.][width][suffix]]`. Each command maps the codes and names to
//! its own fields.

/// One piece of a `-o` string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Token {
    Text(String),
    Code {
        /// `.`: right-justified.
        right: bool,
        /// `#`: as wide as the widest value (sinfo's own layouts).
        widest: bool,
        width: Option<usize>,
        code: char,
    },
}

/// The widest field a format may ask for.
const MAX_WIDTH: usize = 1024;

/// The longest `-o` or `-O` string taken.
const MAX_FORMAT_LEN: usize = 4096;

/// The most a format's widths may add up to (a line's padding).
const MAX_LINE_WIDTH: usize = 16 * 1024;

/// Refuses a format too long, or whose widths add up to lines too wide,
/// before anything is made of it (`-O JobID:100000` repeated a thousand
/// times would pad every line to megabytes).
pub fn check(s: &str) -> Result<(), String> {
    if s.len() > MAX_FORMAT_LEN {
        return Err(format!(
            "Invalid format specification: {} bytes, at most {MAX_FORMAT_LEN}",
            s.len()
        ));
    }
    let mut total = 0usize;
    let mut digits = 0usize;
    for c in s.chars().chain(std::iter::once(' ')) {
        match c.to_digit(10) {
            Some(d) => digits = (digits * 10 + d as usize).min(MAX_WIDTH),
            None => {
                total += digits;
                digits = 0;
            }
        }
    }
    if total > MAX_LINE_WIDTH {
        return Err(format!(
            "Invalid format specification: its widths add up to {total}, at most {MAX_LINE_WIDTH}"
        ));
    }
    Ok(())
}

/// Splits a `-o` string into text and codes; a `%` at the very end is
/// text.
pub fn tokens(s: &str) -> Vec<Token> {
    let mut out = Vec::new();
    let mut text = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            text.push(c);
            continue;
        }
        let right = chars.next_if_eq(&'.').is_some();
        let widest = chars.next_if_eq(&'#').is_some();
        let mut width = None;
        while let Some(d) = chars.peek().and_then(|d| d.to_digit(10)) {
            width = Some((width.unwrap_or(0usize) * 10 + d as usize).min(MAX_WIDTH));
            chars.next();
        }
        let Some(code) = chars.next() else {
            text.push('%');
            break;
        };
        if !text.is_empty() {
            out.push(Token::Text(std::mem::take(&mut text)));
        }
        out.push(Token::Code {
            right,
            widest,
            width,
            code,
        });
    }
    if !text.is_empty() {
        out.push(Token::Text(text));
    }
    out
}

/// One item of a `-O` list: its name, justification, width (`None` for
/// `:0`, as wide as the value; `default` when none is given) and the text
/// after the width.
#[derive(Debug)]
pub struct Item<'a> {
    pub name: &'a str,
    pub right: bool,
    pub width: Option<usize>,
    pub suffix: &'a str,
}

/// Splits a `-O` list into its items.
pub fn items(s: &str, default: usize) -> Vec<Item<'_>> {
    s.split(',')
        .filter(|i| !i.is_empty())
        .map(|item| {
            let (name, spec) = item.split_once(':').unwrap_or((item, ""));
            let right = spec.starts_with('.');
            let spec = spec.trim_start_matches('.');
            let digits = spec.bytes().take_while(u8::is_ascii_digit).count();
            let width = match spec[..digits].parse::<usize>() {
                Ok(0) => None,
                Ok(w) => Some(w.min(MAX_WIDTH)),
                Err(_) => Some(default),
            };
            Item {
                name,
                right,
                width,
                suffix: &spec[digits..],
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_too_long_or_too_wide_are_refused() {
        check("%.18i %9P %8j").unwrap();
        check(&"JobID:1000,".repeat(16)).unwrap();
        let wide = "JobID:100000,".repeat(20);
        assert_eq!(
            check(&wide).unwrap_err(),
            "Invalid format specification: its widths add up to 20480, at most 16384"
        );
        let long = "%i".repeat(3000);
        assert!(check(&long)
            .unwrap_err()
            .contains("6000 bytes, at most 4096"));
    }

    #[test]
    fn codes_widths_and_text() {
        assert_eq!(
            tokens("%.18i|%#P %5j%"),
            vec![
                Token::Code {
                    right: true,
                    widest: false,
                    width: Some(18),
                    code: 'i'
                },
                Token::Text("|".into()),
                Token::Code {
                    right: false,
                    widest: true,
                    width: None,
                    code: 'P'
                },
                Token::Text(" ".into()),
                Token::Code {
                    right: false,
                    widest: false,
                    width: Some(5),
                    code: 'j'
                },
                Token::Text("%".into()),
            ]
        );
        let it = items("JobID,Name:.10,State:0,Comment:5|", 20);
        let got: Vec<_> = it
            .iter()
            .map(|i| (i.name, i.right, i.width, i.suffix))
            .collect();
        assert_eq!(
            got,
            [
                ("JobID", false, Some(20), ""),
                ("Name", true, Some(10), ""),
                ("State", false, None, ""),
                ("Comment", false, Some(5), "|"),
            ]
        );
    }
}

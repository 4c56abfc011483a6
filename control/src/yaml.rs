//! Limits on YAML text before it reaches the parser: a size limit and a nesting-depth limit,
//! checked in one linear pass.
//!
//! Why: the YAML parser handles deep nesting in quadratic time (200,000 nested `[` took 126 s, the
//! file source blocked all along) before the deserializer's own recursion limit refuses it. No
//! parser option bounds that, so this pass looks at the text first. It is written by hand because
//! it is a bracket and indentation count, not a parser: it over-estimates depth rather than
//! under-estimates it (a `[` inside a plain scalar counts), which only matters for text nested
//! far deeper than any manifest or config is.

use std::fmt;

/// Deepest nesting accepted. Kubernetes objects nest about 12 levels (a Pod template's container
/// ports); the deserializer refuses beyond 128 anyway.
pub const MAX_DEPTH: usize = 100;

/// Largest text accepted (one file): far above a 100,000-Service state file (~60 MiB).
pub const MAX_BYTES: usize = 256 << 20;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LimitError {
    TooLarge { bytes: u64 },
    TooDeep { line: usize },
}

impl fmt::Display for LimitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LimitError::TooLarge { bytes } => write!(
                f,
                "{bytes} bytes is larger than the {} MiB kxdp reads from one YAML file",
                MAX_BYTES >> 20
            ),
            LimitError::TooDeep { line } => write!(
                f,
                "line {line}: nested deeper than {MAX_DEPTH} levels; refusing to parse it \
                 (Kubernetes objects nest about a dozen)"
            ),
        }
    }
}

impl std::error::Error for LimitError {}

/// The text's lines with their line breaks, as `str::split_inclusive('\n')` gives them. The
/// breaks are found by one `memchr` pass over the whole text: `str`'s iterators search again
/// from each line's start, which for the 30-byte lines of a state file costs more than the line.
pub fn lines_inclusive(text: &str) -> impl Iterator<Item = &str> + '_ {
    let mut start = 0;
    memchr::memchr_iter(b'\n', text.as_bytes())
        .map(|i| i + 1)
        .chain(std::iter::once(text.len()))
        .filter_map(move |end| {
            // The last end repeats the previous one when the text ends with a line break.
            let line = (end > start).then(|| &text[start..end]);
            start = end;
            line
        })
}

/// The text's lines without their line breaks (`\n` or `\r\n`), as `str::lines` gives them
/// (see `lines_inclusive`).
pub fn lines(text: &str) -> impl Iterator<Item = &str> + '_ {
    lines_inclusive(text).map(|line| match line.strip_suffix('\n') {
        Some(line) => line.strip_suffix('\r').unwrap_or(line),
        None => line,
    })
}

/// Checks `text` against the size and depth limits, in time linear in its length.
pub fn check(text: &str) -> Result<(), LimitError> {
    if text.len() > MAX_BYTES {
        return Err(LimitError::TooLarge {
            bytes: text.len() as u64,
        });
    }
    let mut scan = Scan::default();
    for (n, line) in lines(text).enumerate() {
        if scan.line(line.as_bytes()) > MAX_DEPTH {
            return Err(LimitError::TooDeep { line: n + 1 });
        }
    }
    Ok(())
}

/// Nesting state carried from line to line.
#[derive(Default)]
struct Scan {
    /// Open flow collections (`[`, `{`).
    flow: usize,
    /// Indentations of the open block collections.
    indents: Vec<usize>,
    /// Inside a block scalar (`|`, `>`) whose parent is indented this much: its lines are text.
    block_scalar: Option<usize>,
    /// Inside a quoted scalar that continues on the next line.
    quote: Option<u8>,
}

impl Scan {
    /// Takes one line; returns the deepest nesting seen on it.
    fn line(&mut self, line: &[u8]) -> usize {
        let indent = line.iter().take_while(|&&b| b == b' ').count();
        let rest = &line[indent..];
        if let Some(parent) = self.block_scalar {
            if rest.iter().all(|b| b.is_ascii_whitespace()) || indent > parent {
                return 0;
            }
            self.block_scalar = None;
        }
        if self.quote.is_none() {
            if rest.is_empty() || rest[0] == b'#' {
                return 0;
            }
            if indent == 0 && (rest.starts_with(b"---") || rest.starts_with(b"...")) {
                // A new document.
                self.indents.clear();
                self.flow = 0;
            }
            if self.flow == 0 {
                while self.indents.last().is_some_and(|&top| top > indent) {
                    self.indents.pop();
                }
                if self.indents.last() != Some(&indent) {
                    self.indents.push(indent);
                }
            }
        }
        let mut deepest = self.indents.len() + self.flow;
        // `- - x` and `? x` open a collection each on the same line.
        let mut extra = 0;
        let mut leading = true;
        let mut prev = b' ';
        let mut i = 0;
        let mut content_end = rest.len();
        while i < rest.len() {
            let b = rest[i];
            if let Some(q) = self.quote {
                // Inside quotes only the closing quote (and, in double quotes, an escape)
                // matter: skip to it.
                let run = rest[i..]
                    .iter()
                    .position(|&c| c == q || (q == b'"' && c == b'\\'))
                    .unwrap_or(rest.len() - i);
                if run > 0 {
                    prev = rest[i + run - 1];
                    i += run;
                    continue;
                }
                if q == b'"' && b == b'\\' {
                    i += 2;
                    continue;
                }
                if b == q {
                    self.quote = None;
                }
                prev = b;
                i += 1;
                continue;
            }
            if !SPECIAL[usize::from(b)] {
                // Plain text and blanks change nothing but `leading` and `prev` (the deepest
                // nesting is already counted): skip the run (byte by byte, this check
                // was 30 % of the decoding threads' CPU once parsing got fast).
                let run = rest[i..]
                    .iter()
                    .position(|&c| SPECIAL[usize::from(c)])
                    .unwrap_or(rest.len() - i);
                leading &= rest[i..i + run].iter().all(|&c| c == b' ');
                prev = rest[i + run - 1];
                i += run;
                continue;
            }
            let next_blank = rest.get(i + 1).is_none_or(|n| *n == b' ');
            match b {
                b'"' | b'\'' if matches!(prev, b' ' | b'[' | b'{' | b',' | b':') => {
                    self.quote = Some(b);
                    leading = false;
                }
                b'#' if prev == b' ' => {
                    content_end = i;
                    break;
                }
                b'[' | b'{' => {
                    self.flow += 1;
                    leading = false;
                }
                b']' | b'}' => {
                    self.flow = self.flow.saturating_sub(1);
                    leading = false;
                }
                b'-' | b'?' if leading && self.flow == 0 && next_blank => extra += 1,
                b' ' => {}
                _ => leading = false,
            }
            deepest = deepest.max(self.indents.len() + extra + self.flow);
            prev = b;
            i += 1;
        }
        if self.quote.is_none() && self.flow == 0 && is_block_scalar_header(&rest[..content_end]) {
            self.block_scalar = Some(indent + extra * 2);
        }
        deepest
    }
}

/// The bytes `Scan::line` acts on outside quotes (all others only end a leading run of blanks).
const SPECIAL: [bool; 256] = {
    let bytes = b"\"'#[]{}-?";
    let mut t = [false; 256];
    let mut i = 0;
    while i < bytes.len() {
        t[bytes[i] as usize] = true;
        i += 1;
    }
    t
};

/// Whether a line ends with a block scalar indicator (`|`, `>`, with chomping/indent indicators).
fn is_block_scalar_header(content: &[u8]) -> bool {
    let t = content.trim_ascii_end();
    let tail = t
        .iter()
        .rev()
        .take_while(|b| matches!(b, b'+' | b'-' | b'0'..=b'9'))
        .count();
    let t = &t[..t.len() - tail];
    matches!(t.last(), Some(b'|' | b'>')) && (t.len() == 1 || t[t.len() - 2] == b' ')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_the_std_lines() {
        for text in [
            "",
            "\n",
            "\n\n",
            "a",
            "a\n",
            "a\nb",
            "a\r\nb\r\n",
            "a\r\n\r\nb\r",
            "---\nkind: Service\n\n# note\nx: \"é\"\n",
        ] {
            assert_eq!(
                lines_inclusive(text).collect::<Vec<_>>(),
                text.split_inclusive('\n').collect::<Vec<_>>(),
                "{text:?}"
            );
            assert_eq!(
                lines(text).collect::<Vec<_>>(),
                text.lines().collect::<Vec<_>>(),
                "{text:?}"
            );
        }
    }

    #[test]
    fn deep_flow_nesting_is_refused_naming_the_line() {
        // Unbounded, 200,000 nested `[` kept the parser busy for 126 s.
        let text = format!("a: 1\nb: {}", "[".repeat(200_000));
        let err = check(&text).unwrap_err();
        assert_eq!(err, LimitError::TooDeep { line: 2 });
        assert!(err.to_string().contains("nested deeper than 100 levels"));
    }

    #[test]
    fn deep_block_nesting_is_refused() {
        let mut text = String::new();
        for d in 0..150 {
            text.push_str(&" ".repeat(d));
            text.push_str("k:\n");
        }
        assert!(matches!(check(&text), Err(LimitError::TooDeep { .. })));
        let dashes = format!("{}x\n", "- ".repeat(150));
        assert!(matches!(
            check(&dashes),
            Err(LimitError::TooDeep { line: 1 })
        ));
    }

    #[test]
    fn manifests_pass() {
        let text = r#"
apiVersion: v1
kind: Service
metadata:
  name: web   # a comment with [ and {
  annotations:
    re: "^[a-z]+$"
    quote: 'it''s [ fine'
    script: |
      if [ -f x ]; then
            deeply indented text is text
      fi
spec:
  selector: {app: web}
  ports:
  - name: http
    port: 80
    targetPort: [8080]
---
kind: List
items:
- - nested
  - - deeper
"#;
        check(text).unwrap();
        // Depth well inside the limit, as generated manifests might be.
        let mut deep = String::new();
        for d in 0..40 {
            deep.push_str(&"  ".repeat(d));
            deep.push_str("k:\n");
        }
        check(&deep).unwrap();
        check(&format!("a: {}{}", "[".repeat(90), "]".repeat(90))).unwrap();
    }

    #[test]
    fn the_parser_agrees_about_what_passes() {
        // Text at the limit still parses; the check is about time, not about meaning.
        let text = format!("a: {}1{}", "[".repeat(99), "]".repeat(99));
        check(&text).unwrap();
        let v: Result<serde_json::Value, _> = yaml_serde::from_str(&text);
        assert!(v.is_ok(), "{v:?}");
    }
}

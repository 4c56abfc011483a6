//! A reader of the block-style YAML subset that kubectl, `kxdp pcap gen` and the sync bench
//! write, handing each document straight to serde with its scalars borrowed from the text
//! (libyaml's scanner and parser and `yaml_serde`'s event vector, which copies every
//! scalar, were about half of a 30,000-Service startup).
//!
//! Written by hand because no crate does it without a C toolchain: `yaml_serde` (libyaml
//! translated to Rust) builds an event vector of owned scalars per document, `serde-saphyr`
//! decoded at 0.4× its speed (measured on a 30,000-Service state), and the other pure-Rust
//! parsers build a tree of owned nodes first.
//!
//! It reads only what it is sure of and answers `None` for anything else (the caller then
//! reads the document with `yaml_serde`, as before), so a document it takes reads exactly as
//! `yaml_serde` reads it:
//!
//! - text: printable ASCII and line feeds only (no tabs, carriage returns, non-ASCII: YAML
//!   treats some of those as line breaks or trims them);
//! - block mappings with plain keys (first character a letter, a digit, `_`, `.` or `/`), block
//!   sequences (`- ` items, a mapping starting on the item's line), at any consistent
//!   indentation; a mapping's sequence may sit at the mapping's own indentation;
//! - flow sequences and flow mappings on one line, nested, of plain and quoted scalars;
//! - scalars on one line: double-quoted without escapes, single-quoted without `''`, and plain
//!   ones whose YAML type is certain (see `classify`): `null`/`~`/empty, `true`/`false` in
//!   their three spellings, decimal integers, and strings that cannot be numbers;
//! - comments after a blank, comment lines, blank lines, a leading `---` line.
//!
//! Not taken (`None`): anchors and aliases, tags, block scalars (`|`, `>`), multi-line plain or
//! quoted scalars, quoted keys, explicit keys (`?`), escapes, a flow collection over lines,
//! plain scalars that could be floats or non-decimal integers (`1.5`, `0x50`, `.inf`, `+1`),
//! and anything unexpected. The scalars are handed over as `yaml_serde`'s `deserialize_any`
//! hands them (`visit_unit`, `visit_bool`, `visit_u64`, `visit_i64`, `visit_borrowed_str`), so
//! `super::typed_yaml::Strict` reads them exactly as it reads `yaml_serde`'s.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

/// The deepest nesting read (`crate::yaml::MAX_DEPTH`; `yaml_serde` refuses beyond 128).
const MAX_DEPTH: usize = crate::yaml::MAX_DEPTH;
/// The longest key read: libyaml refuses an implicit key over 1,024 characters.
const MAX_KEY: usize = 1000;

/// `T` from one YAML document (`text` holds exactly one, with or without its `---` line), or
/// `None` when the text is outside the subset or `T` refuses it.
pub(super) fn from_str<T: de::DeserializeOwned>(text: &str) -> Option<T> {
    if !text
        .bytes()
        .all(|c| c == b'\n' || (b' '..=b'~').contains(&c))
    {
        return None;
    }
    let mut p = Parser {
        s: text,
        pos: 0,
        line_start: 0,
        depth: 0,
        ended_at: usize::MAX,
    };
    if text.starts_with("---") {
        p.pos = 3;
        p.end_of_line().ok()?;
    }
    p.skip_blank_lines();
    if p.eof() {
        return None;
    }
    let indent = p.indent();
    p.pos += indent;
    let head = p.node_at_line_start(indent).ok()?;
    let value = T::deserialize(super::typed_yaml::Strict(De { p: &mut p, head })).ok()?;
    p.skip_blank_lines();
    p.eof().then_some(value)
}

/// Something outside the subset, or refused by the type: the caller reads the document again.
#[derive(Debug)]
pub(super) struct Unsupported;

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not read by the block-subset reader")
    }
}

impl std::error::Error for Unsupported {}

impl de::Error for Unsupported {
    fn custom<T: fmt::Display>(_: T) -> Self {
        Unsupported
    }
}

type Result<T> = std::result::Result<T, Unsupported>;

/// A scalar's YAML type, as `yaml_serde` resolves it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Null,
    Bool(bool),
    U64(u64),
    I64(i64),
    Str,
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct Scalar<'a> {
    text: &'a str,
    kind: Kind,
}

/// What a node is, its first token read.
enum Head<'a> {
    Scalar(Scalar<'a>),
    /// A block mapping whose first key starts at the position, at this column.
    BlockMap(usize),
    /// A block sequence whose first `-` is at the position, at this column.
    BlockSeq(usize),
    /// A flow sequence or mapping, its bracket read; `true` when it is a block value (the line
    /// must end after it).
    FlowSeq(bool),
    FlowMap(bool),
}

/// A plain scalar's type when `yaml_serde` is certain to resolve it so (its
/// `visit_untagged_scalar`: null, bool, then integers in several radixes, then floats through
/// Rust's `f64` parser, keeping finite ones only, then a string); `Unsupported` for what might
/// be a float, a non-decimal integer or a `+`-signed one.
fn classify(text: &str) -> Result<Scalar<'_>> {
    let kind = match text {
        "" | "~" | "null" | "Null" | "NULL" => Kind::Null,
        "true" | "True" | "TRUE" => Kind::Bool(true),
        "false" | "False" | "FALSE" => Kind::Bool(false),
        _ => {
            let b = text.as_bytes();
            let all_digits = |s: &[u8]| !s.is_empty() && s.iter().all(u8::is_ascii_digit);
            let body = b.strip_prefix(b"-").unwrap_or(b);
            if b[0].is_ascii_alphabetic()
                || b.iter()
                    .any(|c| !(c.is_ascii_alphanumeric() || matches!(c, b'.' | b'+' | b'-')))
            {
                // No integer or float Rust parses starts with a letter (`inf`, `nan` and the
                // like parse as non-finite: `yaml_serde` reads those as strings), nor holds
                // any other character.
                Kind::Str
            } else if b[0] == b'+' || body.first() == Some(&b'.') {
                return Err(Unsupported); // `+1`, `.5`, `.inf`, `-.nan`
            } else if let Some(rest) = [&b"0x"[..], b"0o", b"0b"]
                .iter()
                .find_map(|p| body.strip_prefix(*p))
            {
                let radix = match body[1] {
                    b'x' => 16,
                    b'o' => 8,
                    _ => 2,
                };
                let number =
                    !rest.is_empty() && rest.iter().all(|&c| char::from(c).is_digit(radix));
                if number {
                    return Err(Unsupported);
                }
                Kind::Str // neither an integer in that radix nor a float (`0b6f-11`)
            } else if !decimal_number(body)
                || (all_digits(body) && body.len() > 1 && body[0] == b'0')
            {
                // No number (`10.0.0.1`, `3c6a-11`, `1e5x`), or digits with leading zeros,
                // which `digits_but_not_number` makes a string.
                Kind::Str
            } else if all_digits(body) && body.len() == b.len() {
                Kind::U64(text.parse().map_err(|_| Unsupported)?)
            } else if all_digits(body) {
                Kind::I64(text.parse().map_err(|_| Unsupported)?)
            } else {
                return Err(Unsupported); // a float
            }
        }
    };
    Ok(Scalar { text, kind })
}

/// Whether Rust's `f64` parser reads `b` (no sign) as a decimal number:
/// `(digits | digits '.' digits? | '.' digits) (('e' | 'E') sign? digits)?`.
fn decimal_number(b: &[u8]) -> bool {
    let digits = |from: usize| b[from..].iter().take_while(|c| c.is_ascii_digit()).count();
    let whole = digits(0);
    let mut i = whole;
    let mut fraction = 0;
    if b.get(i) == Some(&b'.') {
        fraction = digits(i + 1);
        i += 1 + fraction;
    }
    if whole + fraction == 0 {
        return false;
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        let exponent = digits(i);
        if exponent == 0 {
            return false;
        }
        i += exponent;
    }
    i == b.len()
}

/// Whether the plain scalar starting `rest` may not start so here: a YAML indicator (some are
/// scalars in places; all are left to `yaml_serde`), or a `-` but before a digit.
fn bad_start(rest: &[u8]) -> bool {
    let c = rest.first().copied().unwrap_or(b'\n');
    if c == b'-' {
        return !rest.get(1).is_some_and(u8::is_ascii_digit);
    }
    matches!(
        c,
        b'\n'
            | b'?'
            | b':'
            | b','
            | b'['
            | b']'
            | b'{'
            | b'}'
            | b'#'
            | b'&'
            | b'*'
            | b'!'
            | b'|'
            | b'>'
            | b'\''
            | b'"'
            | b'%'
            | b'@'
            | b'`'
            | b'<'
            | b'='
    )
}

/// Whether a plain key may start with `c` here (a letter, a digit, `_`, `.` or `/`).
fn key_start(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'/')
}

/// Where a plain scalar in block context ends on its line.
enum PlainEnd {
    /// A `:` followed by a blank or the end of the line at this offset: the scalar is a key.
    Key(usize),
    /// The scalar ends at this offset (trailing blanks excluded; a comment or nothing follows).
    Value(usize),
}

struct Parser<'a> {
    s: &'a str,
    pos: usize,
    line_start: usize,
    /// Collections open.
    depth: usize,
    /// The depth of the collection whose end was read last (see `collection`).
    ended_at: usize,
}

impl<'a> Parser<'a> {
    fn eof(&self) -> bool {
        self.pos >= self.s.len()
    }

    fn byte(&self, i: usize) -> u8 {
        self.s.as_bytes().get(i).copied().unwrap_or(b'\n')
    }

    fn line_end(&self, from: usize) -> usize {
        self.s.as_bytes()[from.min(self.s.len())..]
            .iter()
            .position(|&c| c == b'\n')
            .map_or(self.s.len(), |n| from + n)
    }

    /// Spaces at the position (a line start).
    fn indent(&self) -> usize {
        self.s.as_bytes()[self.pos..]
            .iter()
            .take_while(|&&c| c == b' ')
            .count()
    }

    fn skip_spaces(&mut self) -> usize {
        let n = self.indent();
        self.pos += n;
        n
    }

    fn next_line(&mut self) {
        self.pos = (self.line_end(self.pos) + 1).min(self.s.len());
        self.line_start = self.pos;
    }

    /// From a line start, past blank and comment lines.
    fn skip_blank_lines(&mut self) {
        while !self.eof() {
            let c = self.byte(self.pos + self.indent());
            if c != b'\n' && c != b'#' {
                return;
            }
            self.next_line();
        }
    }

    /// Blanks, then a comment (after at least one blank) or nothing, to the next line.
    fn end_of_line(&mut self) -> Result<()> {
        let blanks = self.skip_spaces();
        match self.byte(self.pos) {
            b'\n' => {}
            b'#' if blanks > 0 => {}
            _ => return Err(Unsupported),
        }
        self.next_line();
        Ok(())
    }

    fn is_dash(&self, i: usize) -> bool {
        self.byte(i) == b'-' && matches!(self.byte(i + 1), b' ' | b'\n')
    }

    fn column(&self) -> usize {
        self.pos - self.line_start
    }

    fn plain_end(&self) -> PlainEnd {
        let b = self.s.as_bytes();
        let mut i = self.pos;
        // One pass to the line's end (not the line's end found first, then a second pass).
        while let Some(&c) = b.get(i) {
            match c {
                b'\n' => break,
                b':' if matches!(self.byte(i + 1), b' ' | b'\n') => return PlainEnd::Key(i),
                b'#' if b[i - 1] == b' ' => break,
                _ => {}
            }
            i += 1;
        }
        let mut j = i;
        while b[j - 1] == b' ' {
            j -= 1;
        }
        PlainEnd::Value(j)
    }

    /// A quoted scalar's content (the position at its opening quote).
    fn quoted(&mut self) -> Result<&'a str> {
        let q = self.byte(self.pos);
        let start = self.pos + 1;
        let end = self.line_end(start);
        let close = self.s.as_bytes()[start..end]
            .iter()
            .position(|&c| c == q)
            .ok_or(Unsupported)?
            + start;
        let text = &self.s[start..close];
        if (q == b'"' && text.contains('\\')) || (q == b'\'' && self.byte(close + 1) == b'\'') {
            return Err(Unsupported);
        }
        self.pos = close + 1;
        Ok(text)
    }

    /// A node in block context at the position (its first character), at `column`; `value`
    /// when it follows a key on the key's line (where a mapping cannot start).
    fn node_here(&mut self, column: usize, value: bool) -> Result<Head<'a>> {
        match self.byte(self.pos) {
            b'[' => {
                self.pos += 1;
                return Ok(Head::FlowSeq(true));
            }
            b'{' => {
                self.pos += 1;
                return Ok(Head::FlowMap(true));
            }
            b'"' | b'\'' => {
                let text = self.quoted()?;
                self.end_of_line()?;
                return Ok(Head::Scalar(Scalar {
                    text,
                    kind: Kind::Str,
                }));
            }
            _ if bad_start(&self.s.as_bytes()[self.pos..]) => return Err(Unsupported),
            _ => {}
        }
        if self.s[self.pos..].starts_with("---") || self.s[self.pos..].starts_with("...") {
            return Err(Unsupported);
        }
        match self.plain_end() {
            PlainEnd::Key(_) if value => Err(Unsupported),
            PlainEnd::Key(_) => Ok(Head::BlockMap(column)),
            PlainEnd::Value(end) => {
                let scalar = classify(&self.s[self.pos..end])?;
                self.pos = end;
                self.end_of_line()?;
                Ok(Head::Scalar(scalar))
            }
        }
    }

    /// A node starting a line (the position past its indentation `column`).
    fn node_at_line_start(&mut self, column: usize) -> Result<Head<'a>> {
        if self.is_dash(self.pos) {
            Ok(Head::BlockSeq(column))
        } else {
            self.node_here(column, false)
        }
    }

    /// What follows a `-` or a key's `:` (the position just past it) in a block collection at
    /// `column`: the node on the same line, or on the lines below, or null.
    fn block_value(&mut self, column: usize, after_key: bool) -> Result<Head<'a>> {
        let blanks = self.skip_spaces();
        let c = self.byte(self.pos);
        if c == b'\n' || (c == b'#' && blanks > 0) {
            self.next_line();
            self.skip_blank_lines();
            if self.eof() {
                return Ok(null());
            }
            let indent = self.indent();
            let at = self.pos + indent;
            if indent > column || (after_key && indent == column && self.is_dash(at)) {
                self.pos = at;
                return self.node_at_line_start(indent);
            }
            return Ok(null());
        }
        if blanks == 0 || self.is_dash(self.pos) {
            return Err(Unsupported);
        }
        self.node_here(self.column(), after_key)
    }

    /// A key in block context (the position at its first character), past its `:`.
    fn block_key(&mut self) -> Result<&'a str> {
        if !key_start(self.byte(self.pos)) {
            return Err(Unsupported);
        }
        match self.plain_end() {
            PlainEnd::Key(end) if self.byte(end - 1) != b' ' && end - self.pos <= MAX_KEY => {
                let key = &self.s[self.pos..end];
                self.pos = end + 1;
                Ok(key)
            }
            _ => Err(Unsupported),
        }
    }

    /// A plain scalar in flow context (ends at a flow indicator or a `: `); no `:` or `#`
    /// inside (where flow and block rules differ), no empty one.
    fn flow_plain(&mut self) -> Result<&'a str> {
        let b = self.s.as_bytes();
        let start = self.pos;
        if bad_start(&b[start..]) {
            return Err(Unsupported);
        }
        let mut i = start;
        while i < b.len() && !matches!(b[i], b',' | b'[' | b']' | b'{' | b'}' | b'\n' | b':') {
            if b[i] == b'#' {
                return Err(Unsupported);
            }
            i += 1;
        }
        let mut j = i;
        while j > start && b[j - 1] == b' ' {
            j -= 1;
        }
        if j == start {
            return Err(Unsupported);
        }
        self.pos = j;
        Ok(&self.s[start..j])
    }

    /// A node in flow context (blanks before it skipped).
    fn flow_node(&mut self) -> Result<Head<'a>> {
        self.skip_spaces();
        match self.byte(self.pos) {
            b'[' => {
                self.pos += 1;
                Ok(Head::FlowSeq(false))
            }
            b'{' => {
                self.pos += 1;
                Ok(Head::FlowMap(false))
            }
            b'"' | b'\'' => Ok(Head::Scalar(Scalar {
                text: self.quoted()?,
                kind: Kind::Str,
            })),
            _ => Ok(Head::Scalar(classify(self.flow_plain()?)?)),
        }
    }

    /// Before a flow collection's next entry: `None` at its closing `close` (read, the
    /// collection ended), `Some` at an entry (a `,` before it read, unless `first`).
    fn flow_next(&mut self, close: u8, first: bool) -> Result<Option<()>> {
        self.skip_spaces();
        let c = self.byte(self.pos);
        if c == close {
            self.pos += 1;
            self.ended();
            return Ok(None);
        }
        if !first {
            if c != b',' {
                return Err(Unsupported);
            }
            self.pos += 1;
            self.skip_spaces();
            if matches!(self.byte(self.pos), b']' | b'}' | b',') {
                return Err(Unsupported); // a trailing or empty entry
            }
        }
        Ok(Some(()))
    }

    /// Runs `visit` over a collection one level deeper, and checks that it read the collection
    /// to its end (a visitor that stops early would leave the position inside it).
    fn collection<T>(&mut self, visit: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        if self.depth >= MAX_DEPTH {
            return Err(Unsupported);
        }
        self.depth += 1;
        self.ended_at = usize::MAX;
        let value = visit(self)?;
        if self.ended_at != self.depth {
            return Err(Unsupported);
        }
        self.depth -= 1;
        Ok(value)
    }

    fn ended(&mut self) {
        self.ended_at = self.depth;
    }
}

fn null<'a>() -> Head<'a> {
    Head::Scalar(Scalar {
        text: "",
        kind: Kind::Null,
    })
}

/// A node, its head read.
struct De<'p, 'a> {
    p: &'p mut Parser<'a>,
    head: Head<'a>,
}

impl<'de> Deserializer<'de> for De<'_, 'de> {
    type Error = Unsupported;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        let p = self.p;
        match self.head {
            Head::Scalar(s) => match s.kind {
                Kind::Null => visitor.visit_unit(),
                Kind::Bool(b) => visitor.visit_bool(b),
                Kind::U64(n) => visitor.visit_u64(n),
                Kind::I64(n) => visitor.visit_i64(n),
                Kind::Str => visitor.visit_borrowed_str(s.text),
            },
            Head::BlockMap(column) => p.collection(|p| visitor.visit_map(Block::new(p, column))),
            Head::BlockSeq(column) => p.collection(|p| visitor.visit_seq(Block::new(p, column))),
            Head::FlowSeq(block) | Head::FlowMap(block) => {
                let map = matches!(self.head, Head::FlowMap(_));
                let v = p.collection(|p| {
                    let flow = Flow { p, first: true };
                    if map {
                        visitor.visit_map(flow)
                    } else {
                        visitor.visit_seq(flow)
                    }
                })?;
                if block {
                    p.end_of_line()?; // a block value: the line ends after it
                }
                Ok(v)
            }
        }
    }

    /// As `yaml_serde`: a plain null is `None`, anything else `Some`.
    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match self.head {
            Head::Scalar(Scalar {
                kind: Kind::Null, ..
            }) => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    /// As `yaml_serde`: any scalar's text.
    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match self.head {
            Head::Scalar(s) => visitor.visit_borrowed_str(s.text),
            _ => Err(Unsupported),
        }
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.deserialize_str(visitor)
    }

    // (`Strict` answers enums itself, refusing them.)
    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char bytes byte_buf unit
        unit_struct newtype_struct seq tuple tuple_struct map struct enum identifier ignored_any
    }
}

/// A key: its text (map keys are read as strings, as `yaml_serde` reads them).
struct Key<'a>(&'a str);

impl<'de> Deserializer<'de> for Key<'de> {
    type Error = Unsupported;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_borrowed_str(self.0)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map struct enum
        identifier ignored_any
    }
}

/// A block mapping or sequence at `column`; `first`: its first key or `-` is at the position.
struct Block<'p, 'a> {
    p: &'p mut Parser<'a>,
    column: usize,
    first: bool,
}

impl<'p, 'a> Block<'p, 'a> {
    fn new(p: &'p mut Parser<'a>, column: usize) -> Self {
        Block {
            p,
            column,
            first: true,
        }
    }
}

impl<'de> MapAccess<'de> for Block<'_, 'de> {
    type Error = Unsupported;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>> {
        let p = &mut *self.p;
        if !std::mem::take(&mut self.first) {
            p.skip_blank_lines();
            if p.eof() {
                p.ended();
                return Ok(None);
            }
            let indent = p.indent();
            if indent < self.column {
                p.ended();
                return Ok(None);
            }
            if indent > self.column || p.is_dash(p.pos + indent) {
                return Err(Unsupported);
            }
            p.pos += indent;
        }
        let key = p.block_key()?;
        seed.deserialize(Key(key)).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value> {
        let head = self.p.block_value(self.column, true)?;
        seed.deserialize(De {
            p: &mut *self.p,
            head,
        })
    }
}

impl<'de> SeqAccess<'de> for Block<'_, 'de> {
    type Error = Unsupported;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>> {
        let p = &mut *self.p;
        if !std::mem::take(&mut self.first) {
            p.skip_blank_lines();
            let indent = p.indent();
            if indent > self.column {
                return Err(Unsupported);
            }
            if p.eof() || indent < self.column || !p.is_dash(p.pos + indent) {
                p.ended();
                return Ok(None);
            }
            p.pos += indent;
        }
        p.pos += 1; // the `-`
        let head = p.block_value(self.column, false)?;
        seed.deserialize(De { p, head }).map(Some)
    }
}

/// A flow sequence or mapping, its opening bracket read; `first`: no entry read yet.
struct Flow<'p, 'a> {
    p: &'p mut Parser<'a>,
    first: bool,
}

impl Flow<'_, '_> {
    /// Whether an entry follows (else the closing `close` was read).
    fn entry(&mut self, close: u8) -> Result<bool> {
        let first = std::mem::take(&mut self.first);
        Ok(self.p.flow_next(close, first)?.is_some())
    }
}

impl<'de> SeqAccess<'de> for Flow<'_, 'de> {
    type Error = Unsupported;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>> {
        if !self.entry(b']')? {
            return Ok(None);
        }
        let p = &mut *self.p;
        let head = p.flow_node()?;
        seed.deserialize(De { p, head }).map(Some)
    }
}

impl<'de> MapAccess<'de> for Flow<'_, 'de> {
    type Error = Unsupported;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>> {
        if !self.entry(b'}')? {
            return Ok(None);
        }
        let p = &mut *self.p;
        if !key_start(p.byte(p.pos)) {
            return Err(Unsupported);
        }
        let key = p.flow_plain()?;
        if key.len() > MAX_KEY {
            return Err(Unsupported);
        }
        if p.byte(p.pos) != b':' || p.byte(p.pos + 1) != b' ' {
            return Err(Unsupported);
        }
        p.pos += 1;
        seed.deserialize(Key(key)).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value> {
        let p = &mut *self.p;
        p.skip_spaces();
        if matches!(p.byte(p.pos), b',' | b'}' | b']' | b'\n') {
            return Err(Unsupported); // an empty value
        }
        let head = p.flow_node()?;
        seed.deserialize(De { p, head })
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use serde::de::DeserializeOwned;
    use serde_json::Value;

    use super::*;

    /// What the reader makes of `text` as a `T`, checked against `yaml_serde` read strictly:
    /// the same value, or `None` (left to it).
    fn read<T: DeserializeOwned + PartialEq + fmt::Debug>(text: &str) -> Option<T> {
        let fast = from_str::<T>(text);
        if fast.is_some() {
            let slow = super::super::typed_yaml::with_yaml_serde::<T>(text);
            assert_eq!(
                fast, slow,
                "the subset reader and yaml_serde differ on\n{text}"
            );
        }
        fast
    }

    fn value(text: &str) -> Option<Value> {
        read::<Value>(text)
    }

    #[test]
    fn scalars_typed_as_yaml_serde_types_them() {
        let taken = [
            "a",
            "web",
            "80",
            "0",
            "007",
            "-5",
            "-0",
            "-07",
            "true",
            "True",
            "TRUE",
            "false",
            "FALSE",
            "yes",
            "no",
            "on",
            "null",
            "Null",
            "NULL",
            "~",
            "10.0.0.1",
            "1.2.3",
            "a b",
            "a:b",
            "nginx:1.2",
            "fd00::1",
            "a#b",
            "1_000",
            "inf",
            "nan",
            "Infinity",
            "e5",
            "E",
            "x1.5",
            "a,b",
            "a]b",
            "it's",
            "say \"x\"",
            "kubernetes.io/name",
            "18446744073709551615",
            "-9223372036854775808",
            "\"80\"",
            "'80'",
            "\"\"",
            "''",
            "\"true\"",
            "'null'",
            "\"a b # c\"",
            "'x: y'",
            "\"10.0.0.1\"",
            "a # comment",
            "80 # comment",
            "'q'   # c",
            "[]",
            "{}",
            "[a, 1, true, \"x\", 'y', ~]",
            "[ a ,b ]",
            "{a: b, c: 1, d: [e, {f: g}]}",
            "[[a], [b, [c]]]",
            "{a: {b: {c: d}}}",
            "[\"10.0.0.1\", 10.0.0.2]",
            "{kubernetes.io/service-name: svc-1}",
            "-7 # c",
            "-07",
            "0b6f-11",
            "3c6a1f0e-1b2c",
            "1e5x",
            "10.0.0.0/8",
            "1.2.3e4",
            "0x",
            "0xg",
            "0o9",
            "0b2",
            "1-2",
            "1+2",
            "-1.2.3",
            "2024-01-01",
            "1e",
            "1e+",
        ];
        for s in taken {
            let t = format!("k: {s}\n");
            assert!(value(&t).is_some(), "not taken: {t}");
        }
        let left = [
            "1.5",
            "0x50",
            "0o7",
            "0b1",
            "+1",
            ".inf",
            "-.inf",
            ".nan",
            "1e3",
            "1.",
            ".5",
            "18446744073709551616",
            "-9223372036854775809",
            "&a x",
            "*a",
            "!t x",
            "!!str 80",
            "|",
            ">",
            "|-",
            "- a",
            "? a",
            ": a",
            "%x",
            "@x",
            "`x",
            "\"a\\\"b\"",
            "\"a\\nb\"",
            "'it''s'",
            "\"unclosed",
            "[a, b",
            "[a, ]",
            "[a,, b]",
            "{a: }",
            "{a}",
            "{a:1}",
            "[a:b]",
            "[fd00::1]",
            "{\"a\": b}",
            "[a] x",
            "\"a\" x",
            "a: b",
            "a:",
            "[a]#c",
            "<<",
            "=",
            "---",
            "...",
            "- ",
            "[-]",
            "{a: b}}",
            "0x1F",
            "-0x1",
            "0o17",
            "0b101",
            "1e5",
            "1E-5",
            "1.",
            "-1.5",
            "007.5",
            ".5",
            "+.5",
            "-.inf",
            ".NaN",
            "1.5e3",
        ];
        for s in left {
            let t = format!("k: {s}\n");
            assert_eq!(value(&t), None, "taken: {t}");
        }
    }

    #[test]
    fn block_structure() {
        let taken = [
            "a: 1\nb:\n  c: d\n  e:\n  - f\n  - g: h\n    i: j\n  -\n  - k\nl: m\n",
            "---\na: [1]\n",
            "--- # c\n# c\n\na:\n\n  # c\n  b: c   # c\n\n",
            "a:\n- 1\n- 2\nb: 3\n",
            "a:\n    - b: 1\n      c:\n        d: e\n    - x\n",
            "a:\n  [1, 2]\nb:\n  'q'\nc:\n  plain\n",
            "a:\nb: ~\nc: \n",
            "a:\n  -\n    b: c\n  -   d: e\n      f: g\n",
            "  a: 1\n  b: 2\n",
            "a: 1\na: 2\n",
            "a b: c\nkubernetes.io/x: y\n_z: 1\n.d: 2\n/e: 3\n9: 4\n",
        ];
        for t in taken {
            assert!(value(t).is_some(), "not taken: {t}");
        }
        let left = [
            "a: 1\n  b: 2\n",
            "a:\n  b\n  c\n",
            "a: x\n  y\n",
            "- a\n  b\n",
            "a: 1\n- b\n",
            "a:\n    b: 1\n  c: 2\n",
            "a:\n- - b\n",
            "a: &x 1\nb: *x\n",
            "a: !!int 1\n",
            "a: |\n  x\n",
            "a: \"x\n  y\"\n",
            "a: [1,\n  2]\n",
            "? a\n: b\n",
            "\"a\": b\n",
            "'a': b\n",
            "a : b\n",
            "a:\tb\n",
            "a: b\r\n",
            "\ta: b\n",
            "a: é\n",
            "a: b\n...\n",
            "a: 1\n---\nb: 2\n",
            "<<: {a: b}\n",
            "- a\n- b\n",
            "a",
            "",
            "# only\n",
            "---\n",
        ];
        for t in left {
            let v = value(t);
            assert!(
                v.is_none() || matches!(v, Some(Value::Array(_) | Value::String(_))),
                "taken: {t:?}"
            );
        }
        // libyaml refuses an implicit key over 1,024 characters.
        let long = "k".repeat(1025);
        assert_eq!(value(&format!("{long}: 1\n")), None);
        assert_eq!(value(&format!("a: {{{long}: 1}}\n")), None);
        assert_eq!(
            value("a:\n- 1\n- b: x\n  c: [y]\nd:\n"),
            Some(serde_json::json!({"a": [1, {"b": "x", "c": ["y"]}], "d": null}))
        );
    }

    /// Random documents of the subset's pieces and of what it leaves, checked against
    /// `yaml_serde`: whatever the reader takes reads the same.
    #[test]
    fn random_documents_read_as_yaml_serde_reads_them() {
        const SCALARS: &[&str] = &[
            "a",
            "80",
            "007",
            "-5",
            "1.5",
            "0x50",
            "true",
            "yes",
            "null",
            "~",
            "",
            "10.0.0.1",
            "a b",
            "a:b",
            "a #c",
            "\"q\"",
            "'q'",
            "\"a\\\"b\"",
            "'it''s'",
            "[a, 1]",
            "[]",
            "{}",
            "{a: b, c: [1, ~]}",
            "[a, ]",
            "{a: }",
            "&x a",
            "*x",
            "!t a",
            ".inf",
            "-x",
            "+1",
            "\"\"",
            "fd00::1",
            "[fd00::1]",
            "{a:1}",
            "a: b",
            "|",
            "- a",
        ];
        const KEYS: &[&str] = &["a", "b", "kubernetes.io/x", "9", "c d", "\"q\"", "?", "a "];
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut rand = move |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        fn node(out: &mut String, indent: usize, depth: usize, r: &mut dyn FnMut(usize) -> usize) {
            let pad = " ".repeat(indent);
            let step = [2, 2, 4, 3, 1][r(5)];
            match if depth > 3 { 0 } else { r(4) } {
                0 | 1 => {
                    for _ in 0..1 + r(3) {
                        out.push_str(&format!("{pad}{}:", KEYS[r(KEYS.len())]));
                        match r(4) {
                            0 => {
                                out.push('\n');
                                node(out, indent + step, depth + 1, r);
                            }
                            1 if depth < 3 => {
                                out.push('\n');
                                for _ in 0..1 + r(2) {
                                    out.push_str(&format!(
                                        "{pad}- {}\n",
                                        SCALARS[r(SCALARS.len())]
                                    ));
                                }
                            }
                            _ => out.push_str(&format!(" {}\n", SCALARS[r(SCALARS.len())])),
                        }
                        if r(8) == 0 {
                            out.push_str(["\n", "# c\n", "   # c\n"][r(3)]);
                        }
                    }
                }
                2 => {
                    for _ in 0..1 + r(3) {
                        out.push_str(&format!("{pad}-"));
                        if r(2) == 0 {
                            out.push_str(&format!(" {}\n", SCALARS[r(SCALARS.len())]));
                        } else {
                            let key = KEYS[r(KEYS.len())];
                            out.push_str(&format!(" {key}: {}\n", SCALARS[r(SCALARS.len())]));
                            let inner = " ".repeat(indent + 2);
                            out.push_str(&format!("{inner}b: {}\n", SCALARS[r(SCALARS.len())]));
                        }
                    }
                }
                _ => out.push_str(&format!("{pad}{}\n", SCALARS[r(SCALARS.len())])),
            }
        }
        let mut taken = 0;
        for _ in 0..20_000 {
            let mut doc = String::new();
            node(&mut doc, 0, 0, &mut rand);
            if value(&doc).is_some() {
                taken += 1;
            }
        }
        assert!(taken > 2_000, "only {taken} of 20,000 documents taken");
    }

    #[test]
    fn typed_objects_as_yaml_serde_reads_them() {
        let svc = "apiVersion: v1\nkind: Service\nmetadata:\n  name: svc-1\n  namespace: default\nspec:\n  type: ClusterIP\n  clusterIP: \"172.16.0.1\"\n  clusterIPs: [\"172.16.0.1\"]\n  ipFamilies: [IPv4]\n  ipFamilyPolicy: SingleStack\n  selector: {app: svc-1}\n  ports:\n  - {name: http, port: 80, protocol: TCP, targetPort: 8080}\n";
        let slice = "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: svc-1-0\n  namespace: default\n  labels: {kubernetes.io/service-name: svc-1}\naddressType: IPv4\nports:\n- {name: http, port: 8080, protocol: TCP}\nendpoints:\n- addresses: [\"10.0.0.1\"]\n  conditions: {ready: true, serving: true, terminating: false}\n  nodeName: node-1\n- addresses: [10.0.0.2]\n  conditions:\n    ready: false\n  targetRef: {kind: Pod, name: p, namespace: default}\n";
        assert!(read::<Service>(svc).is_some());
        assert!(read::<EndpointSlice>(slice).is_some());
        // A type error: not taken (and `yaml_serde` decides, refusing it too).
        assert!(read::<Service>(&svc.replace("port: 80,", "port: \"80\",")).is_none());
        assert!(read::<Service>(&svc.replace("name: svc-1\n", "name: 80\n")).is_none());
        // kubectl's output: block style throughout.
        let kubectl = "apiVersion: v1\nkind: Service\nmetadata:\n  annotations:\n    kubectl.kubernetes.io/last-applied-configuration: '{\"a\":1}'\n  creationTimestamp: \"2024-01-01T00:00:00Z\"\n  labels:\n    app: web\n  name: web\n  namespace: shop\n  resourceVersion: \"123\"\n  uid: 0b6f-11\nspec:\n  clusterIP: 10.96.0.10\n  clusterIPs:\n  - 10.96.0.10\n  internalTrafficPolicy: Cluster\n  ipFamilies:\n  - IPv4\n  ipFamilyPolicy: SingleStack\n  ports:\n  - name: http\n    port: 80\n    protocol: TCP\n    targetPort: 8080\n  selector:\n    app: web\n  sessionAffinity: None\n  type: ClusterIP\nstatus:\n  loadBalancer: {}\n";
        assert!(read::<Service>(kubectl).is_some());
        // `kxdp pcap gen`'s Node and Namespace (its Services and slices are the two above).
        let node = "apiVersion: v1\nkind: Node\nmetadata:\n  name: node-0\nstatus:\n  addresses:\n    - {type: InternalIP, address: 192.168.0.2}\n    - {type: InternalIP, address: \"fd00::2\"}\n";
        assert!(read::<k8s_openapi::api::core::v1::Node>(node).is_some());
        let ns = "---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: default\n";
        assert!(read::<k8s_openapi::api::core::v1::Namespace>(ns).is_some());
    }
}

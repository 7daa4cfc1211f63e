//! The source scan of `check-deps`: finds paths that `domain` must never
//! name (I/O, processes, threads, environment, clocks, async runtimes and
//! drivers) in Rust source text.
//!
//! A pure function over text, so it is tested against deliberately bad
//! source below. It tokenizes just enough of Rust to be honest about it:
//! comments (doc comments included), string, byte-string, raw-string and
//! character literals are skipped, so prose that *mentions* `std::fs` is not
//! a hit; paths are read as tokens, so `std :: fs`, `::std::fs`,
//! `use std::{io, fs::File}` (nested groups too) and `use {tokio::spawn}`
//! are all seen as the paths they are.
//!
//! Known blind spot: an alias (`use std::time::Instant as I; I::now()`) is
//! caught at the `use`, not at the call — which is where it matters.

/// Modules of `std` that perform I/O, spawn processes or threads, or read
/// the environment.
const FORBIDDEN_STD_MODULES: &[&str] = &["env", "fs", "net", "process", "thread"];

/// Crates whose mere naming means I/O or an async runtime.
const FORBIDDEN_CRATES: &[&str] = &["hyper", "lapin", "mio", "reqwest", "socket2", "sqlx", "tokio"];

/// Clock reads: `Type::now` for these types (chrono's too: the domain
/// uses its date types, and its clock is linked in by other crates).
const FORBIDDEN_CLOCKS: &[&str] = &["Instant", "Local", "SystemTime", "Utc"];

/// One forbidden path found in a source file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hit {
    /// 1-based line of the segment that made the path forbidden.
    pub(crate) line: usize,
    /// The forbidden path as written, normalised: `std::fs`, `tokio::spawn`.
    pub(crate) path: String,
    /// The offending source line, trimmed.
    pub(crate) text: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Ident(String),
    PathSep,
    Punct(char),
}

#[derive(Debug, Clone)]
struct Token {
    tok: Tok,
    line: usize,
}

/// Scans Rust source text and returns every forbidden path, in order.
pub(crate) fn scan(source: &str) -> Vec<Hit> {
    let tokens = tokenize(source);
    let lines: Vec<&str> = source.lines().collect();
    let mut hits = Vec::new();
    for path in paths(&tokens) {
        if let Some((end, rendered)) = forbidden(&path) {
            let line = path.segments[end].1;
            let text = lines.get(line - 1).map_or("", |l| l.trim()).to_owned();
            hits.push(Hit {
                line,
                path: rendered,
                text,
            });
        }
    }
    hits.sort_by_key(|h| h.line);
    hits.dedup();
    hits
}

/// A path as a list of `(segment, line)`; `in_use` when it comes from a
/// `use` tree or `extern crate`, where a single segment names a crate.
#[derive(Debug)]
struct Path {
    segments: Vec<(String, usize)>,
    in_use: bool,
}

/// Whether `path` is forbidden: the index of the segment that makes it so,
/// and the forbidden prefix rendered.
fn forbidden(path: &Path) -> Option<(usize, String)> {
    let seg: Vec<&str> = path.segments.iter().map(|(s, _)| s.as_str()).collect();
    let first = *seg.first()?;
    if first == "std" {
        match seg.get(1) {
            Some(&m) if FORBIDDEN_STD_MODULES.contains(&m) => return Some((1, format!("std::{m}"))),
            // A glob import of std brings `fs`, `env`, … into scope unseen.
            Some(&"*") => return Some((1, "std::*".to_owned())),
            _ => {}
        }
    }
    if FORBIDDEN_CRATES.contains(&first) && (seg.len() > 1 || path.in_use) {
        let end = usize::from(seg.len() > 1);
        return Some((end, seg[..=end].join("::")));
    }
    seg.windows(2)
        .position(|w| FORBIDDEN_CLOCKS.contains(&w[0]) && w[1] == "now")
        .map(|i| (i + 1, format!("{}::now", seg[i])))
}

/// Reads every path out of the token stream, expanding `use` groups.
fn paths(tokens: &[Token]) -> Vec<Path> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let prev = i.checked_sub(1).map(|p| &tokens[p].tok);
        let is_use = matches!(prev, Some(Tok::Ident(k)) if k == "use");
        let is_extern_crate = matches!(prev, Some(Tok::Ident(k)) if k == "crate")
            && matches!(i.checked_sub(2).map(|p| &tokens[p].tok), Some(Tok::Ident(k)) if k == "extern");
        match &tokens[i].tok {
            // `use {a::b, c}`: a group with an empty prefix.
            Tok::Punct('{') if is_use => {
                i = parse_group(tokens, i, &[], &mut out);
            }
            // A leading `::` (`::std::fs`) starts a path unless it follows
            // something a path can continue from (`Vec::<u8>::new`).
            Tok::PathSep if !continues_path(prev) => {
                i = parse_path(tokens, i + 1, Vec::new(), is_use, &mut out);
            }
            Tok::Ident(word) if KEYWORDS.contains(&word.as_str()) => i += 1,
            Tok::Ident(_) if !matches!(prev, Some(Tok::PathSep)) => {
                i = parse_path(tokens, i, Vec::new(), is_use || is_extern_crate, &mut out);
            }
            _ => i += 1,
        }
    }
    out
}

/// Keywords after which `::` starts a path; never path segments themselves.
const KEYWORDS: &[&str] = &[
    "as", "box", "break", "dyn", "else", "if", "impl", "in", "let", "match", "move", "mut", "pub", "ref", "return",
    "use", "where", "while", "yield",
];

/// Whether a `::` after `prev` continues a path (`a::b`, `Vec::<u8>::new`,
/// `f()::x`) rather than starting one (`use ::std`, `(::std::fs::read)`).
fn continues_path(prev: Option<&Tok>) -> bool {
    match prev {
        Some(Tok::Ident(word)) => !KEYWORDS.contains(&word.as_str()),
        Some(Tok::Punct('>' | ')' | ']')) => true,
        _ => false,
    }
}

/// Parses a path starting at `tokens[i]` (an identifier) under `prefix`;
/// pushes the finished path(s) and returns the index after it.
fn parse_path(
    tokens: &[Token],
    mut i: usize,
    mut prefix: Vec<(String, usize)>,
    in_use: bool,
    out: &mut Vec<Path>,
) -> usize {
    loop {
        match tokens.get(i).map(|t| &t.tok) {
            Some(Tok::Ident(name)) => {
                prefix.push((name.clone(), tokens[i].line));
                i += 1;
            }
            Some(Tok::Punct('*')) => {
                prefix.push(("*".to_owned(), tokens[i].line));
                i += 1;
            }
            Some(Tok::Punct('{')) if in_use => return parse_group(tokens, i, &prefix, out),
            _ => break,
        }
        if matches!(tokens.get(i).map(|t| &t.tok), Some(Tok::PathSep)) {
            i += 1;
        } else {
            break;
        }
    }
    if !prefix.is_empty() {
        out.push(Path {
            segments: prefix,
            in_use,
        });
    }
    i
}

/// Parses a `{ … }` use group at `tokens[open]` whose items extend
/// `prefix`; returns the index after the closing brace.
fn parse_group(tokens: &[Token], open: usize, prefix: &[(String, usize)], out: &mut Vec<Path>) -> usize {
    let mut i = open + 1;
    while let Some(t) = tokens.get(i) {
        match &t.tok {
            Tok::Punct('}') => return i + 1,
            Tok::Punct(',') => i += 1,
            Tok::PathSep => i += 1,
            Tok::Punct('{') => i = parse_group(tokens, i, prefix, out),
            Tok::Ident(k) if k == "as" => i += 2, // `as alias`
            Tok::Ident(k) if k == "self" => {
                if !prefix.is_empty() {
                    out.push(Path {
                        segments: prefix.to_vec(),
                        in_use: true,
                    });
                }
                i += 1;
            }
            Tok::Ident(_) | Tok::Punct('*') => i = parse_path(tokens, i, prefix.to_vec(), true, out),
            _ => i += 1,
        }
    }
    i
}

/// Splits source into identifiers, `::` and single punctuation, skipping
/// whitespace, comments, literals and lifetimes.
fn tokenize(source: &str) -> Vec<Token> {
    let chars: Vec<char> = source.chars().collect();
    let mut tokens = Vec::new();
    let mut line = 1;
    let mut i = 0;
    // Advances over `chars[from..to]`, counting newlines.
    let skip = |from: usize, to: usize, line: &mut usize| {
        *line += chars[from..to.min(chars.len())].iter().filter(|&&c| c == '\n').count();
        to
    };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        match c {
            '\n' => {
                line += 1;
                i += 1;
            }
            c if c.is_whitespace() => i += 1,
            '/' if next == Some('/') => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '/' if next == Some('*') => {
                let end = block_comment_end(&chars, i);
                i = skip(i, end, &mut line);
            }
            '"' => {
                let end = quoted_end(&chars, i + 1, '"');
                i = skip(i, end, &mut line);
            }
            '\'' => {
                // A char literal ('a', '\n', '\u{1F600}') or a lifetime ('a).
                if next == Some('\\') {
                    i = skip(i, quoted_end(&chars, i + 1, '\''), &mut line);
                } else if chars.get(i + 2) == Some(&'\'') {
                    i += 3;
                } else {
                    i += 1;
                    while i < chars.len() && is_ident_continue(chars[i]) {
                        i += 1;
                    }
                }
            }
            c if is_ident_start(c) => {
                // Literal prefixes: r"…", r#"…"#, b"…", br"…", c"…", b'x'.
                if let Some(end) = prefixed_literal_end(&chars, i) {
                    i = skip(i, end, &mut line);
                    continue;
                }
                if c == 'r' && next == Some('#') && chars.get(i + 2).is_some_and(|&c| is_ident_start(c)) {
                    i += 2; // raw identifier r#name
                }
                let name_start = i;
                while i < chars.len() && is_ident_continue(chars[i]) {
                    i += 1;
                }
                tokens.push(Token {
                    tok: Tok::Ident(chars[name_start..i].iter().collect()),
                    line,
                });
            }
            c if c.is_ascii_digit() => {
                while i < chars.len() && (is_ident_continue(chars[i]) || chars[i] == '.') {
                    // Stop before `..` so `0..n` stays a range.
                    if chars[i] == '.' && chars.get(i + 1) == Some(&'.') {
                        break;
                    }
                    i += 1;
                }
            }
            ':' if next == Some(':') => {
                tokens.push(Token {
                    tok: Tok::PathSep,
                    line,
                });
                i += 2;
            }
            c => {
                tokens.push(Token {
                    tok: Tok::Punct(c),
                    line,
                });
                i += 1;
            }
        }
    }
    tokens
}

fn is_ident_start(c: char) -> bool {
    c == '_' || c.is_alphabetic()
}

fn is_ident_continue(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

/// The index after a (possibly nested) block comment starting at `start`.
fn block_comment_end(chars: &[char], start: usize) -> usize {
    let mut depth = 0usize;
    let mut i = start;
    while i < chars.len() {
        if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
            depth += 1;
            i += 2;
        } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            i += 1;
        }
    }
    chars.len()
}

/// The index after the closing `quote` of a literal whose body starts at
/// `i`, honouring backslash escapes.
fn quoted_end(chars: &[char], mut i: usize, quote: char) -> usize {
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 2,
            c if c == quote => return i + 1,
            _ => i += 1,
        }
    }
    chars.len()
}

/// If a prefixed literal (`r"…"`, `r#"…"#`, `b"…"`, `br#"…"#`, `c"…"`,
/// `cr"…"`, `b'x'`) starts at `i`, the index after it.
fn prefixed_literal_end(chars: &[char], i: usize) -> Option<usize> {
    let mut j = i;
    let byte_or_c = matches!(chars[j], 'b' | 'c');
    if byte_or_c {
        j += 1;
    }
    let raw = chars.get(j) == Some(&'r');
    if raw {
        j += 1;
    }
    if !byte_or_c && !raw {
        return None;
    }
    if raw {
        let hashes = chars[j..].iter().take_while(|&&c| c == '#').count();
        j += hashes;
        if chars.get(j) != Some(&'"') {
            return None;
        }
        j += 1;
        while j < chars.len() {
            if chars[j] == '"' && chars[j + 1..].iter().take(hashes).filter(|&&c| c == '#').count() == hashes {
                return Some(j + 1 + hashes);
            }
            j += 1;
        }
        return Some(chars.len());
    }
    match chars.get(j) {
        Some('"') => Some(quoted_end(chars, j + 1, '"')),
        Some('\'') if chars[i] == 'b' => Some(quoted_end(chars, j + 1, '\'')),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(line, path)` of every hit.
    fn check(source: &str) -> Vec<(usize, String)> {
        scan(source).into_iter().map(|h| (h.line, h.path)).collect()
    }

    fn hits(source: &str, expected: &[(usize, &str)]) {
        let expected: Vec<(usize, String)> = expected.iter().map(|&(l, p)| (l, p.to_owned())).collect();
        assert_eq!(check(source), expected, "source:\n{source}");
    }

    #[test]
    fn clean_domain_like_source_passes() {
        hits(
            r#"//! A pure module.
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::LazyLock;
use std::time::Duration;
use serde_json::{Map, Value};

pub const SCHEMA: &str = include_str!("../schema/x.json");

fn f<'a>(x: &'a str, d: Duration) -> Vec<&'a str> {
    let _ = Vec::<u8>::new();
    let c = 'x';
    let _ = (0..10).map(|i| i * 2);
    let fs = 3; let env = fs; let process = env; let tokio = process; // locals named like modules
    let _ = b'a';
    let _ = crate::process::derive(fs);
    vec![x]
}
"#,
            &[],
        );
    }

    #[test]
    fn every_forbidden_std_module_is_caught_as_a_path() {
        hits(
            "use std::fs;\nuse std::net::TcpStream;\nfn f() { std::process::exit(1) }\nfn g() { std::thread::spawn(|| {}); }\nfn h() { let _ = std::env::var(\"X\"); }\n",
            &[
                (1, "std::fs"),
                (2, "std::net"),
                (3, "std::process"),
                (4, "std::thread"),
                (5, "std::env"),
            ],
        );
    }

    #[test]
    fn leading_colons_and_spacing_do_not_hide_a_path() {
        hits(
            "fn f() { ::std::fs::read(\"x\"); }\nuse std :: env;\nuse ::tokio::spawn;\n",
            &[(1, "std::fs"), (2, "std::env"), (3, "tokio::spawn")],
        );
    }

    #[test]
    fn grouped_imports_are_expanded() {
        hits("use std::{fmt, fs, io};\n", &[(1, "std::fs")]);
        hits(
            "use std::{io::{self, Read}, process::Command};\n",
            &[(1, "std::process")],
        );
        hits(
            "use std::{\n    collections::HashMap,\n    env as environment,\n};\n",
            &[(3, "std::env")],
        );
        hits("use {std::net, serde::Serialize};\n", &[(1, "std::net")]);
        hits("use {tokio::spawn, serde::Serialize};\n", &[(1, "tokio::spawn")]);
        hits("pub(crate) use std::{thread::{self}};\n", &[(1, "std::thread")]);
    }

    #[test]
    fn a_glob_import_of_std_is_forbidden() {
        hits("use std::*;\n", &[(1, "std::*")]);
        hits("use std::{*};\n", &[(1, "std::*")]);
    }

    #[test]
    fn clock_reads_are_caught() {
        hits(
            "fn f() { let t = SystemTime::now(); }\nfn g() { let t = std::time::Instant::now(); }\nuse std::time::Instant;\n",
            &[(1, "SystemTime::now"), (2, "Instant::now")],
        );
        hits(
            "fn f() { let t = chrono::Utc::now(); }\nfn g() { let t = Local::now(); }\n",
            &[(1, "Utc::now"), (2, "Local::now")],
        );
    }

    #[test]
    fn every_forbidden_crate_is_caught() {
        hits(
            "use tokio::sync::Mutex;\nfn f() { tokio::spawn(async {}); }\n#[tokio::main]\nasync fn main() {}\n",
            &[(1, "tokio::sync"), (2, "tokio::spawn"), (3, "tokio::main")],
        );
        for krate in FORBIDDEN_CRATES {
            hits(&format!("use {krate}::Thing;\n"), &[(1, &format!("{krate}::Thing"))]);
            hits(&format!("use {krate};\n"), &[(1, krate)]);
            hits(&format!("extern crate {krate};\n"), &[(1, krate)]);
            hits(
                &format!("fn f() {{ let x = {krate}::make(); }}\n"),
                &[(1, &format!("{krate}::make"))],
            );
        }
    }

    #[test]
    fn comments_and_literals_are_not_hits() {
        hits(
            r##"//! Never use std::fs here.
/// Unlike tokio::spawn, this is pure.
// std::process::exit(1)
/* std::net::TcpStream /* nested std::env::var */ still a comment std::thread */
#[doc = "std::fs in an attribute string"]
fn f() -> &'static str {
    let _ = 'a'; let _ = '\''; let _ = '"';
    let _ = "std::fs::read(\"x\") and tokio::spawn";
    let _ = r#"std::env::var("X") "quoted""#;
    let _ = br"std::net";
    let _ = b"Instant::now()";
    "SystemTime::now()"
}
"##,
            &[],
        );
    }

    #[test]
    fn code_after_a_comment_or_literal_is_still_scanned() {
        hits(
            "let s = \"a \\\" b\"; use std::fs; // and std::net\n/* x */ std::env::args();\n",
            &[(1, "std::fs"), (2, "std::env")],
        );
        hits(
            "let c = '\\u{1F600}'; let l: &'static str = \"\"; tokio::spawn(f);\n",
            &[(1, "tokio::spawn")],
        );
    }

    #[test]
    fn hits_carry_the_offending_line() {
        let hits = scan("//! doc\n\n    use std::{fmt, fs};   \n");
        assert_eq!(
            hits,
            [Hit {
                line: 3,
                path: "std::fs".into(),
                text: "use std::{fmt, fs};".into()
            }]
        );
    }

    #[test]
    fn modules_of_the_same_name_elsewhere_are_not_hits() {
        hits(
            "use crate::process::Step;\nuse self::env::Vars;\nfn f() { my::tokio::thing(); serde::fs::x(); }\n",
            &[],
        );
    }
}

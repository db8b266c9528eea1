//! A configuration that failed to load ([`Error`]), and where in its text the blame lies: the
//! TOML error locator ([`Locator`]), which finds a key's line from its path and a key's path
//! from an offset. serde's messages are put in the file's words ([`plain_words`]): `expected
//! i64` says "expected a whole number", a sequence is an array, a map a table.

use std::ops::Range;
use std::path::PathBuf;

/// A configuration that failed to load.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A bad value or key; `line` is 0 (and left out) where the text does not set the key.
    #[error("{}", invalid(origin, *line, key, message))]
    Invalid {
        origin: String,
        line: usize,
        key: String,
        message: String,
    },
    #[error("{origin}: {message}")]
    Semantic { origin: String, message: String },
}

fn invalid(origin: &str, line: usize, key: &str, message: &str) -> String {
    match (line, key) {
        (0, "") => format!("{origin}: {message}"),
        (0, key) => format!("{origin}: key `{key}`: {message}"),
        (line, "") => format!("{origin}: line {line}: {message}"),
        (line, key) => format!("{origin}: line {line}, key `{key}`: {message}"),
    }
}

impl Error {
    pub(super) fn from_toml(e: &toml::de::Error, text: &str, origin: &str) -> Error {
        let at = Locator::new(text);
        let (line, key) = match e.span() {
            Some(span) => (at.line_at(span.start), at.key_at(span.start)),
            None => (0, String::new()),
        };
        Error::Invalid {
            origin: origin.to_string(),
            line,
            key,
            message: plain_words(e.message().trim()),
        }
    }
}

/// serde's message with Rust's type names (`expected i64`, `expected struct TlsConfig`,
/// `invalid type: sequence`) in the words of a TOML file.
pub(super) fn plain_words(message: &str) -> String {
    /// What a type serde names is, in a configuration file.
    fn plain(word: &str) -> Option<&'static str> {
        Some(match word {
            "i8" | "i16" | "i32" | "i64" | "i128" | "isize" => "a whole number",
            "u8" => "a whole number from 0 to 255",
            "u16" => "a whole number from 0 to 65535",
            "u32" => "a whole number from 0 to 4294967295",
            "u64" | "u128" | "usize" => "a whole number, 0 or more",
            "f32" | "f64" => "a number",
            "sequence" => "an array",
            "map" => "a table",
            "option" => "a value",
            "unit" | "unit value" => "nothing",
            "char" => "a single character",
            _ => return None,
        })
    }
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    // serde writes `expected TYPE` and `invalid type: TYPE` (`invalid type: sequence, expected
    // a string`); `expected struct X` / `expected enum X` name Rust items.
    while let Some(at) = ["expected ", "invalid type: "]
        .iter()
        .filter_map(|lead| rest.find(lead).map(|i| (i, lead.len())))
        .min()
    {
        let (i, lead) = at;
        out.push_str(&rest[..i + lead]);
        rest = &rest[i + lead..];
        // serde's own nouns: `expected a sequence`, `expected a map`.
        let noun = |r: &str, n: &str| {
            r.strip_prefix(n)
                .filter(|after| !after.starts_with(|c: char| c.is_ascii_alphanumeric()))
                .map(str::len)
        };
        if let Some(left) = noun(rest, "a sequence") {
            out.push_str("an array");
            rest = &rest[rest.len() - left..];
            continue;
        }
        if let Some(left) = noun(rest, "a map") {
            out.push_str("a table");
            rest = &rest[rest.len() - left..];
            continue;
        }
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let word = &rest[..end];
        if let Some(p) = plain(word) {
            out.push_str(p);
            rest = &rest[end..];
        } else if word == "struct" || word == "enum" {
            // `struct TlsConfig`: the Rust name of a table; an enum is one of some strings.
            let after = rest[end..].trim_start();
            let name_end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            out.push_str(if word == "struct" {
                "a table"
            } else {
                "one of its values"
            });
            rest = &after[name_end..];
        }
    }
    out.push_str(rest);
    out
}

/// One step of a key path: a key of a table, or an index in an array (of tables).
#[derive(Debug, Clone, Copy)]
pub(super) enum Seg<'a> {
    Key(&'a str),
    Index(usize),
}
pub(super) use Seg::{Index, Key};

/// Where the keys of a configuration text are: the text parsed again by `toml_edit` (the parser
/// under `toml`), which keeps each key's and value's span. Only built to report an error.
pub(super) struct Locator<'a> {
    text: &'a str,
    doc: Option<toml_edit::ImDocument<&'a str>>,
}

/// A child of a [`Node`]: its key (none for an array's element), the key's span (an element's
/// own span), and the child.
type Child<'d> = (Option<&'d str>, Option<Range<usize>>, Node<'d>);

/// A node of the parsed text, whatever its form.
#[derive(Clone, Copy)]
enum Node<'d> {
    Item(&'d toml_edit::Item),
    Table(&'d toml_edit::Table),
    Value(&'d toml_edit::Value),
}

impl<'d> Node<'d> {
    /// Its own span: a value's, or a table's (its header).
    fn span(self) -> Option<Range<usize>> {
        match self {
            Node::Item(toml_edit::Item::Value(v)) | Node::Value(v) => v.span(),
            Node::Item(toml_edit::Item::Table(t)) | Node::Table(t) => t.span(),
            Node::Item(_) => None,
        }
    }

    /// Its children.
    fn children(self) -> Vec<Child<'d>> {
        use toml_edit::{Item, Value};
        let table = |t: &'d toml_edit::Table| {
            t.iter()
                .map(|(k, v)| (Some(k), t.key(k).and_then(|k| k.span()), Node::Item(v)))
                .collect()
        };
        match self {
            Node::Table(t) | Node::Item(Item::Table(t)) => table(t),
            Node::Item(Item::ArrayOfTables(a)) => {
                a.iter().map(|t| (None, t.span(), Node::Table(t))).collect()
            }
            Node::Item(Item::Value(v)) | Node::Value(v) => match v {
                Value::InlineTable(t) => t
                    .iter()
                    .map(|(k, v)| (Some(k), t.key(k).and_then(|k| k.span()), Node::Value(v)))
                    .collect(),
                Value::Array(a) => a.iter().map(|v| (None, v.span(), Node::Value(v))).collect(),
                _ => Vec::new(),
            },
            Node::Item(Item::None) => Vec::new(),
        }
    }
}

fn holds(span: &Option<Range<usize>>, offset: usize) -> bool {
    span.as_ref().is_some_and(|s| s.contains(&offset))
}

impl<'a> Locator<'a> {
    pub(super) fn new(text: &'a str) -> Self {
        Locator {
            text,
            doc: toml_edit::ImDocument::parse(text).ok(),
        }
    }

    /// The line (from 1) holding byte `offset`.
    fn line_at(&self, offset: usize) -> usize {
        self.text[..offset.min(self.text.len())]
            .matches('\n')
            .count()
            + 1
    }

    /// The path (`cache.max_size`, `listener.route.proxy.upstream`) of the deepest key whose
    /// key or value holds byte `offset`; empty if none does (a syntax error between keys).
    fn key_at(&self, offset: usize) -> String {
        fn find<'d>(node: Node<'d>, offset: usize, path: &mut Vec<&'d str>) -> bool {
            for (key, key_span, child) in node.children() {
                let depth = path.len();
                path.extend(key);
                if find(child, offset, path)
                    || holds(&key_span, offset)
                    || holds(&child.span(), offset)
                {
                    return true;
                }
                path.truncate(depth);
            }
            false
        }
        let mut path = Vec::new();
        if let Some(doc) = &self.doc {
            find(Node::Item(doc.as_item()), offset, &mut path);
        }
        path.join(".")
    }

    /// The line where the text sets `path` (its key; for a table in an array, its header), or
    /// 0 if it does not.
    pub(super) fn line_of(&self, path: &[Seg]) -> usize {
        let Some(doc) = &self.doc else { return 0 };
        let mut node = Node::Item(doc.as_item());
        let mut span = None;
        for seg in path {
            let children = node.children();
            let found = match *seg {
                Key(k) => children.into_iter().find(|(name, ..)| *name == Some(k)),
                Index(i) => children
                    .into_iter()
                    .filter(|(name, ..)| name.is_none())
                    .nth(i),
            };
            let Some((_, key_span, child)) = found else {
                return 0;
            };
            span = key_span;
            node = child;
        }
        span.map_or(0, |s| self.line_at(s.start))
    }

    /// An error blaming the first of `paths` the text sets (else the first path, without a line).
    pub(super) fn error(&self, origin: &str, paths: &[&[Seg]], message: String) -> Error {
        let (line, path) = paths
            .iter()
            .map(|p| (self.line_of(p), *p))
            .find(|(line, _)| *line > 0)
            .unwrap_or((0, paths.first().copied().unwrap_or(&[])));
        let key = path
            .iter()
            .filter_map(|s| match s {
                Key(k) => Some(*k),
                Index(_) => None,
            })
            .collect::<Vec<_>>()
            .join(".");
        Error::Invalid {
            origin: origin.to_string(),
            line,
            key,
            message,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::plain_words;
    use crate::config::tests::{err, MIN};

    #[test]
    fn serde_type_names_are_put_in_plain_words() {
        assert_eq!(
            plain_words("invalid type: string \"x\", expected i64"),
            "invalid type: string \"x\", expected a whole number"
        );
        assert_eq!(
            plain_words("invalid type: sequence, expected struct TlsConfig"),
            "invalid type: an array, expected a table"
        );
        assert_eq!(
            plain_words("invalid value: integer `-1`, expected u16"),
            "invalid value: integer `-1`, expected a whole number from 0 to 65535"
        );
        assert_eq!(
            plain_words("unknown field `x`, expected one of `a`, `b`"),
            "unknown field `x`, expected one of `a`, `b`"
        );
        assert_eq!(plain_words("expected f64"), "expected a number");
        assert_eq!(
            plain_words("invalid type: integer `3`, expected a sequence"),
            "invalid type: integer `3`, expected an array"
        );
        assert_eq!(plain_words("expected a mapping"), "expected a mapping");
    }

    #[test]
    fn wrong_types_in_a_file_say_no_rust_type_names() {
        for text in [
            format!("[server]\nworkers = \"two\"\n{MIN}"),
            format!("[compression]\ngzip_level = \"high\"\n{MIN}"),
            format!("[server]\nh2c = 1\n{MIN}"),
            format!("[cache]\nheuristic_fraction = \"x\"\n{MIN}"),
            format!("cache = 3\n{MIN}"),
            "listener = 3\n".to_string(),
        ] {
            let e = err(&text);
            for rust in [
                "i64", "u64", "u16", "u32", "usize", "f64", "struct", "sequence",
            ] {
                assert!(!e.contains(rust), "{text}\n=> {e}");
            }
        }
    }

    #[test]
    fn unknown_key_names_key_and_line() {
        let e = err(&format!("[cache]\nmax_size = \"1MiB\"\nbogus = 3\n{MIN}"));
        assert!(e.contains("line 3"), "{e}");
        assert!(e.contains("bogus"), "{e}");
    }

    #[test]
    fn bad_value_names_key_and_line() {
        let e = err(&format!("[server]\n\n[cache]\nmax_size = \"12XB\"\n{MIN}"));
        assert!(e.contains("line 4"), "{e}");
        assert!(e.contains("max_size"), "{e}");
        let e = err(&format!("[compression]\ngzip_level = 12\n{MIN}"));
        assert!(
            e.contains("line 2") && e.contains("gzip_level") && e.contains("1 to 9"),
            "{e}"
        );
    }

    #[test]
    fn errors_name_the_full_key_path_even_in_inline_tables() {
        let e = err(&format!(
            "{MIN}[[listener.route]]\npath = \"/r\"\nrespond = {{ body = \"x\", status = 1000 }}\n"
        ));
        assert!(
            e.contains("line 7, key `listener.route.respond.status`: 1000 is out of range"),
            "{e}"
        );
        let e = err(&format!("[server]\nworkers = 1\nh2c = \"yes\"\n{MIN}"));
        assert!(e.contains("line 3, key `server.h2c`"), "{e}");
        let e = err(&format!("cache.max_size = \"1KiB\"\n{MIN}"));
        assert!(e.contains("line 1, key `cache.max_size`"), "{e}");
    }
}

//! Subscription filters: which records a subscriber sees. An id pattern (`cars/*`,
//! [`IdPattern`]) and conditions on the record's members, in a small syntax that reads the same
//! in a URL (`?filter=...`) and in a WebSocket message:
//!
//! ```text
//! price < 100 and (color == "red" or color in ["blue", "green"]) and not sold
//! owner.address.city == "Oslo" or tags[0] == "new" or $id == "cars/42"
//! ```
//!
//! A member is a path of names (`a.b`) and array indexes (`a[0]`); `$id` is the record's id.
//! Literals are JSON (strings, numbers, `true`, `false`, `null`). `==` and `!=` compare any JSON
//! values (numbers by value); `<`, `<=`, `>`, `>=` compare numbers with numbers and strings with
//! strings, and are false otherwise; a member alone is true when present and neither `false`
//! nor `null`. `and`/`&&`, `or`/`||`, `not`/`!` and parentheses combine them.
//!
//! A filter is parsed once per subscription and its canonical text names the topic that every
//! subscriber with the same pattern and filter shares (`super::fanout`), so that a change is
//! evaluated once per distinct filter, not once per subscriber.

use std::cmp::Ordering;
use std::fmt;

use serde_json::Value;

pub use crate::config::push::IdPattern;

/// The longest filter text accepted.
pub const MAX_LEN: usize = 4096;
/// The deepest nesting of parentheses and `not`.
const MAX_DEPTH: usize = 32;

/// A parsed condition on a record.
#[derive(Debug, Clone, PartialEq)]
pub enum Filter {
    True,
    Cmp(Path, Op, Value),
    In(Path, Vec<Value>),
    Truthy(Path),
    Not(Box<Filter>),
    And(Vec<Filter>),
    Or(Vec<Filter>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// A member path; `$id` is the empty path flagged `id`.
#[derive(Debug, Clone, PartialEq)]
pub struct Path {
    id: bool,
    steps: Vec<Step>,
}

#[derive(Debug, Clone, PartialEq)]
enum Step {
    Name(String),
    Index(usize),
}

/// Why a filter did not parse: where, and what was expected.
#[derive(Debug, Clone, PartialEq)]
pub struct ParseError {
    pub at: usize,
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "filter: {} at byte {}", self.message, self.at)
    }
}

impl Filter {
    /// Parses `text` (empty: every record).
    pub fn parse(text: &str) -> Result<Filter, ParseError> {
        if text.len() > MAX_LEN {
            return Err(ParseError {
                at: MAX_LEN,
                message: format!("longer than {MAX_LEN} bytes"),
            });
        }
        let mut p = Parser { s: text, i: 0 };
        p.skip_ws();
        if p.i == text.len() {
            return Ok(Filter::True);
        }
        let f = p.or(0)?;
        p.skip_ws();
        if p.i != text.len() {
            return Err(p.err("expected `and`, `or` or the end"));
        }
        Ok(f)
    }

    /// Whether the record `id` with `value` passes.
    pub fn eval(&self, id: &str, value: &Value) -> bool {
        match self {
            Filter::True => true,
            Filter::Cmp(p, op, lit) => p
                .get(id, value)
                .is_some_and(|v| compare(v.as_ref(), *op, lit)),
            Filter::In(p, list) => p
                .get(id, value)
                .is_some_and(|v| list.iter().any(|l| equal(v.as_ref(), l))),
            Filter::Truthy(p) => p
                .get(id, value)
                .is_some_and(|v| !matches!(v.as_ref(), Value::Null | Value::Bool(false))),
            Filter::Not(f) => !f.eval(id, value),
            Filter::And(fs) => fs.iter().all(|f| f.eval(id, value)),
            Filter::Or(fs) => fs.iter().any(|f| f.eval(id, value)),
        }
    }

    /// The canonical text of the filter: equal for filters that differ only in spacing,
    /// keyword spelling or redundant parentheses.
    pub fn canonical(&self) -> String {
        let mut s = String::new();
        self.write(&mut s);
        s
    }

    fn write(&self, s: &mut String) {
        match self {
            Filter::True => {}
            Filter::Cmp(p, op, v) => {
                p.write(s);
                s.push_str(match op {
                    Op::Eq => "==",
                    Op::Ne => "!=",
                    Op::Lt => "<",
                    Op::Le => "<=",
                    Op::Gt => ">",
                    Op::Ge => ">=",
                });
                s.push_str(&v.to_string());
            }
            Filter::In(p, list) => {
                p.write(s);
                s.push_str(" in ");
                s.push_str(&Value::Array(list.clone()).to_string());
            }
            Filter::Truthy(p) => p.write(s),
            Filter::Not(f) => {
                s.push_str("not(");
                f.write(s);
                s.push(')');
            }
            Filter::And(fs) | Filter::Or(fs) => {
                let sep = if matches!(self, Filter::And(_)) {
                    " and "
                } else {
                    " or "
                };
                for (i, f) in fs.iter().enumerate() {
                    if i > 0 {
                        s.push_str(sep);
                    }
                    s.push('(');
                    f.write(s);
                    s.push(')');
                }
            }
        }
    }
}

impl Path {
    /// The member's value in `value` (or the id).
    fn get<'a>(&self, id: &'a str, value: &'a Value) -> Option<std::borrow::Cow<'a, Value>> {
        if self.id {
            return Some(std::borrow::Cow::Owned(Value::String(id.to_string())));
        }
        let mut v = value;
        for step in &self.steps {
            v = match step {
                Step::Name(n) => v.get(n.as_str())?,
                Step::Index(i) => v.get(*i)?,
            };
        }
        Some(std::borrow::Cow::Borrowed(v))
    }

    fn write(&self, s: &mut String) {
        if self.id {
            s.push_str("$id");
        }
        for (i, step) in self.steps.iter().enumerate() {
            match step {
                Step::Name(n) => {
                    if i > 0 {
                        s.push('.');
                    }
                    s.push_str(n);
                }
                Step::Index(n) => {
                    s.push('[');
                    s.push_str(&n.to_string());
                    s.push(']');
                }
            }
        }
    }
}

fn as_num(v: &Value) -> Option<f64> {
    v.as_f64()
}

fn equal(a: &Value, b: &Value) -> bool {
    match (as_num(a), as_num(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

fn compare(a: &Value, op: Op, b: &Value) -> bool {
    match op {
        Op::Eq => return equal(a, b),
        Op::Ne => return !equal(a, b),
        _ => {}
    }
    let ord = match (a, b) {
        (Value::String(x), Value::String(y)) => Some(x.cmp(y)),
        _ => match (as_num(a), as_num(b)) {
            (Some(x), Some(y)) => x.partial_cmp(&y),
            _ => None,
        },
    };
    let Some(ord) = ord else { return false };
    match op {
        Op::Lt => ord == Ordering::Less,
        Op::Le => ord != Ordering::Greater,
        Op::Gt => ord == Ordering::Greater,
        Op::Ge => ord != Ordering::Less,
        Op::Eq | Op::Ne => unreachable!("handled above"),
    }
}

struct Parser<'a> {
    s: &'a str,
    i: usize,
}

impl Parser<'_> {
    fn err(&self, message: &str) -> ParseError {
        ParseError {
            at: self.i,
            message: message.to_string(),
        }
    }

    fn rest(&self) -> &str {
        &self.s[self.i..]
    }

    fn skip_ws(&mut self) {
        let r = self.rest();
        self.i += r.len() - r.trim_start().len();
    }

    /// Takes `sym` (an operator) if it comes next.
    fn eat(&mut self, sym: &str) -> bool {
        self.skip_ws();
        if self.rest().starts_with(sym) {
            self.i += sym.len();
            true
        } else {
            false
        }
    }

    /// Takes the keyword `kw` if it comes next as a whole word.
    fn eat_kw(&mut self, kw: &str) -> bool {
        self.skip_ws();
        let r = self.rest();
        let ok = r.len() >= kw.len()
            && r[..kw.len()].eq_ignore_ascii_case(kw)
            && !r[kw.len()..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_');
        if ok {
            self.i += kw.len();
        }
        ok
    }

    fn or(&mut self, depth: usize) -> Result<Filter, ParseError> {
        self.chain(depth, ("||", "or"), Self::and, Filter::Or)
    }

    fn and(&mut self, depth: usize) -> Result<Filter, ParseError> {
        self.chain(depth, ("&&", "and"), Self::unary, Filter::And)
    }

    /// One or more `item`s joined by the operator `op` (its symbol or keyword): the item
    /// alone, or `make` of them all.
    fn chain(
        &mut self,
        depth: usize,
        (sym, kw): (&str, &str),
        item: fn(&mut Self, usize) -> Result<Filter, ParseError>,
        make: fn(Vec<Filter>) -> Filter,
    ) -> Result<Filter, ParseError> {
        let mut items = vec![item(self, depth)?];
        while self.eat(sym) || self.eat_kw(kw) {
            items.push(item(self, depth)?);
        }
        Ok(if items.len() == 1 {
            items.pop().expect("one")
        } else {
            make(items)
        })
    }

    fn unary(&mut self, depth: usize) -> Result<Filter, ParseError> {
        if depth > MAX_DEPTH {
            return Err(self.err("nested too deeply"));
        }
        self.skip_ws();
        if self.rest().starts_with("!=") {
            return Err(self.err("expected a member"));
        }
        if self.eat("!") || self.eat_kw("not") {
            return Ok(Filter::Not(Box::new(self.unary(depth + 1)?)));
        }
        if self.eat("(") {
            let f = self.or(depth + 1)?;
            if !self.eat(")") {
                return Err(self.err("expected `)`"));
            }
            return Ok(f);
        }
        self.condition()
    }

    fn condition(&mut self) -> Result<Filter, ParseError> {
        let path = self.path()?;
        for (sym, op) in [
            ("==", Op::Eq),
            ("!=", Op::Ne),
            ("<=", Op::Le),
            (">=", Op::Ge),
            ("<", Op::Lt),
            (">", Op::Gt),
        ] {
            if self.eat(sym) {
                return Ok(Filter::Cmp(path, op, self.literal()?));
            }
        }
        if self.eat_kw("in") {
            if !self.eat("[") {
                return Err(self.err("expected `[` after `in`"));
            }
            let mut list = Vec::new();
            if !self.eat("]") {
                loop {
                    list.push(self.literal()?);
                    if self.eat("]") {
                        break;
                    }
                    if !self.eat(",") {
                        return Err(self.err("expected `,` or `]`"));
                    }
                }
            }
            return Ok(Filter::In(path, list));
        }
        Ok(Filter::Truthy(path))
    }

    fn path(&mut self) -> Result<Path, ParseError> {
        self.skip_ws();
        let mut path = Path {
            id: false,
            steps: Vec::new(),
        };
        if self.rest().starts_with("$id")
            && !self.rest()[3..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
        {
            self.i += 3;
            path.id = true;
            return Ok(path);
        }
        loop {
            let r = self.rest();
            let n = r
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
                .unwrap_or(r.len());
            if n == 0 || r.starts_with(|c: char| c.is_ascii_digit() || c == '-') {
                return Err(self.err("expected a member name"));
            }
            path.steps.push(Step::Name(r[..n].to_string()));
            self.i += n;
            loop {
                if self.rest().starts_with('[') {
                    self.i += 1;
                    let r = self.rest();
                    let n = r.find(|c: char| !c.is_ascii_digit()).unwrap_or(r.len());
                    let idx = r[..n].parse().map_err(|_| self.err("expected an index"))?;
                    self.i += n;
                    if !self.rest().starts_with(']') {
                        return Err(self.err("expected `]`"));
                    }
                    self.i += 1;
                    path.steps.push(Step::Index(idx));
                } else {
                    break;
                }
            }
            if self.rest().starts_with('.') {
                self.i += 1;
            } else {
                return Ok(path);
            }
        }
    }

    /// A JSON scalar: a string, a number, `true`, `false` or `null` (parsed by serde_json).
    fn literal(&mut self) -> Result<Value, ParseError> {
        self.skip_ws();
        let r = self.rest();
        let end = if r.starts_with('"') {
            let b = r.as_bytes();
            let mut j = 1;
            loop {
                match b.get(j) {
                    None => return Err(self.err("unterminated string")),
                    Some(b'\\') => j += 2,
                    Some(b'"') => break j + 1,
                    Some(_) => j += 1,
                }
            }
        } else {
            r.find(|c: char| !(c.is_ascii_alphanumeric() || "+-.".contains(c)))
                .unwrap_or(r.len())
        };
        let v: Value = serde_json::from_str(&r[..end])
            .map_err(|_| self.err("expected a JSON string, number, true, false or null"))?;
        if v.is_array() || v.is_object() {
            return Err(self.err("expected a scalar"));
        }
        self.i += end;
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ok(f: &str, v: Value) -> bool {
        Filter::parse(f).unwrap().eval("cars/42", &v)
    }

    #[test]
    fn conditions() {
        let car = json!({"price": 90, "color": "red", "sold": false,
                         "owner": {"city": "Oslo"}, "tags": ["new", "fast"]});
        assert!(ok("", car.clone()));
        assert!(ok("price < 100", car.clone()));
        assert!(ok("price <= 90 && price >= 90.0", car.clone()));
        assert!(!ok("price > 90", car.clone()));
        assert!(ok(r#"color == "red" and not sold"#, car.clone()));
        assert!(ok(r#"color in ["blue", "red"]"#, car.clone()));
        assert!(!ok(r#"color in []"#, car.clone()));
        assert!(ok(r#"owner.city == "Oslo" or x"#, car.clone()));
        assert!(ok(r#"tags[1] == "fast""#, car.clone()));
        assert!(ok(r#"$id == "cars/42""#, car.clone()));
        assert!(!ok("missing", car.clone()));
        assert!(!ok("sold", car.clone()));
        assert!(ok("!sold", car.clone()));
        assert!(!ok(r#"price < "a""#, car.clone()));
        assert!(ok(r#"color != "blue""#, car.clone()));
        assert!(ok(r#"NOT (price > 100 OR color == "blue")"#, car.clone()));
        assert!(ok(r#"color == "r\"ed" or price == 90"#, car));
    }

    #[test]
    fn errors_say_where() {
        for bad in [
            "price <",
            "price < 100 and",
            "(price < 1",
            "price < [1]",
            "price in [1,",
            "price 100",
            "== 3",
            r#"a == "open"#,
            "1a == 2",
        ] {
            assert!(Filter::parse(bad).is_err(), "{bad}");
        }
        let deep = "(".repeat(100) + "a" + &")".repeat(100);
        assert!(Filter::parse(&deep).is_err());
        assert!(Filter::parse(&"a or ".repeat(1000)).is_err());
        assert_eq!(Filter::parse("a <").unwrap_err().at, 3);
    }

    #[test]
    fn canonical_text_ignores_spelling() {
        let a = Filter::parse(r#"price<100 AND (color=="red")"#).unwrap();
        let b = Filter::parse(r#"  price < 100 && color == "red" "#).unwrap();
        assert_eq!(a.canonical(), b.canonical());
        assert_ne!(
            a.canonical(),
            Filter::parse("price < 101").unwrap().canonical()
        );
    }
}

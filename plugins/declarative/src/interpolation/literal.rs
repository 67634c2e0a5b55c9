//! Python's `ast.literal_eval` of a rendered template, as Airbyte's CDK
//! applies it: text that is a Python literal (a number, a quoted string,
//! `True`/`False`/`None`, a list, tuple or dict of literals) becomes that
//! value; anything else stays text.

use super::value::Val;

/// The literal `text` reads as, if it is one.
pub(crate) fn literal(text: &str) -> Option<Val> {
    let mut p = Reader { chars: text.trim().chars().collect(), at: 0 };
    let v = p.value()?;
    p.skip_space();
    (p.at == p.chars.len()).then_some(v)
}

struct Reader {
    chars: Vec<char>,
    at: usize,
}

impl Reader {
    fn skip_space(&mut self) {
        while self.chars.get(self.at).is_some_and(|c| c.is_whitespace()) {
            self.at += 1;
        }
    }

    fn eat(&mut self, c: char) -> bool {
        self.skip_space();
        let found = self.chars.get(self.at) == Some(&c);
        self.at += usize::from(found);
        found
    }

    fn value(&mut self) -> Option<Val> {
        self.skip_space();
        let c = *self.chars.get(self.at)?;
        match c {
            '\'' | '"' => self.string(),
            '[' => {
                self.at += 1;
                Some(Val::List(self.items(']')?))
            }
            '(' => {
                self.at += 1;
                let items = self.items(')')?;
                Some(Val::List(items))
            }
            '{' => self.dict(),
            '-' | '+' => {
                self.at += 1;
                match self.value()? {
                    Val::Int(i) if c == '-' => Some(Val::Int(i.checked_neg()?)),
                    Val::Float(f) if c == '-' => Some(Val::Float(-f)),
                    v @ (Val::Int(_) | Val::Float(_)) => Some(v),
                    _ => None,
                }
            }
            c if c.is_ascii_digit() || c == '.' => self.number(),
            _ => {
                let start = self.at;
                while self.chars.get(self.at).is_some_and(|c| c.is_alphanumeric() || *c == '_') {
                    self.at += 1;
                }
                match self.chars[start..self.at].iter().collect::<String>().as_str() {
                    "True" => Some(Val::Bool(true)),
                    "False" => Some(Val::Bool(false)),
                    "None" => Some(Val::None),
                    _ => None,
                }
            }
        }
    }

    /// Items up to `close`, a trailing comma allowed.
    fn items(&mut self, close: char) -> Option<Vec<Val>> {
        let mut items = Vec::new();
        loop {
            if self.eat(close) {
                return Some(items);
            }
            items.push(self.value()?);
            if !self.eat(',') {
                return self.eat(close).then_some(items);
            }
        }
    }

    fn dict(&mut self) -> Option<Val> {
        self.at += 1;
        let mut entries = Vec::new();
        loop {
            if self.eat('}') {
                return Some(Val::Dict(entries));
            }
            let key = match self.value()? {
                Val::Str(s) => s,
                v @ (Val::Int(_) | Val::Float(_) | Val::Bool(_) | Val::None) => v.to_text(),
                _ => return None,
            };
            if !self.eat(':') {
                return None;
            }
            let value = self.value()?;
            match entries.iter_mut().find(|(k, _): &&mut (String, Val)| *k == key) {
                Some(entry) => entry.1 = value,
                None => entries.push((key, value)),
            }
            if !self.eat(',') {
                return self.eat('}').then_some(Val::Dict(entries));
            }
        }
    }

    fn string(&mut self) -> Option<Val> {
        let quote = self.chars[self.at];
        self.at += 1;
        let mut out = String::new();
        loop {
            let c = *self.chars.get(self.at)?;
            self.at += 1;
            if c == quote {
                break;
            }
            if c == '\\' {
                let e = *self.chars.get(self.at)?;
                self.at += 1;
                out.push(match e {
                    'n' => '\n',
                    't' => '\t',
                    'r' => '\r',
                    '0' => '\0',
                    other => other,
                });
            } else if c == '\n' {
                return None;
            } else {
                out.push(c);
            }
        }
        // Adjacent strings join, as in Python.
        self.skip_space();
        if matches!(self.chars.get(self.at), Some('\'' | '"'))
            && let Some(Val::Str(next)) = self.string()
        {
            out.push_str(&next);
        }
        Some(Val::Str(out))
    }

    fn number(&mut self) -> Option<Val> {
        let start = self.at;
        while self.chars.get(self.at).is_some_and(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_')) {
            // An exponent's sign belongs to the number.
            if matches!(self.chars[self.at], 'e' | 'E') && matches!(self.chars.get(self.at + 1), Some('+' | '-')) {
                self.at += 1;
            }
            self.at += 1;
        }
        let text: String = self.chars[start..self.at].iter().collect();
        if text.contains("__") || text.starts_with('_') || text.ends_with('_') {
            return None;
        }
        let plain: String = text.chars().filter(|c| *c != '_').collect();
        if plain.chars().all(|c| c.is_ascii_digit()) {
            // Python refuses leading zeros on a non-zero integer (`01`).
            if plain.len() > 1 && plain.starts_with('0') && plain.chars().any(|c| c != '0') {
                return None;
            }
            return plain.parse::<i64>().ok().map(Val::Int);
        }
        if let Some(hex) = plain.strip_prefix("0x").or_else(|| plain.strip_prefix("0X")) {
            return i64::from_str_radix(hex, 16).ok().map(Val::Int);
        }
        if plain.chars().all(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '+' | '-')) {
            return plain.parse::<f64>().ok().map(Val::Float);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_literals_become_values_and_the_rest_stays_text() {
        assert_eq!(literal("42"), Some(Val::Int(42)));
        assert_eq!(literal(" -3 "), Some(Val::Int(-3)));
        assert_eq!(literal("1.5e3"), Some(Val::Float(1500.0)));
        assert_eq!(literal("1_000"), Some(Val::Int(1000)));
        assert_eq!(literal("True"), Some(Val::Bool(true)));
        assert_eq!(literal("None"), Some(Val::None));
        assert_eq!(literal("'a' 'b'"), Some(Val::Str("ab".into())));
        assert_eq!(
            literal("[1, 'x', (2, 3)]"),
            Some(Val::List(vec![Val::Int(1), Val::Str("x".into()), Val::List(vec![Val::Int(2), Val::Int(3)])]))
        );
        assert_eq!(literal("{'a': 1, 'a': 2}"), Some(Val::Dict(vec![("a".into(), Val::Int(2))])));
        for text in ["2020-01-01", "01", "true", "abc", "1 2", "[1,", "2020-11-10", "1.2.3", "https://x", ""] {
            assert_eq!(literal(text), None, "{text}");
        }
    }
}

//! JSONPath text for a location in a JSON document (`$.tasks[0].key`,
//! `$['my key'][2]`), as every located error in FlowForge writes it.

use std::fmt::Write as _;

/// Appends the property `name` to `path`: `.name` for a plain identifier,
/// `['name']` (quote, backslash and NUL escaped) otherwise.
pub fn push_property(path: &mut String, name: &str) {
    let plain = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if plain {
        path.push('.');
        path.push_str(name);
    } else {
        path.push_str("['");
        path.push_str(&name.replace('\\', "\\\\").replace('\'', "\\'").replace('\0', "\\u0000"));
        path.push_str("']");
    }
}

/// Appends the array index `index` to `path`.
pub fn push_index(path: &mut String, index: usize) {
    let _ = write!(path, "[{index}]");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_use_dots_and_others_brackets() {
        let mut path = String::from("$");
        push_property(&mut path, "tasks");
        push_index(&mut path, 0);
        push_property(&mut path, "my key");
        push_property(&mut path, "it's\\");
        push_property(&mut path, "nul\0");
        assert_eq!(path, "$.tasks[0]['my key']['it\\'s\\\\']['nul\\u0000']");
    }
}

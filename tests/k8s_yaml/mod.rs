//! The manifests in `deploy/k8s/` as trees, for `tests/k8s_manifests.rs`: read by
//! `serde_norway` (the YAML crate the brain reads kubeconfigs with), every scalar as its
//! text, with small accessors by key path.

#[derive(Debug, Clone, PartialEq)]
pub enum Yaml {
    Str(String),
    Seq(Vec<Yaml>),
    Map(Vec<(String, Yaml)>),
}

pub const NONE: &Yaml = &Yaml::Seq(Vec::new());

impl Yaml {
    pub fn get(&self, key: &str) -> Option<&Yaml> {
        match self {
            Yaml::Map(m) => m.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    pub fn at(&self, path: &[&str]) -> Option<&Yaml> {
        path.iter().try_fold(self, |v, k| v.get(k))
    }

    pub fn str_at(&self, path: &[&str]) -> Option<&str> {
        match self.at(path)? {
            Yaml::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The items of a sequence at `path` (none if it is missing).
    pub fn seq_at(&self, path: &[&str]) -> &[Yaml] {
        match self.at(path).unwrap_or(NONE) {
            Yaml::Seq(items) => items,
            other => panic!("{path:?} is not a sequence: {other:?}"),
        }
    }

    pub fn strs_at(&self, path: &[&str]) -> Vec<&str> {
        self.seq_at(path)
            .iter()
            .map(|v| match v {
                Yaml::Str(s) => s.as_str(),
                other => panic!("{path:?} holds a non-scalar: {other:?}"),
            })
            .collect()
    }
}

/// The documents of a multi-document YAML text (empty documents left out).
pub fn parse_documents(text: &str) -> Vec<Yaml> {
    use serde::Deserialize;
    serde_norway::Deserializer::from_str(text)
        .map(|d| serde_json::Value::deserialize(d).expect("valid YAML"))
        .filter(|v| !v.is_null())
        .map(tree)
        .collect()
}

fn tree(v: serde_json::Value) -> Yaml {
    use serde_json::Value as V;
    match v {
        V::String(s) => Yaml::Str(s),
        V::Null => Yaml::Str(String::new()),
        V::Bool(b) => Yaml::Str(b.to_string()),
        V::Number(n) => Yaml::Str(n.to_string()),
        V::Array(a) => Yaml::Seq(a.into_iter().map(tree).collect()),
        V::Object(o) => Yaml::Map(o.into_iter().map(|(k, v)| (k, tree(v))).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_read_as_trees() {
        let docs = parse_documents(
            "# a comment\nkind: A # trailing\nlist:\n- a\n- \"b # not a comment\"\nnested:\n  items:\n    - name: x\n      drop: [\"ALL\", 'b']\n    - y\n  empty: {}\n  port: 7443\nscript: |\n  one\n    two\n---\n# only a comment\n---\nkind: B\n",
        );
        assert_eq!(docs.len(), 2, "{docs:?}");
        let a = &docs[0];
        assert_eq!(a.str_at(&["kind"]), Some("A"));
        assert_eq!(a.strs_at(&["list"]), ["a", "b # not a comment"]);
        let items = a.seq_at(&["nested", "items"]);
        assert_eq!(items[0].str_at(&["name"]), Some("x"));
        assert_eq!(items[0].strs_at(&["drop"]), ["ALL", "b"]);
        assert_eq!(items[1], Yaml::Str("y".into()));
        assert_eq!(a.at(&["nested", "empty"]), Some(&Yaml::Map(Vec::new())));
        assert_eq!(a.str_at(&["nested", "port"]), Some("7443"));
        assert_eq!(a.str_at(&["script"]), Some("one\n  two\n"));
        assert_eq!(docs[1].str_at(&["kind"]), Some("B"));
    }
}

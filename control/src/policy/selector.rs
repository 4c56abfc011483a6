//! Label selectors (`metav1.LabelSelector`): parsed once, validated as the API server validates
//! them, matched against label maps.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// One `matchExpressions` requirement.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Expr {
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

/// A parsed selector: every `matchLabels` pair and every expression must hold (AND). Empty
/// selects everything.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Selector {
    labels: Vec<(String, String)>,
    exprs: Vec<Expr>,
}

impl Selector {
    /// Selects everything (`{}`).
    pub fn everything() -> Selector {
        Selector::default()
    }

    pub fn is_everything(&self) -> bool {
        self.labels.is_empty() && self.exprs.is_empty()
    }

    /// `matchLabels` only (tests, traces).
    pub fn from_labels<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Selector {
        let mut labels: Vec<(String, String)> = pairs
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        labels.sort();
        labels.dedup();
        Selector {
            labels,
            exprs: vec![],
        }
    }

    /// Parses and validates a selector; `field` names it in errors (for example
    /// `spec.ingress[0].from[1].podSelector`). Invalid selectors are errors, never "everything".
    pub fn parse(sel: &LabelSelector, field: &str) -> Result<Selector, String> {
        let mut labels: Vec<(String, String)> = sel
            .match_labels
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (k, _) in &labels {
            if k.is_empty() {
                return Err(format!("{field}.matchLabels: empty key"));
            }
        }
        labels.sort();
        let mut exprs = Vec::new();
        for (i, r) in sel.match_expressions.iter().flatten().enumerate() {
            let f = format!("{field}.matchExpressions[{i}]");
            if r.key.is_empty() {
                return Err(format!("{f}.key: empty"));
            }
            let mut values = r.values.clone().unwrap_or_default();
            values.sort();
            values.dedup();
            let e = match r.operator.as_str() {
                "In" | "NotIn" if values.is_empty() => {
                    return Err(format!(
                        "{f}: operator {} needs at least one value",
                        r.operator
                    ))
                }
                "In" => Expr::In(r.key.clone(), values),
                "NotIn" => Expr::NotIn(r.key.clone(), values),
                "Exists" | "DoesNotExist" if !values.is_empty() => {
                    return Err(format!("{f}: operator {} takes no values", r.operator))
                }
                "Exists" => Expr::Exists(r.key.clone()),
                "DoesNotExist" => Expr::DoesNotExist(r.key.clone()),
                other => {
                    return Err(format!(
                        "{f}.operator: `{other}` is not In, NotIn, Exists or DoesNotExist"
                    ))
                }
            };
            exprs.push(e);
        }
        exprs.sort();
        exprs.dedup();
        Ok(Selector { labels, exprs })
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.labels
            .iter()
            .all(|(k, v)| labels.get(k).is_some_and(|x| x == v))
            && self.exprs.iter().all(|e| match e {
                Expr::In(k, vs) => labels.get(k).is_some_and(|x| vs.contains(x)),
                // NotIn also matches objects without the key, as in apimachinery.
                Expr::NotIn(k, vs) => labels.get(k).is_none_or(|x| !vs.contains(x)),
                Expr::Exists(k) => labels.contains_key(k),
                Expr::DoesNotExist(k) => !labels.contains_key(k),
            })
    }
}

impl fmt::Display for Selector {
    /// The `kubectl` form: `a=b,c in (d,e),!f`; `{}` for everything.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_everything() {
            return f.write_str("{}");
        }
        let mut parts: Vec<String> = self
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        for e in &self.exprs {
            parts.push(match e {
                Expr::In(k, vs) => format!("{k} in ({})", vs.join(",")),
                Expr::NotIn(k, vs) => format!("{k} notin ({})", vs.join(",")),
                Expr::Exists(k) => k.clone(),
                Expr::DoesNotExist(k) => format!("!{k}"),
            });
        }
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn req(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: if values.is_empty() {
                None
            } else {
                Some(values.iter().map(|s| s.to_string()).collect())
            },
        }
    }

    fn sel(ml: &[(&str, &str)], me: Vec<LabelSelectorRequirement>) -> Selector {
        Selector::parse(
            &LabelSelector {
                match_labels: if ml.is_empty() {
                    None
                } else {
                    Some(labels(ml))
                },
                match_expressions: if me.is_empty() { None } else { Some(me) },
            },
            "s",
        )
        .unwrap()
    }

    #[test]
    fn truth_table() {
        let a = labels(&[("app", "web"), ("tier", "front")]);
        let b = labels(&[("app", "db")]);
        let c = labels(&[]);
        // (selector, [matches a, b, c])
        let cases: Vec<(Selector, [bool; 3])> = vec![
            (sel(&[], vec![]), [true, true, true]),
            (sel(&[("app", "web")], vec![]), [true, false, false]),
            (
                sel(&[("app", "web"), ("tier", "front")], vec![]),
                [true, false, false],
            ),
            (sel(&[("app", "web"), ("tier", "back")], vec![]), [false; 3]),
            (
                sel(&[], vec![req("app", "In", &["web", "db"])]),
                [true, true, false],
            ),
            (
                sel(&[], vec![req("app", "NotIn", &["web"])]),
                [false, true, true],
            ),
            (
                sel(&[], vec![req("tier", "Exists", &[])]),
                [true, false, false],
            ),
            (
                sel(&[], vec![req("tier", "DoesNotExist", &[])]),
                [false, true, true],
            ),
            (
                sel(
                    &[("app", "db")],
                    vec![req("tier", "DoesNotExist", &[]), req("app", "In", &["db"])],
                ),
                [false, true, false],
            ),
        ];
        for (s, want) in cases {
            assert_eq!([s.matches(&a), s.matches(&b), s.matches(&c)], want, "{s}");
        }
    }

    #[test]
    fn invalid_selectors_are_errors() {
        let bad = [
            req("a", "In", &[]),
            req("a", "NotIn", &[]),
            req("a", "Exists", &["x"]),
            req("a", "DoesNotExist", &["x"]),
            req("a", "Gt", &["1"]),
            req("", "Exists", &[]),
        ];
        for r in bad {
            let s = LabelSelector {
                match_labels: None,
                match_expressions: Some(vec![r.clone()]),
            };
            assert!(Selector::parse(&s, "x").is_err(), "{r:?}");
        }
    }

    #[test]
    fn display() {
        let s = sel(
            &[("app", "web")],
            vec![
                req("env", "In", &["prod", "dev"]),
                req("x", "DoesNotExist", &[]),
            ],
        );
        assert_eq!(s.to_string(), "app=web,env in (dev,prod),!x");
        assert_eq!(Selector::everything().to_string(), "{}");
    }
}

//! envoyproxy/ratelimit's configuration, read as it is: YAML files, each a `domain` and its
//! nested `descriptors`, compiled into a table that finds the rule of a request's descriptor.

use std::{
    collections::{BTreeMap, HashMap},
    path::Path,
    sync::Arc,
};

use serde::Deserialize;

use super::proto::Unit;
use crate::error::ConfigError;

/// One file's shape.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileShape {
    domain: String,
    #[serde(default)]
    descriptors: Vec<DescriptorShape>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DescriptorShape {
    key: String,
    #[serde(default)]
    value: Option<Scalar>,
    #[serde(default)]
    rate_limit: Option<RateLimitShape>,
    #[serde(default)]
    descriptors: Vec<DescriptorShape>,
    #[serde(default)]
    shadow_mode: bool,
    /// Metrics per value: every value of this service's keys is counted apart already.
    #[serde(default)]
    #[allow(dead_code)]
    detailed_metric: bool,
    /// Metrics named by value: as `detailed_metric`.
    #[serde(default)]
    #[allow(dead_code)]
    value_to_metric: bool,
    /// Refused when on: quota mode is not supported.
    #[serde(default)]
    quota_mode: bool,
    /// Refused when on: one counter shared by every value a wildcard matches is not supported.
    #[serde(default)]
    share_threshold: bool,
    /// Rules' metadata for Envoy's dynamic metadata: not sent, read and left aside.
    #[serde(default)]
    #[allow(dead_code)]
    metadata: Option<serde::de::IgnoredAny>,
}

/// A value as YAML writes it: `value: 10` is the text `10`, as envoyproxy/ratelimit reads it.
#[derive(Deserialize)]
#[serde(untagged)]
enum Scalar {
    Text(String),
    Whole(i64),
    Decimal(f64),
    Flag(bool),
}

impl Scalar {
    fn text(&self) -> String {
        match self {
            Scalar::Text(t) => t.clone(),
            Scalar::Whole(n) => n.to_string(),
            Scalar::Decimal(f) => f.to_string(),
            Scalar::Flag(b) => b.to_string(),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RateLimitShape {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    unit: Option<String>,
    #[serde(default)]
    requests_per_unit: Option<u32>,
    #[serde(default)]
    unlimited: bool,
    #[serde(default)]
    replaces: Vec<ReplaceShape>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplaceShape {
    name: String,
}

/// A rule: the limit of the descriptors that end at one node of a domain's tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RlsRule {
    /// The domain and the rule's path of keys (with `_VALUE` for a rule on a value), joined by
    /// `.`: `edge.remote_address`, `edge.path_/api.method` (what the metrics call the policy).
    pub path: String,
    /// The rule's `name`, if it has one (what `replaces` names).
    pub name: Option<String>,
    /// The unit.
    pub unit: Unit,
    /// Requests per unit (0 for an unlimited rule).
    pub requests_per_unit: u32,
    /// `unlimited: true`: matched, never limited.
    pub unlimited: bool,
    /// `shadow_mode: true`: decided and counted, never refusing.
    pub shadow: bool,
    /// The names of the rules this one replaces in a request where both match.
    pub replaces: Vec<String>,
}

/// A node of a domain's tree.
#[derive(Debug, Default)]
struct Node {
    /// Children by `key` then exact `value`.
    exact: HashMap<String, HashMap<String, Node>>,
    /// Children on a value with `*` (each matching any run of characters), by key, in the
    /// file's order.
    patterns: HashMap<String, Vec<(String, Node)>>,
    /// Children on a key alone (any value, each counted apart).
    any: HashMap<String, Node>,
    rule: Option<Arc<RlsRule>>,
}

impl Node {
    /// The child that matches `key` = `value`: an exact value first, then the first pattern
    /// that matches, in the file's order, then the key alone.
    fn child(&self, key: &str, value: &str) -> Option<&Node> {
        if let Some(node) = self.exact.get(key).and_then(|values| values.get(value)) {
            return Some(node);
        }
        if let Some(patterns) = self.patterns.get(key) {
            if let Some((_, node)) = patterns.iter().find(|(p, _)| wildcard(p, value)) {
                return Some(node);
            }
        }
        self.any.get(key)
    }
}

/// The rules of every domain: what a rate limit service decides requests by. Read from
/// envoyproxy/ratelimit's YAML ([`from_yaml`](Self::from_yaml), [`load`](Self::load)).
///
/// A descriptor's entries are walked down its domain's tree: at each level an entry takes
/// the child with its key and exactly its value, else the first child (in the file's order)
/// whose value has `*` and matches the entry's value (`*` stands for any run of characters:
/// `/api/*` matches every value starting with `/api/`), else the child with its key and no
/// value (each value then counted apart). The choice at a level is final, as in
/// envoyproxy/ratelimit: a deeper entry that matches nothing under an exact value does not
/// try the key alone. The descriptor's rule is the one of the node its last entry
/// reaches; a descriptor with an entry that matches nothing, or that ends at a node without a
/// `rate_limit`, has no rule and is not limited.
///
/// ```
/// use tower_redis_ratelimit::rate_limit::rls::RlsRules;
///
/// let rules = RlsRules::from_yaml("edge.yaml", "
/// domain: edge
/// descriptors:
///   - key: remote_address
///     rate_limit: { unit: second, requests_per_unit: 10 }
/// ")?;
/// let rule = rules.find("edge", &[("remote_address", "10.0.0.1")]).unwrap();
/// assert_eq!((rule.path.as_str(), rule.requests_per_unit), ("edge.remote_address", 10));
/// # Ok::<(), tower_redis_ratelimit::ConfigError>(())
/// ```
#[derive(Debug, Default)]
pub struct RlsRules {
    domains: BTreeMap<String, Node>,
    rules: Vec<Arc<RlsRule>>,
}

impl RlsRules {
    /// The rules of one YAML file's text (`source` names it in errors).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `source` with the line and column of what does not read (an
    /// unknown field, a value of the wrong type), a unit that is not `second`, `minute`,
    /// `hour`, `day`, `week`, `month` or `year`, a `rate_limit` without `unit` or
    /// `requests_per_unit` (unless `unlimited`), a `requests_per_unit` of 0, an empty domain
    /// or key, a key and value given twice at one level, or a rule name given twice.
    pub fn from_yaml(source: &str, text: &str) -> Result<Self, ConfigError> {
        let mut rules = Self::default();
        rules.add_yaml(source, text)?;
        Ok(rules)
    }

    /// The rules of a YAML file, or of every `*.yaml` and `*.yml` file of a directory (in the
    /// order of their names; not its subdirectories).
    ///
    /// # Errors
    ///
    /// As [`from_yaml`](Self::from_yaml); a file or directory that cannot be read, a directory
    /// without a YAML file, and a domain given by two files.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let shown = path.display().to_string();
        let unreadable =
            |e: std::io::Error| ConfigError::new("rls_config", format!("{shown}: {e}"));
        let meta = std::fs::metadata(path).map_err(unreadable)?;
        let files = if meta.is_dir() {
            let mut files: Vec<_> = std::fs::read_dir(path)
                .map_err(unreadable)?
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| {
                    p.is_file()
                        && matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"))
                })
                .collect();
            files.sort();
            if files.is_empty() {
                return Err(ConfigError::new(
                    "rls_config",
                    format!("{shown}: no *.yaml or *.yml file in the directory"),
                ));
            }
            files
        } else {
            vec![path.to_path_buf()]
        };
        let mut rules = Self::default();
        for file in files {
            let name = file.display().to_string();
            let len = std::fs::metadata(&file).map_err(unreadable)?.len();
            if len > crate::rate_limit::rls::MAX_FILE_LEN {
                return Err(ConfigError::new(
                    "rls_config",
                    format!(
                        "{name}: over {} bytes",
                        crate::rate_limit::rls::MAX_FILE_LEN
                    ),
                ));
            }
            let text = std::fs::read_to_string(&file)
                .map_err(|e| ConfigError::new("rls_config", format!("{name}: {e}")))?;
            rules.add_yaml(&name, &text)?;
        }
        Ok(rules)
    }

    fn add_yaml(&mut self, source: &str, text: &str) -> Result<(), ConfigError> {
        let bad = |message: String| ConfigError::new("rls_config", format!("{source}: {message}"));
        let file: FileShape = serde_saphyr::from_str(text).map_err(|e| {
            // The parser's first line: `error: line L column C: what`.
            let first = e.to_string();
            let first = first.lines().next().unwrap_or_default();
            bad(first.strip_prefix("error: ").unwrap_or(first).to_owned())
        })?;
        if file.domain.is_empty() {
            return Err(bad("domain: must not be empty".into()));
        }
        if self.domains.contains_key(&file.domain) {
            return Err(bad(format!(
                "domain {:?} is given by another file too",
                file.domain
            )));
        }
        let mut root = Node::default();
        for d in &file.descriptors {
            self.add(&mut root, &file.domain, d, &bad)?;
        }
        self.domains.insert(file.domain, root);
        Ok(())
    }

    fn add(
        &mut self,
        parent: &mut Node,
        path: &str,
        d: &DescriptorShape,
        bad: &dyn Fn(String) -> ConfigError,
    ) -> Result<(), ConfigError> {
        if d.key.is_empty() {
            return Err(bad(format!("{path}: a descriptor's key must not be empty")));
        }
        if d.quota_mode || d.share_threshold {
            let field = if d.quota_mode {
                "quota_mode"
            } else {
                "share_threshold"
            };
            return Err(bad(format!("{path}.{}: {field} is not supported", d.key)));
        }
        let value = d.value.as_ref().map(Scalar::text);
        let value = value.as_deref().filter(|v| !v.is_empty());
        let step = match value {
            Some(value) => format!("{}_{value}", d.key),
            None => d.key.clone(),
        };
        let here = format!("{path}.{step}");
        let taken = match value {
            None => parent.any.contains_key(&d.key),
            Some(v) if v.contains('*') => parent
                .patterns
                .get(&d.key)
                .is_some_and(|list| list.iter().any(|(p, _)| p == v)),
            Some(v) => parent.exact.get(&d.key).is_some_and(|m| m.contains_key(v)),
        };
        if taken {
            return Err(bad(format!("{here}: the descriptor is given twice")));
        }
        let mut node = Node {
            rule: self.rule(&here, d, bad)?,
            ..Node::default()
        };
        for child in &d.descriptors {
            self.add(&mut node, &here, child, bad)?;
        }
        match value {
            None => {
                parent.any.insert(d.key.clone(), node);
            }
            Some(v) if v.contains('*') => parent
                .patterns
                .entry(d.key.clone())
                .or_default()
                .push((v.to_owned(), node)),
            Some(v) => {
                parent
                    .exact
                    .entry(d.key.clone())
                    .or_default()
                    .insert(v.to_owned(), node);
            }
        }
        Ok(())
    }

    /// The rule of the descriptor at `path`, if it has a `rate_limit`.
    fn rule(
        &mut self,
        path: &str,
        d: &DescriptorShape,
        bad: &dyn Fn(String) -> ConfigError,
    ) -> Result<Option<Arc<RlsRule>>, ConfigError> {
        let Some(limit) = &d.rate_limit else {
            return Ok(None);
        };
        let unit = limit.unit.as_deref().and_then(unit_named);
        let (unit, requests_per_unit) = if limit.unlimited {
            if unit.is_some() {
                return Err(bad(format!(
                    "{path}: an unlimited rate_limit takes no unit"
                )));
            }
            (Unit::Unknown, 0)
        } else {
            let written = limit.unit.as_deref().unwrap_or_default();
            let unit = unit.ok_or_else(|| {
                bad(format!(
                    "{path}: unit {written:?} is not second, minute, hour, day, week, month or year"
                ))
            })?;
            // No requests_per_unit, or 0: every request is over the limit (a block list).
            (unit, limit.requests_per_unit.unwrap_or(0))
        };
        if limit.replaces.iter().any(|r| r.name.is_empty()) {
            return Err(bad(format!("{path}: a replaces entry needs a name")));
        }
        if let Some(name) = &limit.name {
            if limit.replaces.iter().any(|r| &r.name == name) {
                return Err(bad(format!(
                    "{path}: a rule cannot replace itself ({name:?})"
                )));
            }
        }
        if let Some(name) = &limit.name {
            if self.rules.iter().any(|r| r.name.as_ref() == Some(name)) {
                return Err(bad(format!("{path}: the rule name {name:?} is used twice")));
            }
        }
        let rule = Arc::new(RlsRule {
            path: path.to_owned(),
            name: limit.name.clone(),
            unit,
            requests_per_unit,
            unlimited: limit.unlimited,
            shadow: d.shadow_mode,
            replaces: limit.replaces.iter().map(|r| r.name.clone()).collect(),
        });
        self.rules.push(rule.clone());
        Ok(Some(rule))
    }

    /// The rule of a descriptor with these entries (key, value) in `domain`, if any.
    pub fn find<K: AsRef<str>, V: AsRef<str>>(
        &self,
        domain: &str,
        entries: &[(K, V)],
    ) -> Option<&Arc<RlsRule>> {
        let mut node = self.domains.get(domain)?;
        if entries.is_empty() {
            return None;
        }
        for (key, value) in entries {
            node = node.child(key.as_ref(), value.as_ref())?;
        }
        node.rule.as_ref()
    }

    /// Whether `domain` has rules.
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// The number of domains.
    pub fn domains(&self) -> usize {
        self.domains.len()
    }

    /// Every rule, in the order of the files.
    pub fn rules(&self) -> &[Arc<RlsRule>] {
        &self.rules
    }
}

/// A unit as the files write it, in any case.
fn unit_named(name: &str) -> Option<Unit> {
    Some(match name.to_ascii_lowercase().as_str() {
        "second" => Unit::Second,
        "minute" => Unit::Minute,
        "hour" => Unit::Hour,
        "day" => Unit::Day,
        "week" => Unit::Week,
        "month" => Unit::Month,
        "year" => Unit::Year,
        _ => return None,
    })
}

/// Whether `value` matches `pattern`, where each `*` stands for any run of characters
/// (none included): the parts between them appear in order, the first at the start, the
/// last at the end.
fn wildcard(pattern: &str, value: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = value.strip_prefix(first) else {
        return false;
    };
    let mut parts: Vec<&str> = parts.collect();
    let last = parts.pop().unwrap_or_default();
    for part in parts {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

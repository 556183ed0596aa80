//! Lease definitions (spec §2): the YAML document, its validation, and the resolved definition an acquisition
//! uses.
//!
//! A [`DefinitionDocument`] is one parsed document with every field optional: the unit of a config layer. It is
//! valid on its own terms once parsed (caps ≥ 1, known keys, numbers where numbers belong). A
//! [`LeaseDefinition`] is what an acquisition sees: a name, a resource and defaults filled in.

use serde::Deserialize;

use crate::error::Level;

/// `ttlSeconds` when no layer sets it.
pub const DEFAULT_TTL_SECONDS: u64 = 300;
/// `waitMs` when no layer sets it: fail at once with `LEASE_BUSY`.
pub const DEFAULT_WAIT_MS: u64 = 0;
/// The longest `waitMs` accepted: an acquisition runs on a caller's lane and must never block for long.
pub const MAX_WAIT_MS: u64 = 600_000;

/// A definition document that cannot be used, naming the field and the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct DefinitionError {
    /// The offending field (`levels.global`, `name`, …), or `document` for a document that is not YAML.
    pub field: String,
    /// What is wrong, including the offending value.
    pub problem: String,
}

impl DefinitionError {
    fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        DefinitionError { field: field.into(), problem: problem.into() }
    }
}

/// Caps per level; `None` means the level is pass-through.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Caps {
    /// Across all tenants.
    pub global: Option<u32>,
    /// Per tenant.
    pub tenant: Option<u32>,
    /// Per project.
    pub project: Option<u32>,
    /// Per user, across projects.
    pub user: Option<u32>,
}

impl Caps {
    /// The cap of `level`.
    pub fn get(&self, level: Level) -> Option<u32> {
        match level {
            Level::Global => self.global,
            Level::Tenant => self.tenant,
            Level::Project => self.project,
            Level::User => self.user,
        }
    }

    /// The capped levels in check order (narrow → wide) with their caps.
    pub fn narrow_to_wide(&self) -> impl Iterator<Item = (Level, u32)> + '_ {
        Level::NARROW_TO_WIDE.into_iter().filter_map(|l| self.get(l).map(|c| (l, c)))
    }

    /// No level is capped: the lease is a NOOP.
    pub fn is_empty(&self) -> bool {
        self.narrow_to_wide().next().is_none()
    }
}

/// One definition document, every field optional: a config layer, or an inline definition.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DefinitionDocument {
    /// `name`: must match the file name.
    pub name: Option<String>,
    /// `resource`: the counter key.
    pub resource: Option<String>,
    /// `levels.*`.
    pub levels: Caps,
    /// `ttlSeconds`.
    pub ttl_seconds: Option<u64>,
    /// `waitMs`.
    pub wait_ms: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawDocument {
    name: Option<String>,
    resource: Option<String>,
    levels: Option<RawLevels>,
    ttl_seconds: Option<i64>,
    wait_ms: Option<i64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLevels {
    global: Option<i64>,
    tenant: Option<i64>,
    project: Option<i64>,
    user: Option<i64>,
}

fn cap(field: &str, value: Option<i64>) -> Result<Option<u32>, DefinitionError> {
    match value {
        None => Ok(None),
        Some(v) if (1..=i64::from(u32::MAX)).contains(&v) => Ok(Some(v as u32)),
        Some(v) => Err(DefinitionError::new(
            field,
            format!("cap must be at least 1, got {v} (to switch a lease off, set the consumer's lease to none)"),
        )),
    }
}

impl DefinitionDocument {
    /// Parses and validates one YAML document. Broken YAML, unknown keys, non-numeric values, caps < 1, a
    /// `ttlSeconds` < 1, a negative or too long `waitMs` and malformed names are errors naming field and value.
    pub fn parse(yaml: &str) -> Result<Self, DefinitionError> {
        let raw: RawDocument = serde_yaml::from_str(yaml).map_err(|e| {
            // serde_yaml prefixes the path of the offending key (`levels.global: invalid type: string "six"`).
            let text = e.to_string();
            let field = match text.split_once(": ") {
                Some((path, _)) if !path.contains(' ') => path.to_owned(),
                _ => "document".to_owned(),
            };
            DefinitionError::new(field, text)
        })?;
        let levels = raw.levels.map_or(Ok(Caps::default()), |l| {
            Ok::<_, DefinitionError>(Caps {
                global: cap("levels.global", l.global)?,
                tenant: cap("levels.tenant", l.tenant)?,
                project: cap("levels.project", l.project)?,
                user: cap("levels.user", l.user)?,
            })
        })?;
        if let Some(name) = &raw.name {
            validate_name("name", name)?;
        }
        if let Some(resource) = &raw.resource {
            validate_name("resource", resource)?;
        }
        let ttl_seconds = match raw.ttl_seconds {
            Some(t) if t < 1 => {
                return Err(DefinitionError::new("ttlSeconds", format!("must be at least 1, got {t}")));
            }
            t => t.map(|t| t as u64),
        };
        let wait_ms = match raw.wait_ms {
            Some(w) if !(0..=MAX_WAIT_MS as i64).contains(&w) => {
                return Err(DefinitionError::new("waitMs", format!("must be between 0 and {MAX_WAIT_MS}, got {w}")));
            }
            w => w.map(|w| w as u64),
        };
        Ok(DefinitionDocument { name: raw.name, resource: raw.resource, levels, ttl_seconds, wait_ms })
    }
}

/// Checks a lease or resource name: `[A-Za-z0-9][A-Za-z0-9_-]{0,63}` (names are path segments and counter key
/// parts).
pub fn validate_name(field: &str, name: &str) -> Result<(), DefinitionError> {
    let mut chars = name.chars();
    let ok = name.len() <= 64
        && chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if ok {
        Ok(())
    } else {
        Err(DefinitionError::new(field, format!("{name:?} is not a valid name: [A-Za-z0-9][A-Za-z0-9_-]{{0,63}}")))
    }
}

/// A resolved lease definition: what an acquisition funnels through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseDefinition {
    /// The definition's name.
    pub name: String,
    /// The counted resource (the first part of every counter key).
    pub resource: String,
    /// The caps; none at all makes the lease a NOOP.
    pub levels: Caps,
    /// Idle time after which a holder is reaped.
    pub ttl_seconds: u64,
    /// How long an acquisition waits for a slot.
    pub wait_ms: u64,
}

impl LeaseDefinition {
    /// The definition of the single document `<file_name>.yaml`: its `name` must be present and equal
    /// `file_name`; `resource` defaults to the name.
    pub fn from_yaml(file_name: &str, yaml: &str) -> Result<Self, DefinitionError> {
        let doc = DefinitionDocument::parse(yaml)?;
        match &doc.name {
            None => Err(DefinitionError::new("name", "is missing")),
            Some(n) if n != file_name => {
                Err(DefinitionError::new("name", format!("{n:?} does not match the file name {file_name:?}")))
            }
            Some(_) => Ok(Self::from_document(doc)),
        }
    }

    /// Fills the defaults into a named document. The caller has checked that `doc.name` is set.
    pub(crate) fn from_document(doc: DefinitionDocument) -> Self {
        let name = doc.name.unwrap_or_default();
        LeaseDefinition {
            resource: doc.resource.unwrap_or_else(|| name.clone()),
            name,
            levels: doc.levels,
            ttl_seconds: doc.ttl_seconds.unwrap_or(DEFAULT_TTL_SECONDS),
            wait_ms: doc.wait_ms.unwrap_or(DEFAULT_WAIT_MS),
        }
    }

    /// No level is capped: acquisitions return the NOOP lease without touching the store.
    pub fn is_noop(&self) -> bool {
        self.levels.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(yaml: &str) -> DefinitionError {
        LeaseDefinition::from_yaml("tex", yaml).unwrap_err()
    }

    #[test]
    fn parses_the_spec_example_with_defaults_filled_in() {
        let d = LeaseDefinition::from_yaml("tex", "name: tex\nlevels: {global: 6, tenant: 3, project: 1}\n").unwrap();
        assert_eq!(d.resource, "tex");
        assert_eq!(d.levels, Caps { global: Some(6), tenant: Some(3), project: Some(1), user: None });
        assert_eq!(d.ttl_seconds, DEFAULT_TTL_SECONDS);
        assert_eq!(d.wait_ms, DEFAULT_WAIT_MS);
        assert_eq!(
            d.levels.narrow_to_wide().collect::<Vec<_>>(),
            vec![(Level::Project, 1), (Level::Tenant, 3), (Level::Global, 6)]
        );
    }

    #[test]
    fn no_caps_is_a_noop_definition() {
        assert!(LeaseDefinition::from_yaml("tex", "name: tex\nttlSeconds: 5\n").unwrap().is_noop());
    }

    #[test]
    fn broken_yaml_is_rejected() {
        let e = err("name: 'tex\nlevels: {global: 6}\n");
        assert_eq!(e.field, "document");
        assert!(e.problem.contains("line"), "{e}");
    }

    #[test]
    fn non_numeric_cap_names_field_and_value() {
        let e = err("name: tex\nlevels:\n  global: six\n");
        assert_eq!(e.field, "levels.global");
        assert!(e.problem.contains("six"), "{e}");
    }

    #[test]
    fn cap_below_one_names_field_and_value() {
        let e = err("name: tex\nlevels:\n  project: 0\n");
        assert_eq!(e.field, "levels.project");
        assert!(e.problem.contains("got 0"), "{e}");
        assert_eq!(err("name: tex\nlevels: {user: -3}\n").field, "levels.user");
    }

    #[test]
    fn unknown_keys_are_rejected_at_every_depth() {
        let e = err("name: tex\nttl: 5\n");
        assert!(e.problem.contains("unknown field `ttl`"), "{e}");
        let e = err("name: tex\nlevels: {region: 2}\n");
        assert_eq!(e.field, "levels");
        assert!(e.problem.contains("region"), "{e}");
    }

    #[test]
    fn name_must_match_the_file() {
        let e = err("name: pdf\n");
        assert_eq!(e.field, "name");
        assert!(e.problem.contains("\"pdf\""), "{e}");
        assert_eq!(err("resource: x\n").field, "name");
    }

    #[test]
    fn malformed_names_and_resources_are_rejected() {
        for bad in ["-tex", "te x", "tex/../x", "", &"a".repeat(65)] {
            assert!(validate_name("name", bad).is_err(), "{bad:?} accepted");
        }
        for good in ["tex", "T", "a_b-c9", &"a".repeat(64)] {
            assert!(validate_name("name", good).is_ok(), "{good:?} rejected");
        }
        assert_eq!(err("name: tex\nresource: 'tex|global'\n").field, "resource");
    }

    #[test]
    fn ttl_and_wait_are_bounded() {
        assert_eq!(err("name: tex\nttlSeconds: 0\n").field, "ttlSeconds");
        assert_eq!(err("name: tex\nwaitMs: -1\n").field, "waitMs");
        assert_eq!(err("name: tex\nwaitMs: 10s\n").field, "waitMs");
    }
}

//! Consumer settings through the config layers: how a consumer such as tex learns which lease to use.
//!
//! Settings live in one document per layer, [`SETTINGS_PATH`] (`_vance/config/settings.yaml`), a flat YAML map
//! of setting keys to values:
//!
//! ```yaml
//! tex.lease: none        # the tex add-on takes no lease in this scope
//! ```
//!
//! A key resolves Project → Tenant → System → classpath → the consumer's built-in default; the most specific
//! layer that sets the key wins (every layer may set every setting: whoever may write a consumer's config may
//! switch its lease off, spec §1). Nested keys are not interpreted: `tex: {lease: none}` is the setting `tex`.
//!
//! Fail-closed: a settings document that cannot be read or is not a map of text keys fails the lookup with
//! `LEASE_UNAVAILABLE` naming the layer. A lease setting whose value is not a lease name (or `none`) is
//! `INVALID_REQUEST`, like a name reference to an unknown definition: a bad reference, not an outage.

use std::collections::HashMap;
use std::sync::Arc;

use serde_yaml::Value;

use super::layers::{Layer, LayeredDefinitions};
use crate::definition::validate_name;
use crate::error::LeaseError;
use crate::service::LeaseRef;

/// The settings document of every layer.
pub const SETTINGS_PATH: &str = "_vance/config/settings.yaml";

/// The tex add-on's lease setting (built-in default: `tex`).
pub const TEX_LEASE_SETTING: &str = "tex.lease";

/// A setting's value and the layer it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Setting {
    /// The most specific layer that sets the key.
    pub layer: Layer,
    /// The value as written (`null` for `key:` without a value).
    pub value: Value,
}

/// Every key of the merged layers, with the winning layer's value.
pub(crate) type MergedSettings = HashMap<String, Setting>;

/// Parses one settings document: a map of text keys; an empty document (or only comments) is an empty map.
fn parse(content: &str) -> Result<Vec<(String, Value)>, String> {
    match serde_yaml::from_str::<Value>(content).map_err(|e| e.to_string())? {
        Value::Null => Ok(Vec::new()),
        Value::Mapping(map) => map
            .into_iter()
            .map(|(k, v)| match k {
                Value::String(k) => Ok((k, v)),
                other => Err(format!("setting keys must be text, got {other:?}")),
            })
            .collect(),
        other => Err(format!("a settings document is a map of setting keys, got {other:?}")),
    }
}

/// Interprets a lease setting's value: `none`, an empty value or no value → [`LeaseRef::None`]; a lease name →
/// [`LeaseRef::Name`]. Anything else (a malformed name, a number, a list) is `INVALID_REQUEST` on `key`.
pub fn lease_ref_from_value(key: &str, value: &Value) -> Result<LeaseRef, LeaseError> {
    match value {
        Value::Null => Ok(LeaseRef::None),
        Value::String(s) => {
            let s = s.trim();
            if s.is_empty() || s.eq_ignore_ascii_case("none") {
                Ok(LeaseRef::None)
            } else {
                validate_name(key, s).map_err(|e| LeaseError::invalid(key, e.problem))?;
                Ok(LeaseRef::Name(s.to_owned()))
            }
        }
        other => Err(LeaseError::invalid(key, format!("must be a lease name or none, got {other:?}"))),
    }
}

impl LayeredDefinitions {
    /// The setting `key` for `(tenant, project)`: the value of the most specific layer that sets it, `None` if no
    /// layer does. Cached like definitions; `LEASE_UNAVAILABLE` naming the layer if a settings document cannot be
    /// read or parsed.
    pub async fn setting(&self, tenant: &str, project: &str, key: &str) -> Result<Option<Setting>, LeaseError> {
        let merged =
            self.cached(&self.settings, tenant, project, SETTINGS_PATH, || self.load_settings(tenant, project)).await?;
        Ok(merged.get(key).cloned())
    }

    /// The lease a consumer setting such as `tex.lease` asks for in `(tenant, project)`, ready for a
    /// [`LeaseRequest`](crate::LeaseRequest): Project → Tenant → System → classpath → `default`. `none` or an empty
    /// value is [`LeaseRef::None`] (no lease, no store traffic).
    ///
    /// Errors: `LEASE_UNAVAILABLE` for an unreadable or unparsable settings layer; `INVALID_REQUEST` for a value
    /// that is not a lease name (the message names the layer).
    pub async fn lease_setting(
        &self,
        tenant: &str,
        project: &str,
        key: &str,
        default: &str,
    ) -> Result<LeaseRef, LeaseError> {
        let (origin, value) = match self.setting(tenant, project, key).await? {
            Some(s) => (format!("the {} layer", s.layer), s.value),
            None => ("the built-in default".to_owned(), Value::String(default.to_owned())),
        };
        lease_ref_from_value(key, &value).map_err(|e| match e {
            LeaseError::InvalidRequest { field, message } => {
                LeaseError::invalid(field, format!("{message} (set in {origin} of {SETTINGS_PATH})"))
            }
            other => other,
        })
    }

    async fn load_settings(&self, tenant: &str, project: &str) -> Result<Arc<MergedSettings>, LeaseError> {
        let mut merged = MergedSettings::new();
        for l in self.read_layers(tenant, project, SETTINGS_PATH, "settings").await? {
            let entries =
                parse(&l.content).map_err(|problem| l.invalid("settings", SETTINGS_PATH, tenant, project, &problem))?;
            for (key, value) in entries {
                merged.insert(key, Setting { layer: l.layer, value });
            }
        }
        Ok(Arc::new(merged))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_values() {
        let v = |yaml: &str| serde_yaml::from_str::<Value>(yaml).unwrap();
        for none in ["none", "NONE", "''", "~", "' '"] {
            assert_eq!(lease_ref_from_value("tex.lease", &v(none)).unwrap(), LeaseRef::None, "{none}");
        }
        assert_eq!(lease_ref_from_value("tex.lease", &v("tex-2")).unwrap(), LeaseRef::Name("tex-2".into()));
        for bad in ["'a b'", "'../x'", "[tex]", "true", "{a: 1}"] {
            let e = lease_ref_from_value("tex.lease", &v(bad)).unwrap_err();
            assert_eq!(e.code(), "INVALID_REQUEST", "{bad}");
        }
    }

    #[test]
    fn documents() {
        assert_eq!(parse("# nothing yet\n").unwrap(), vec![]);
        assert_eq!(parse("tex.lease: none\n").unwrap(), vec![("tex.lease".into(), Value::String("none".into()))]);
        assert!(parse("- tex.lease\n").is_err());
        assert!(parse("1: x\n").is_err());
        assert!(parse("tex.lease: 'none\n").is_err());
    }
}

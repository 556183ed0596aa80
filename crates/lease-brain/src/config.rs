//! The brain's configuration: an optional YAML file plus environment overrides, validated at start-up into an
//! immutable struct. Every setting has an environment variable and a file key ([`KEYS`]); the environment wins.

use std::net::SocketAddr;
use std::time::Duration;

/// A configuration value that cannot be used, naming the variable and the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{variable}={value:?}: {problem}")]
pub struct ConfigError {
    /// The offending variable.
    pub variable: &'static str,
    /// Its value.
    pub value: String,
    /// What is wrong with it.
    pub problem: String,
}

/// Every setting: its environment variable and its key in the YAML config file.
pub const KEYS: &[(&str, &str)] = &[
    ("BRAIN_LISTEN", "listen"),
    ("BRAIN_MONGODB_URI", "mongodb-uri"),
    ("BRAIN_MONGODB_DATABASE", "mongodb-database"),
    ("BRAIN_POD_ID", "pod-id"),
    ("BRAIN_ADVERTISED_ENDPOINT", "advertised-endpoint"),
    ("BRAIN_INTERNAL_SECRET", "internal-secret"),
    ("BRAIN_JWT_SECRET", "jwt-secret"),
    ("BRAIN_HEARTBEAT_INTERVAL_MS", "heartbeat-interval-ms"),
    ("BRAIN_HEARTBEAT_STALENESS_MS", "heartbeat-staleness-ms"),
    ("VANCE_LEASE_REAP_INTERVAL_MS", "vance.lease.reap-interval-ms"),
    ("VANCE_LEASE_RECONCILE_SAFETY_MS", "vance.lease.reconcile-safety-ms"),
    ("VANCE_LEASE_RECONCILE_SETTLE_MS", "vance.lease.reconcile-settle-ms"),
    ("BRAIN_TEX2PDF_URL", "tex2pdf-url"),
    ("BRAIN_TEX2PDF_POLL_MS", "tex2pdf-poll-ms"),
    ("BRAIN_MCP_IDLE_CLOSE_MS", "mcp-idle-close-ms"),
];

/// The validated configuration of one brain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrainConfig {
    /// Where the HTTP server listens (`BRAIN_LISTEN`, default `127.0.0.1:8080`).
    pub listen: SocketAddr,
    /// The MongoDB URI (`BRAIN_MONGODB_URI`); absent = the embedded in-memory store, single brain only.
    pub mongodb_uri: Option<String>,
    /// The MongoDB database (`BRAIN_MONGODB_DATABASE`, default `vance`).
    pub database: String,
    /// This pod's id (`BRAIN_POD_ID`, default `brain-<random>`).
    pub pod_id: String,
    /// The base URL other pods reach this one at (`BRAIN_ADVERTISED_ENDPOINT`, default `http://<listen address>`).
    pub advertised_endpoint: Option<String>,
    /// The shared secret of internal endpoints (`BRAIN_INTERNAL_SECRET`); required with MongoDB (several pods),
    /// random per process for the embedded brain.
    pub internal_secret: String,
    /// Whether [`Self::internal_secret`] was made up at start (embedded brain without `BRAIN_INTERNAL_SECRET`):
    /// then nobody outside this process can use the internal and admin endpoints.
    pub internal_secret_generated: bool,
    /// The HS256 secret of lease API tokens (`BRAIN_JWT_SECRET`); without it the lease API answers 503.
    pub jwt_secret: Option<String>,
    /// Heartbeat interval (`BRAIN_HEARTBEAT_INTERVAL_MS`, default 5 000).
    pub heartbeat_interval: Duration,
    /// Age after which a pod's heartbeat is stale and the pod dead (`BRAIN_HEARTBEAT_STALENESS_MS`, default
    /// 20 000; more than the interval).
    pub heartbeat_staleness: Duration,
    /// `vance.lease.reap-interval` (`VANCE_LEASE_REAP_INTERVAL_MS`, default 30 000).
    pub reap_interval: Duration,
    /// `vance.lease.reconcile-safety-ms` (`VANCE_LEASE_RECONCILE_SAFETY_MS`, default 60 000).
    pub reconcile_safety: Duration,
    /// Reconcile's pause between its scan and its writes, longer than any delete-to-decrement gap
    /// (`VANCE_LEASE_RECONCILE_SETTLE_MS`, default 1 000).
    pub reconcile_settle: Duration,
    /// The remote tex2pdf compile service (`BRAIN_TEX2PDF_URL`); absent = the built-in test double.
    pub tex2pdf_url: Option<String>,
    /// The longest pause between two polls of a compile job (`BRAIN_TEX2PDF_POLL_MS`, default 1 000). Every poll
    /// checks the lease, so the tex definition's `ttlSeconds` must exceed it.
    pub tex2pdf_poll_interval: Duration,
    /// A pooled MCP session nobody used for this long is closed (`BRAIN_MCP_IDLE_CLOSE_MS`, default 600 000): its
    /// lease is released and a stdio server process ends; the next call opens a new session.
    pub mcp_idle_close: Duration,
}

fn millis(
    env: &impl Fn(&str) -> Option<String>,
    variable: &'static str,
    default: u64,
) -> Result<Duration, ConfigError> {
    match env(variable) {
        None => Ok(Duration::from_millis(default)),
        Some(v) => match v.parse::<u64>() {
            Ok(ms) if ms > 0 => Ok(Duration::from_millis(ms)),
            _ => Err(ConfigError { variable, value: v, problem: "must be a positive number of milliseconds".into() }),
        },
    }
}

impl BrainConfig {
    /// Reads and validates the configuration from the YAML text of a config file (if any) and `env` (pass
    /// `|k| std::env::var(k).ok()` in production); the environment overrides the file. Unknown file keys, non-scalar
    /// values and broken YAML are errors naming the key.
    pub fn load(file: Option<&str>, env: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let file_values = match file {
            None => std::collections::BTreeMap::new(),
            Some(text) => parse_file(text)?,
        };
        let lookup = |variable: &str| {
            env(variable).or_else(|| {
                let key = KEYS.iter().find(|(v, _)| *v == variable).map(|(_, k)| *k)?;
                file_values.get(key).cloned()
            })
        };
        Self::from_env(lookup).map_err(|mut e| {
            // Name the file key when the offending value came from the file.
            if env(e.variable).is_none() {
                if let Some((_, key)) = KEYS.iter().find(|(v, _)| *v == e.variable) {
                    if file_values.contains_key(*key) {
                        e.variable = key;
                    }
                }
            }
            e
        })
    }

    /// Reads and validates the configuration from `env` alone.
    pub fn from_env(env: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let listen_text = env("BRAIN_LISTEN").unwrap_or_else(|| "127.0.0.1:8080".to_owned());
        let listen = listen_text.parse().map_err(|e| ConfigError {
            variable: "BRAIN_LISTEN",
            value: listen_text.clone(),
            problem: format!("not a socket address: {e}"),
        })?;
        let mongodb_uri = env("BRAIN_MONGODB_URI").filter(|u| !u.is_empty());
        if let Some(uri) = &mongodb_uri {
            if !uri.starts_with("mongodb://") && !uri.starts_with("mongodb+srv://") {
                return Err(ConfigError {
                    variable: "BRAIN_MONGODB_URI",
                    value: uri.clone(),
                    problem: "must start with mongodb:// or mongodb+srv://".to_owned(),
                });
            }
        }
        let database = env("BRAIN_MONGODB_DATABASE").unwrap_or_else(|| "vance".to_owned());
        if database.is_empty() || database.contains(['/', '\\', '.', ' ', '"', '$']) {
            return Err(ConfigError {
                variable: "BRAIN_MONGODB_DATABASE",
                value: database,
                problem: "not a valid MongoDB database name".to_owned(),
            });
        }
        let pod_id = env("BRAIN_POD_ID").unwrap_or_else(|| format!("brain-{:08x}", rand::random::<u32>()));
        if pod_id.is_empty() || pod_id.len() > 128 || pod_id.contains(['/', '|']) {
            return Err(ConfigError {
                variable: "BRAIN_POD_ID",
                value: pod_id,
                problem: "1 to 128 characters without '/' or '|'".into(),
            });
        }
        let advertised_endpoint = env("BRAIN_ADVERTISED_ENDPOINT");
        if let Some(e) = &advertised_endpoint {
            if !e.starts_with("http://") && !e.starts_with("https://") {
                return Err(ConfigError {
                    variable: "BRAIN_ADVERTISED_ENDPOINT",
                    value: e.clone(),
                    problem: "must be an http:// or https:// base URL".into(),
                });
            }
        }
        let internal_secret = match (env("BRAIN_INTERNAL_SECRET").filter(|s| !s.is_empty()), &mongodb_uri) {
            (Some(s), _) if s.len() < 16 => {
                return Err(ConfigError {
                    variable: "BRAIN_INTERNAL_SECRET",
                    value: "<redacted>".into(),
                    problem: "must be at least 16 characters".into(),
                });
            }
            (Some(s), _) => s,
            (None, Some(_)) => {
                return Err(ConfigError {
                    variable: "BRAIN_INTERNAL_SECRET",
                    value: String::new(),
                    problem: "required with MongoDB: pods authenticate each other with it".into(),
                });
            }
            (None, None) => format!("{:032x}", rand::random::<u128>()),
        };
        let internal_secret_generated = env("BRAIN_INTERNAL_SECRET").filter(|s| !s.is_empty()).is_none();
        let jwt_secret = env("BRAIN_JWT_SECRET").filter(|s| !s.is_empty());
        let heartbeat_interval = millis(&env, "BRAIN_HEARTBEAT_INTERVAL_MS", 5_000)?;
        let heartbeat_staleness = millis(&env, "BRAIN_HEARTBEAT_STALENESS_MS", 20_000)?;
        if heartbeat_staleness <= heartbeat_interval {
            return Err(ConfigError {
                variable: "BRAIN_HEARTBEAT_STALENESS_MS",
                value: heartbeat_staleness.as_millis().to_string(),
                problem: format!("must exceed the heartbeat interval ({} ms)", heartbeat_interval.as_millis()),
            });
        }
        Ok(BrainConfig {
            listen,
            mongodb_uri,
            database,
            pod_id,
            advertised_endpoint,
            internal_secret,
            internal_secret_generated,
            jwt_secret,
            heartbeat_interval,
            heartbeat_staleness,
            reap_interval: millis(&env, "VANCE_LEASE_REAP_INTERVAL_MS", 30_000)?,
            reconcile_safety: millis(&env, "VANCE_LEASE_RECONCILE_SAFETY_MS", 60_000)?,
            reconcile_settle: millis(&env, "VANCE_LEASE_RECONCILE_SETTLE_MS", 1_000)?,
            tex2pdf_url: match env("BRAIN_TEX2PDF_URL").filter(|u| !u.is_empty()) {
                Some(u) if !u.starts_with("http://") && !u.starts_with("https://") => {
                    return Err(ConfigError {
                        variable: "BRAIN_TEX2PDF_URL",
                        value: u,
                        problem: "must be an http:// or https:// URL".into(),
                    });
                }
                u => u,
            },
            tex2pdf_poll_interval: millis(&env, "BRAIN_TEX2PDF_POLL_MS", 1_000)?,
            mcp_idle_close: millis(&env, "BRAIN_MCP_IDLE_CLOSE_MS", 600_000)?,
        })
    }
}

fn parse_file(text: &str) -> Result<std::collections::BTreeMap<String, String>, ConfigError> {
    let file_error = |value: String, problem: String| ConfigError { variable: "config file", value, problem };
    let map: std::collections::BTreeMap<String, serde_yaml::Value> = if text.trim().is_empty() {
        Default::default()
    } else {
        serde_yaml::from_str(text).map_err(|e| file_error(String::new(), format!("not a YAML map of settings: {e}")))?
    };
    let mut values = std::collections::BTreeMap::new();
    for (key, value) in map {
        if !KEYS.iter().any(|(_, k)| *k == key) {
            let known: Vec<&str> = KEYS.iter().map(|(_, k)| *k).collect();
            return Err(file_error(key, format!("unknown key; known keys: {}", known.join(", "))));
        }
        let text = match value {
            serde_yaml::Value::String(s) => s,
            serde_yaml::Value::Number(n) => n.to_string(),
            serde_yaml::Value::Bool(b) => b.to_string(),
            _ => return Err(file_error(key, "must be a single value".to_owned())),
        };
        values.insert(key, text);
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| (*v).to_owned())
    }

    #[test]
    fn defaults_are_a_local_embedded_brain() {
        let c = BrainConfig::from_env(env(&[])).unwrap();
        assert_eq!(c.listen, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(c.mongodb_uri, None);
    }

    #[test]
    fn bad_values_name_variable_and_value() {
        let e = BrainConfig::from_env(env(&[("BRAIN_LISTEN", "localhost")])).unwrap_err();
        assert_eq!((e.variable, e.value.as_str()), ("BRAIN_LISTEN", "localhost"));
        let e = BrainConfig::from_env(env(&[("BRAIN_MONGODB_URI", "http://x")])).unwrap_err();
        assert_eq!(e.variable, "BRAIN_MONGODB_URI");
        let e = BrainConfig::from_env(env(&[("BRAIN_MONGODB_DATABASE", "a.b")])).unwrap_err();
        assert_eq!(e.variable, "BRAIN_MONGODB_DATABASE");
        let e = BrainConfig::from_env(env(&[("BRAIN_HEARTBEAT_INTERVAL_MS", "soon")])).unwrap_err();
        assert_eq!((e.variable, e.value.as_str()), ("BRAIN_HEARTBEAT_INTERVAL_MS", "soon"));
        let e = BrainConfig::from_env(env(&[("BRAIN_HEARTBEAT_STALENESS_MS", "100")])).unwrap_err();
        assert_eq!(e.variable, "BRAIN_HEARTBEAT_STALENESS_MS");
    }

    #[test]
    fn file_values_apply_and_the_environment_overrides_them() {
        let file = "listen: 127.0.0.1:9001\npod-id: from-file\nvance.lease.reap-interval-ms: 5000\n";
        let c = BrainConfig::load(Some(file), env(&[("BRAIN_POD_ID", "from-env")])).unwrap();
        assert_eq!(c.listen, "127.0.0.1:9001".parse().unwrap());
        assert_eq!(c.pod_id, "from-env");
        assert_eq!(c.reap_interval, Duration::from_millis(5000));
    }

    #[test]
    fn bad_file_keys_and_values_name_the_key() {
        let e = BrainConfig::load(Some("lissen: 1\n"), env(&[])).unwrap_err();
        assert_eq!((e.variable, e.value.as_str()), ("config file", "lissen"));
        let e = BrainConfig::load(Some("heartbeat-interval-ms: soon\n"), env(&[])).unwrap_err();
        assert_eq!((e.variable, e.value.as_str()), ("heartbeat-interval-ms", "soon"));
        let e = BrainConfig::load(Some("listen: [1, 2]\n"), env(&[])).unwrap_err();
        assert_eq!(e.value, "listen");
        assert!(BrainConfig::load(Some("listen: '127.0.0.1:1\n"), env(&[])).is_err());
    }

    #[test]
    fn mongodb_requires_an_internal_secret_and_never_echoes_it() {
        let e = BrainConfig::from_env(env(&[("BRAIN_MONGODB_URI", "mongodb://127.0.0.1:1")])).unwrap_err();
        assert_eq!(e.variable, "BRAIN_INTERNAL_SECRET");
        let e = BrainConfig::from_env(env(&[("BRAIN_INTERNAL_SECRET", "short-secret")])).unwrap_err();
        assert!(!e.to_string().contains("short-secret"), "{e}");
    }
}

//! The brain's configuration: environment variables, validated at start-up into an immutable struct.

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
    /// The remote tex2pdf compile service (`BRAIN_TEX2PDF_URL`); absent = the built-in test double.
    pub tex2pdf_url: Option<String>,
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
    /// Reads and validates the configuration from `env` (pass `|k| std::env::var(k).ok()` in production).
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
            jwt_secret,
            heartbeat_interval,
            heartbeat_staleness,
            reap_interval: millis(&env, "VANCE_LEASE_REAP_INTERVAL_MS", 30_000)?,
            reconcile_safety: millis(&env, "VANCE_LEASE_RECONCILE_SAFETY_MS", 60_000)?,
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
        })
    }
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
    fn mongodb_requires_an_internal_secret_and_never_echoes_it() {
        let e = BrainConfig::from_env(env(&[("BRAIN_MONGODB_URI", "mongodb://127.0.0.1:1")])).unwrap_err();
        assert_eq!(e.variable, "BRAIN_INTERNAL_SECRET");
        let e = BrainConfig::from_env(env(&[("BRAIN_INTERNAL_SECRET", "short-secret")])).unwrap_err();
        assert!(!e.to_string().contains("short-secret"), "{e}");
    }
}

//! The brain's configuration: environment variables, validated at start-up into an immutable struct.

use std::net::SocketAddr;

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
        Ok(BrainConfig { listen, mongodb_uri, database })
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
    }
}

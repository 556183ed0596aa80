//! The brain server binary, and the operator's token minting.
//!
//! `brain [--config FILE]` runs the server until SIGTERM or Ctrl-C; `brain mint-token --tenant T --user U` prints a
//! lease API token signed with the configured JWT secret. Configuration: the YAML file (also `BRAIN_CONFIG`) plus
//! environment overrides, see `lease_brain::config::KEYS`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use lease_brain::BrainConfig;
use lease_brain::auth::JwtKeys;
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(name = "brain", about = "The lease brain server")]
struct Cli {
    /// YAML config file (environment variables override its values).
    #[arg(long, env = "BRAIN_CONFIG", global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Prints a lease API bearer token for a tenant and user, signed with the configured JWT secret.
    MintToken {
        /// The tenant the token is bound to.
        #[arg(long)]
        tenant: String,
        /// The user (`sub`).
        #[arg(long)]
        user: String,
        /// Roles, comma separated (e.g. ADMIN).
        #[arg(long, value_delimiter = ',')]
        roles: Vec<String>,
        /// Validity in seconds.
        #[arg(long, default_value_t = 3600)]
        ttl_seconds: u64,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .init();
    let cli = Cli::parse();
    let file = match &cli.config {
        None => None,
        Some(path) => match std::fs::read_to_string(path) {
            Ok(text) => Some(text),
            Err(e) => {
                tracing::error!(path = %path.display(), error = %e, "cannot read the config file");
                return ExitCode::from(2);
            }
        },
    };
    let config = match BrainConfig::load(file.as_deref(), |k| std::env::var(k).ok()) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("invalid configuration: {e}");
            return ExitCode::from(2);
        }
    };
    match cli.command {
        Some(Command::MintToken { tenant, user, roles, ttl_seconds }) => {
            let Some(secret) = &config.jwt_secret else {
                tracing::error!("no JWT secret configured (BRAIN_JWT_SECRET or jwt-secret): nothing to sign with");
                return ExitCode::from(2);
            };
            println!("{}", JwtKeys::new(secret).mint(&tenant, &user, &roles, ttl_seconds));
            ExitCode::SUCCESS
        }
        None => match lease_brain::server::run(config, lease_brain::server::shutdown_signal()).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!("brain stopped: {e}");
                ExitCode::FAILURE
            }
        },
    }
}

//! Authentication: tenant-bound HS256 bearer JWTs for the lease API, and the internal shared secret for
//! pod-to-pod and operator calls (compared in constant time).

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;

/// The claims of a lease API token.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Claims {
    /// The user.
    pub sub: String,
    /// The tenant every operation is bound to.
    pub tenant: String,
    /// Roles, e.g. `ADMIN`.
    #[serde(default)]
    pub roles: Vec<String>,
    /// Expiry, seconds since the epoch.
    pub exp: u64,
}

/// Why a token was refused (all answer 401; the reason is logged, not returned in detail).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct AuthError(pub String);

/// Signs and verifies lease API tokens with one HS256 secret.
#[derive(Clone)]
pub struct JwtKeys {
    encoding: EncodingKey,
    decoding: DecodingKey,
}

impl std::fmt::Debug for JwtKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JwtKeys(..)")
    }
}

impl JwtKeys {
    /// Keys from the configured secret.
    pub fn new(secret: &str) -> Self {
        JwtKeys {
            encoding: EncodingKey::from_secret(secret.as_bytes()),
            decoding: DecodingKey::from_secret(secret.as_bytes()),
        }
    }

    /// Mints a token for `tenant` / `user` valid for `ttl_seconds` (the operator's `brain mint-token`).
    pub fn mint(&self, tenant: &str, user: &str, roles: &[String], ttl_seconds: u64) -> String {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let claims =
            Claims { sub: user.to_owned(), tenant: tenant.to_owned(), roles: roles.to_vec(), exp: now + ttl_seconds };
        // Encoding HS256 claims of plain strings cannot fail.
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &self.encoding).unwrap_or_default()
    }

    /// Verifies a bearer token: HS256 only, signature, expiry (no leeway), non-empty tenant and user.
    pub fn verify(&self, token: &str) -> Result<Claims, AuthError> {
        let mut validation = Validation::new(Algorithm::HS256);
        validation.leeway = 0;
        validation.set_required_spec_claims(&["exp"]);
        let data = jsonwebtoken::decode::<Claims>(token, &self.decoding, &validation)
            .map_err(|e| AuthError(format!("invalid token: {e}")))?;
        if data.claims.tenant.is_empty() || data.claims.sub.is_empty() {
            return Err(AuthError("token without tenant or user".to_owned()));
        }
        Ok(data.claims)
    }
}

/// Compares a presented internal secret with the configured one in constant time.
pub fn internal_secret_matches(presented: &str, configured: &str) -> bool {
    presented.as_bytes().ct_eq(configured.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minted_tokens_verify_and_carry_their_claims() {
        let keys = JwtKeys::new("s3cret");
        let c = keys.verify(&keys.mint("t1", "u1", &["ADMIN".into()], 60)).unwrap();
        assert_eq!((c.tenant.as_str(), c.sub.as_str(), c.roles.as_slice()), ("t1", "u1", &["ADMIN".to_owned()][..]));
    }

    #[test]
    fn wrong_signature_and_garbage_are_refused() {
        let token = JwtKeys::new("other").mint("t1", "u1", &[], 60);
        assert!(JwtKeys::new("s3cret").verify(&token).is_err());
        assert!(JwtKeys::new("s3cret").verify("not.a.token").is_err());
    }

    #[test]
    fn secrets_compare_exactly() {
        assert!(internal_secret_matches("abc", "abc"));
        assert!(!internal_secret_matches("abd", "abc"));
        assert!(!internal_secret_matches("ab", "abc"));
    }
}

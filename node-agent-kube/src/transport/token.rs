//! The bearer token, read from its file before every request.

use std::path::Path;

use super::error::TransportError;

/// `Bearer <token>` from the file, read now so that a rotated token is picked up.
pub(super) async fn read_token(
    endpoint: &'static str,
    path: &Path,
) -> Result<http::HeaderValue, TransportError> {
    let raw =
        tokio::fs::read_to_string(path)
            .await
            .map_err(|source| TransportError::ReadToken {
                endpoint,
                path: path.to_path_buf(),
                source,
            })?;
    let token = raw.trim();
    let bad = || TransportError::BadToken {
        endpoint,
        path: path.to_path_buf(),
    };
    if token.is_empty() {
        return Err(bad());
    }
    let mut value = http::HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| bad())?;
    value.set_sensitive(true);
    Ok(value)
}

//! The console's single sign-on: the OpenID Connect authorization code flow
//! with PKCE (S256), `state` and `nonce`, for a public client. [`begin`]
//! makes the provider's authorization URL and the secrets the callback
//! needs; [`finish`] exchanges the code and validates the ID token with the
//! same JWKS checks as access tokens, plus `aud` = the client and the nonce.

use oauth2::{CsrfToken, PkceCodeChallenge};

use crate::{Refusal, Validator, Verified, fetch};

/// One sign-in under way; kept by serve between the redirect and the
/// callback. `Debug` shows no secret.
#[derive(Clone)]
pub struct Login {
    /// Where the browser goes.
    pub url: String,
    /// The `state` the callback must carry.
    pub state: String,
    /// The `nonce` the ID token must carry.
    pub nonce: String,
    /// The PKCE verifier.
    pub verifier: String,
    /// The issuer signed in with.
    pub issuer: String,
    /// The redirect URI (the console's callback).
    pub redirect_uri: String,
    /// The client id.
    pub client_id: String,
}

impl std::fmt::Debug for Login {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Login")
            .field("issuer", &self.issuer)
            .field("redirect_uri", &self.redirect_uri)
            .finish_non_exhaustive()
    }
}

/// The scopes the console asks for.
pub const SCOPES: &str = "openid profile email groups";

/// A sign-in with `issuer` for client `client_id` returning to
/// `redirect_uri`.
pub async fn begin(
    validator: &Validator,
    issuer: &str,
    client_id: &str,
    redirect_uri: &str,
) -> Result<Login, Refusal> {
    let meta = validator.metadata(issuer).await?;
    let Some(endpoint) = &meta.authorization_endpoint else {
        return Err(Refusal::KeysUnavailable(format!(
            "{issuer}'s discovery document has no authorization_endpoint"
        )));
    };
    let (challenge, verifier) = PkceCodeChallenge::new_random_sha256();
    let state = CsrfToken::new_random().secret().clone();
    let nonce = CsrfToken::new_random().secret().clone();
    let mut url = url::Url::parse(endpoint)
        .map_err(|e| Refusal::KeysUnavailable(format!("authorization_endpoint: {e}")))?;
    url.query_pairs_mut()
        .append_pair("response_type", "code")
        .append_pair("client_id", client_id)
        .append_pair("redirect_uri", redirect_uri)
        .append_pair("scope", SCOPES)
        .append_pair("state", &state)
        .append_pair("nonce", &nonce)
        .append_pair("code_challenge", challenge.as_str())
        .append_pair("code_challenge_method", "S256");
    Ok(Login {
        url: url.into(),
        state,
        nonce,
        verifier: verifier.secret().clone(),
        issuer: issuer.to_owned(),
        redirect_uri: redirect_uri.to_owned(),
        client_id: client_id.to_owned(),
    })
}

/// A finished sign-in: what the ID token says, and the ID token itself
/// (for a later logout's `id_token_hint`; `Debug` does not show it).
#[derive(Clone)]
pub struct Finished {
    /// The validated ID token's claims.
    pub verified: Verified,
    /// The ID token.
    pub id_token: String,
}

impl std::fmt::Debug for Finished {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Finished")
            .field("verified", &self.verified)
            .finish_non_exhaustive()
    }
}

/// Exchanges `code` of `login` and validates the ID token.
pub async fn finish(validator: &Validator, login: &Login, code: &str) -> Result<Finished, String> {
    let meta = validator
        .metadata(&login.issuer)
        .await
        .map_err(|e| e.to_string())?;
    let Some(endpoint) = &meta.token_endpoint else {
        return Err(format!(
            "{}'s discovery document has no token_endpoint",
            login.issuer
        ));
    };
    let (status, answer) = fetch::post_form(
        &validator.http,
        endpoint,
        &[
            ("grant_type", "authorization_code"),
            ("code", code),
            ("redirect_uri", &login.redirect_uri),
            ("client_id", &login.client_id),
            ("code_verifier", &login.verifier),
        ],
        validator.options.max_document_bytes,
        validator.options.fetch_timeout,
    )
    .await?;
    if !status.is_success() {
        let error = answer
            .get("error")
            .and_then(|v| v.as_str())
            .unwrap_or("(no error code)");
        let description = answer
            .get("error_description")
            .and_then(|v| v.as_str())
            .unwrap_or("");
        return Err(format!(
            "the provider refused the code: {error} {description} (status {status})"
        ));
    }
    let Some(id_token) = answer.get("id_token").and_then(|v| v.as_str()) else {
        return Err(
            "the provider's token answer has no id_token; is \"openid\" among the client's scopes?"
                .into(),
        );
    };
    let verified = validator
        .validate_id_token(id_token, &login.issuer, &login.client_id, &login.nonce)
        .await
        .map_err(|e| format!("the ID token was refused ({}): {e}", e.cause()))?;
    Ok(Finished {
        verified,
        id_token: id_token.to_owned(),
    })
}

/// Where a browser goes to end its session at `issuer` too (OpenID Connect
/// RP-Initiated Logout 1.0): the discovery document's
/// `end_session_endpoint` with `client_id`, `id_token_hint` when known,
/// and `post_logout_redirect_uri`; `None` when the issuer offers no such
/// endpoint (or its discovery cannot be read: the logout goes on locally).
pub async fn end_session_url(
    validator: &Validator,
    issuer: &str,
    client_id: &str,
    id_token_hint: Option<&str>,
    post_logout_redirect_uri: &str,
) -> Option<String> {
    let meta = validator.metadata(issuer).await.ok()?;
    let mut url = url::Url::parse(meta.end_session_endpoint.as_deref()?).ok()?;
    if !matches!(url.scheme(), "https" | "http") {
        return None;
    }
    {
        let mut q = url.query_pairs_mut();
        q.append_pair("client_id", client_id);
        if let Some(hint) = id_token_hint {
            q.append_pair("id_token_hint", hint);
        }
        q.append_pair("post_logout_redirect_uri", post_logout_redirect_uri);
    }
    Some(url.into())
}

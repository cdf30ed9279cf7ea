//! Console logins: session ids (cookies), their CSRF tokens and one-time login codes, kept in the state store so a session outlives the serve that opened it.
//!
//! The store keeps only each session id's and code's SHA-256, never the
//! secret itself, and no bearer token: a session opened with a token holds
//! the token's id and the token is checked again (live, not revoked, not
//! expired) on every request, so revoking it ends the session at once.
//! Lifetimes are decided by the database's clock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use plugd_control::store::{Lifetime, LiveKind, LiveSessionStore, StoreError};
use serde_json::{Value, json};

/// A session unused this long is gone (the cookie's `Max-Age` too).
pub const IDLE_LIMIT: Duration = Duration::from_secs(12 * 3600);

/// A session is gone this long after its login, used or not.
pub const AGE_LIMIT: Duration = Duration::from_secs(7 * 24 * 3600);

/// A login code printed in a link is good once, for this long.
pub const CODE_LIFETIME: Duration = Duration::from_secs(10 * 60);

/// Sessions kept at most; a login beyond drops the least recently used.
pub const MAX_SESSIONS: u64 = 256;

/// How often a session in use is marked used in the store (its idle clock).
const TOUCH_EVERY: Duration = Duration::from_secs(60);

const LIFETIME: Lifetime = Lifetime {
    idle_ms: IDLE_LIMIT.as_millis() as i64,
    max_age_ms: Some(AGE_LIMIT.as_millis() as i64),
};

/// What a session stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Login {
    /// A bearer token, by its id; checked again on every request
    /// (revocation and expiry end the session at once).
    Token {
        /// The token's id (not its secret).
        id: String,
    },
    /// The serve owner, logged in by a one-time code (admin, like the
    /// socket's users); `name` is the user name.
    Owner {
        /// The Unix user name the code was minted for.
        name: String,
    },
    /// A single sign-on with an OpenID Connect issuer (plugd.yaml
    /// `auth.issuers`): its groups decide the role on every request, and
    /// the session ends when the ID token's `exp` passes.
    Oidc {
        /// The identity's name (`oidc:HOST/SUB`).
        name: String,
        /// The subject's groups, as the ID token said.
        groups: Vec<String>,
        /// The ID token's `exp`, Unix seconds: the session's end.
        expires_at: u64,
        /// The issuer signed in with (for the logout at its
        /// `end_session_endpoint`); `None` in sessions made before it was kept.
        issuer: Option<String>,
        /// The ID token's org claim (the issuer's `org_claim`), if any.
        org: Option<String>,
        /// The ID token's project claim (the issuer's `project_claim`), if any.
        project: Option<String>,
    },
}

/// The string member `key` of `data`, if there is one.
fn text(data: &Value, key: &str) -> Option<String> {
    data.get(key).and_then(Value::as_str).map(str::to_owned)
}

impl Login {
    fn owner(&self) -> String {
        match self {
            Login::Token { id } => format!("token-id:{id}"),
            Login::Owner { name } => format!("owner:{name}"),
            Login::Oidc { name, .. } => name.clone(),
        }
    }

    fn data(&self, csrf: &str) -> Value {
        match self {
            Login::Token { id } => json!({"login": "token", "token_id": id, "csrf": csrf}),
            Login::Owner { name } => json!({"login": "owner", "name": name, "csrf": csrf}),
            Login::Oidc {
                name,
                groups,
                expires_at,
                issuer,
                org,
                project,
            } => json!({"login": "oidc", "name": name, "groups": groups,
                        "expires_at": expires_at, "issuer": issuer, "org": org,
                        "project": project, "csrf": csrf}),
        }
    }

    fn from_data(data: &Value) -> Option<(Login, String)> {
        let csrf = data.get("csrf")?.as_str()?.to_owned();
        let login = match data.get("login")?.as_str()? {
            "token" => Login::Token {
                id: data.get("token_id")?.as_str()?.to_owned(),
            },
            "owner" => Login::Owner {
                name: data.get("name")?.as_str()?.to_owned(),
            },
            "oidc" => Login::Oidc {
                name: data.get("name")?.as_str()?.to_owned(),
                groups: data
                    .get("groups")?
                    .as_array()?
                    .iter()
                    .filter_map(|g| g.as_str().map(str::to_owned))
                    .collect(),
                expires_at: data.get("expires_at")?.as_u64()?,
                issuer: text(data, "issuer"),
                org: text(data, "org"),
                project: text(data, "project"),
            },
            _ => return None,
        };
        Some((login, csrf))
    }
}

/// A live session as a request sees it.
#[derive(Debug, Clone)]
pub struct Session {
    /// Who it is.
    pub login: Login,
    /// The token state-changing requests must echo in `X-Plugd-CSRF`.
    pub csrf: String,
}

/// Every console session and login code, in the state store.
pub struct Sessions {
    store: Arc<dyn LiveSessionStore>,
    /// When this serve last marked each session used in the store.
    touched: Mutex<HashMap<String, Instant>>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions").finish_non_exhaustive()
    }
}

/// 32 random bytes in hex; `None` when the OS cannot give randomness.
fn random_id() -> Option<String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).ok()?;
    Some(hex::encode(bytes))
}

/// Why a session or code could not be made.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The operating system gave no randomness.
    #[error("the operating system gave no randomness for a session id or login code")]
    NoRandomness,
    /// The state store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Sessions {
    /// Sessions kept in `store`.
    pub fn new(store: Arc<dyn LiveSessionStore>) -> Sessions {
        Sessions {
            store,
            touched: Mutex::new(HashMap::new()),
        }
    }

    fn touched(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.touched.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts a session for `login`: its id (the cookie's value) and CSRF
    /// token.
    pub async fn create(&self, login: Login) -> Result<(String, Session), SessionError> {
        let id = random_id().ok_or(SessionError::NoRandomness)?;
        let csrf = random_id().ok_or(SessionError::NoRandomness)?;
        self.store
            .live_sessions_sweep(LiveKind::Console, LIFETIME)
            .await?;
        self.store
            .live_session_put(
                LiveKind::Console,
                &id,
                &login.owner(),
                None,
                &login.data(&csrf),
            )
            .await?;
        self.store
            .live_sessions_trim(LiveKind::Console, MAX_SESSIONS)
            .await?;
        self.touched().insert(id.clone(), Instant::now());
        Ok((id, Session { login, csrf }))
    }

    /// The live session `id`, marked as used (in the store at most once per
    /// minute).
    pub async fn get(&self, id: &str) -> Result<Option<Session>, StoreError> {
        let Some(stored) = self
            .store
            .live_session_get(LiveKind::Console, id, LIFETIME)
            .await?
        else {
            self.touched().remove(id);
            return Ok(None);
        };
        let Some((login, csrf)) = Login::from_data(&stored.data) else {
            return Ok(None);
        };
        let due = {
            let mut t = self.touched();
            let due = t.get(id).is_none_or(|at| at.elapsed() >= TOUCH_EVERY);
            if due {
                if t.len() >= 4 * MAX_SESSIONS as usize {
                    t.clear();
                }
                t.insert(id.to_owned(), Instant::now());
            }
            due
        };
        if due {
            self.store.live_session_touch(LiveKind::Console, id).await?;
        }
        Ok(Some(Session { login, csrf }))
    }

    /// Ends session `id` (logout); whether it existed.
    pub async fn remove(&self, id: &str) -> Result<bool, StoreError> {
        self.touched().remove(id);
        self.store.live_session_delete(LiveKind::Console, id).await
    }

    /// A one-time login code for the serve owner `name`, good for
    /// [`CODE_LIFETIME`].
    pub async fn mint_code(&self, name: &str) -> Result<String, SessionError> {
        let code = random_id().ok_or(SessionError::NoRandomness)?;
        self.store
            .login_code_put(&code, name, CODE_LIFETIME.as_millis() as i64)
            .await?;
        Ok(code)
    }

    /// Spends `code`: the owner it was minted for, once, while it is fresh.
    pub async fn redeem_code(&self, code: &str) -> Result<Option<String>, StoreError> {
        self.store.login_code_redeem(code).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner() -> Login {
        Login::Owner {
            name: "alice".into(),
        }
    }

    fn sessions() -> Sessions {
        Sessions::new(Arc::new(plugd_store::Store::open_in_memory().unwrap()))
    }

    #[tokio::test]
    async fn a_session_is_found_by_its_id_until_it_is_removed() {
        let s = sessions();
        let (id, session) = s.create(owner()).await.unwrap();
        assert_eq!(id.len(), 64);
        assert_ne!(id, session.csrf);
        let got = s.get(&id).await.unwrap().unwrap();
        assert_eq!(got.csrf, session.csrf);
        assert_eq!(got.login, owner());
        assert!(s.get("nope").await.unwrap().is_none());
        assert!(s.remove(&id).await.unwrap());
        assert!(s.get(&id).await.unwrap().is_none());
        assert!(!s.remove(&id).await.unwrap());
    }

    #[tokio::test]
    async fn a_session_outlives_the_serve_that_opened_it() {
        let store: Arc<dyn LiveSessionStore> =
            Arc::new(plugd_store::Store::open_in_memory().unwrap());
        let (id, session) = Sessions::new(store.clone())
            .create(Login::Token {
                id: "0123456789abcdef".into(),
            })
            .await
            .unwrap();
        let again = Sessions::new(store).get(&id).await.unwrap().unwrap();
        assert_eq!(
            again.login,
            Login::Token {
                id: "0123456789abcdef".into()
            }
        );
        assert_eq!(again.csrf, session.csrf);
    }

    #[tokio::test]
    async fn sessions_are_bounded_and_the_least_recently_used_goes_first() {
        let store = Arc::new(plugd_store::Store::open_in_memory().unwrap());
        let s = Sessions::new(store.clone());
        let (first, _) = s.create(owner()).await.unwrap();
        let (second, _) = s.create(owner()).await.unwrap();
        // The first is used again: the second is now the least recent.
        std::thread::sleep(Duration::from_millis(5));
        store.live_session_touch(LiveKind::Console, &first).unwrap();
        for _ in 0..MAX_SESSIONS - 1 {
            std::thread::sleep(Duration::from_millis(1));
            s.create(owner()).await.unwrap();
        }
        assert!(
            s.get(&first).await.unwrap().is_some(),
            "used recently, kept"
        );
        assert!(
            s.get(&second).await.unwrap().is_none(),
            "least recently used, dropped"
        );
    }

    #[tokio::test]
    async fn a_code_is_good_once() {
        let s = sessions();
        let code = s.mint_code("alice").await.unwrap();
        assert_eq!(
            s.redeem_code(&code).await.unwrap().as_deref(),
            Some("alice")
        );
        assert_eq!(s.redeem_code(&code).await.unwrap(), None);
        assert_eq!(s.redeem_code("forged").await.unwrap(), None);
    }

    #[tokio::test]
    async fn codes_are_bounded() {
        let s = sessions();
        let first = s.mint_code("alice").await.unwrap();
        for _ in 0..plugd_control::store::live::MAX_CODES {
            std::thread::sleep(Duration::from_millis(1));
            s.mint_code("alice").await.unwrap();
        }
        assert_eq!(
            s.redeem_code(&first).await.unwrap(),
            None,
            "the oldest code was dropped"
        );
    }

    #[test]
    fn stored_data_holds_no_secret_but_the_csrf_token() {
        let data = Login::Token { id: "abc".into() }.data("csrf1");
        assert_eq!(
            data,
            json!({"login": "token", "token_id": "abc", "csrf": "csrf1"})
        );
        assert_eq!(
            Login::from_data(&data),
            Some((Login::Token { id: "abc".into() }, "csrf1".into()))
        );
        assert_eq!(
            Login::from_data(&json!({"login": "root", "csrf": "x"})),
            None
        );
    }
}

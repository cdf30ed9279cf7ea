//! Console logins held in serve's memory: session ids (cookies), their CSRF
//! tokens, and one-time login codes. Bounded and expiring; never on disk.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use zeroize::Zeroizing;

/// A session unused this long is gone (the cookie's `Max-Age` too).
pub const IDLE_LIMIT: Duration = Duration::from_secs(12 * 3600);

/// A session is gone this long after its login, used or not.
pub const AGE_LIMIT: Duration = Duration::from_secs(7 * 24 * 3600);

/// A login code printed in a link is good once, for this long.
pub const CODE_LIFETIME: Duration = Duration::from_secs(10 * 60);

/// Sessions kept at most; a login beyond drops the least recently used.
pub const MAX_SESSIONS: usize = 256;

/// Codes waiting at most; minting one beyond drops the oldest.
pub const MAX_CODES: usize = 16;

/// What a session stands for.
#[derive(Clone)]
pub enum Login {
    /// A bearer token, verified again on every request (revocation and
    /// expiry end the session at once).
    Token(Zeroizing<String>),
    /// The serve owner, logged in by a one-time code (admin, like the
    /// socket's users); `name` is the user name.
    Owner {
        /// The Unix user name the code was minted for.
        name: String,
    },
}

impl std::fmt::Debug for Login {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Login::Token(_) => f.write_str("Login::Token(••••)"),
            Login::Owner { name } => write!(f, "Login::Owner({name})"),
        }
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

struct Entry {
    session: Session,
    created: Instant,
    used: Instant,
}

struct Code {
    name: String,
    minted: Instant,
}

#[derive(Default)]
struct State {
    sessions: HashMap<String, Entry>,
    codes: HashMap<String, Code>,
}

/// Every console session and login code of one serve.
#[derive(Default)]
pub struct Sessions {
    state: Mutex<State>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.lock();
        f.debug_struct("Sessions")
            .field("sessions", &s.sessions.len())
            .field("codes", &s.codes.len())
            .finish()
    }
}

/// 32 random bytes in hex; `None` when the OS cannot give randomness.
fn random_id() -> Option<String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).ok()?;
    Some(hex::encode(bytes))
}

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts a session for `login`: its id (the cookie's value) and CSRF
    /// token. `None` only when the OS has no randomness to give.
    pub fn create(&self, login: Login) -> Option<(String, Session)> {
        let id = random_id()?;
        let session = Session {
            login,
            csrf: random_id()?,
        };
        let now = Instant::now();
        let mut s = self.lock();
        prune(&mut s, now);
        if s.sessions.len() >= MAX_SESSIONS {
            drop_oldest(&mut s.sessions, |e| e.used);
        }
        s.sessions.insert(
            id.clone(),
            Entry {
                session: session.clone(),
                created: now,
                used: now,
            },
        );
        Some((id, session))
    }

    /// The live session `id`, marked as used now.
    pub fn get(&self, id: &str) -> Option<Session> {
        let now = Instant::now();
        let mut s = self.lock();
        let entry = s.sessions.get_mut(id)?;
        if expired(entry, now) {
            s.sessions.remove(id);
            return None;
        }
        entry.used = now;
        Some(entry.session.clone())
    }

    /// Ends session `id` (logout); whether it existed.
    pub fn remove(&self, id: &str) -> bool {
        self.lock().sessions.remove(id).is_some()
    }

    /// How many sessions are live.
    pub fn len(&self) -> usize {
        let mut s = self.lock();
        prune(&mut s, Instant::now());
        s.sessions.len()
    }

    /// Whether no session is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A one-time login code for the serve owner `name`, good for
    /// [`CODE_LIFETIME`].
    pub fn mint_code(&self, name: &str) -> Option<String> {
        let code = random_id()?;
        let now = Instant::now();
        let mut s = self.lock();
        s.codes
            .retain(|_, c| now.duration_since(c.minted) < CODE_LIFETIME);
        if s.codes.len() >= MAX_CODES {
            drop_oldest(&mut s.codes, |c| c.minted);
        }
        s.codes.insert(
            code.clone(),
            Code {
                name: name.to_owned(),
                minted: now,
            },
        );
        Some(code)
    }

    /// Spends `code`: the owner it was minted for, once, while it is fresh.
    pub fn redeem_code(&self, code: &str) -> Option<String> {
        let c = self.lock().codes.remove(code)?;
        (c.minted.elapsed() < CODE_LIFETIME).then_some(c.name)
    }
}

/// Removes the entry of `map` whose `at` is earliest.
fn drop_oldest<V>(map: &mut HashMap<String, V>, at: impl Fn(&V) -> Instant) {
    if let Some(oldest) = map
        .iter()
        .min_by_key(|(_, v)| at(v))
        .map(|(k, _)| k.clone())
    {
        map.remove(&oldest);
    }
}

fn expired(e: &Entry, now: Instant) -> bool {
    now.duration_since(e.used) >= IDLE_LIMIT || now.duration_since(e.created) >= AGE_LIMIT
}

fn prune(s: &mut State, now: Instant) {
    s.sessions.retain(|_, e| !expired(e, now));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner() -> Login {
        Login::Owner {
            name: "alice".into(),
        }
    }

    #[test]
    fn a_session_is_found_by_its_id_until_it_is_removed() {
        let s = Sessions::default();
        let (id, session) = s.create(owner()).unwrap();
        assert_eq!(id.len(), 64);
        assert_ne!(id, session.csrf);
        assert_eq!(s.get(&id).unwrap().csrf, session.csrf);
        assert!(s.get("nope").is_none());
        assert!(s.remove(&id));
        assert!(s.get(&id).is_none());
        assert!(!s.remove(&id));
    }

    #[test]
    fn sessions_are_bounded_and_the_least_recently_used_goes_first() {
        let s = Sessions::default();
        let (first, _) = s.create(owner()).unwrap();
        let (second, _) = s.create(owner()).unwrap();
        // The first is used again: the second is now the least recent.
        std::thread::sleep(Duration::from_millis(2));
        assert!(s.get(&first).is_some());
        for _ in 0..MAX_SESSIONS - 1 {
            s.create(owner()).unwrap();
        }
        assert_eq!(s.len(), MAX_SESSIONS);
        assert!(s.get(&first).is_some(), "used recently, kept");
        assert!(s.get(&second).is_none(), "least recently used, dropped");
    }

    #[test]
    fn a_code_is_good_once() {
        let s = Sessions::default();
        let code = s.mint_code("alice").unwrap();
        assert_eq!(s.redeem_code(&code).as_deref(), Some("alice"));
        assert_eq!(s.redeem_code(&code), None);
        assert_eq!(s.redeem_code("forged"), None);
    }

    #[test]
    fn codes_are_bounded() {
        let s = Sessions::default();
        let first = s.mint_code("alice").unwrap();
        for _ in 0..MAX_CODES {
            s.mint_code("alice").unwrap();
        }
        assert_eq!(s.redeem_code(&first), None, "the oldest code was dropped");
    }

    #[test]
    fn a_token_never_shows_in_debug_output() {
        let login = Login::Token(Zeroizing::new("plugd_secret".into()));
        assert!(!format!("{login:?}").contains("plugd_secret"));
    }
}

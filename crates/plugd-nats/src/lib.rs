//! plugd's cluster transport on NATS: the bus across the nodes of one cluster ([`NatsBus`]), approval pins in the Object Store ([`NatsPinBlobs`]), and a throw-away nats-server for tests (`test_nats`, feature `test-util`).
//!
//! PostgreSQL is the truth; NATS carries nothing that cannot be rebuilt from
//! it. The node wires this crate in (a [`plugd_host::bus::Bus`] trait
//! object); the runtime does not import it.

pub mod bus;
pub mod envelope;
pub mod forward;
pub mod pins;
#[cfg(feature = "test-util")]
pub mod test_nats;

pub use bus::{BusStats, NatsBus};
pub use forward::NatsForwarder;
pub use pins::NatsPinBlobs;

/// `url` without its user information (`nats://user:secret@host:4222` →
/// `nats://…@host:4222`), for logs and errors.
pub fn redact_url(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => match rest.rsplit_once('@') {
            Some((_, host)) => format!("{scheme}://…@{host}"),
            None => url.to_owned(),
        },
        None => url
            .rsplit_once('@')
            .map_or_else(|| url.to_owned(), |(_, h)| format!("…@{h}")),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn credentials_never_reach_a_log_line() {
        assert_eq!(
            super::redact_url("nats://u:s3cret@h:4222"),
            "nats://…@h:4222"
        );
        assert_eq!(super::redact_url("nats://h:4222"), "nats://h:4222");
        assert_eq!(super::redact_url("tok@h"), "…@h");
    }
}

/// What can go wrong talking to NATS.
#[derive(Debug, thiserror::Error)]
pub enum NatsError {
    /// The server could not be reached or refused the connection.
    #[error("cannot connect to NATS at {url}: {source}")]
    Connect {
        /// The server's URL (without credentials).
        url: String,
        /// Why.
        source: async_nats::ConnectError,
    },
    /// A subscription was refused.
    #[error("cannot subscribe to {subject:?} on NATS: {source}")]
    Subscribe {
        /// The subject.
        subject: String,
        /// Why.
        source: async_nats::SubscribeError,
    },
}

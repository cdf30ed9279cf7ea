//! The channel counters of `GET /metrics`: one family per counter of
//! `plugd_runtime::channels::ChannelStats`, labelled by channel kind.

use std::collections::BTreeMap;

use plugd_runtime::channels::ChannelStats;

/// One family: name, help, and the counter it reads.
type Family = (&'static str, &'static str, fn(&ChannelStats) -> u64);

/// Appends the channel families to a Prometheus text body.
pub(crate) fn metrics(out: &mut String, stats: &BTreeMap<String, ChannelStats>) {
    let families: [Family; 6] = [
        (
            "plugd_channel_inbound_total",
            "Inbound events received on plugin.inbound.KIND.",
            |s| s.received,
        ),
        (
            "plugd_channel_replies_total",
            "Replies sent with channel.send_outbound.",
            |s| s.replied,
        ),
        (
            "plugd_channel_blocked_total",
            "Inbound messages blocked by a hook.",
            |s| s.blocked,
        ),
        (
            "plugd_channel_unhandled_total",
            "Inbound messages not handled (no llm: section).",
            |s| s.unhandled,
        ),
        (
            "plugd_channel_failed_total",
            "Malformed inbound events, failed turns and failed replies.",
            |s| s.failed,
        ),
        (
            "plugd_channel_shed_total",
            "Inbound events shed because the inbound queue was full.",
            |s| s.shed,
        ),
    ];
    for (name, help, get) in families {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} counter\n"));
        for (kind, s) in stats {
            out.push_str(&format!(
                "{name}{{kind=\"{}\"}} {}\n",
                crate::bus::label(kind),
                get(s)
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_are_labelled_by_kind() {
        let mut stats = BTreeMap::new();
        stats.insert(
            "web\"hook".to_owned(),
            ChannelStats {
                received: 3,
                replied: 2,
                blocked: 1,
                unhandled: 0,
                failed: 0,
                shed: 0,
            },
        );
        let mut out = String::new();
        metrics(&mut out, &stats);
        assert!(out.contains("# TYPE plugd_channel_inbound_total counter\n"));
        assert!(
            out.contains("plugd_channel_inbound_total{kind=\"web\\\"hook\"} 3\n"),
            "{out}"
        );
        assert!(out.contains("plugd_channel_replies_total{kind=\"web\\\"hook\"} 2\n"));
        assert!(out.contains("plugd_channel_blocked_total{kind=\"web\\\"hook\"} 1\n"));
    }
}

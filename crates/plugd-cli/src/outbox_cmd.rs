//! `plugd events emit`, `plugd outbox list|retry` (the outbox worker runs in serve: `plugd-node`).

use anyhow::{Context, Result, bail};
use clap::Subcommand;
use plugd_runtime::Runtime;
use plugd_runtime::outbox::OutboxExt;
use plugd_store::outbox::{Delivery, DeliveryStatus, RetryOutcome};
use serde_json::{Value, json};

/// `plugd events …`.
#[derive(Subcommand, Debug)]
pub enum EventsCmd {
    /// Record a semantic event (e.g. run.completed) for every subscribed VAI
    /// hook export and print the delivery ids as a JSON array; `plugd serve`
    /// delivers them.
    Emit {
        /// Event type, e.g. run.completed, chain.compacted, session.created, tool.completed.
        #[arg(value_name = "TYPE")]
        event_type: String,
        /// The event's summary, a JSON object.
        #[arg(long, default_value = "{}", value_name = "JSON")]
        payload: String,
        /// The event's subject, a JSON object (default: {"kind": "cli"}).
        #[arg(long, value_name = "JSON")]
        subject: Option<String>,
    },
}

/// `plugd outbox …`.
#[derive(Subcommand, Debug)]
pub enum OutboxCmd {
    /// List hook deliveries: id, delivery id, export, event, attempt, status,
    /// next attempt, last error.
    List {
        /// Only dead letters.
        #[arg(long)]
        dead: bool,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Move a dead letter back to pending with a fresh attempt budget.
    Retry {
        /// Row id or delivery id (del_…), as `plugd outbox list` shows them.
        id: String,
    },
}

fn object(flag: &str, text: &str) -> Result<Value> {
    let v: Value = serde_json::from_str(text)
        .with_context(|| format!("{flag} is not valid JSON: {text:?}"))?;
    if !v.is_object() {
        bail!("{flag} must be a JSON object, got {v}");
    }
    Ok(v)
}

/// Runs `plugd events …`.
pub async fn events(rt: &Runtime, cmd: &EventsCmd) -> Result<()> {
    match cmd {
        EventsCmd::Emit {
            event_type,
            payload,
            subject,
        } => {
            let summary = object("--payload", payload)?;
            let subject = match subject {
                Some(s) => object("--subject", s)?,
                None => json!({"kind": "cli"}),
            };
            let ids = rt.emit(event_type, subject, summary).await?;
            if ids.is_empty() {
                tracing::info!(event_type, "no hook export subscribes to this event type");
            }
            println!("{}", serde_json::to_string(&ids)?);
        }
    }
    Ok(())
}

/// Runs `plugd outbox …`.
pub async fn outbox(rt: &Runtime, cmd: &OutboxCmd) -> Result<()> {
    let store = rt.state();
    match cmd {
        OutboxCmd::List { dead, json } => {
            let rows = store
                .outbox_list(dead.then_some(DeliveryStatus::Dead))
                .await?;
            if *json {
                println!("{}", serde_json::to_string(&rows)?);
            } else {
                print_table(&rows, *dead);
            }
        }
        OutboxCmd::Retry { id } => match store.outbox_retry(id).await? {
            RetryOutcome::Retried(d) => println!(
                "delivery {} ({}) is pending again with a fresh budget of attempts; `plugd serve` delivers it",
                d.id, d.delivery_id
            ),
            RetryOutcome::NotFound => {
                bail!("no outbox delivery {id:?}; `plugd outbox list` shows the ids")
            }
            RetryOutcome::NotDead(d) => bail!(
                "outbox delivery {id:?} is {}, not dead; only dead letters (`plugd outbox list --dead`) can be retried",
                d.status.as_str()
            ),
        },
    }
    Ok(())
}

fn print_table(rows: &[Delivery], dead: bool) {
    if rows.is_empty() {
        println!(
            "{}",
            if dead {
                "no dead letters"
            } else {
                "no hook deliveries in the outbox"
            }
        );
        return;
    }
    let export = |d: &Delivery| format!("{}/{}", d.plugin_id, d.export_id);
    let w = rows
        .iter()
        .map(|d| export(d).len())
        .max()
        .unwrap_or(6)
        .max(6);
    let e = rows
        .iter()
        .map(|d| d.event_type.len())
        .max()
        .unwrap_or(5)
        .max(5);
    println!(
        "{:>4}  {:20}  {:w$}  {:e$}  {:>7}  {:9}  {:20}  LAST ERROR",
        "ID", "DELIVERY", "EXPORT", "EVENT", "ATTEMPT", "STATUS", "NEXT ATTEMPT"
    );
    for d in rows {
        let error: String = d
            .last_error
            .as_deref()
            .unwrap_or("-")
            .replace('\n', " ")
            .chars()
            .take(120)
            .collect();
        println!(
            "{:>4}  {:20}  {:w$}  {:e$}  {:>7}  {:9}  {:20}  {error}",
            d.id,
            d.delivery_id.0,
            export(d),
            d.event_type,
            d.attempt,
            d.status.as_str(),
            d.next_attempt_at.as_deref().unwrap_or("-"),
        );
    }
}

//! plugd-nats against a real nats-server: the bus across nodes, hand-offs between nodes, approval pins in the Object Store.

mod bus;
mod forward;
mod pins;

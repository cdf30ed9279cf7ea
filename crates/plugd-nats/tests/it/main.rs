//! plugd-nats against a real nats-server: the bus across nodes, approval pins in the Object Store.

mod bus;
mod pins;

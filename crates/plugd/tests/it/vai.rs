//! vai dialect: real plugins of this contract through the runtime and the CLI.

//! autoapproval: a Kubernetes-native controller that auto-approves contract
//! requests kept in PostgreSQL.

pub mod approval;
pub mod bench;
pub mod cleanser;
pub mod cli;
pub mod clock;
pub mod controller;
pub mod coordination;
pub mod demo;
pub mod domain;
pub mod endpoints;
pub mod external;
pub mod processors;
pub mod retry;
pub mod sim;
pub mod stack;
pub mod store;
pub mod telemetry;

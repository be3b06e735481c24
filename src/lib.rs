//! autoapproval: a Kubernetes-native controller that auto-approves contract
//! requests kept in PostgreSQL or MySQL/MariaDB. This crate is what ships:
//! the `autoapproval` binary (`run`, `migrate`, `crd`, `request`, `shadow-report`) and the
//! library it is built from. The simulator, the lab and the test API server
//! are crates of their own under `crates/`, never normal dependencies of
//! this one.
#![warn(missing_docs)]

pub mod approval;
pub mod census;
pub mod cleanser;
pub mod cli;
pub mod clock;
pub mod controller;
pub mod coordination;
pub mod db;
pub mod domain;
pub mod endpoints;
pub mod events;
pub mod external;
pub mod flags;
pub mod operator;
pub mod outage;
pub mod processors;
pub mod retry;
pub mod shadow;
pub mod shutdown;
pub mod telemetry;
pub mod traces;
pub mod vocabulary;

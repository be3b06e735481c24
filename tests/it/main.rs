//! The integration tests, one binary: a module per area.

mod binary;
mod business;
mod candidates;
mod census;
mod chain;
mod claims;
mod cleanser;
mod controller;
mod deploy;
mod external;
mod fencing;
mod helm;
mod image;
mod inputs;
mod malformed;
mod manual;
mod migrate;
mod mysql;
mod one_chain;
mod real_faults;
mod real_server;
mod replica_lag;
mod replicas;
mod retry;
mod support;
mod traces;

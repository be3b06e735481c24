//! Integration tests for kube-testserver, one module per area. The behaviour tests run on
//! both the in-memory server and the real kube-apiserver (`server::on_both_servers!`); the
//! fault-injection tests, which the real server cannot serve, on the in-memory one only.

mod server;

mod faults;
mod fidelity;
mod kube_rs;
mod kubectl;
mod protobuf;

//! Integration tests for kube-testserver, one module per area.

mod faults;
mod kube_rs;
mod kubectl;
mod protobuf;

//! Integration tests for kube-testserver, one module per area.

mod kube_rs;
mod kubectl;

//! Integration tests for kube-testserver, one module per area.

mod kubectl;

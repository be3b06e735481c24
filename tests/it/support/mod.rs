//! What the integration tests share; test modules import only from here,
//! never from each other.
//!
//! - `db`: the test's database on PostgreSQL or MariaDB/MySQL, `on_both!`, and `on_both_servers!`
//!   (each database on the test API server and on the real kube-apiserver);
//! - `engine`: an approver, the simulator and a manual clock over the test's database;
//! - `rows`: request and state rows as the business system and earlier attempts leave them;
//! - `chart`: the chart rendered by `helm template`, its values schema and the Role's grants;
//! - `cluster`: the test API server (or the real one), the simulator and one replica in this process;
//! - `control_plane`: the real kube-apiserver and etcd, a namespace per test with the chart's RBAC;
//! - `kubelet`: the Job controller and kubelet the tests play, the replica as the pod's ServiceAccount;
//! - `processes`: the real binary as a child process, signals, `/metrics`, a fresh directory and
//!   kubeconfig for it;
//! - `tls`: a CA the test makes, certificates it signs, files written as the kubelet writes a
//!   Secret's, and the simulator over HTTPS;
//! - `tls_db`: a CA the test makes, its certificates, and dedicated PostgreSQL and MariaDB servers
//!   that speak only TLS;
//! - `tools`: the real kubectl and helm against one test API server.

pub mod chart;
pub mod cluster;
pub mod control_plane;
pub mod db;
pub mod engine;
pub mod kubelet;
pub mod processes;
pub mod rows;
pub mod tls;
pub mod tls_db;
pub mod tools;

pub use chart::*;
pub use cluster::*;
pub use control_plane::*;
pub use db::*;
pub use engine::*;
pub use kubelet::*;
pub use processes::*;
pub use rows::*;
pub use tls_db::*;
pub use tools::*;

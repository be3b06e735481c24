//! The lab: the demo, the benchmark and the seed's two designs as
//! baselines, all on a throwaway stack (a PostgreSQL of its own, the test
//! API server, the simulator, replicas as child processes). The replicas of
//! "ours" run the shipped `autoapproval` binary, so what is measured is what
//! ships; nothing here is linked into it.
#![warn(missing_docs)]

pub mod bench;
pub mod cli;
pub mod demo;
pub mod harness;
pub mod stack;

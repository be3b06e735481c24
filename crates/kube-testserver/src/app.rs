//! The server's shared state, owned by the router and handed to every
//! handler and watch stream.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use parking_lot::Mutex;

use crate::faults::Faults;
use crate::store::Store;

/// Shared server state: what every handler and watch stream reads and writes.
pub struct App {
    /// Objects, types and the event log.
    pub store: Mutex<Store>,
    /// Fault injection.
    pub faults: Faults,
    /// How often watches with allowWatchBookmarks get a BOOKMARK.
    pub bookmark_interval: Duration,
    /// host:port the server listens on.
    pub addr: String,
    /// Requests served so far, by verb and resource ("create autoapprovals").
    pub requests: Mutex<BTreeMap<String, u64>>,
    /// What each client (by User-Agent) did, as RBAC sees it.
    pub access: Mutex<BTreeMap<String, BTreeSet<Access>>>,
}

/// One request as an RBAC rule matches it: API group, resource (with its
/// subresource, `autoapprovals/status`) and verb.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Access {
    /// The API group; empty for the core group.
    pub group: String,
    /// The resource plural, `/subresource` appended when there is one.
    pub resource: String,
    /// The RBAC verb: get, list, watch, create, update, patch, delete, deletecollection.
    pub verb: String,
}

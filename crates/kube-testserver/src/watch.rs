//! Watch streams: replay from a resourceVersion, initial events, bookmarks, timeouts and forced closes.

use crate::app::App;
use crate::error::ApiError;
use crate::resources::ResourceType;
use crate::selector::{FieldSelector, LabelSelector};
use crate::store::Event;
use crate::table;
use axum::body::Body;
use bytes::Bytes;
use serde_json::{Value, json};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;

/// Parameters of one watch request.
pub struct WatchParams {
    /// Resource type.
    pub rt: ResourceType,
    /// Requested version.
    pub version: String,
    /// Namespace filter.
    pub ns: Option<String>,
    /// Label selector.
    pub labels: LabelSelector,
    /// Field selector.
    pub fields: FieldSelector,
    /// Start point: None = current state first (unset or "0").
    pub rv: Option<u64>,
    /// sendInitialEvents=true.
    pub send_initial: bool,
    /// allowWatchBookmarks=true.
    pub bookmarks: bool,
    /// timeoutSeconds.
    pub timeout: Duration,
    /// Table output with this includeObject mode.
    pub table: Option<String>,
    /// Length-delimited protobuf frames instead of JSON lines.
    pub protobuf: bool,
}

impl WatchParams {
    fn matches(&self, ns: &str, obj: &Value) -> bool {
        self.ns.as_deref().is_none_or(|n| n == ns)
            && self.labels.matches(obj)
            && self.fields.matches(obj)
    }
    fn line(&self, type_: &str, obj: &Value) -> Bytes {
        let mut o = obj.clone();
        if o.get("kind").and_then(Value::as_str) != Some("Status") {
            o["apiVersion"] = json!(self.rt.api_version(&self.version));
            o["kind"] = json!(self.rt.kind);
        }
        if let Some(inc) = &self.table
            && type_ != "ERROR"
            && type_ != "BOOKMARK"
        {
            let rv = o
                .pointer("/metadata/resourceVersion")
                .cloned()
                .unwrap_or(Value::Null);
            o = table::table(
                &self.rt,
                &self.version,
                &[o],
                inc,
                json!({"resourceVersion": rv}),
            );
        }
        if self.protobuf {
            match crate::protobuf::watch_frame(type_, &o) {
                Ok(frame) => return Bytes::from(frame),
                // The stream's media type is fixed by now: a frame that cannot be encoded ends
                // the watch as a closed stream would, and the client lists and watches again.
                Err(e) => {
                    tracing::warn!(error = %e, "watch event does not fit its protobuf message");
                    return Bytes::new();
                }
            }
        }
        let mut s = json!({"type": type_, "object": o}).to_string();
        s.push('\n');
        Bytes::from(s)
    }
    fn bookmark(&self, rv: u64, initial_end: bool) -> Bytes {
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        self.line("BOOKMARK", &json!({"kind": self.rt.kind, "apiVersion": self.rt.api_version(&self.version), "metadata": meta}))
    }
}

/// Starts a watch and returns the streaming body.
pub fn start(app: Arc<App>, p: WatchParams) -> Body {
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(256);
    let mut close = app.faults.close_signal();
    close.mark_unchanged();
    let (initial, captured, sub) = {
        let st = app.store.lock();
        let key = p.rt.key();
        let sub = st.tx.subscribe();
        match p.rv {
            Some(rv) => match st.events_since(&key, rv) {
                Ok(evs) => {
                    let mut lines = vec![];
                    if p.send_initial {
                        for o in st.list(&p.rt, p.ns.as_deref()) {
                            let ns = crate::util::s(&o, "/metadata/namespace").to_string();
                            if p.matches(&ns, &o) {
                                lines.push(p.line("ADDED", &o));
                            }
                        }
                    } else {
                        for e in evs {
                            if p.matches(&e.namespace, &e.object) {
                                lines.push(p.line(e.type_, &e.object));
                            }
                        }
                    }
                    (Ok(lines), st.rv, sub)
                }
                Err(e) => (Err(e), st.rv, sub),
            },
            None => {
                let mut lines = vec![];
                for o in st.list(&p.rt, p.ns.as_deref()) {
                    let ns = crate::util::s(&o, "/metadata/namespace").to_string();
                    if p.matches(&ns, &o) {
                        lines.push(p.line("ADDED", &o));
                    }
                }
                (Ok(lines), st.rv, sub)
            }
        }
    };
    let bookmark_every = app.bookmark_interval;
    let app2 = app.clone();
    tokio::spawn(async move {
        let mut sub = sub;
        let lines = match initial {
            Ok(l) => l,
            Err(e) => {
                let _ = tx.send(Ok(p.line("ERROR", &e.status_body()))).await;
                return;
            }
        };
        for l in lines {
            if tx.send(Ok(l)).await.is_err() {
                return;
            }
        }
        if p.send_initial && p.bookmarks && tx.send(Ok(p.bookmark(captured, true))).await.is_err() {
            return;
        }
        let deadline = tokio::time::Instant::now() + p.timeout;
        let mut ticker = tokio::time::interval(bookmark_every);
        ticker.tick().await;
        let mut last = captured;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => return,
                _ = close.changed() => return,
                _ = tx.closed() => return,
                _ = ticker.tick(), if p.bookmarks => {
                    let rv = app2.store.lock().rv;
                    loop {
                        match sub.try_recv() {
                            Ok(e) => if !send_event(&p, &tx, &e, &mut last).await { return },
                            Err(broadcast::error::TryRecvError::Empty) => break,
                            Err(_) => return,
                        }
                    }
                    let rv = rv.max(last);
                    if tx.send(Ok(p.bookmark(rv, false))).await.is_err() { return; }
                }
                r = sub.recv() => match r {
                    Ok(e) => if !send_event(&p, &tx, &e, &mut last).await { return },
                    Err(_) => return,
                },
            }
        }
    });
    Body::from_stream(ReceiverStream::new(rx))
}

async fn send_event(
    p: &WatchParams,
    tx: &mpsc::Sender<Result<Bytes, Infallible>>,
    e: &Arc<Event>,
    last: &mut u64,
) -> bool {
    if e.rv <= *last || e.key != p.rt.key() {
        return true;
    }
    *last = e.rv;
    if !p.matches(&e.namespace, &e.object) {
        return true;
    }
    tx.send(Ok(p.line(e.type_, &e.object))).await.is_ok()
}

/// Parses a resourceVersion parameter ("" and "0" mean "any").
pub fn parse_rv(s: Option<&String>) -> Result<Option<u64>, ApiError> {
    match s.map(String::as_str) {
        None | Some("") | Some("0") => Ok(None),
        Some(x) => x
            .parse::<u64>()
            .map(Some)
            .map_err(|_| ApiError::bad_request(format!("invalid resource version: {x}"))),
    }
}

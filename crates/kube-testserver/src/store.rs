//! In-memory object storage with a cluster-wide resourceVersion and a bounded event log for watches.

use crate::error::{ApiError, ApiResult, Cause, What};
use crate::patch;
use crate::resources::{self, Flavor, ResKey, ResourceType};
use crate::util::{self, s};
use crate::validation;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use tokio::sync::broadcast;

/// One change, as kept in the event log and sent to watchers.
#[derive(Debug)]
pub struct Event {
    /// resourceVersion of the change.
    pub rv: u64,
    /// Resource type.
    pub key: ResKey,
    /// Namespace ("" for cluster-scoped).
    pub namespace: String,
    /// ADDED, MODIFIED or DELETED.
    pub type_: &'static str,
    /// The object after the change (for DELETED, the last state).
    pub object: Value,
}

type ObjKey = (String, String);

/// The whole cluster state.
pub struct Store {
    /// Last resourceVersion handed out.
    pub rv: u64,
    /// Served resource types.
    pub types: BTreeMap<ResKey, ResourceType>,
    objects: HashMap<ResKey, BTreeMap<ObjKey, Value>>,
    log: VecDeque<Arc<Event>>,
    window: usize,
    /// Events with rv <= compacted are no longer retained.
    pub compacted: u64,
    /// Live event feed.
    pub tx: broadcast::Sender<Arc<Event>>,
}

/// Who is writing, for managedFields.
#[derive(Debug, Clone, Default)]
pub struct WriteCtx {
    /// fieldManager (or derived from the user agent).
    pub manager: String,
    /// Dry run: validate but do not persist.
    pub dry_run: bool,
    /// Server-side apply already computed managedFields: store them as given.
    pub fields_applied: bool,
}

fn what(rt: &ResourceType) -> What<'_> {
    What {
        group: &rt.group,
        plural: &rt.plural,
        kind: &rt.kind,
    }
}

fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 253
        && n.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && n.starts_with(|c: char| c.is_ascii_alphanumeric())
        && n.ends_with(|c: char| c.is_ascii_alphanumeric())
}

fn without_meta_status(v: &Value) -> Value {
    let mut c = v.clone();
    if let Some(m) = c.as_object_mut() {
        m.remove("metadata");
        m.remove("status");
        m.remove("apiVersion");
        m.remove("kind");
    }
    c
}

fn comparable(v: &Value) -> Value {
    let mut c = v.clone();
    if let Some(m) = c.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
        if let Some(mf) = m.get_mut("managedFields").and_then(Value::as_array_mut) {
            for e in mf {
                if let Some(e) = e.as_object_mut() {
                    e.remove("time");
                }
            }
        }
    }
    if let Some(m) = c.as_object_mut() {
        m.remove("apiVersion");
    }
    c
}

impl Store {
    /// A store with the built-in types and the `default` and `kube-system` namespaces.
    pub fn new(window: usize) -> Self {
        let (tx, _) = broadcast::channel(16384);
        let mut st = Store {
            rv: 0,
            types: BTreeMap::new(),
            objects: HashMap::new(),
            log: VecDeque::new(),
            window: window.max(1),
            compacted: 0,
            tx,
        };
        for rt in resources::builtins() {
            st.types.insert(rt.key(), rt);
        }
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            let obj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
            let rt = st.types.get(&(String::new(), "namespaces".into())).cloned();
            if let Some(rt) = rt {
                let _ = st.create(
                    &rt,
                    "v1",
                    "",
                    obj,
                    &WriteCtx {
                        manager: "kube-apiserver".into(),
                        dry_run: false,
                        fields_applied: false,
                    },
                );
            }
        }
        st
    }

    /// Sets how many events the watch log retains.
    pub fn set_window(&mut self, window: usize) {
        self.window = window.max(1);
        self.trim();
    }

    fn trim(&mut self) {
        while self.log.len() > self.window {
            if let Some(e) = self.log.pop_front() {
                self.compacted = e.rv;
            }
        }
    }

    /// Finds a resource type by group and plural/kind/short name (as in a URL, plural).
    pub fn find_type(&self, group: &str, version: &str, plural: &str) -> Option<&ResourceType> {
        self.types
            .get(&(group.to_string(), plural.to_string()))
            .filter(|rt| rt.versions.iter().any(|v| v == version))
    }

    /// Events after `rv` (exclusive) for a resource type, or 410 if they are no longer retained.
    pub fn events_since(&self, key: &ResKey, rv: u64) -> ApiResult<Vec<Arc<Event>>> {
        if rv < self.compacted {
            return Err(ApiError::expired(format!(
                "too old resource version: {rv} ({})",
                self.compacted + 1
            )));
        }
        Ok(self
            .log
            .iter()
            .filter(|e| e.rv > rv && e.key == *key)
            .cloned()
            .collect())
    }

    /// Whether a resourceVersion is still in the retained window.
    pub fn rv_retained(&self, rv: u64) -> bool {
        rv >= self.compacted
    }

    fn commit(
        &mut self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        mut obj: Value,
        type_: &'static str,
    ) -> Value {
        self.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        let key = rt.key();
        let objs = self.objects.entry(key.clone()).or_default();
        if type_ == "DELETED" {
            objs.remove(&(ns.to_string(), name.to_string()));
        } else {
            objs.insert((ns.to_string(), name.to_string()), obj.clone());
        }
        let ev = Arc::new(Event {
            rv: self.rv,
            key,
            namespace: ns.to_string(),
            type_,
            object: obj.clone(),
        });
        self.log.push_back(ev.clone());
        self.trim();
        let _ = self.tx.send(ev);
        obj
    }

    /// Objects of a type, sorted by (namespace, name); `ns` None = all
    /// namespaces. Core Events include the `events.k8s.io` ones, converted.
    pub fn list(&self, rt: &ResourceType, ns: Option<&str>) -> Vec<Value> {
        let of = |key: &ResKey| -> Vec<Value> {
            self.objects
                .get(key)
                .map(|m| {
                    m.iter()
                        .filter(|((n, _), _)| ns.is_none_or(|x| x == n))
                        .map(|(_, v)| v.clone())
                        .collect()
                })
                .unwrap_or_default()
        };
        let mut items = of(&rt.key());
        if rt.flavor == Flavor::Event && rt.group.is_empty() {
            let new_style = ("events.k8s.io".to_string(), "events".to_string());
            items.extend(of(&new_style).iter().map(crate::events::to_core));
            items.sort_by(|a, b| {
                let key = |v: &Value| {
                    (
                        v.pointer("/metadata/namespace")
                            .and_then(Value::as_str)
                            .map(str::to_owned),
                        v.pointer("/metadata/name")
                            .and_then(Value::as_str)
                            .map(str::to_owned),
                    )
                };
                key(a).cmp(&key(b))
            });
        }
        items
    }

    /// One page of [`Store::list`]: the objects after `after` (namespace,
    /// name) that `keep` accepts, at most `limit` of them (0: all), and how
    /// many more it accepts. Only the page is cloned: a paged list of
    /// 100,000 objects used to clone all of them for every page.
    pub fn list_page(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        after: Option<&ObjKey>,
        limit: usize,
        keep: impl Fn(&Value) -> bool,
    ) -> (Vec<Value>, usize) {
        use std::ops::Bound;
        if rt.flavor == Flavor::Event && rt.group.is_empty() {
            // Core Events merge two kinds: the whole list, cut here.
            let all: Vec<Value> = self
                .list(rt, ns)
                .into_iter()
                .filter(|o| {
                    after.is_none_or(|(ans, aname)| {
                        let key = |p: &str| o.pointer(p).and_then(Value::as_str).unwrap_or("");
                        (key("/metadata/namespace"), key("/metadata/name"))
                            > (ans.as_str(), aname.as_str())
                    })
                })
                .filter(|o| keep(o))
                .collect();
            return page_of(all.iter(), limit);
        }
        let Some(objects) = self.objects.get(&rt.key()) else {
            return (Vec::new(), 0);
        };
        let from = match after {
            Some(key) => Bound::Excluded(key.clone()),
            None => Bound::Unbounded,
        };
        let matching = objects
            .range((from, Bound::Unbounded))
            .filter(|((n, _), _)| ns.is_none_or(|x| x == n))
            .map(|(_, v)| v)
            .filter(|o| keep(o));
        page_of(matching, limit)
    }

    /// One object.
    pub fn get(&self, rt: &ResourceType, ns: &str, name: &str) -> ApiResult<Value> {
        self.objects
            .get(&rt.key())
            .and_then(|m| m.get(&(ns.to_string(), name.to_string())))
            .cloned()
            .ok_or_else(|| ApiError::not_found(&what(rt), name))
    }

    fn ns_type(&self) -> Option<ResourceType> {
        self.types
            .get(&(String::new(), "namespaces".into()))
            .cloned()
    }

    fn check_namespace(&self, rt: &ResourceType, ns: &str) -> ApiResult<()> {
        if !rt.namespaced {
            return Ok(());
        }
        let Some(nst) = self.ns_type() else {
            return Ok(());
        };
        match self.get(&nst, "", ns) {
            Ok(_) => Ok(()),
            Err(_) => Err(ApiError::not_found(
                &What {
                    group: "",
                    plural: "namespaces",
                    kind: "Namespace",
                },
                ns,
            )),
        }
    }

    fn check_kind(rt: &ResourceType, version: &str, obj: &mut Value) -> ApiResult<()> {
        if !obj.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request must be a JSON object",
            ));
        }
        let kind = s(obj, "/kind").to_string();
        if !kind.is_empty() && kind != rt.kind {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({}) does not match the expected API version ({})",
                format_args!("{}/{}", s(obj, "/apiVersion"), kind),
                format_args!("{}/{}", rt.api_version(version), rt.kind)
            )));
        }
        let av = s(obj, "/apiVersion").to_string();
        if !av.is_empty() && !rt.versions.iter().any(|v| rt.api_version(v) == av) {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({av}) does not match the expected API version ({})",
                rt.api_version(version)
            )));
        }
        obj["apiVersion"] = json!(rt.api_version(version));
        obj["kind"] = json!(rt.kind);
        if !obj.get("metadata").is_some_and(Value::is_object) {
            obj["metadata"] = json!({});
        }
        Ok(())
    }

    /// Name, structural-schema and CEL checks; `old` is the stored object
    /// of an update, for the transition rules.
    fn schema_checks(
        &self,
        rt: &ResourceType,
        version: &str,
        obj: &mut Value,
        old: Option<&Value>,
    ) -> ApiResult<()> {
        let name = s(obj, "/metadata/name").to_string();
        let mut causes = vec![];
        if !name.is_empty() && !valid_name(&name) {
            causes.push(Cause {
                reason: "FieldValueInvalid",
                field: "metadata.name".into(),
                message: format!("Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"),
            });
        }
        if rt.flavor == Flavor::Custom
            && let Some(schema) = rt.schemas.get(version)
        {
            validation::prune(obj, schema);
            validation::apply_defaults(obj, schema);
            causes.extend(validation::validate(obj, schema));
            if causes.is_empty() {
                causes.extend(validation::validate_cel(obj, old, schema));
            }
        }
        if rt.flavor == Flavor::Crd {
            let want = format!("{}.{}", s(obj, "/spec/names/plural"), s(obj, "/spec/group"));
            if name != want {
                causes.push(Cause {
                    reason: "FieldValueInvalid",
                    field: "metadata.name".into(),
                    message: format!(
                        "Invalid value: {name:?}: must be spec.names.plural+\".\"+spec.group"
                    ),
                });
            }
            if resources::from_crd(obj).is_none() {
                causes.push(Cause {
                    reason: "FieldValueRequired",
                    field: "spec.versions".into(),
                    message:
                        "Required value: must have exactly one version marked as storage version"
                            .into(),
                });
            }
        }
        if causes.is_empty() {
            Ok(())
        } else {
            Err(ApiError::invalid(&what(rt), &name, causes))
        }
    }

    /// Creates an object (POST).
    pub fn create(
        &mut self,
        rt: &ResourceType,
        version: &str,
        ns: &str,
        mut obj: Value,
        ctx: &WriteCtx,
    ) -> ApiResult<Value> {
        Self::check_kind(rt, version, &mut obj)?;
        let body_ns = s(&obj, "/metadata/namespace").to_string();
        if rt.namespaced {
            if !body_ns.is_empty() && body_ns != ns {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            obj["metadata"]["namespace"] = json!(ns);
        } else if let Some(m) = obj["metadata"].as_object_mut() {
            m.remove("namespace");
        }
        if !s(&obj, "/metadata/resourceVersion").is_empty() {
            return Err(ApiError::internal(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        let mut name = s(&obj, "/metadata/name").to_string();
        if name.is_empty() {
            let gen_name = s(&obj, "/metadata/generateName").to_string();
            if gen_name.is_empty() {
                return Err(ApiError::invalid(
                    &what(rt),
                    "",
                    vec![Cause {
                        reason: "FieldValueRequired",
                        field: "metadata.name".into(),
                        message: "Required value: name or generateName is required".into(),
                    }],
                ));
            }
            name = format!("{gen_name}{}", util::name_suffix());
            obj["metadata"]["name"] = json!(name);
        }
        self.check_namespace(rt, ns)?;
        if rt.group == "events.k8s.io" {
            let causes = crate::events::refused_new(&obj, ns);
            if !causes.is_empty() {
                // Validated as the core Event it is stored as: no group in the message.
                let core = What {
                    group: "",
                    plural: "events",
                    kind: "Event",
                };
                return Err(ApiError::invalid(&core, &name, causes));
            }
        }
        if rt.status_subresource
            && rt.flavor == Flavor::Custom
            && let Some(m) = obj.as_object_mut()
        {
            m.remove("status");
        }
        self.schema_checks(rt, version, &mut obj, None)?;
        if self.get(rt, ns, &name).is_ok() {
            return Err(ApiError::already_exists(&what(rt), &name));
        }
        let now = util::now();
        {
            let Some(m) = obj["metadata"].as_object_mut() else {
                return Err(ApiError::bad_request("metadata must be an object"));
            };
            m.insert("uid".into(), json!(util::uuid()));
            m.insert("creationTimestamp".into(), json!(now));
            m.remove("deletionTimestamp");
            m.remove("deletionGracePeriodSeconds");
            if !ctx.fields_applied {
                m.remove("managedFields");
            }
            if rt.has_generation() {
                m.insert("generation".into(), json!(1));
            } else {
                m.remove("generation");
            }
        }
        match rt.flavor {
            Flavor::Namespace => {
                obj["spec"] = json!({"finalizers": ["kubernetes"]});
                obj["status"] = json!({"phase": "Active"});
            }
            Flavor::Crd => crd_status(&mut obj, None),
            _ => {}
        }
        if obj
            .get("metadata")
            .and_then(|m| m.get("labels"))
            .is_some_and(Value::is_null)
        {
            obj["metadata"].as_object_mut().map(|m| m.remove("labels"));
        }
        if !ctx.fields_applied {
            patch::track_update(None, &mut obj, &ctx.manager, "", &now);
        }
        if ctx.dry_run {
            return Ok(obj);
        }
        let out = self.commit(rt, ns, &name, obj, "ADDED");
        if rt.flavor == Flavor::Crd {
            self.register_crd(&out);
        }
        Ok(out)
    }

    fn register_crd(&mut self, crd: &Value) {
        if let Some(t) = resources::from_crd(crd) {
            self.types.insert(t.key(), t);
        }
    }

    /// Replaces an object (PUT), or only its status when `status` is true.
    #[allow(clippy::too_many_arguments)]
    pub fn update(
        &mut self,
        rt: &ResourceType,
        version: &str,
        ns: &str,
        name: &str,
        mut obj: Value,
        status: bool,
        ctx: &WriteCtx,
    ) -> ApiResult<Value> {
        Self::check_kind(rt, version, &mut obj)?;
        let body_name = s(&obj, "/metadata/name").to_string();
        if !body_name.is_empty() && body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        let body_ns = s(&obj, "/metadata/namespace").to_string();
        if rt.namespaced && !body_ns.is_empty() && body_ns != ns {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        let cur = self.get(rt, ns, name)?;
        let rv = s(&obj, "/metadata/resourceVersion").to_string();
        if !rv.is_empty() && rv != s(&cur, "/metadata/resourceVersion") {
            return Err(ApiError::conflict(&what(rt), name));
        }
        let mut new = if status {
            let mut n = cur.clone();
            match obj.get("status") {
                Some(st) => n["status"] = st.clone(),
                None => {
                    n.as_object_mut().map(|m| m.remove("status"));
                }
            }
            if ctx.fields_applied
                && let Some(mf) = obj.pointer("/metadata/managedFields")
            {
                n["metadata"]["managedFields"] = mf.clone();
            }
            n["apiVersion"] = obj["apiVersion"].clone();
            n
        } else {
            let mut n = obj;
            if rt.status_subresource {
                match cur.get("status") {
                    Some(st) => n["status"] = st.clone(),
                    None => {
                        n.as_object_mut().map(|m| m.remove("status"));
                    }
                }
            }
            n
        };
        {
            let Some(m) = new["metadata"].as_object_mut() else {
                return Err(ApiError::bad_request("metadata must be an object"));
            };
            m.insert("name".into(), json!(name));
            if rt.namespaced {
                m.insert("namespace".into(), json!(ns));
            } else {
                m.remove("namespace");
            }
            for k in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
            ] {
                match cur["metadata"].get(k) {
                    Some(v) => m.insert(k.into(), v.clone()),
                    None => m.remove(k),
                };
            }
            // A status write changes no metadata but the managers: an apply
            // brings its own (its entry names the status subresource).
            if status && !ctx.fields_applied {
                m.remove("managedFields");
                if let Some(mf) = cur["metadata"].get("managedFields") {
                    m.insert("managedFields".into(), mf.clone());
                }
            }
        }
        if cur["metadata"].get("deletionTimestamp").is_some() {
            let old: Vec<Value> = cur
                .pointer("/metadata/finalizers")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let added = new
                .pointer("/metadata/finalizers")
                .and_then(Value::as_array)
                .is_some_and(|a| a.iter().any(|f| !old.contains(f)));
            if added {
                return Err(ApiError::invalid(
                    &what(rt),
                    name,
                    vec![Cause {
                        reason: "FieldValueForbidden",
                        field: "metadata.finalizers".into(),
                        message: "Forbidden: no new finalizers can be added if the object is being deleted".into(),
                    }],
                ));
            }
        }
        self.schema_checks(rt, version, &mut new, Some(&cur))?;
        if rt.flavor == Flavor::Crd {
            crd_status(&mut new, Some(&cur));
        }
        if rt.has_generation() && !status && without_meta_status(&new) != without_meta_status(&cur)
        {
            let g = cur
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            new["metadata"]["generation"] = json!(g + 1);
        }
        let now = util::now();
        if !ctx.fields_applied {
            patch::track_update(
                Some(&cur),
                &mut new,
                &ctx.manager,
                if status { "status" } else { "" },
                &now,
            );
        }
        if comparable(&new) == comparable(&cur) {
            let mut out = cur;
            out["apiVersion"] = json!(rt.api_version(version));
            return Ok(out);
        }
        if ctx.dry_run {
            return Ok(new);
        }
        let finalizers_empty = new
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_none_or(|a| a.is_empty());
        if new["metadata"].get("deletionTimestamp").is_some() && finalizers_empty {
            return Ok(self.remove(rt, ns, name, new));
        }
        let out = self.commit(rt, ns, name, new, "MODIFIED");
        if rt.flavor == Flavor::Crd {
            self.register_crd(&out);
        }
        Ok(out)
    }

    /// Removes an object now, with cascading for namespaces and CRDs.
    fn remove(&mut self, rt: &ResourceType, ns: &str, name: &str, last: Value) -> Value {
        match rt.flavor {
            Flavor::Namespace => {
                let types: Vec<ResourceType> = self
                    .types
                    .values()
                    .filter(|t| t.namespaced)
                    .cloned()
                    .collect();
                for t in types {
                    for o in self.list(&t, Some(name)) {
                        let n = s(&o, "/metadata/name").to_string();
                        self.commit(&t, name, &n, o, "DELETED");
                    }
                }
            }
            Flavor::Crd => {
                let key = (
                    s(&last, "/spec/group").to_string(),
                    s(&last, "/spec/names/plural").to_string(),
                );
                if let Some(t) = self.types.get(&key).cloned() {
                    for o in self.list(&t, None) {
                        let n = s(&o, "/metadata/name").to_string();
                        let ons = s(&o, "/metadata/namespace").to_string();
                        self.commit(&t, &ons, &n, o, "DELETED");
                    }
                    self.types.remove(&key);
                    self.objects.remove(&key);
                }
            }
            _ => {}
        }
        self.commit(rt, ns, name, last, "DELETED")
    }

    /// Deletes an object (DELETE): sets deletionTimestamp while finalizers are pending.
    /// Returns the object and whether it is gone.
    pub fn delete(
        &mut self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        preconditions: Option<&Value>,
        dry_run: bool,
    ) -> ApiResult<(Value, bool)> {
        let cur = self.get(rt, ns, name)?;
        if let Some(p) = preconditions {
            let uid = p.get("uid").and_then(Value::as_str).unwrap_or("");
            if !uid.is_empty() && uid != s(&cur, "/metadata/uid") {
                // kube-apiserver's words, naming the kind.
                let kind = What {
                    group: &rt.group,
                    plural: &rt.kind,
                    kind: &rt.kind,
                };
                return Err(ApiError::conflict_msg(
                    &kind,
                    name,
                    &format!(
                        "the UID in the precondition ({uid}) does not match the UID in record ({}). The object might have been deleted and then recreated",
                        s(&cur, "/metadata/uid")
                    ),
                ));
            }
            let rv = p
                .get("resourceVersion")
                .and_then(Value::as_str)
                .unwrap_or("");
            if !rv.is_empty() && rv != s(&cur, "/metadata/resourceVersion") {
                return Err(ApiError::conflict_msg(
                    &what(rt),
                    name,
                    &format!(
                        "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                        s(&cur, "/metadata/resourceVersion")
                    ),
                ));
            }
        }
        let pending = cur
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty());
        if dry_run {
            return Ok((cur, !pending));
        }
        if pending {
            if cur["metadata"].get("deletionTimestamp").is_some() {
                return Ok((cur, false));
            }
            let mut n = cur;
            n["metadata"]["deletionTimestamp"] = json!(util::now());
            // kube-apiserver counts the deletion as a change of the desired state.
            if let Some(g) = n.pointer("/metadata/generation").and_then(Value::as_i64) {
                n["metadata"]["generation"] = json!(g + 1);
            }
            n["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            return Ok((self.commit(rt, ns, name, n, "MODIFIED"), false));
        }
        Ok((self.remove(rt, ns, name, cur), true))
    }
}

fn crd_status(obj: &mut Value, prev: Option<&Value>) {
    let now = prev
        .and_then(|p| p.pointer("/status/conditions/0/lastTransitionTime"))
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(util::now);
    let names = obj
        .pointer("/spec/names")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let mut accepted = names.clone();
    if accepted.get("singular").is_none() {
        accepted["singular"] = json!(s(obj, "/spec/names/kind").to_lowercase());
    }
    if accepted.get("listKind").is_none() {
        accepted["listKind"] = json!(format!("{}List", s(obj, "/spec/names/kind")));
    }
    let stored: Vec<Value> = obj
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        .filter_map(|v| v.get("name").cloned())
        .collect();
    obj["status"] = json!({
        "acceptedNames": accepted,
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "lastTransitionTime": now, "reason": "NoConflicts", "message": "no conflicts found"},
            {"type": "Established", "status": "True", "lastTransitionTime": now, "reason": "InitialNamesAccepted", "message": "the initial names have been accepted"}
        ],
        "storedVersions": stored,
    });
}

/// Clones of the first `limit` items (0: all), and how many follow
/// (counted, not cloned).
fn page_of<'a>(mut items: impl Iterator<Item = &'a Value>, limit: usize) -> (Vec<Value>, usize) {
    if limit == 0 {
        return (items.cloned().collect(), 0);
    }
    let page: Vec<Value> = items.by_ref().take(limit).cloned().collect();
    (page, items.count())
}

//! HTTP routing and request handling, shaped like kube-apiserver's REST API.

use crate::app::App;
use crate::discovery;
use crate::error::{ApiError, ApiResult};
use crate::faults::{FaultRule, Outage, RequestInfo};
use crate::openapi;
use crate::patch;
use crate::protobuf;
use crate::resources::{Flavor, ResourceType};
use crate::selector::{FieldSelector, LabelSelector};
use crate::store::WriteCtx;
use crate::table;
use crate::util::{self, s};
use crate::watch::{self, WatchParams};
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

fn json_resp(code: u16, v: &Value) -> Response {
    let code = StatusCode::from_u16(code).unwrap_or(StatusCode::OK);
    (code, [("content-type", "application/json")], v.to_string()).into_response()
}

/// Parsed resource path.
#[derive(Debug, Default)]
struct Target {
    group: String,
    version: String,
    ns: Option<String>,
    plural: String,
    name: Option<String>,
    sub: Option<String>,
}

enum Route {
    Version,
    Api,
    Apis,
    Group(String),
    ResourceList(String, String),
    OpenApiRoot,
    OpenApiGv(String, String),
    Resource(Target),
    NotFound,
}

fn route(path: &str) -> Route {
    let segs: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let (group, version, rest) = match segs.as_slice() {
        ["version"] => return Route::Version,
        ["api"] => return Route::Api,
        ["apis"] => return Route::Apis,
        ["openapi", "v3"] => return Route::OpenApiRoot,
        ["openapi", "v3", "api", v] => return Route::OpenApiGv(String::new(), v.to_string()),
        ["openapi", "v3", "apis", g, v] => return Route::OpenApiGv(g.to_string(), v.to_string()),
        ["apis", g] => return Route::Group(g.to_string()),
        ["api", v] => return Route::ResourceList(String::new(), v.to_string()),
        ["apis", g, v] => return Route::ResourceList(g.to_string(), v.to_string()),
        ["api", v, rest @ ..] => (String::new(), v.to_string(), rest),
        ["apis", g, v, rest @ ..] => (g.to_string(), v.to_string(), rest),
        _ => return Route::NotFound,
    };
    let mut t = Target {
        group,
        version,
        ..Default::default()
    };
    let tail: &[&str] = match rest {
        ["namespaces"] => {
            t.plural = "namespaces".into();
            &[]
        }
        ["namespaces", n] if group_is_core(&t) => {
            t.plural = "namespaces".into();
            t.name = Some(n.to_string());
            &[]
        }
        ["namespaces", n, sub] if group_is_core(&t) && (*sub == "status" || *sub == "finalize") => {
            t.plural = "namespaces".into();
            t.name = Some(n.to_string());
            t.sub = Some(sub.to_string());
            &[]
        }
        ["namespaces", ns, plural, tail @ ..] => {
            t.ns = Some(ns.to_string());
            t.plural = plural.to_string();
            tail
        }
        [plural, tail @ ..] => {
            t.plural = plural.to_string();
            tail
        }
        [] => return Route::NotFound,
    };
    match tail {
        [] => {}
        [name] => t.name = Some(name.to_string()),
        [name, sub] => {
            t.name = Some(name.to_string());
            t.sub = Some(sub.to_string());
        }
        _ => return Route::NotFound,
    }
    Route::Resource(t)
}

fn group_is_core(t: &Target) -> bool {
    t.group.is_empty()
}

fn verb_of(method: &Method, t: &Target, q: &HashMap<String, String>) -> &'static str {
    let watch = q.get("watch").is_some_and(|w| w == "true" || w == "1");
    match (method.as_str(), t.name.is_some()) {
        ("GET", false) if watch => "watch",
        ("GET", true) if watch => "watch",
        ("GET", false) => "list",
        ("GET", true) => "get",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => "unknown",
    }
}

/// The single entry point for every request.
pub async fn handle(
    State(app): State<Arc<App>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_string();
    let q: HashMap<String, String> = Query::try_from_uri(&uri)
        .map(|Query(q)| q)
        .unwrap_or_default();
    if let Some(admin) = path.strip_prefix("/_testserver/") {
        return admin_handle(&app, &method, admin, &q, &body);
    }
    let r = route(&path);
    let info = match &r {
        Route::Resource(t) => RequestInfo {
            verb: verb_of(&method, t, &q).into(),
            resource: t.plural.clone(),
            path: path.clone(),
        },
        _ => RequestInfo {
            verb: "get".into(),
            resource: String::new(),
            path: path.clone(),
        },
    };
    *app.requests
        .lock()
        .entry(format!("{} {}", info.verb, info.resource))
        .or_default() += 1;
    if let Route::Resource(t) = &r {
        let agent = headers
            .get(axum::http::header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let resource = match &t.sub {
            Some(sub) => format!("{}/{sub}", t.plural),
            None => t.plural.clone(),
        };
        app.access
            .lock()
            .entry(agent)
            .or_default()
            .insert(crate::app::Access {
                group: t.group.clone(),
                resource,
                verb: info.verb.clone(),
            });
    }
    if let Some(err) = app.faults.check(&info).await {
        return err.into_response();
    }
    if app.faults.outage() == Outage::Refuse {
        return ApiError::new(
            503,
            "ServiceUnavailable",
            "refusing connections (injected outage)",
        )
        .into_response();
    }
    match dispatch(&app, &method, r, &q, &headers, &body) {
        Ok(resp) => resp,
        Err(e) => e.into_response(),
    }
}

fn admin_handle(
    app: &App,
    method: &Method,
    path: &str,
    q: &HashMap<String, String>,
    body: &Bytes,
) -> Response {
    let secs = q
        .get("seconds")
        .and_then(|x| x.parse::<f64>().ok())
        .map(Duration::from_secs_f64);
    match (method.as_str(), path) {
        ("GET", "faults") => json_resp(200, &json!(app.faults.rules())),
        ("POST", "faults") => match serde_json::from_slice::<FaultRule>(body) {
            Ok(r) => {
                app.faults.add(r);
                json_resp(200, &json!(app.faults.rules()))
            }
            Err(e) => ApiError::bad_request(format!("invalid fault rule: {e}")).into_response(),
        },
        ("DELETE", "faults") => {
            app.faults.clear();
            json_resp(200, &json!([]))
        }
        ("POST", "close-watches") => {
            app.faults.close_watches();
            json_resp(200, &json!({"closed": true}))
        }
        ("POST", "hang") => {
            app.faults.hang(secs);
            json_resp(200, &json!({"outage": "hang"}))
        }
        ("POST", "refuse") => {
            app.faults.refuse(secs);
            json_resp(200, &json!({"outage": "refuse"}))
        }
        ("POST", "resume") => {
            app.faults.resume();
            json_resp(200, &json!({"outage": "none"}))
        }
        ("POST", "watch-window") => match q.get("events").and_then(|x| x.parse::<usize>().ok()) {
            Some(n) => {
                app.store.lock().set_window(n);
                json_resp(200, &json!({"window": n}))
            }
            None => ApiError::bad_request("events=N required").into_response(),
        },
        _ => ApiError::no_route().into_response(),
    }
}

fn accept(headers: &HeaderMap) -> String {
    headers
        .get("accept")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

fn dispatch(
    app: &Arc<App>,
    method: &Method,
    r: Route,
    q: &HashMap<String, String>,
    headers: &HeaderMap,
    body: &Bytes,
) -> ApiResult<Response> {
    if method != Method::GET && !matches!(r, Route::Resource(_)) {
        return Err(ApiError::method_not_allowed());
    }
    let st = || app.store.lock();
    match r {
        Route::Version => Ok(json_resp(200, &discovery::version())),
        Route::Api | Route::Apis => {
            let core = matches!(r, Route::Api);
            if let Some(media_type) = discovery::aggregated_media_type(&accept(headers)) {
                let body = discovery::aggregated(&st(), core, media_type);
                let mut resp = json_resp(200, &body);
                if let Ok(v) = axum::http::HeaderValue::from_str(media_type) {
                    resp.headers_mut().insert("content-type", v);
                }
                return Ok(resp);
            }
            if core {
                Ok(json_resp(200, &discovery::api(&app.addr)))
            } else {
                Ok(json_resp(200, &discovery::apis(&st())))
            }
        }
        Route::Group(g) => discovery::group(&st(), &g)
            .map(|d| json_resp(200, &d))
            .ok_or_else(ApiError::no_route),
        Route::ResourceList(g, v) => {
            if g.is_empty() && v != "v1" {
                return Err(ApiError::no_route());
            }
            discovery::resource_list(&st(), &g, &v)
                .map(|d| json_resp(200, &d))
                .ok_or_else(ApiError::no_route)
        }
        Route::OpenApiRoot => Ok(json_resp(200, &openapi::root(&st()))),
        Route::OpenApiGv(g, v) => openapi::gv_doc(&st(), &g, &v)
            .map(|d| json_resp(200, &d))
            .ok_or_else(ApiError::no_route),
        Route::NotFound => Err(ApiError::no_route()),
        Route::Resource(t) => resource(app, method, t, q, headers, body),
    }
}

/// A request body: protobuf when its content type says so, else JSON or YAML.
fn decode_body(body: &Bytes, content_type: &str) -> ApiResult<Value> {
    if body.is_empty() {
        return Err(ApiError::bad_request("the request body is empty"));
    }
    if content_type.starts_with(protobuf::MEDIA_TYPE) {
        return protobuf::decode(body).map_err(|e| {
            ApiError::bad_request(format!("error decoding protobuf request body: {e}"))
        });
    }
    serde_json::from_slice(body).or_else(|_| {
        serde_yaml::from_slice::<Value>(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding request body: {e}")))
    })
}

fn manager(q: &HashMap<String, String>, headers: &HeaderMap) -> String {
    if let Some(m) = q.get("fieldManager").filter(|m| !m.is_empty()) {
        return m.clone();
    }
    let ua = headers
        .get("user-agent")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("unknown");
    ua.split('/').next().unwrap_or("unknown").to_string()
}

fn with_version(rt: &ResourceType, version: &str, mut v: Value) -> Value {
    if v.is_object() {
        v["apiVersion"] = json!(rt.api_version(version));
        v["kind"] = json!(rt.kind);
    }
    v
}

fn encode_continue(rv: u64, ns: &str, name: &str) -> String {
    format!("{rv}/{ns}/{name}")
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn decode_continue(tok: &str) -> ApiResult<(u64, String, String)> {
    let bad = || ApiError::bad_request("continue key is not valid: invalid continue token");
    if !tok.len().is_multiple_of(2) {
        return Err(bad());
    }
    let bytes: Result<Vec<u8>, _> = (0..tok.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&tok[i..i + 2], 16))
        .collect();
    let s = String::from_utf8(bytes.map_err(|_| bad())?).map_err(|_| bad())?;
    let mut it = s.splitn(3, '/');
    let rv = it.next().and_then(|x| x.parse().ok()).ok_or_else(bad)?;
    let ns = it.next().ok_or_else(bad)?.to_string();
    let name = it.next().ok_or_else(bad)?.to_string();
    Ok((rv, ns, name))
}

/// The fields a field selector may name beyond metadata.name and namespace.
fn selectable(rt: &ResourceType) -> &'static [&'static str] {
    if rt.flavor == Flavor::Event && rt.group.is_empty() {
        crate::events::CORE_FIELDS
    } else {
        &[]
    }
}

fn resource(
    app: &Arc<App>,
    method: &Method,
    t: Target,
    q: &HashMap<String, String>,
    headers: &HeaderMap,
    body: &Bytes,
) -> ApiResult<Response> {
    let rt = {
        let st = app.store.lock();
        st.find_type(&t.group, &t.version, &t.plural)
            .cloned()
            .ok_or_else(ApiError::no_route)?
    };
    if !rt.namespaced && t.ns.is_some() {
        return Err(ApiError::no_route());
    }
    if rt.namespaced && t.ns.is_none() && (t.name.is_some() || *method != Method::GET) {
        return Err(ApiError::no_route());
    }
    let status_sub = match t.sub.as_deref() {
        None => false,
        Some("status") if rt.status_subresource => true,
        Some("finalize") if rt.flavor == Flavor::Namespace => false,
        Some(_) => return Err(ApiError::no_route()),
    };
    let version = t.version.clone();
    let ns = t.ns.clone().unwrap_or_default();
    let verb = verb_of(method, &t, q);
    let ctx = WriteCtx {
        manager: manager(q, headers),
        dry_run: q.get("dryRun").is_some_and(|d| d == "All"),
        fields_applied: false,
    };
    let accept = accept(headers);
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    // Built-in kinds speak protobuf as in kube-apiserver; custom resources (and CRDs here) JSON.
    let in_protobuf = protobuf::serves(&rt.api_version(&version), &rt.kind);
    if content_type.starts_with(protobuf::MEDIA_TYPE) && !in_protobuf {
        return Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "{} {} is served in JSON only, as custom resources are by kube-apiserver: send application/json",
                rt.kind,
                rt.api_version(&version)
            ),
        ));
    }
    let reply = Reply {
        protobuf: in_protobuf && protobuf::wanted(&accept),
    };
    match (verb, t.name.as_deref()) {
        ("watch", name) => {
            let mut fields = FieldSelector::parse_with(
                q.get("fieldSelector").map(String::as_str).unwrap_or(""),
                selectable(&rt),
            )?;
            if let Some(n) = name {
                fields = FieldSelector::parse(&format!("metadata.name={n}"))?;
            }
            let p = WatchParams {
                rt: rt.clone(),
                version,
                ns: t.ns.clone(),
                labels: LabelSelector::parse(
                    q.get("labelSelector").map(String::as_str).unwrap_or(""),
                )?,
                fields,
                rv: watch::parse_rv(q.get("resourceVersion"))?,
                send_initial: q.get("sendInitialEvents").is_some_and(|v| v == "true"),
                bookmarks: q.get("allowWatchBookmarks").is_some_and(|v| v == "true"),
                timeout: Duration::from_secs(
                    q.get("timeoutSeconds")
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(1800),
                ),
                protobuf: reply.protobuf,
                table: table::wants_table(&accept).then(|| {
                    q.get("includeObject")
                        .cloned()
                        .unwrap_or_else(|| "Metadata".into())
                }),
            };
            let content_type = if p.protobuf {
                format!("{};stream=watch", protobuf::MEDIA_TYPE)
            } else {
                "application/json".to_owned()
            };
            let body = watch::start(app.clone(), p);
            Ok(Response::builder()
                .status(200)
                .header("content-type", content_type)
                .header("transfer-encoding", "chunked")
                .body(body)
                .unwrap_or_else(|_| ApiError::internal("response").into_response()))
        }
        ("list", _) => {
            let labels =
                LabelSelector::parse(q.get("labelSelector").map(String::as_str).unwrap_or(""))?;
            let fields = FieldSelector::parse_with(
                q.get("fieldSelector").map(String::as_str).unwrap_or(""),
                selectable(&rt),
            )?;
            let limit: usize = q.get("limit").and_then(|l| l.parse().ok()).unwrap_or(0);
            let st = app.store.lock();
            let (list_rv, after) = match q.get("continue").filter(|c| !c.is_empty()) {
                Some(tok) => {
                    let (rv, cns, cname) = decode_continue(tok)?;
                    if !st.rv_retained(rv) {
                        return Err(ApiError::expired(
                            "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.",
                        ));
                    }
                    (rv, Some((cns, cname)))
                }
                None => (st.rv, None),
            };
            let (items, remaining) =
                st.list_page(&rt, t.ns.as_deref(), after.as_ref(), limit, |o| {
                    labels.matches(o) && fields.matches(o)
                });
            drop(st);
            let mut meta = json!({"resourceVersion": list_rv.to_string()});
            if remaining > 0
                && let Some(last) = items.last()
            {
                meta["continue"] = json!(encode_continue(
                    list_rv,
                    s(last, "/metadata/namespace"),
                    s(last, "/metadata/name")
                ));
                // kube-apiserver counts what is left only for an unfiltered list: with a
                // selector it would have to read every object to know.
                let selected = ["labelSelector", "fieldSelector"]
                    .iter()
                    .any(|k| q.get(*k).is_some_and(|v| !v.trim().is_empty()));
                if !selected {
                    meta["remainingItemCount"] = json!(remaining);
                }
            }
            let items: Vec<Value> = items
                .into_iter()
                .map(|o| with_version(&rt, &version, o))
                .collect();
            if table::wants_table(&accept) {
                let inc = q
                    .get("includeObject")
                    .map(String::as_str)
                    .unwrap_or("Metadata");
                return Ok(json_resp(
                    200,
                    &table::table(&rt, &version, &items, inc, meta),
                ));
            }
            // In JSON, kube-apiserver's lists of built-in kinds carry no apiVersion and kind
            // on their items (custom resources' items keep theirs); protobuf encodes by them.
            let items = if rt.flavor == Flavor::Custom || reply.protobuf {
                items
            } else {
                items
                    .into_iter()
                    .map(|mut o| {
                        if let Some(m) = o.as_object_mut() {
                            m.remove("apiVersion");
                            m.remove("kind");
                        }
                        o
                    })
                    .collect()
            };
            Ok(reply.object(
                200,
                &json!({"kind": rt.list_kind, "apiVersion": rt.api_version(&version), "metadata": meta, "items": items}),
            ))
        }
        ("get", Some(name)) => {
            let o = with_version(&rt, &version, app.store.lock().get(&rt, &ns, name)?);
            if table::wants_table(&accept) {
                let inc = q
                    .get("includeObject")
                    .map(String::as_str)
                    .unwrap_or("Metadata");
                let rv = o
                    .pointer("/metadata/resourceVersion")
                    .cloned()
                    .unwrap_or(Value::Null);
                return Ok(json_resp(
                    200,
                    &table::table(&rt, &version, &[o], inc, json!({"resourceVersion": rv})),
                ));
            }
            Ok(reply.object(200, &o))
        }
        ("create", None) => {
            let obj = decode_body(body, content_type)?;
            let o = app.store.lock().create(&rt, &version, &ns, obj, &ctx)?;
            Ok(reply.object(201, &with_version(&rt, &version, o)))
        }
        ("update", Some(name)) => {
            let obj = decode_body(body, content_type)?;
            let mut st = app.store.lock();
            // Custom resources allow no unconditional update, as in kube-apiserver: a PUT
            // names the resourceVersion it replaces.
            if rt.flavor == Flavor::Custom && s(&obj, "/metadata/resourceVersion").is_empty() {
                st.get(&rt, &ns, name)?;
                return Err(ApiError::resource_version_required(
                    &rt.group, &rt.plural, name,
                ));
            }
            let o = st.update(&rt, &version, &ns, name, obj, status_sub, &ctx)?;
            Ok(reply.object(200, &with_version(&rt, &version, o)))
        }
        ("patch", Some(name)) => {
            let ct = headers
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let ct = ct.split(';').next().unwrap_or("").trim().to_string();
            let p = decode_body(body, &ct)?;
            let mut st = app.store.lock();
            if ct == "application/apply-patch+yaml" {
                if q.get("fieldManager").is_none_or(|m| m.is_empty()) {
                    let mut e = ApiError::new(
                        422,
                        "Invalid",
                        "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
                    );
                    e.details = Some(
                        json!({"group": "meta.k8s.io", "kind": "PatchOptions", "causes": [{"reason": "FieldValueRequired", "message": "Required value: is required for apply patch", "field": "fieldManager"}]}),
                    );
                    return Err(e);
                }
                let pname = s(&p, "/metadata/name");
                if !pname.is_empty() && pname != name {
                    return Err(ApiError::bad_request(format!(
                        "the name of the object ({pname}) does not match the name on the URL ({name})"
                    )));
                }
                let force = q.get("force").is_some_and(|f| f == "true");
                let now = util::now();
                let cur = st.get(&rt, &ns, name).ok();
                let mut applied = p.clone();
                if applied.get("metadata").is_none() {
                    applied["metadata"] = json!({"name": name});
                }
                let subresource = if status_sub { "status" } else { "" };
                let merged = patch::apply(
                    cur.as_ref(),
                    &applied,
                    &ctx.manager,
                    subresource,
                    force,
                    &now,
                )?;
                let applied_ctx = WriteCtx {
                    fields_applied: true,
                    ..ctx.clone()
                };
                let (code, o) = match cur {
                    // An apply that creates names its object, as kube-apiserver requires.
                    None if !status_sub && pname.is_empty() => {
                        return Err(ApiError::bad_request(format!(
                            "the name of the object ({name} based on URL) was undeterminable: name must be provided"
                        )));
                    }
                    None if !status_sub => {
                        let mut m = merged;
                        m["metadata"]["name"] = json!(name);
                        (201, st.create(&rt, &version, &ns, m, &applied_ctx)?)
                    }
                    None => {
                        return Err(ApiError::not_found(
                            &crate::error::What {
                                group: &rt.group,
                                plural: &rt.plural,
                                kind: &rt.kind,
                            },
                            name,
                        ));
                    }
                    Some(_) => (
                        200,
                        st.update(&rt, &version, &ns, name, merged, status_sub, &applied_ctx)?,
                    ),
                };
                return Ok(reply.object(code, &with_version(&rt, &version, o)));
            }
            let mut cur = st.get(&rt, &ns, name)?;
            match ct.as_str() {
                "application/merge-patch+json" => patch::merge(&mut cur, &p),
                "application/json-patch+json" => patch::json_patch(&mut cur, &p)?,
                // Custom resources have no patch strategies: kube-apiserver refuses the type.
                "application/strategic-merge-patch+json" if rt.flavor == Flavor::Custom => {
                    return Err(ApiError::unsupported_custom_patch());
                }
                "application/strategic-merge-patch+json" => patch::strategic(&mut cur, &p)?,
                other => return Err(ApiError::unsupported_media(other)),
            }
            let o = st.update(&rt, &version, &ns, name, cur, status_sub, &ctx)?;
            Ok(reply.object(200, &with_version(&rt, &version, o)))
        }
        ("delete", Some(name)) => {
            // DeleteOptions: JSON from most clients, protobuf from client-go's typed ones.
            let opts: Option<Value> = if body.is_empty() {
                None
            } else if content_type.starts_with(protobuf::MEDIA_TYPE) {
                Some(decode_body(body, content_type)?)
            } else {
                serde_json::from_slice(body).ok()
            };
            let pre = opts.as_ref().and_then(|o| o.get("preconditions"));
            let (o, gone) = app.store.lock().delete(&rt, &ns, name, pre, ctx.dry_run)?;
            // kube-apiserver answers an immediate deletion with a Status, custom resources
            // included; a CRD (held by its cleanup finalizer there) comes back as the object.
            if gone && rt.flavor != Flavor::Crd {
                let mut details =
                    json!({"name": name, "kind": rt.plural, "uid": s(&o, "/metadata/uid")});
                if !rt.group.is_empty() {
                    details["group"] = json!(rt.group);
                }
                return Ok(reply.object(
                    200,
                    &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}),
                ));
            }
            Ok(reply.object(200, &with_version(&rt, &version, o)))
        }
        ("deletecollection", None) => {
            let labels =
                LabelSelector::parse(q.get("labelSelector").map(String::as_str).unwrap_or(""))?;
            let fields = FieldSelector::parse_with(
                q.get("fieldSelector").map(String::as_str).unwrap_or(""),
                selectable(&rt),
            )?;
            let mut st = app.store.lock();
            let targets: Vec<Value> = st
                .list(&rt, t.ns.as_deref())
                .into_iter()
                .filter(|o| labels.matches(o) && fields.matches(o))
                .collect();
            let mut items = vec![];
            for o in targets {
                let (d, _) = st.delete(
                    &rt,
                    s(&o, "/metadata/namespace"),
                    s(&o, "/metadata/name"),
                    None,
                    ctx.dry_run,
                )?;
                items.push(with_version(&rt, &version, d));
            }
            let rv = st.rv;
            Ok(reply.object(
                200,
                &json!({"kind": rt.list_kind, "apiVersion": rt.api_version(&version), "metadata": {"resourceVersion": rv.to_string()}, "items": items}),
            ))
        }
        _ => Err(ApiError::method_not_allowed()),
    }
}

/// How a resource request is answered: protobuf when the client asks for it first and the kind
/// is a built-in one, as kube-apiserver negotiates; JSON otherwise.
struct Reply {
    protobuf: bool,
}

impl Reply {
    fn object(&self, code: u16, v: &Value) -> Response {
        if self.protobuf {
            match protobuf::encode(v) {
                Ok(bytes) => {
                    let code = StatusCode::from_u16(code).unwrap_or(StatusCode::OK);
                    return (code, [("content-type", protobuf::MEDIA_TYPE)], bytes).into_response();
                }
                // A stored object that does not fit its message (a field of the wrong type,
                // accepted because built-ins are not validated) still reaches the client in
                // JSON, which every client that asks for protobuf also accepts.
                Err(e) => {
                    tracing::warn!(error = %e, "answering in JSON: the object does not fit its protobuf message")
                }
            }
        }
        json_resp(code, v)
    }
}

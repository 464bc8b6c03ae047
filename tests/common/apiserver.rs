//! A stand-in Kubernetes API server for the DRA driver's tests: plain HTTP/1.1 on a loopback
//! port, speaking the JSON of `resource.k8s.io/v1` for what the driver uses (ResourceSlice
//! list with field selectors, create, update with resourceVersion checks, delete; ResourceClaim
//! get, and a watch of slices: chunked JSON events from a resourceVersion on, as the real one
//! streams them) and checking slices the way the real one does for the rules the driver must
//! keep (driver and device names, devices per slice: 128, 64 once one has taints or consumes
//! counters; taints: at most 16 per device, keys qualified names, values label values;
//! attribute names, pool fields), and refusing slice writes where a test asks. Every
//! request is recorded, so a test asserts what the driver published and in which order, and
//! how many requests it made.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";

#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub body: Option<Value>,
    /// The `Authorization` header's value.
    pub authorization: Option<String>,
}

/// A service account token as the API server issues one (unsigned: this server reads, never
/// checks, it): `account` is `<namespace>/<name>`; `node` the Node it is bound to.
pub fn token(account: &str, node: Option<&str>, issued: i64, expires: i64) -> String {
    use base64::Engine;
    let (ns, name) = account.split_once('/').unwrap();
    let mut k = json!({"namespace": ns, "serviceaccount": {"name": name, "uid": "sa-uid"}});
    if let Some(n) = node {
        k["node"] = json!({"name": n, "uid": "node-uid"});
    }
    let payload = json!({
        "sub": format!("system:serviceaccount:{ns}:{name}"),
        "iat": issued, "exp": expires, "kubernetes.io": k,
    });
    let b = |s: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
    format!(
        "{}.{}.sig",
        b(br#"{"alg":"RS256"}"#),
        b(payload.to_string().as_bytes())
    )
}

/// A token's claims (its JWT payload), or `Null`.
pub fn claims_of(token: &str) -> Value {
    use base64::Engine;
    token
        .trim()
        .split('.')
        .nth(1)
        .and_then(|p| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(p)
                .ok()
        })
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null)
}

/// The node a bearer token is bound to (its `kubernetes.io.node.name` claim).
fn bearer_node(authorization: Option<&str>) -> Option<String> {
    let t = authorization?.strip_prefix("Bearer ")?;
    claims_of(t)["kubernetes.io"]["node"]["name"]
        .as_str()
        .map(str::to_string)
}

fn now_seconds() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// A `status.devices` entry's keys (its list-map keys in the API): driver, pool, device, share.
type DeviceKey = [Option<String>; 4];

fn device_key(d: &Value) -> DeviceKey {
    ["driver", "pool", "device", "shareID"].map(|k| d[k].as_str().map(String::from))
}

#[derive(Default)]
struct State {
    slices: BTreeMap<String, Value>,
    /// `<namespace>/<name>` → claim.
    claims: BTreeMap<String, Value>,
    /// `<namespace>/<name>` → field manager → the `status.devices` entries (by their keys)
    /// it applied last.
    status_owners: BTreeMap<String, BTreeMap<String, Vec<DeviceKey>>>,
    requests: Vec<Request>,
    version: u64,
    /// Every change of a slice, in order: (resourceVersion, event type, the slice then).
    events: Vec<(u64, &'static str, Value)>,
    /// Refuse a claim status write whose bearer token is bound to no node, as Kubernetes 1.36
    /// does where the driver is granted only `associated-node:patch`.
    node_bound_status: bool,
    /// Slice writes (create, update) still to refuse with a 500, as a server restarting or
    /// overloaded answers.
    refuse_writes: usize,
}

impl State {
    fn changed(&mut self, kind: &'static str, mut slice: Value) -> Value {
        self.version += 1;
        slice["metadata"]["resourceVersion"] = self.version.to_string().into();
        self.events.push((self.version, kind, slice.clone()));
        slice
    }
}

#[derive(Clone)]
pub struct ApiServer {
    pub url: String,
    state: Arc<Mutex<State>>,
    /// Woken at every change of a slice (watches wait on it).
    changed: Arc<Condvar>,
}

impl ApiServer {
    pub fn start() -> ApiServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state: Arc<Mutex<State>> = Arc::default();
        let changed: Arc<Condvar> = Arc::default();
        let (s, c) = (Arc::clone(&state), Arc::clone(&changed));
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let (s, c) = (Arc::clone(&s), Arc::clone(&c));
                std::thread::spawn(move || serve(conn, &s, &c));
            }
        });
        ApiServer {
            url,
            state,
            changed,
        }
    }

    /// A kube client for this server. Its TLS roots are given (none): kube's rustls client
    /// otherwise loads the machine's CA store, even for plain HTTP, and fails where there is
    /// none (the tests/vm guests have no ca-certificates).
    pub fn client(&self) -> kube::Client {
        let mut config = kube::Config::new(self.url.parse().unwrap());
        config.root_cert = Some(Vec::new());
        kube::Client::try_from(config).unwrap()
    }

    pub fn slices(&self) -> Vec<Value> {
        self.state
            .lock()
            .unwrap()
            .slices
            .values()
            .cloned()
            .collect()
    }

    /// The slices of `driver`, by name.
    pub fn slices_of(&self, driver: &str) -> Vec<Value> {
        self.slices()
            .into_iter()
            .filter(|s| s["spec"]["driver"] == driver)
            .collect()
    }

    /// From now on, a claim's status is written only with a token bound to a node (1.36).
    pub fn require_node_bound_status(&self) {
        self.state.lock().unwrap().node_bound_status = true;
    }

    /// The next `n` slice writes (create or update) are refused (500, InternalError).
    pub fn refuse_slice_writes(&self, n: usize) {
        self.state.lock().unwrap().refuse_writes = n;
    }

    pub fn requests(&self) -> Vec<Request> {
        self.state.lock().unwrap().requests.clone()
    }

    /// Deletes every slice, as kubelet does at its start.
    pub fn wipe(&self) {
        let mut st = self.state.lock().unwrap();
        for (_, s) in std::mem::take(&mut st.slices) {
            st.changed("DELETED", s);
        }
        self.changed.notify_all();
    }

    /// Deletes the slice `name` behind the driver's back (an admin, another controller).
    pub fn delete_slice(&self, name: &str) {
        let mut st = self.state.lock().unwrap();
        let s = st
            .slices
            .remove(name)
            .unwrap_or_else(|| panic!("no slice {name}"));
        st.changed("DELETED", s);
        self.changed.notify_all();
    }

    /// Changes the slice `name` behind the driver's back.
    pub fn edit_slice(&self, name: &str, edit: impl FnOnce(&mut Value)) {
        let mut st = self.state.lock().unwrap();
        let mut s = st
            .slices
            .get(name)
            .cloned()
            .unwrap_or_else(|| panic!("no slice {name}"));
        edit(&mut s);
        let s = st.changed("MODIFIED", s);
        st.slices.insert(name.to_string(), s);
        self.changed.notify_all();
    }

    /// A kubeconfig in `dir` naming this server (plain HTTP), its user `user` (YAML: `{}`
    /// for no credential), for the real driver binary.
    pub fn kubeconfig(&self, dir: &std::path::Path, user: &str) -> std::path::PathBuf {
        let path = dir.join("kubeconfig");
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: stand-in\n  cluster:\n    server: {}\n\
                 contexts:\n- name: stand-in\n  context:\n    cluster: stand-in\n    user: stand-in\n\
                 current-context: stand-in\nusers:\n- name: stand-in\n  user: {user}\n",
                self.url
            ),
        )
        .unwrap();
        path
    }

    /// The claim `ns/name` as the server holds it now (its status as drivers wrote it).
    pub fn claim(&self, ns: &str, name: &str) -> Value {
        self.state.lock().unwrap().claims[&format!("{ns}/{name}")].clone()
    }

    /// A claim allocated `devices` (request, device) of `driver` in pool `pool`, as the
    /// scheduler leaves it.
    pub fn put_claim(
        &self,
        ns: &str,
        name: &str,
        uid: &str,
        driver: &str,
        pool: &str,
        devices: &[(&str, &str)],
    ) {
        let results: Vec<Value> = devices
            .iter()
            .map(
                |(req, dev)| json!({"request": req, "driver": driver, "pool": pool, "device": dev}),
            )
            .collect();
        self.put_claim_results(ns, name, uid, driver, results);
    }

    /// As [`ApiServer::put_claim_results`], with the allocation's `config` entries (each a
    /// `DeviceAllocationConfiguration`: `source`, `requests`, `opaque`).
    pub fn put_claim_config(
        &self,
        ns: &str,
        name: &str,
        uid: &str,
        driver: &str,
        results: Vec<Value>,
        config: Vec<Value>,
    ) {
        self.put_claim_results(ns, name, uid, driver, results);
        let mut st = self.state.lock().unwrap();
        let claim = st.claims.get_mut(&format!("{ns}/{name}")).unwrap();
        claim["status"]["allocation"]["devices"]["config"] = config.into();
    }

    /// A claim whose allocation is `results` as given (each a `DeviceRequestAllocationResult`
    /// as the API serves it, e.g. with a `shareID`), requesting `driver`'s devices.
    pub fn put_claim_results(
        &self,
        ns: &str,
        name: &str,
        uid: &str,
        driver: &str,
        results: Vec<Value>,
    ) {
        let claim = json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": ns, "uid": uid, "resourceVersion": "1"},
            "spec": {"devices": {"requests": [{"name": "gcus", "exactly": {"deviceClassName": driver, "count": results.len()}}]}},
            "status": {"allocation": {"devices": {"results": results}},
                       "reservedFor": [{"resource": "pods", "name": "p", "uid": "0b4c7f3e-0000-4000-8000-000000000001"}]}
        });
        self.state
            .lock()
            .unwrap()
            .claims
            .insert(format!("{ns}/{name}"), claim);
    }
}

fn status(code: u16, reason: &str, msg: &str) -> (u16, Value) {
    (
        code,
        json!({"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
               "message": msg, "reason": reason, "code": code}),
    )
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            out.push(u8::from_str_radix(&s[i + 1..i + 3], 16).unwrap());
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

fn label_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A label value (apimachinery's IsValidLabelValue): at most 63 characters, letters, digits,
/// `-`, `_`, `.`, beginning and ending with a letter or digit; empty is one.
fn label_value_ok(s: &str) -> bool {
    s.is_empty()
        || (s.len() <= 63
            && s.bytes()
                .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(&c))
            && s.as_bytes()[0].is_ascii_alphanumeric()
            && s.as_bytes()[s.len() - 1].is_ascii_alphanumeric())
}

/// A qualified name (IsQualifiedName): `[prefix/]name`, the prefix a DNS subdomain, the name
/// a non-empty label value.
fn qualified_name_ok(s: &str) -> bool {
    let (prefix, name) = match s.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    !name.is_empty()
        && label_value_ok(name)
        && prefix.is_none_or(|p| p.len() <= 253 && p.split('.').all(label_ok))
}

/// semver.org 2.0.0 without pre-release or build parts (what the driver may publish):
/// three numbers, no leading zeros, at most 64 characters.
fn semver_ok(v: &str) -> bool {
    let parts: Vec<&str> = v.split('.').collect();
    v.len() <= 64
        && parts.len() == 3
        && parts.iter().all(|p| {
            !p.is_empty()
                && p.bytes().all(|b| b.is_ascii_digit())
                && (*p == "0" || !p.starts_with('0'))
        })
}

/// A Kubernetes quantity of whole units with an optional binary or decimal suffix.
fn quantity_ok(q: &str) -> bool {
    let digits = q.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let suffix = &q[digits.len()..];
    !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && [
            "", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "k", "M", "G", "T", "P", "E",
        ]
        .contains(&suffix)
}

/// A whole quantity in bytes or units (`8Gi`, `100`), for the request policy's rules.
fn whole(q: &str) -> Option<u128> {
    let digits = q.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let scale: u128 = match &q[digits.len()..] {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        _ => return None,
    };
    Some(digits.parse::<u128>().ok()? * scale)
}

/// KEP-5075's rules of a `validRange` request policy (API `CapacityRequestPolicyRange`): min
/// within the value, max at most the value and a whole number of steps above min, default in
/// range on a step, min + step within the value.
fn policy_invalid(value: &str, policy: &Value) -> Option<String> {
    let value = whole(value)?;
    let range = &policy["validRange"];
    let min = whole(range["min"].as_str()?)?;
    let max = range["max"].as_str().map_or(Some(value), whole)?;
    let step = range["step"].as_str().map_or(Some(1), whole)?;
    let default = policy["default"].as_str().map_or(Some(min), whole)?;
    let on_step = |x: u128| x >= min && (x - min).is_multiple_of(step);
    if policy.get("validValues").is_some() {
        return Some("validRange and validValues both".into());
    }
    if min > value || max > value || max < min || step == 0 || !on_step(max) {
        return Some(format!("range {range} against value {value}"));
    }
    if default > max || !on_step(default) || min + step > value {
        return Some(format!("default {default} against {range}"));
    }
    None
}

/// What the real API server's validation of a v1 ResourceSlice refuses, among the rules the
/// driver could break.
fn invalid(slice: &Value) -> Option<String> {
    let spec = &slice["spec"];
    let driver = spec["driver"].as_str()?;
    if driver.len() > 63 || !driver.split('.').all(label_ok) {
        return Some(format!("spec.driver {driver:?}"));
    }
    if spec["nodeName"].as_str().is_none() {
        return Some("spec.nodeName missing".into());
    }
    let pool = &spec["pool"];
    if pool["name"].as_str().is_none()
        || pool["generation"].as_i64().is_none()
        || pool["resourceSliceCount"].as_i64().unwrap_or(0) < 1
    {
        return Some(format!("spec.pool {pool}"));
    }
    let devices = spec["devices"].as_array().cloned().unwrap_or_default();
    let sets = spec["sharedCounters"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    // From 1.35 a slice holds devices or counter sets, not both (KEP-4815).
    if !devices.is_empty() && !sets.is_empty() {
        return Some("spec.devices and spec.sharedCounters in one slice".into());
    }
    if sets.len() > 8 {
        return Some(format!("{} counter sets", sets.len()));
    }
    for set in &sets {
        let name = set["name"].as_str().unwrap_or_default();
        let counters = set["counters"].as_object().cloned().unwrap_or_default();
        if !label_ok(name) || counters.is_empty() || counters.len() > 32 {
            return Some(format!("counter set {set}"));
        }
        for (k, c) in counters {
            if !label_ok(&k) || !quantity_ok(c["value"].as_str().unwrap_or_default()) {
                return Some(format!("counter set {name}: counter {k}: {c}"));
            }
        }
    }
    let limited = devices
        .iter()
        .any(|d| d.get("taints").is_some() || d.get("consumesCounters").is_some());
    if devices.len() > if limited { 64 } else { 128 } {
        return Some(format!("{} devices", devices.len()));
    }
    for d in &devices {
        let name = d["name"].as_str().unwrap_or_default();
        let consumes = d["consumesCounters"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if consumes.len() > 2 {
            return Some(format!("{name}: {} consumesCounters", consumes.len()));
        }
        for c in &consumes {
            let counters = c["counters"].as_object().cloned().unwrap_or_default();
            if !label_ok(c["counterSet"].as_str().unwrap_or_default())
                || counters.is_empty()
                || counters
                    .values()
                    .any(|v| !quantity_ok(v["value"].as_str().unwrap_or_default()))
            {
                return Some(format!("{name}: consumesCounters {c}"));
            }
        }
        let shareable = d["allowMultipleAllocations"] == true;
        let capacity = d["capacity"].as_object().cloned().unwrap_or_default();
        let attrs = d["attributes"].as_object().map_or(0, |a| a.len());
        if attrs + capacity.len() > 32 {
            return Some(format!(
                "{name}: {} attributes and capacities",
                attrs + capacity.len()
            ));
        }
        for (k, c) in &capacity {
            let Some(policy) = c.get("requestPolicy") else {
                continue;
            };
            if !shareable {
                return Some(format!("{name}: capacity {k}: requestPolicy on a device without allowMultipleAllocations"));
            }
            if let Some(e) = policy_invalid(c["value"].as_str().unwrap_or_default(), policy) {
                return Some(format!("{name}: capacity {k}: requestPolicy: {e}"));
            }
        }
    }
    for d in &devices {
        let name = d["name"].as_str().unwrap_or_default();
        if !label_ok(name) {
            return Some(format!("device name {name:?}"));
        }
        let attrs = d["attributes"].as_object().cloned().unwrap_or_default();
        if attrs.len() > 32 {
            return Some(format!("{name}: {} attributes", attrs.len()));
        }
        for (k, v) in attrs {
            let id = k.rsplit('/').next().unwrap();
            let c_ident = id.len() <= 32
                && id.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_')
                && !id.as_bytes()[0].is_ascii_digit();
            let one = v.as_object().is_some_and(|o| {
                o.len() == 1
                    && ["int", "bool", "string", "version"]
                        .contains(&o.keys().next().unwrap().as_str())
            });
            if !c_ident || !one || v["string"].as_str().is_some_and(|s| s.len() > 64) {
                return Some(format!("{name}: attribute {k}: {v}"));
            }
            if let Some(ver) = v.get("version") {
                if !semver_ok(ver.as_str().unwrap_or_default()) {
                    return Some(format!("{name}: attribute {k}: {ver} is not semver"));
                }
            }
        }
        for (k, c) in d["capacity"].as_object().cloned().unwrap_or_default() {
            if !quantity_ok(c["value"].as_str().unwrap_or_default()) {
                return Some(format!("{name}: capacity {k}: {c}"));
            }
        }
        let taints = d["taints"].as_array().cloned().unwrap_or_default();
        if taints.len() > 16 {
            return Some(format!("{name}: {} taints", taints.len()));
        }
        for t in taints {
            if !["NoSchedule", "NoExecute", "None"].contains(&t["effect"].as_str().unwrap_or(""))
                || !qualified_name_ok(t["key"].as_str().unwrap_or(""))
                || !label_value_ok(t["value"].as_str().unwrap_or(""))
            {
                return Some(format!("{name}: taint {t}"));
            }
        }
    }
    None
}

/// The `fieldSelector` of a query: `(field, value)` pairs.
fn selector(query: &str) -> Vec<(String, String)> {
    let mut fields = Vec::new();
    for kv in query.split('&') {
        if let Some(v) = kv.strip_prefix("fieldSelector=") {
            for sel in decode(v).split(',') {
                let (k, v) = sel.split_once('=').unwrap();
                fields.push((k.into(), v.into()));
            }
        }
    }
    fields
}

fn selects(fields: &[(String, String)], s: &Value) -> bool {
    fields.iter().all(|(k, v)| match k.as_str() {
        "spec.nodeName" => s["spec"]["nodeName"] == v.as_str(),
        "spec.driver" => s["spec"]["driver"] == v.as_str(),
        _ => false,
    })
}

/// A query parameter's value.
fn param<'q>(query: &'q str, name: &str) -> Option<&'q str> {
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
}

/// A watch of slices: the events after `resourceVersion` that its selector matches, as
/// chunks of one JSON object each, until `timeoutSeconds` passes (then the response ends, as
/// the real server ends it, and the client watches again).
fn watch(
    st: &Mutex<State>,
    changed: &Condvar,
    target: &str,
    w: &mut TcpStream,
) -> std::io::Result<()> {
    let query = target.split_once('?').map_or("", |(_, q)| q);
    let fields = selector(query);
    let timeout = param(query, "timeoutSeconds")
        .and_then(|t| t.parse().ok())
        .unwrap_or(290u64);
    let mut seen: u64 = param(query, "resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let until = Instant::now() + Duration::from_secs(timeout);
    w.write_all(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n",
    )?;
    let mut guard = st.lock().unwrap();
    guard.requests.push(Request {
        method: "WATCH".into(),
        path: target.into(),
        body: None,
        authorization: None,
    });
    loop {
        let events: Vec<Value> = guard
            .events
            .iter()
            .filter(|(v, _, s)| *v > seen && selects(&fields, s))
            .map(|(_, kind, s)| json!({"type": kind, "object": s}))
            .collect();
        seen = guard.version;
        if !events.is_empty() {
            drop(guard);
            for e in events {
                let mut line = serde_json::to_vec(&e).unwrap();
                line.push(b'\n');
                w.write_all(format!("{:x}\r\n", line.len()).as_bytes())?;
                line.extend_from_slice(b"\r\n");
                w.write_all(&line)?;
            }
            guard = st.lock().unwrap();
            continue;
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            drop(guard);
            return w.write_all(b"0\r\n\r\n");
        }
        guard = changed.wait_timeout(guard, left).unwrap().0;
    }
}

fn handle(
    st: &Mutex<State>,
    method: &str,
    target: &str,
    body: Option<Value>,
    authorization: Option<String>,
) -> (u16, Value) {
    let mut st = st.lock().unwrap();
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    st.requests.push(Request {
        method: method.into(),
        path: target.into(),
        body: body.clone(),
        authorization: authorization.clone(),
    });
    // TokenRequest: /api/v1/namespaces/<ns>/serviceaccounts/<name>/token, a token bound to
    // the Node the request names, for the seconds it asks.
    let parts: Vec<&str> = path.split('/').collect();
    if method == "POST"
        && parts.len() == 8
        && parts[..4] == ["", "api", "v1", "namespaces"]
        && parts[5] == "serviceaccounts"
        && parts[7] == "token"
    {
        let spec = body.unwrap_or_default()["spec"].clone();
        let bound = &spec["boundObjectRef"];
        let node = (bound["kind"] == "Node").then(|| bound["name"].as_str().unwrap_or(""));
        let now = now_seconds();
        let exp = now + spec["expirationSeconds"].as_i64().unwrap_or(3600);
        let account = format!("{}/{}", parts[4], parts[6]);
        return (
            201,
            json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                   "spec": spec,
                   "status": {"token": token(&account, node, now, exp),
                              "expirationTimestamp": k8s_openapi::jiff::Timestamp::from_second(exp)
                                  .unwrap().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()}}),
        );
    }
    let rest = path.strip_prefix(SLICES);
    match (method, rest) {
        ("GET", Some("")) => {
            let fields = selector(query);
            let items: Vec<Value> = st
                .slices
                .values()
                .filter(|s| selects(&fields, s))
                .cloned()
                .collect();
            (
                200,
                json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList",
                       "metadata": {"resourceVersion": st.version.to_string()}, "items": items}),
            )
        }
        ("POST" | "PUT", Some(_)) if st.refuse_writes > 0 => {
            st.refuse_writes -= 1;
            status(500, "InternalError", "refused as the test asked")
        }
        ("POST", Some("")) => {
            let mut s = body.unwrap();
            if let Some(e) = invalid(&s) {
                return status(422, "Invalid", &e);
            }
            let name = s["metadata"]["name"].as_str().unwrap().to_string();
            if st.slices.contains_key(&name) {
                return status(409, "AlreadyExists", &name);
            }
            s["metadata"]["uid"] = format!("slice-uid-{}", st.version + 1).into();
            let s = st.changed("ADDED", s);
            st.slices.insert(name, s.clone());
            (201, s)
        }
        ("PUT", Some(n)) if n.starts_with('/') => {
            let name = &n[1..];
            let s = body.unwrap();
            let Some(old) = st.slices.get(name) else {
                return status(404, "NotFound", name);
            };
            if old["metadata"]["resourceVersion"] != s["metadata"]["resourceVersion"] {
                return status(409, "Conflict", "the object has been modified");
            }
            if let Some(e) = invalid(&s) {
                return status(422, "Invalid", &e);
            }
            let s = st.changed("MODIFIED", s);
            st.slices.insert(name.to_string(), s.clone());
            (200, s)
        }
        ("DELETE", Some(n)) if n.starts_with('/') => match st.slices.remove(&n[1..]) {
            Some(s) => (200, st.changed("DELETED", s)),
            None => status(404, "NotFound", &n[1..]),
        },
        // Server-side apply of a claim's status, as the API server merges `status.devices` (a
        // list-map keyed by driver, pool, device and share): each entry is owned by the field
        // managers that applied it; an apply replaces the entries it names and removes those
        // its manager applied before and leaves out now, unless another manager owns them.
        ("PATCH", None) if path.ends_with("/status") => {
            let parts: Vec<&str> = path.split('/').collect();
            if parts.len() != 9 || parts[4] != "namespaces" || parts[6] != "resourceclaims" {
                return status(404, "NotFound", path);
            }
            let Some(manager) = param(query, "fieldManager").map(decode) else {
                return status(
                    400,
                    "BadRequest",
                    "PATCH is not supported without a field manager",
                );
            };
            let key = format!("{}/{}", parts[5], parts[7]);
            if !st.claims.contains_key(&key) {
                return status(404, "NotFound", &key);
            }
            if st.node_bound_status && bearer_node(authorization.as_deref()).is_none() {
                return status(
                    403,
                    "Forbidden",
                    &format!(
                        "resourceclaims.resource.k8s.io {:?} is forbidden: status.devices: \
                         Forbidden: a credential not tied to the claim's node needs \
                         arbitrary-node:patch on resourceclaims/driver",
                        parts[7]
                    ),
                );
            }
            let applied = body.unwrap_or_default()["status"]["devices"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let applied_keys: Vec<DeviceKey> = applied.iter().map(device_key).collect();
            let owners = st.status_owners.entry(key.clone()).or_default();
            let before = owners
                .insert(manager.clone(), applied_keys.clone())
                .unwrap_or_default();
            let dropped: Vec<DeviceKey> = before
                .into_iter()
                .filter(|k| !applied_keys.contains(k))
                .filter(|k| !owners.iter().any(|(m, ks)| *m != manager && ks.contains(k)))
                .collect();
            let claim = st.claims.get_mut(&key).unwrap();
            let mut devices: Vec<Value> = claim["status"]["devices"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter(|d| {
                    let k = device_key(d);
                    !applied_keys.contains(&k) && !dropped.contains(&k)
                })
                .collect();
            devices.extend(applied);
            claim["status"]["devices"] = devices.into();
            (200, claim.clone())
        }
        ("GET", None) => {
            let parts: Vec<&str> = path.split('/').collect();
            // /apis/resource.k8s.io/v1/namespaces/<ns>/resourceclaims/<name>
            if parts.len() == 8 && parts[4] == "namespaces" && parts[6] == "resourceclaims" {
                let key = format!("{}/{}", parts[5], parts[7]);
                return match st.claims.get(&key) {
                    Some(c) => (200, c.clone()),
                    None => status(404, "NotFound", &key),
                };
            }
            status(404, "NotFound", path)
        }
        _ => status(405, "MethodNotAllowed", target),
    }
}

fn serve(conn: TcpStream, st: &Mutex<State>, changed: &Condvar) {
    let _ = conn.set_nodelay(true);
    let mut w = conn.try_clone().unwrap();
    let mut r = BufReader::new(conn);
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut it = line.split_whitespace();
        let (method, target) = (
            it.next().unwrap_or("").to_string(),
            it.next().unwrap_or("").to_string(),
        );
        let mut len = 0usize;
        let mut authorization = None;
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    len = v.trim().parse().unwrap();
                }
                if k.eq_ignore_ascii_case("authorization") {
                    authorization = Some(v.trim().to_string());
                }
            }
        }
        let mut body = vec![0; len];
        r.read_exact(&mut body).unwrap();
        let body = (len > 0).then(|| serde_json::from_slice(&body).unwrap());
        let (path, query) = target.split_once('?').unwrap_or((&target, ""));
        if method == "GET" && path == SLICES && matches!(param(query, "watch"), Some("true" | "1"))
        {
            if watch(st, changed, &target, &mut w).is_err() {
                return;
            }
            continue;
        }
        let (code, value) = handle(st, &method, &target, body, authorization);
        if method != "GET" {
            changed.notify_all();
        }
        let text = serde_json::to_vec(&value).unwrap();
        let head = format!(
            "HTTP/1.1 {code} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            text.len()
        );
        // One write: a head and a body in two would wait on the client's delayed ACK.
        let mut out = head.into_bytes();
        out.extend_from_slice(&text);
        if w.write_all(&out).is_err() {
            return;
        }
    }
}

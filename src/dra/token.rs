//! The driver's own credential where no kubelet renews it (the systemd unit, `--token-file`):
//! a token of its service account bound to its Node object. Such a token names the node to
//! the API server (`authentication.kubernetes.io/node-name`) as a pod's token does, which is
//! what Kubernetes 1.36 asks before a driver may write a claim's status with
//! `associated-node:patch`, and what the shipped admission policies read. An administrator
//! makes the first one (docs/dra.md, "Running the driver from systemd"); the driver asks the
//! TokenRequest API for the next one, bound to the same Node, before it expires, and writes it
//! over the file its kubeconfig's `tokenFile` names (kube re-reads that file within a minute).
//!
//! Ref: KEP-4193 (tokens bound to a Node), k8s.io/api/authentication/v1 (TokenRequest).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};
use tokio::sync::watch;

/// The longest token asked for (the policy accel-dra-driver-token-request allows no longer)
/// and the shortest (the API server's minimum).
pub const MAX_SECONDS: i64 = 48 * 3600;
pub const MIN_SECONDS: i64 = 600;
/// A token is renewed this long before it expires at the latest: kube re-reads the file at
/// least once a minute, so the new one is in use well before the old one ends.
const MARGIN: i64 = 180;
/// The least time between two renewals.
const AFTER_RENEWAL: i64 = 30;

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("--token-file {}: {source}", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("--token-file {}: not a service account token: {why}", .path.display())]
    NotAToken { path: PathBuf, why: String },
    #[error(
        "--token-file {}: its token is bound to no Node, so the API server refuses the \
         driver's writes; make one bound to the Node {node:?} (docs/dra.md, \"Running the \
         driver from systemd\")",
        .path.display()
    )]
    NoNode { path: PathBuf, node: String },
    #[error(
        "--token-file {}: its token is bound to the Node {bound:?}, not to this node {node:?}",
        .path.display()
    )]
    OtherNode {
        path: PathBuf,
        bound: String,
        node: String,
    },
    #[error("cannot renew the token of {account}: {source}")]
    Request {
        account: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("cannot renew the token of {account}: the API server returned none")]
    Empty { account: String },
    #[error("--token-file {}: cannot write the renewed token: {source}", .path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What a service account token says of itself (its JWT payload; the signature is the API
/// server's to check).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    pub namespace: String,
    pub account: String,
    /// Issued and expiring, in seconds since the epoch.
    pub issued: i64,
    pub expires: i64,
    /// The Node it is bound to, or the node of the pod it is bound to.
    pub node: Option<String>,
}

impl Claims {
    /// Reads a token's claims; `Err` says what it lacks.
    pub fn of(token: &str) -> Result<Claims, String> {
        let payload = token
            .trim()
            .split('.')
            .nth(1)
            .ok_or("not a JWT (no payload)")?;
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(payload.trim_end_matches('='))
            .map_err(|e| format!("payload not base64url: {e}"))?;
        let v: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| format!("payload not JSON: {e}"))?;
        let k = &v["kubernetes.io"];
        let text = |x: &serde_json::Value| x.as_str().map(str::to_string);
        let (namespace, account) = match (text(&k["namespace"]), text(&k["serviceaccount"]["name"]))
        {
            (Some(n), Some(a)) => (n, a),
            _ => {
                let sub = v["sub"].as_str().unwrap_or("");
                let mut it = sub
                    .strip_prefix("system:serviceaccount:")
                    .ok_or_else(|| format!("subject {sub:?} is not a service account"))?
                    .splitn(2, ':');
                match (it.next(), it.next()) {
                    (Some(n), Some(a)) if !n.is_empty() && !a.is_empty() => {
                        (n.to_string(), a.to_string())
                    }
                    _ => return Err(format!("subject {sub:?} is not a service account")),
                }
            }
        };
        let expires = v["exp"].as_i64().ok_or("no expiry (exp)")?;
        let issued = v["iat"].as_i64().unwrap_or(expires - 3600);
        Ok(Claims {
            namespace,
            account,
            issued,
            expires,
            node: text(&k["node"]["name"]),
        })
    }

    /// When to ask for the next token: four fifths into this one's life, and at the latest
    /// three minutes before it ends.
    pub fn renew_at(&self) -> i64 {
        let life = (self.expires - self.issued).max(0);
        (self.issued + life * 4 / 5).min(self.expires - MARGIN)
    }

    /// How long a token to ask for: as long as this one, within what the API server and the
    /// policy allow.
    pub fn lifetime(&self) -> i64 {
        (self.expires - self.issued).clamp(MIN_SECONDS, MAX_SECONDS)
    }
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// The claims of the token at `path`, checked to be bound to `node`.
pub fn read(path: &Path, node: &str) -> Result<Claims, TokenError> {
    let text = std::fs::read_to_string(path).map_err(|source| TokenError::Read {
        path: path.into(),
        source,
    })?;
    let c = Claims::of(&text).map_err(|why| TokenError::NotAToken {
        path: path.into(),
        why,
    })?;
    match &c.node {
        None => Err(TokenError::NoNode {
            path: path.into(),
            node: node.into(),
        }),
        Some(b) if b != node => Err(TokenError::OtherNode {
            path: path.into(),
            bound: b.clone(),
            node: node.into(),
        }),
        Some(_) => Ok(c),
    }
}

/// Writes `token` over `path` whole or not at all: a file beside it, mode 0600, renamed over.
pub fn write(path: &Path, token: &str) -> std::io::Result<()> {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(token.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Asks for the next token of `current`'s service account, bound to the Node `node`, and
/// writes it over `path`; its claims.
pub async fn renew(
    client: &kube::Client,
    path: &Path,
    node: &str,
    current: &Claims,
) -> Result<Claims, TokenError> {
    let account = format!("{}/{}", current.namespace, current.account);
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), &current.namespace);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: Vec::new(),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(node.into()),
                uid: None,
            }),
            expiration_seconds: Some(current.lifetime()),
        },
        ..TokenRequest::default()
    };
    let answer = api
        .create_token_request(&current.account, &PostParams::default(), &request)
        .await
        .map_err(|source| TokenError::Request {
            account: account.clone(),
            source: Box::new(source),
        })?;
    let token = answer
        .status
        .map(|s| s.token)
        .filter(|t| !t.is_empty())
        .ok_or(TokenError::Empty {
            account: account.clone(),
        })?;
    let claims = Claims::of(&token).map_err(|why| TokenError::NotAToken {
        path: path.into(),
        why: format!("the renewed token: {why}"),
    })?;
    write(path, &token).map_err(|source| TokenError::Write {
        path: path.into(),
        source,
    })?;
    Ok(claims)
}

/// Keeps the token at `path` renewed until `stop` turns true. A failure is said and tried
/// again (30 s, doubling to 5 min) while the token still holds.
pub async fn keep_renewed(
    client: kube::Client,
    path: PathBuf,
    node: String,
    mut stop: watch::Receiver<bool>,
) {
    let mut failures: u32 = 0;
    loop {
        let retry = Duration::from_secs((30u64 << failures.min(4)).min(300));
        let wait = match read(&path, &node) {
            Err(e) => {
                log::error!("{e}");
                failures += 1;
                retry
            }
            Ok(c) if c.renew_at() > now() => {
                failures = 0;
                Duration::from_secs((c.renew_at() - now()) as u64)
            }
            Ok(c) => match renew(&client, &path, &node, &c).await {
                Ok(new) => {
                    log::info!(
                        "renewed the token of {}/{} bound to the Node {node} in {} (valid {} s)",
                        new.namespace,
                        new.account,
                        path.display(),
                        new.expires - now()
                    );
                    failures = 0;
                    // At least 30 s: a server that issues short tokens is not asked in a loop.
                    Duration::from_secs((new.renew_at() - now()).max(AFTER_RENEWAL) as u64)
                }
                Err(e) => {
                    let left = c.expires - now();
                    if left > 0 {
                        log::error!("{e}; the present token holds {left} s more");
                    } else {
                        log::error!("{e}; the present token has expired");
                    }
                    failures += 1;
                    retry
                }
            },
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwt(payload: serde_json::Value) -> String {
        let b = |s: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        format!(
            "{}.{}.sig",
            b(br#"{"alg":"RS256"}"#),
            b(payload.to_string().as_bytes())
        )
    }

    #[test]
    fn a_node_bound_tokens_claims() {
        let t = jwt(serde_json::json!({
            "sub": "system:serviceaccount:accel-system:accel-dra-driver",
            "iat": 1000, "exp": 1000 + 86400,
            "kubernetes.io": {"namespace": "accel-system",
                "serviceaccount": {"name": "accel-dra-driver", "uid": "u"},
                "node": {"name": "n1", "uid": "v"}},
        }));
        let c = Claims::of(&t).unwrap();
        assert_eq!(
            c,
            Claims {
                namespace: "accel-system".into(),
                account: "accel-dra-driver".into(),
                issued: 1000,
                expires: 1000 + 86400,
                node: Some("n1".into()),
            }
        );
        assert_eq!(c.renew_at(), 1000 + 86400 * 4 / 5);
        assert_eq!(c.lifetime(), 86400);
        // A short one: renewed three minutes before its end, asked again for the minimum.
        let short = Claims {
            expires: 1000 + 600,
            ..c.clone()
        };
        assert_eq!(short.renew_at(), 1000 + 600 - 180);
        assert_eq!(
            Claims {
                expires: 1000 + 60,
                ..c
            }
            .lifetime(),
            MIN_SECONDS
        );
    }

    #[test]
    fn what_is_not_a_service_account_token_is_said() {
        assert!(Claims::of("abc").unwrap_err().contains("no payload"));
        let user = jwt(serde_json::json!({"sub": "alice", "exp": 5}));
        assert!(Claims::of(&user).unwrap_err().contains("\"alice\""));
        let no_exp = jwt(serde_json::json!({"sub": "system:serviceaccount:a:b"}));
        assert!(Claims::of(&no_exp).unwrap_err().contains("exp"));
    }

    #[test]
    fn the_token_file_is_replaced_whole_and_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("token");
        std::fs::write(&p, "old").unwrap();
        write(&p, "new").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "new");
        let mode = std::fs::metadata(&p).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}

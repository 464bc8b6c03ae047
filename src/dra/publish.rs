//! Publishing one profile's pool to the API server: the slices of [`super::slices`], written
//! with the pool generation rules of `resource.k8s.io/v1`. A change writes every slice of
//! the pool at a generation above any the API server holds for it (the scheduler ignores
//! slices of older generations, so a half-written pool is never mixed), then deletes the
//! slices the pool no longer needs.
//!
//! What the API server holds is followed by a watch of this node's slices of this driver
//! (kube's reflector: one list, then one long watch request, renewed every few minutes), so
//! deciding whether to write costs no request: a steady node sends nothing, and a slice that
//! someone else deletes or changes (kubelet wipes a node's slices when it starts) is seen at
//! once and written back at the driver's next look.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{DeleteParams, PostParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};
use tokio::sync::Notify;
use tokio_stream::StreamExt;

use super::slices::{slices, Contents, Pool};

/// How long a write of ours stands for the API server's copy before its watch event comes
/// back (milliseconds, usually). After that the watch's copy is believed: a slice edited
/// behind our back right after our write is written back then.
const PENDING: Duration = Duration::from_secs(5);

pub struct Publisher {
    api: Api<ResourceSlice>,
    driver: String,
    node: String,
    generation: i64,
    /// This node's slices of this driver as the watch last saw them.
    store: Store<ResourceSlice>,
    /// Our writes whose watch event has not come back yet: the slice as written (`None`:
    /// deleted), and when.
    pending: BTreeMap<String, (Option<ResourceSlice>, Instant)>,
    watching: tokio::task::JoinHandle<()>,
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.watching.abort();
    }
}

impl Publisher {
    /// A publisher for `driver`'s pool on `node`, its watch started; `changed` is notified at
    /// every event the watch sees.
    pub fn new(client: Client, driver: &str, node: &str, changed: Arc<Notify>) -> Publisher {
        let api: Api<ResourceSlice> = Api::all(client);
        let (store, writer) = reflector::store();
        let config = watcher::Config::default()
            .fields(&format!("spec.nodeName={node},spec.driver={driver}"));
        let events = reflector::reflector(writer, watcher(api.clone(), config)).default_backoff();
        let name = driver.to_string();
        let watching = tokio::spawn(async move {
            let mut events = std::pin::pin!(events);
            let mut failing = false;
            while let Some(e) = events.next().await {
                match e {
                    Ok(_) => {
                        failing = false;
                        changed.notify_one();
                    }
                    // Retried with backoff; said once per outage.
                    Err(e) if !failing => {
                        failing = true;
                        log::warn!("{name}: watching the ResourceSlices: {e}");
                    }
                    Err(_) => {}
                }
            }
        });
        Publisher {
            api,
            driver: driver.to_string(),
            node: node.to_string(),
            generation: 0,
            store,
            pending: BTreeMap::new(),
            watching,
        }
    }

    pub fn generation(&self) -> i64 {
        self.generation
    }

    /// The pool's slices as the API server holds them, as far as this publisher knows: the
    /// watch's, with our own writes whose events have not come back yet.
    fn known(&mut self) -> BTreeMap<String, ResourceSlice> {
        let mut known: BTreeMap<String, ResourceSlice> = self
            .store
            .state()
            .iter()
            .filter(|s| s.spec.driver == self.driver && s.spec.pool.name == self.node)
            .filter_map(|s| Some((s.metadata.name.clone()?, (**s).clone())))
            .collect();
        self.pending.retain(|name, (written, at)| {
            let seen = known.get(name);
            let arrived = match written {
                Some(w) => {
                    seen.is_some_and(|s| s.metadata.resource_version == w.metadata.resource_version)
                }
                None => seen.is_none(),
            };
            !arrived && at.elapsed() < PENDING
        });
        for (name, (written, _)) in &self.pending {
            match written {
                Some(w) => known.insert(name.clone(), w.clone()),
                None => known.remove(name),
            };
        }
        known
    }

    /// Makes the pool hold `contents`: nothing is sent when the API server's copy (as the
    /// watch has it) already does. Returns whether anything was written; an error when the
    /// watch has not listed the slices yet, or a write failed (the next look tries again).
    pub async fn publish(
        &mut self,
        pool: &Pool<'_>,
        contents: &Contents,
    ) -> Result<bool, PublishError> {
        let r = self.publish_inner(pool, contents).await;
        crate::kubelet::metrics::dra().publish(&self.driver, &r);
        r
    }

    async fn publish_inner(
        &mut self,
        pool: &Pool<'_>,
        contents: &Contents,
    ) -> Result<bool, PublishError> {
        // Not waited for: the loop has health to report meanwhile, and the watch's first
        // list wakes it.
        if tokio::time::timeout(Duration::ZERO, self.store.wait_until_ready())
            .await
            .is_err()
        {
            return Err(PublishError::NotWatching);
        }
        let existing = self.known();
        let seen = existing
            .values()
            .map(|s| s.spec.pool.generation)
            .max()
            .unwrap_or(0);
        let current = self.generation.max(seen);
        let same = |want: &[ResourceSlice]| {
            want.len() == existing.len()
                && want.iter().all(|w| {
                    existing
                        .get(w.metadata.name.as_deref().unwrap_or_default())
                        .is_some_and(|e| e.spec == w.spec)
                })
        };
        if current > 0 && same(&slices(pool, contents, current)) {
            self.generation = current;
            return Ok(false);
        }
        self.generation = current + 1;
        let want = slices(pool, contents, self.generation);
        let pp = PostParams {
            field_manager: Some(super::slices::MANAGER.into()),
            ..PostParams::default()
        };
        for s in &want {
            let name = s.metadata.name.clone().unwrap_or_default();
            let written = match existing.get(&name) {
                Some(old) => {
                    let mut s = s.clone();
                    s.metadata.resource_version = old.metadata.resource_version.clone();
                    match self.api.replace(&name, &pp, &s).await {
                        // Changed since the watch saw it: made anew from what is there now.
                        Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => {
                            self.pending.remove(&name);
                            return Err(PublishError::Api(kube::Error::Api(e)));
                        }
                        r => r?,
                    }
                }
                None => self.api.create(&pp, s).await?,
            };
            self.pending.insert(name, (Some(written), Instant::now()));
        }
        for name in existing.keys() {
            if !want
                .iter()
                .any(|w| w.metadata.name.as_deref() == Some(name))
            {
                match self.api.delete(name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(e.into()),
                }
                self.pending.insert(name.clone(), (None, Instant::now()));
            }
        }
        Ok(true)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("the watch of the ResourceSlices has not listed them yet")]
    NotWatching,
    #[error(transparent)]
    Api(#[from] kube::Error),
}

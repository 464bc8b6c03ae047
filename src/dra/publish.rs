//! Publishing one profile's pool to the API server: the slices of [`super::slices`], written
//! with the pool generation rules of `resource.k8s.io/v1`. A change writes every slice of
//! the pool at a generation above any the API server holds for it (the scheduler ignores
//! slices of older generations, so a half-written pool is never mixed), then deletes the
//! slices the pool no longer needs. A resync lists the pool and rewrites it only when the
//! API server's copy differs (kubelet wipes a node's slices when it starts).

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};

use super::slices::{slices, Pool};

pub struct Publisher {
    api: Api<ResourceSlice>,
    driver: String,
    node: String,
    generation: i64,
    /// The devices the API server holds, as far as this publisher knows.
    published: Option<Vec<Device>>,
}

impl Publisher {
    pub fn new(client: Client, driver: &str, node: &str) -> Publisher {
        Publisher {
            api: Api::all(client),
            driver: driver.to_string(),
            node: node.to_string(),
            generation: 0,
            published: None,
        }
    }

    pub fn generation(&self) -> i64 {
        self.generation
    }

    /// Makes the pool hold `devices`. Without `resync`, devices equal to the last published
    /// ones cost nothing; with it, the API server's slices are compared. Returns whether
    /// anything was written.
    pub async fn publish(
        &mut self,
        pool: &Pool<'_>,
        devices: &[Device],
        resync: bool,
    ) -> Result<bool, kube::Error> {
        let r = self.publish_inner(pool, devices, resync).await;
        crate::kubelet::metrics::dra().publish(&self.driver, &r);
        r
    }

    async fn publish_inner(
        &mut self,
        pool: &Pool<'_>,
        devices: &[Device],
        resync: bool,
    ) -> Result<bool, kube::Error> {
        if !resync && self.published.as_deref() == Some(devices) {
            return Ok(false);
        }
        let lp = ListParams::default().fields(&format!(
            "spec.nodeName={},spec.driver={}",
            self.node, self.driver
        ));
        let existing: BTreeMap<String, ResourceSlice> = self
            .api
            .list(&lp)
            .await?
            .items
            .into_iter()
            .filter(|s| s.spec.driver == self.driver && s.spec.pool.name == self.node)
            .filter_map(|s| Some((s.metadata.name.clone()?, s)))
            .collect();
        let same = |want: &[ResourceSlice]| {
            want.len() == existing.len()
                && want.iter().all(|w| {
                    existing
                        .get(w.metadata.name.as_deref().unwrap_or_default())
                        .is_some_and(|e| e.spec == w.spec)
                })
        };
        if self.generation > 0 && same(&slices(pool, devices, self.generation)) {
            self.published = Some(devices.to_vec());
            return Ok(false);
        }
        let seen = existing
            .values()
            .map(|s| s.spec.pool.generation)
            .max()
            .unwrap_or(0);
        self.generation = self.generation.max(seen) + 1;
        let want = slices(pool, devices, self.generation);
        // Until every write is through, what the API server holds is unknown.
        self.published = None;
        let pp = PostParams {
            field_manager: Some(super::slices::MANAGER.into()),
            ..PostParams::default()
        };
        for s in &want {
            let name = s.metadata.name.clone().unwrap_or_default();
            match existing.get(&name) {
                Some(old) => {
                    let mut s = s.clone();
                    s.metadata.resource_version = old.metadata.resource_version.clone();
                    self.api.replace(&name, &pp, &s).await?;
                }
                None => {
                    self.api.create(&pp, s).await?;
                }
            }
        }
        for name in existing.keys() {
            if !want
                .iter()
                .any(|w| w.metadata.name.as_deref() == Some(name))
            {
                match self.api.delete(name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(e),
                }
            }
        }
        self.published = Some(devices.to_vec());
        Ok(true)
    }
}

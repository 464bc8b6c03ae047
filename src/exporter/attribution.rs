//! Which pod and container hold each device, from kubelet's PodResources `List`: device
//! plugin allocations (`devices`: resource and device IDs, replicas `<id>::<k>` counted for
//! their device) and DRA claims (`dynamic_resources`: the claim, and per device the driver,
//! pool and device name kubelet prepared). Kubelet alone knows this; no API server access is
//! needed. Computed when `List` answers (off the scrape path); a scrape only looks it up.
//!
//! Ref: k8s.io/kubelet/pkg/apis/podresources/v1/api.proto; KEP-3695 (dynamic resources).

use std::collections::HashMap;

use crate::kubelet::proto::podresources::ListPodResourcesResponse;
use crate::request::split_replica;

use super::snapshot::{Device, ProfileSnapshot};

/// How a container holds a device.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Via {
    Plugin {
        resource: String,
        /// As kubelet gave it (`GCU-3::1` for a replica).
        id: String,
    },
    Dra {
        driver: String,
        pool: String,
        device: String,
        claim: String,
        claim_namespace: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Holder {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub via: Via,
}

/// Every holder of kubelet's answer, by what names its device.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Holders {
    /// By (resource, device ID without a replica suffix).
    plugin: HashMap<(String, String), Vec<Holder>>,
    /// By (driver, device name).
    dra: HashMap<(String, String), Vec<Holder>>,
    pub count: usize,
}

impl Holders {
    pub fn from_list(resp: &ListPodResourcesResponse) -> Holders {
        let mut h = Holders::default();
        for pod in &resp.pod_resources {
            for c in &pod.containers {
                let holder = |via| Holder {
                    namespace: pod.namespace.clone(),
                    pod: pod.name.clone(),
                    container: c.name.clone(),
                    via,
                };
                for d in &c.devices {
                    for id in &d.device_ids {
                        let base = split_replica(id).map_or(id.as_str(), |(b, _)| b);
                        h.plugin
                            .entry((d.resource_name.clone(), base.to_string()))
                            .or_default()
                            .push(holder(Via::Plugin {
                                resource: d.resource_name.clone(),
                                id: id.clone(),
                            }));
                        h.count += 1;
                    }
                }
                for claim in &c.dynamic_resources {
                    for r in &claim.claim_resources {
                        h.dra
                            .entry((r.driver_name.clone(), r.device_name.clone()))
                            .or_default()
                            .push(holder(Via::Dra {
                                driver: r.driver_name.clone(),
                                pool: r.pool_name.clone(),
                                device: r.device_name.clone(),
                                claim: claim.claim_name.clone(),
                                claim_namespace: claim.claim_namespace.clone(),
                            }));
                        h.count += 1;
                    }
                }
            }
        }
        for v in h.plugin.values_mut().chain(h.dra.values_mut()) {
            v.sort();
            v.dedup();
        }
        h
    }

    /// The holders of `dev`, a device of profile `p`, sorted.
    pub fn of<'a>(&'a self, p: &ProfileSnapshot, dev: &Device) -> Vec<&'a Holder> {
        let mut out: Vec<&Holder> = Vec::new();
        if let Some(id) = &dev.plugin_id {
            for r in &p.resources {
                if let Some(v) = self.plugin.get(&(r.clone(), id.clone())) {
                    out.extend(v);
                }
            }
        }
        if let Some(driver) = &p.dra_driver {
            for name in std::iter::once(&dev.dra_name).chain(&dev.dra_offers) {
                if let Some(v) = self.dra.get(&(driver.clone(), name.clone())) {
                    out.extend(v);
                }
            }
        }
        out.sort();
        out
    }
}

/// The pod labels a device's value series carry: `namespace` and `pod` where one pod holds
/// it, `container` where one container does, `claim` and `claim_namespace` where one DRA
/// claim does. A device held by several (replicas, a shared claim) carries only what they
/// all share, so no value is counted twice by a sum; `accel_device_holder_info` lists them
/// all.
pub fn pod_labels(holders: &[&Holder]) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    let Some(first) = holders.first() else {
        return out;
    };
    if holders
        .iter()
        .all(|h| h.namespace == first.namespace && h.pod == first.pod)
    {
        out.push(("namespace", first.namespace.clone()));
        out.push(("pod", first.pod.clone()));
        if holders.iter().all(|h| h.container == first.container) {
            out.push(("container", first.container.clone()));
        }
    }
    let claim = |h: &Holder| match &h.via {
        Via::Dra {
            claim,
            claim_namespace,
            ..
        } => Some((claim.clone(), claim_namespace.clone())),
        Via::Plugin { .. } => None,
    };
    if let Some((c, ns)) = claim(first) {
        if holders
            .iter()
            .all(|h| claim(h).as_ref() == Some(&(c.clone(), ns.clone())))
        {
            out.push(("claim", c));
            out.push(("claim_namespace", ns));
        }
    }
    out
}

/// One holder's labels in `accel_device_holder_info`.
pub fn holder_labels(h: &Holder) -> Vec<(&'static str, String)> {
    let mut out = vec![
        ("namespace", h.namespace.clone()),
        ("pod", h.pod.clone()),
        ("container", h.container.clone()),
    ];
    match &h.via {
        Via::Plugin { resource, id } => {
            out.push(("resource", resource.clone()));
            out.push(("device_id", id.clone()));
        }
        Via::Dra {
            driver,
            pool,
            device,
            claim,
            claim_namespace,
        } => {
            out.push(("claim", claim.clone()));
            out.push(("claim_namespace", claim_namespace.clone()));
            out.push(("dra_driver", driver.clone()));
            out.push(("dra_pool", pool.clone()));
            out.push(("dra_device", device.clone()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubelet::proto::podresources::{
        ClaimResource, ContainerResources, DynamicResource, PodResources,
    };

    /// Issue 35: a claim holds a share or a part of a device under the offer's name; the
    /// device's series name its holders all the same.
    #[test]
    fn a_share_or_a_part_is_held_as_its_device() {
        let pod = |name: &str, device: &str| PodResources {
            name: name.into(),
            namespace: "ns".into(),
            containers: vec![ContainerResources {
                name: "c".into(),
                devices: vec![],
                dynamic_resources: vec![DynamicResource {
                    claim_name: format!("{name}-claim"),
                    claim_namespace: "ns".into(),
                    claim_resources: vec![ClaimResource {
                        cdi_devices: vec![],
                        driver_name: "gcu.enflame.com".into(),
                        pool_name: "n1".into(),
                        device_name: device.into(),
                        share_id: None,
                    }],
                }],
            }],
        };
        let h = Holders::from_list(&ListPodResourcesResponse {
            pod_resources: vec![
                pod("a", "gcu-3-shared"),
                pod("b", "gcu-3-half-1"),
                pod("c", "gcu-30"),
            ],
        });
        let p = ProfileSnapshot {
            profile: "enflame".into(),
            driver_version: None,
            resources: vec![],
            dra_driver: Some("gcu.enflame.com".into()),
            devices: vec![],
            poll_seconds: 0.0,
        };
        let dev = Device {
            dra_name: "gcu-3".into(),
            dra_offers: vec![
                "gcu-3-shared".into(),
                "gcu-3-half-0".into(),
                "gcu-3-half-1".into(),
            ],
            ..Device::default()
        };
        let pods: Vec<&str> = h.of(&p, &dev).iter().map(|x| x.pod.as_str()).collect();
        assert_eq!(pods, ["a", "b"]);
    }
}

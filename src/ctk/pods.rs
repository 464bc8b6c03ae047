//! `accel-ctk pods [--json] [--socket PATH]`: which pod and container holds each device of
//! the profiles' resources, from kubelet's PodResources API (v1 `List`). Only kubelet knows
//! this: the device plugin's Allocate is a pure function of the IDs and keeps no record, so
//! this is also how usage of shared devices (replicas, `<id>::<k>`) is attributed to pods.
//!
//! Built with the cargo feature `plugin` (kubelet's protocols, [`crate::kubelet`]). The JSON form:
//! `{"holders":[{resource, device, id, namespace, pod, container}]}`, `device` being the
//! device ID of a replica `id`; fields are only ever added.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use serde::Serialize;

use crate::kubelet::proto::podresources::pod_resources_lister_client::PodResourcesListerClient;
use crate::kubelet::proto::podresources::{
    ListPodResourcesRequest, ListPodResourcesResponse, SOCKET,
};
use crate::request::split_replica;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// kubelet's PodResources socket (in a pod: mount its directory, not the socket).
    #[arg(long, default_value = SOCKET)]
    pub socket: PathBuf,
}

/// One device ID held by one container.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Holder {
    pub resource: String,
    /// The device: `id` itself, or the device of a replica.
    pub device: String,
    /// As kubelet gave it (`GCU-3::1` for a replica).
    pub id: String,
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

/// The holders of `resources`' devices in kubelet's answer, sorted by resource, device, ID.
pub fn holders(resp: &ListPodResourcesResponse, resources: &BTreeSet<String>) -> Vec<Holder> {
    let mut out = Vec::new();
    for pod in &resp.pod_resources {
        for c in &pod.containers {
            for d in c
                .devices
                .iter()
                .filter(|d| resources.contains(&d.resource_name))
            {
                for id in &d.device_ids {
                    out.push(Holder {
                        resource: d.resource_name.clone(),
                        device: split_replica(id)
                            .map_or(id.as_str(), |(b, _)| b)
                            .to_string(),
                        id: id.clone(),
                        namespace: pod.namespace.clone(),
                        pod: pod.name.clone(),
                        container: c.name.clone(),
                    });
                }
            }
        }
    }
    out.sort();
    out
}

pub fn table(holders: &[Holder]) -> String {
    let mut rows: Vec<[String; 5]> =
        vec![["RESOURCE", "DEVICE", "ID", "POD", "CONTAINER"].map(String::from)];
    for h in holders {
        rows.push([
            h.resource.clone(),
            h.device.clone(),
            h.id.clone(),
            format!("{}/{}", h.namespace, h.pod),
            h.container.clone(),
        ]);
    }
    super::columns(&rows)
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let config = super::load_config()?;
    let resources: BTreeSet<String> = config
        .profiles
        .iter()
        .flat_map(|p| p.resource_name.iter().chain(&p.shared_resource_name))
        .cloned()
        .collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the gRPC client")?;
    let resp = rt
        .block_on(async {
            let ch = crate::kubelet::client::connect(&args.socket, "localhost")
                .await
                .map_err(|e| anyhow::anyhow!("{e:#}"))?;
            PodResourcesListerClient::new(ch)
                .list(ListPodResourcesRequest {})
                .await
                .map(tonic::Response::into_inner)
                .map_err(|s| anyhow::anyhow!("List: {}", s.message()))
        })
        .with_context(|| {
            format!(
                "asking kubelet's PodResources API at {}",
                args.socket.display()
            )
        })?;
    let holders = holders(&resp, &resources);
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "holders": holders }))?
        );
    } else if holders.is_empty() {
        let names: Vec<&str> = resources.iter().map(String::as_str).collect();
        println!("no pod holds a device of {}", names.join(", "));
    } else {
        print!("{}", table(&holders));
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubelet::proto::podresources::{ContainerDevices, ContainerResources, PodResources};

    #[test]
    fn replicas_are_attributed_to_their_pods_and_devices() {
        let pod = |name: &str, resource: &str, ids: &[&str]| PodResources {
            name: name.into(),
            namespace: "ml".into(),
            containers: vec![ContainerResources {
                name: "main".into(),
                devices: vec![ContainerDevices {
                    resource_name: resource.into(),
                    device_ids: ids.iter().map(|s| s.to_string()).collect(),
                    topology: None,
                }],
                dynamic_resources: vec![],
            }],
        };
        let resp = ListPodResourcesResponse {
            pod_resources: vec![
                pod("b", "enflame.com/shared-gcu", &["GCU-2::1"]),
                pod("a", "enflame.com/shared-gcu", &["GCU-2::0", "GCU-3::0"]),
                pod("w", "enflame.com/gcu", &["GCU-0"]),
                pod("nic", "rdma/hca", &["x"]),
            ],
        };
        let ours: BTreeSet<String> = ["enflame.com/gcu", "enflame.com/shared-gcu"]
            .map(String::from)
            .into();
        let h = holders(&resp, &ours);
        let got: Vec<(&str, &str, &str)> = h
            .iter()
            .map(|h| (h.device.as_str(), h.id.as_str(), h.pod.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("GCU-0", "GCU-0", "w"),
                ("GCU-2", "GCU-2::0", "a"),
                ("GCU-2", "GCU-2::1", "b"),
                ("GCU-3", "GCU-3::0", "a"),
            ]
        );
        let t = table(&h);
        assert!(
            t.contains("enflame.com/shared-gcu  GCU-2   GCU-2::1  ml/b  main"),
            "{t}"
        );
    }
}

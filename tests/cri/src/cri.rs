//! A CRI v1 client for containerd's unix socket, shaped like kubelet's calls.

use hyper_util::rt::TokioIo;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::*;
use std::future::Future;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

pub type R<T> = Result<T, String>;

/// Settings shared by every call (from the command line).
#[derive(Clone, Debug, Default)]
pub struct Env {
    pub socket: String,
    pub image: String,
    pub cgroup_parent: String,
    pub log_dir: String,
    pub node_ip: String,
    pub cnikit: String,
    pub mode: String,
    pub network: String,
}

/// One pod: name (also its hostname), port mappings (protocol, containerPort, hostPort), and
/// whether it uses the node's network namespace (then CNI is not called at all).
#[derive(Clone, Debug, Default)]
pub struct PodSpec {
    pub name: String,
    pub ports: Vec<(Protocol, u16, u16)>,
    pub host_network: bool,
}

/// A running pod: sandbox id, the app container's id (if one was started), addresses.
#[derive(Clone, Debug, Default)]
pub struct Pod {
    pub name: String,
    pub id: String,
    pub container: String,
    pub ips: Vec<String>,
}

#[derive(Clone)]
pub struct Cri {
    rt: RuntimeServiceClient<Channel>,
    env: Env,
}

impl Cri {
    /// One runtime call, `what` by its CRI name: `call` gets a handle of its
    /// own (tonic clients are cheap clones over one channel); a failure
    /// becomes the status message and code, named.
    async fn call<T, F>(
        &self,
        what: &str,
        call: impl FnOnce(RuntimeServiceClient<Channel>) -> F,
    ) -> R<T>
    where
        F: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        match call(self.rt.clone()).await {
            Ok(resp) => Ok(resp.into_inner()),
            Err(s) => Err(format!("{what}: {} ({:?})", s.message(), s.code())),
        }
    }

    pub async fn connect(env: &Env) -> R<Cri> {
        let path = env.socket.clone();
        let channel =
            Endpoint::try_from("http://[::]:50051")
                .map_err(|e| e.to_string())?
                .timeout(std::time::Duration::from_secs(120))
                .connect_with_connector(tower::service_fn(move |_: Uri| {
                    let path = path.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?))
                    }
                }))
                .await
                .map_err(|e| format!("connect {}: {e}", env.socket))?;
        Ok(Cri {
            rt: RuntimeServiceClient::new(channel),
            env: env.clone(),
        })
    }

    pub fn sandbox_config(&self, spec: &PodSpec) -> PodSandboxConfig {
        PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: spec.name.clone(),
                uid: format!("uid-{}", spec.name),
                namespace: "cnikit-cri".into(),
                attempt: 0,
            }),
            // kubelet sets no hostname for hostNetwork pods (runc: no private UTS namespace)
            hostname: if spec.host_network {
                String::new()
            } else {
                spec.name.clone()
            },
            log_directory: format!("{}/{}", self.env.log_dir, spec.name),
            port_mappings: spec
                .ports
                .iter()
                .map(|&(p, c, h)| PortMapping {
                    protocol: p as i32,
                    container_port: c.into(),
                    host_port: h.into(),
                    host_ip: String::new(),
                })
                .collect(),
            linux: Some(LinuxPodSandboxConfig {
                cgroup_parent: format!("{}/{}", self.env.cgroup_parent, spec.name),
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: Some(NamespaceOption {
                        network: if spec.host_network {
                            NamespaceMode::Node
                        } else {
                            NamespaceMode::Pod
                        } as i32,
                        pid: NamespaceMode::Container as i32,
                        ipc: NamespaceMode::Pod as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// RunPodSandbox only (what the measurement times).
    pub async fn run_sandbox(&self, spec: &PodSpec) -> R<String> {
        self.run_sandbox_with(self.sandbox_config(spec)).await
    }

    /// RunPodSandbox, then the echo server container (`cri-echo serve` on the container ports).
    pub async fn run_pod(&self, spec: &PodSpec) -> R<Pod> {
        let id = self.run_sandbox(spec).await?;
        let mut pod = Pod {
            name: spec.name.clone(),
            id,
            ..Default::default()
        };
        let mut cmd = vec!["cri-echo".to_string(), "serve".into()];
        for &(p, c, _) in &spec.ports {
            cmd.push(if p == Protocol::Udp { "--udp" } else { "--tcp" }.into());
            cmd.push(c.to_string());
        }
        let req = CreateContainerRequest {
            pod_sandbox_id: pod.id.clone(),
            config: Some(ContainerConfig {
                metadata: Some(ContainerMetadata {
                    name: "echo".into(),
                    attempt: 0,
                }),
                image: Some(ImageSpec {
                    image: self.env.image.clone(),
                    ..Default::default()
                }),
                command: cmd,
                log_path: "echo.log".into(),
                ..Default::default()
            }),
            sandbox_config: Some(self.sandbox_config(spec)),
        };
        let c = self
            .call("CreateContainer", |mut rt| async move {
                rt.create_container(req).await
            })
            .await?;
        pod.container = c.container_id;
        let req = StartContainerRequest {
            container_id: pod.container.clone(),
        };
        self.call("StartContainer", |mut rt| async move {
            rt.start_container(req).await
        })
        .await?;
        pod.ips = self.pod_ips(&pod.id).await?;
        Ok(pod)
    }

    /// RunPodSandbox with `config` as given (the caller chose its namespaces).
    pub async fn run_sandbox_with(&self, config: PodSandboxConfig) -> R<String> {
        let req = RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: String::new(),
        };
        let resp = self
            .call("RunPodSandbox", |mut rt| async move {
                rt.run_pod_sandbox(req).await
            })
            .await?;
        Ok(resp.pod_sandbox_id)
    }

    /// CreateContainer + StartContainer of `config` in sandbox `pod` (made from `sandbox`).
    pub async fn start_container(
        &self,
        pod: &str,
        sandbox: PodSandboxConfig,
        config: ContainerConfig,
    ) -> R<String> {
        let req = CreateContainerRequest {
            pod_sandbox_id: pod.into(),
            config: Some(config),
            sandbox_config: Some(sandbox),
        };
        let c = self
            .call("CreateContainer", |mut rt| async move {
                rt.create_container(req).await
            })
            .await?;
        let req = StartContainerRequest {
            container_id: c.container_id.clone(),
        };
        self.call("StartContainer", |mut rt| async move {
            rt.start_container(req).await
        })
        .await?;
        Ok(c.container_id)
    }

    /// StopContainer as kubelet sends it (SIGTERM, SIGKILL after `timeout` seconds).
    pub async fn stop_container(&self, id: &str, timeout: i64) -> R<()> {
        let req = StopContainerRequest {
            container_id: id.into(),
            timeout,
        };
        self.call("StopContainer", |mut rt| async move {
            rt.stop_container(req).await
        })
        .await?;
        Ok(())
    }

    /// The container's state (ContainerState as i32) and exit code.
    pub async fn container_state(&self, id: &str) -> R<(i32, i32)> {
        let req = ContainerStatusRequest {
            container_id: id.into(),
            verbose: false,
        };
        let st = self
            .call("ContainerStatus", |mut rt| async move {
                rt.container_status(req).await
            })
            .await?;
        let st = st.status.unwrap_or_default();
        Ok((st.state, st.exit_code))
    }

    /// The pod's addresses as PodSandboxStatus reports them (primary first).
    pub async fn pod_ips(&self, id: &str) -> R<Vec<String>> {
        let req = PodSandboxStatusRequest {
            pod_sandbox_id: id.into(),
            verbose: false,
        };
        let st = self
            .call("PodSandboxStatus", |mut rt| async move {
                rt.pod_sandbox_status(req).await
            })
            .await?;
        let net = st.status.and_then(|s| s.network).unwrap_or_default();
        let mut ips = vec![net.ip];
        ips.extend(net.additional_ips.into_iter().map(|i| i.ip));
        ips.retain(|i| !i.is_empty());
        Ok(ips)
    }

    pub async fn stop(&self, id: &str) -> R<()> {
        let req = StopPodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        self.call("StopPodSandbox", |mut rt| async move {
            rt.stop_pod_sandbox(req).await
        })
        .await?;
        Ok(())
    }

    pub async fn remove(&self, id: &str) -> R<()> {
        let req = RemovePodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        self.call("RemovePodSandbox", |mut rt| async move {
            rt.remove_pod_sandbox(req).await
        })
        .await?;
        Ok(())
    }

    /// Sandboxes with this metadata name (any state): (id, state).
    pub async fn find(&self, name: &str) -> R<Vec<(String, i32)>> {
        let req = ListPodSandboxRequest { filter: None };
        let l = self
            .call("ListPodSandbox", |mut rt| async move {
                rt.list_pod_sandbox(req).await
            })
            .await?;
        Ok(l.items
            .into_iter()
            .filter(|p| p.metadata.as_ref().is_some_and(|m| m.name == name))
            .map(|p| (p.id, p.state))
            .collect())
    }

    /// ExecSync in the pod's container: (exit code, stdout, stderr).
    pub async fn exec(&self, container: &str, cmd: &[&str]) -> R<(i32, String, String)> {
        let req = ExecSyncRequest {
            container_id: container.into(),
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            timeout: 10,
        };
        let r = self
            .call("ExecSync", |mut rt| async move { rt.exec_sync(req).await })
            .await?;
        let s = |b: Vec<u8>| String::from_utf8_lossy(&b).trim().to_string();
        Ok((r.exit_code, s(r.stdout), s(r.stderr)))
    }

    /// Wait until the runtime reports NetworkReady with network `name` loaded (after a
    /// conflist change containerd reloads conf_dir).
    pub async fn wait_network(&self, name: &str) -> R<()> {
        let mut last = String::new();
        for _ in 0..150 {
            let req = StatusRequest { verbose: true };
            let st = self
                .call("Status", |mut rt| async move { rt.status(req).await })
                .await?;
            let ready = st.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.r#type == "NetworkReady" && c.status)
            });
            let conf = st.info.get("cniconfig").cloned().unwrap_or_default();
            let loaded = serde_json::from_str::<serde_json::Value>(&conf)
                .ok()
                .is_some_and(|v| {
                    v["Networks"]
                        .as_array()
                        .is_some_and(|n| n.iter().any(|n| n["Config"]["Name"] == name))
                });
            if ready && loaded {
                return Ok(());
            }
            last = format!("NetworkReady={ready}, cniconfig={conf}");
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        Err(format!("network {name} not loaded after 15 s: {last}"))
    }
}

//! The container's shape: labels, name, mounts, limits, user and env, as the
//! create body the engine receives. Pure functions only, so the whole shape
//! is checked by unit tests without an engine.
//!
//! Must never: mount anything but the workspace (and the API socket when
//! given; a synced container: its two tmpfs volumes and nothing of the
//! host; a pooled one: its slot's two empty directories), give the
//! container a network or a writable root, keep a capability, or put into
//! the environment anything but the spec's own variables (no host variable
//! ever; a pooled container none at all: a run's come with each exec).

use std::collections::HashMap;
use std::path::Path;

use bollard::models::{
    ContainerCreateBody, HostConfig, Mount, MountBindOptions, MountBindOptionsPropagationEnum,
    MountType, MountVolumeOptions, MountVolumeOptionsDriverConfig,
};

use crate::sandbox::{
    SandboxLimits, SandboxSpec, CONTAINER_API_SOCKET, CONTAINER_WORKDIR, LABEL_INSTANCE,
    LABEL_KIND, LABEL_RUN, LABEL_SPACE, NOBODY,
};

/// Container command: it only keeps the container alive; tools run via exec.
pub(super) const KEEPALIVE_CMD: [&str; 2] = ["/bin/sleep", "infinity"];

/// How the run's working directory and API reach its container.
#[derive(Debug, Clone, Copy)]
pub(super) enum Reach<'a> {
    /// On this host's engine: the workspace (canonical) bound at
    /// [`CONTAINER_WORKDIR`], the API socket relay bound at its path.
    Bound {
        workspace: &'a Path,
        api_socket: Option<&'a Path>,
    },
    /// On an engine elsewhere: [`CONTAINER_WORKDIR`] a sized tmpfs volume of
    /// the container's own, filled and emptied through the archive API; the
    /// skills and the bridged API socket in a small volume at
    /// [`SYNCED_RUN_DIR`]. Nothing of this host is bound.
    Synced,
}

/// Where a synced container keeps its API socket and skills (a volume: the
/// archive API cannot write a tmpfs mount, and the root is read-only).
pub(super) const SYNCED_RUN_DIR: &str = "/run/mercury";

/// A synced container's run directory: the socket and the skills' files.
const SYNCED_RUN_BYTES: i64 = 64 << 20;

/// The create body of one run's container from `image`, running as `user`
/// (see `user::container_user`), its workspace and API reaching it as
/// `reach` says.
pub(super) fn create_body(
    image: &str,
    spec: &SandboxSpec,
    reach: Reach<'_>,
    user: String,
) -> ContainerCreateBody {
    let labels = HashMap::from([
        (LABEL_INSTANCE.to_string(), spec.instance_id.clone()),
        (LABEL_SPACE.to_string(), spec.space_id.clone()),
        (LABEL_RUN.to_string(), spec.run_id.clone()),
        (LABEL_KIND.to_string(), spec.kind.as_str().to_string()),
    ]);
    // `mounts` rather than `binds`: a bind string breaks on ':' in a path,
    // and a missing source is an error here instead of a fresh directory.
    let limits = &spec.limits;
    let mut mounts = Vec::new();
    match reach {
        Reach::Bound {
            workspace,
            api_socket,
        } => {
            mounts.push(bind_mount(workspace, CONTAINER_WORKDIR));
            if let Some(socket) = api_socket {
                mounts.push(bind_mount(socket, CONTAINER_API_SOCKET));
            }
            for (host, inside) in &spec.ro_binds {
                mounts.push(Mount {
                    read_only: Some(true),
                    ..bind_mount(host, inside)
                });
            }
        }
        Reach::Synced => {
            // Entries as the layer allows them, plus the root.
            let inodes = limits.workspace_entries.saturating_add(16);
            mounts.push(tmpfs_volume(
                CONTAINER_WORKDIR,
                &format!(
                    "size={},nr_inodes={inodes},uid={NOBODY},gid={NOBODY},mode=0755,nosuid,nodev",
                    limits.workspace_bytes
                ),
                &labels,
            ));
            mounts.push(tmpfs_volume(
                SYNCED_RUN_DIR,
                &format!(
                    "size={SYNCED_RUN_BYTES},uid={NOBODY},gid={NOBODY},mode=0755,nosuid,nodev,noexec"
                ),
                &labels,
            ));
        }
    }
    let env = spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    locked_down(image, labels, env, user, mounts, limits)
}

/// Label value of [`LABEL_KIND`] on a pooled container: it belongs to no
/// run, space or kind of run until a turn claims it, and then to that turn
/// alone.
pub(super) const KIND_WARM: &str = "warm";

/// The create body of one pooled (warm) container, made before any turn
/// claims it: the run's lockdown and limits, but no environment, no space
/// and no run. Its two mounts are per-slot host directories, empty until
/// the claim: `work` at [`CONTAINER_WORKDIR`] and `run` (read-only) at
/// [`SYNCED_RUN_DIR`], both `rslave`, so what the host mounts on them at
/// claim time (the turn's layer; the API socket's relay and the skills)
/// appears inside, and nothing the container does goes back.
pub(super) fn warm_body(
    image: &str,
    instance_id: &str,
    slot: &str,
    slot_dirs: (&Path, &Path),
    limits: &SandboxLimits,
    user: String,
) -> ContainerCreateBody {
    let labels = HashMap::from([
        (LABEL_INSTANCE.to_string(), instance_id.to_string()),
        // The sweep spares a container by its run label: the pool's slots
        // are named so until their container is gone.
        (LABEL_RUN.to_string(), slot.to_string()),
        (LABEL_KIND.to_string(), KIND_WARM.to_string()),
    ]);
    let (work, run) = slot_dirs;
    let slave = |m: Mount| Mount {
        bind_options: Some(MountBindOptions {
            propagation: Some(MountBindOptionsPropagationEnum::RSLAVE),
            ..Default::default()
        }),
        ..m
    };
    let mounts = vec![
        slave(bind_mount(work, CONTAINER_WORKDIR)),
        slave(Mount {
            read_only: Some(true),
            ..bind_mount(run, SYNCED_RUN_DIR)
        }),
    ];
    locked_down(image, labels, Vec::new(), user, mounts, limits)
}

/// What every container of a run shares, pooled or not: the keep-alive
/// command, no network, a read-only root, no capability, no new
/// privileges, the limits and a sized `/tmp`.
fn locked_down(
    image: &str,
    labels: HashMap<String, String>,
    env: Vec<String>,
    user: String,
    mounts: Vec<Mount>,
    limits: &SandboxLimits,
) -> ContainerCreateBody {
    ContainerCreateBody {
        image: Some(image.to_string()),
        cmd: Some(
            KEEPALIVE_CMD
                .iter()
                .map(std::string::ToString::to_string)
                .collect(),
        ),
        labels: Some(labels),
        env: Some(env),
        user: Some(user),
        working_dir: Some(CONTAINER_WORKDIR.to_string()),
        tty: Some(false),
        host_config: Some(HostConfig {
            mounts: Some(mounts),
            network_mode: Some("none".into()),
            memory: Some(limits.memory_bytes),
            // Equal to memory: no swap on top of the memory limit.
            memory_swap: Some(limits.memory_bytes),
            nano_cpus: Some(limits.nano_cpus),
            pids_limit: Some(limits.pids),
            readonly_rootfs: Some(true),
            tmpfs: Some(HashMap::from([(
                "/tmp".to_string(),
                format!("rw,nosuid,nodev,noexec,size={},mode=1777", limits.tmp_bytes),
            )])),
            cap_drop: Some(vec!["ALL".into()]),
            security_opt: Some(vec!["no-new-privileges".into()]),
            // Kept until `close` so a failed run can still be inspected
            // and so removal is ours, not a race with the engine.
            auto_remove: Some(false),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// An anonymous volume of the engine's `local` driver backed by a tmpfs:
/// sized, removed with the container (`v=true`), and readable and writable
/// through the archive API, which a plain tmpfs mount is not.
fn tmpfs_volume(target: &str, options: &str, labels: &HashMap<String, String>) -> Mount {
    Mount {
        target: Some(target.to_string()),
        typ: Some(MountType::VOLUME),
        read_only: Some(false),
        volume_options: Some(MountVolumeOptions {
            labels: Some(labels.clone()),
            driver_config: Some(MountVolumeOptionsDriverConfig {
                name: Some("local".into()),
                options: Some(HashMap::from([
                    ("type".to_string(), "tmpfs".to_string()),
                    ("device".to_string(), "tmpfs".to_string()),
                    ("o".to_string(), options.to_string()),
                ])),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn bind_mount(source: &Path, target: &str) -> Mount {
    Mount {
        target: Some(target.to_string()),
        source: Some(source.display().to_string()),
        typ: Some(MountType::BIND),
        read_only: Some(false),
        ..Default::default()
    }
}

/// `mercury-<first 8 of instance id>-<run id>`, with characters Docker does
/// not allow in names replaced by `-`.
pub(super) fn container_name(instance_id: &str, run_id: &str) -> String {
    let short: String = instance_id.chars().take(8).collect();
    format!("mercury-{short}-{run_id}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use serde_json::json;

    use super::*;
    use crate::sandbox::{ApiEndpoint, RunKind, SandboxLimits, WorkspaceMount};

    const MIB: i64 = 1 << 20;

    fn spec(api_socket: Option<PathBuf>) -> SandboxSpec {
        SandboxSpec {
            instance_id: "0123456789abcdef".into(),
            space_id: "space-1".into(),
            run_id: "r-1".into(),
            kind: RunKind::Ask,
            workspace: WorkspaceMount::HostPath(PathBuf::from("/data/spaces/space-1/live")),
            api: api_socket.map(ApiEndpoint::UnixSocket),
            ro_binds: Vec::new(),
            env: vec![
                ("MERCURY_RUN_TOKEN".into(), "tok-123".into()),
                ("MERCURY_SPACE".into(), "space-1".into()),
            ],
            limits: SandboxLimits {
                memory_bytes: 128 * MIB,
                nano_cpus: 500_000_000,
                pids: 64,
                tmp_bytes: 8 * MIB,
                workspace_bytes: 100 * MIB,
                workspace_entries: 1000,
                workspace_depth: 8,
            },
        }
    }

    fn body(api_socket: Option<PathBuf>) -> ContainerCreateBody {
        let spec = spec(api_socket);
        let socket = spec.api.as_ref().map(ApiEndpoint::socket);
        create_body(
            "mercury-agent:test",
            &spec,
            Reach::Bound {
                workspace: Path::new("/canonical/workspace"),
                api_socket: socket,
            },
            "1000:1000".into(),
        )
    }

    fn host(body: &ContainerCreateBody) -> &HostConfig {
        body.host_config.as_ref().expect("a host config")
    }

    /// The whole body as the engine receives it: any field added, dropped
    /// or changed shows up here.
    #[test]
    fn the_create_body_on_the_wire_is_exactly_this() {
        let wire = serde_json::to_value(body(Some("/run/host/api.sock".into()))).expect("json");
        assert_eq!(
            wire,
            json!({
                "Image": "mercury-agent:test",
                "Cmd": ["/bin/sleep", "infinity"],
                "Labels": {
                    "mercury.instance": "0123456789abcdef",
                    "mercury.space": "space-1",
                    "mercury.run": "r-1",
                    "mercury.kind": "ask",
                },
                "Env": ["MERCURY_RUN_TOKEN=tok-123", "MERCURY_SPACE=space-1"],
                "User": "1000:1000",
                "WorkingDir": "/work",
                "Tty": false,
                "HostConfig": {
                    "Mounts": [
                        {
                            "Target": "/work",
                            "Source": "/canonical/workspace",
                            "Type": "bind",
                            "ReadOnly": false,
                        },
                        {
                            "Target": "/run/mercury/api.sock",
                            "Source": "/run/host/api.sock",
                            "Type": "bind",
                            "ReadOnly": false,
                        },
                    ],
                    "NetworkMode": "none",
                    "Memory": 128 * MIB,
                    "MemorySwap": 128 * MIB,
                    "NanoCpus": 500_000_000,
                    "PidsLimit": 64,
                    "ReadonlyRootfs": true,
                    "Tmpfs": {
                        "/tmp": format!("rw,nosuid,nodev,noexec,size={},mode=1777", 8 * MIB),
                    },
                    "CapDrop": ["ALL"],
                    "SecurityOpt": ["no-new-privileges"],
                    "AutoRemove": false,
                },
            })
        );
    }

    #[test]
    fn no_network_a_read_only_root_no_capabilities_and_no_new_privileges() {
        let body = body(None);
        let host = host(&body);
        assert_eq!(host.network_mode.as_deref(), Some("none"));
        assert_eq!(host.readonly_rootfs, Some(true));
        assert_eq!(host.cap_drop, Some(vec!["ALL".to_string()]));
        assert_eq!(host.cap_add, None);
        assert_eq!(host.privileged, None);
        assert_eq!(
            host.security_opt,
            Some(vec!["no-new-privileges".to_string()])
        );
        assert_eq!(host.auto_remove, Some(false));
    }

    #[test]
    fn tmp_is_the_only_tmpfs_noexec_nosuid_nodev_and_of_the_limit_size() {
        let body = body(None);
        let tmpfs = host(&body).tmpfs.clone().expect("tmpfs");
        assert_eq!(tmpfs.len(), 1, "{tmpfs:?}");
        let options: Vec<&str> = tmpfs["/tmp"].split(',').collect();
        assert_eq!(
            options,
            vec![
                "rw",
                "nosuid",
                "nodev",
                "noexec",
                "size=8388608",
                "mode=1777"
            ]
        );
    }

    #[test]
    fn the_limits_are_the_specs_and_swap_adds_nothing() {
        let body = body(None);
        let host = host(&body);
        assert_eq!(host.memory, Some(128 * MIB));
        assert_eq!(host.memory_swap, host.memory);
        assert_eq!(host.nano_cpus, Some(500_000_000));
        assert_eq!(host.pids_limit, Some(64));
    }

    fn mounts(body: &ContainerCreateBody) -> Vec<(String, String, bool)> {
        let host = host(body);
        assert_eq!(host.binds, None, "binds break on ':' in a path");
        assert_eq!(host.volumes_from, None);
        assert_eq!(body.volumes, None);
        host.mounts
            .clone()
            .expect("mounts")
            .into_iter()
            .map(|m| {
                assert_eq!(m.typ, Some(MountType::BIND));
                (
                    m.target.expect("target"),
                    m.source.expect("source"),
                    m.read_only.expect("read_only set"),
                )
            })
            .collect()
    }

    #[test]
    fn exactly_two_mounts_with_a_socket_the_workspace_and_the_socket() {
        assert_eq!(
            mounts(&body(Some("/run/host/api.sock".into()))),
            vec![
                ("/work".into(), "/canonical/workspace".into(), false),
                (
                    "/run/mercury/api.sock".into(),
                    "/run/host/api.sock".into(),
                    false
                ),
            ]
        );
    }

    #[test]
    fn exactly_one_mount_without_a_socket_the_workspace() {
        assert_eq!(
            mounts(&body(None)),
            vec![("/work".into(), "/canonical/workspace".into(), false)]
        );
    }

    #[test]
    fn a_synced_container_binds_nothing_of_the_host_and_its_work_is_a_sized_volume() {
        let mut spec = spec(Some("/run/host/api.sock".into()));
        spec.ro_binds = vec![("/srv/ext/skills".into(), "/run/mercury/skills/x".into())];
        let body = create_body(
            "mercury-agent:test",
            &spec,
            Reach::Synced,
            "65534:65534".into(),
        );
        let wire = serde_json::to_string(&body).expect("json");
        for host_path in ["/data/spaces", "/run/host", "/srv/ext"] {
            assert!(!wire.contains(host_path), "{host_path} in {wire}");
        }
        let mounts = host(&body).mounts.clone().expect("mounts");
        let targets: Vec<_> = mounts.iter().map(|m| m.target.clone().unwrap()).collect();
        assert_eq!(targets, vec!["/work", "/run/mercury"]);
        for m in &mounts {
            assert_eq!(m.typ, Some(MountType::VOLUME));
            assert_eq!(m.source, None, "anonymous: removed with the container");
            let driver = m.volume_options.clone().unwrap().driver_config.unwrap();
            let opts = driver.options.unwrap();
            assert_eq!(opts["type"], "tmpfs");
            assert!(opts["o"].contains("nosuid,nodev"), "{opts:?}");
        }
        let work = mounts[0]
            .volume_options
            .clone()
            .unwrap()
            .driver_config
            .unwrap();
        assert!(
            work.options.unwrap()["o"].starts_with(&format!("size={},nr_inodes=1016,", 100 * MIB)),
            "the workspace quota and entry limit"
        );
        assert_eq!(host(&body).network_mode.as_deref(), Some("none"));
    }

    #[test]
    fn the_env_is_exactly_the_specs_variables_and_nothing_from_the_host() {
        // Set in the test process: the body must not pick it up.
        assert!(std::env::var_os("PATH").is_some());
        let body = body(None);
        let env = body.env.clone().expect("env");
        let keys: Vec<&str> = env
            .iter()
            .map(|kv| kv.split_once('=').expect("key=value").0)
            .collect();
        assert_eq!(keys, vec!["MERCURY_RUN_TOKEN", "MERCURY_SPACE"]);
        assert_eq!(
            env,
            vec!["MERCURY_RUN_TOKEN=tok-123", "MERCURY_SPACE=space-1"]
        );
    }

    #[test]
    fn the_labels_tie_the_container_to_instance_space_run_and_kind() {
        let labels = body(None).labels.expect("labels");
        assert_eq!(
            labels,
            HashMap::from([
                (LABEL_INSTANCE.to_string(), "0123456789abcdef".to_string()),
                (LABEL_SPACE.to_string(), "space-1".to_string()),
                (LABEL_RUN.to_string(), "r-1".to_string()),
                (LABEL_KIND.to_string(), "ask".to_string()),
            ])
        );
    }

    #[test]
    fn the_user_workdir_and_command_are_as_given() {
        let body = body(None);
        assert_eq!(body.user.as_deref(), Some("1000:1000"));
        assert_eq!(body.working_dir.as_deref(), Some("/work"));
        assert_eq!(body.image.as_deref(), Some("mercury-agent:test"));
        assert_eq!(
            body.cmd,
            Some(vec!["/bin/sleep".to_string(), "infinity".to_string()])
        );
        assert_eq!(body.tty, Some(false));
    }

    #[test]
    fn a_pooled_container_has_the_same_lockdown_no_env_and_only_its_slots_two_slave_mounts() {
        let spec = spec(None);
        let warm = warm_body(
            "mercury-agent:test",
            &spec.instance_id,
            "warm-abc",
            (Path::new("/pool/1/work"), Path::new("/pool/1/run")),
            &spec.limits,
            "65534:65534".into(),
        );
        let cold = body(None);
        assert_eq!(
            warm.env,
            Some(Vec::new()),
            "a run's env comes with each exec"
        );
        assert_eq!(
            warm.labels,
            Some(HashMap::from([
                (LABEL_INSTANCE.to_string(), "0123456789abcdef".to_string()),
                (LABEL_RUN.to_string(), "warm-abc".to_string()),
                (LABEL_KIND.to_string(), "warm".to_string()),
            ]))
        );
        let (mut warm_host, mut cold_host) = (host(&warm).clone(), host(&cold).clone());
        let mounts = warm_host.mounts.take().expect("mounts");
        cold_host.mounts = None;
        assert_eq!(
            warm_host, cold_host,
            "the lockdown and limits are the run's"
        );
        let wire = serde_json::to_value(&mounts).expect("json");
        assert_eq!(
            wire,
            json!([
                {"Target": "/work", "Source": "/pool/1/work", "Type": "bind", "ReadOnly": false,
                 "BindOptions": {"Propagation": "rslave"}},
                {"Target": "/run/mercury", "Source": "/pool/1/run", "Type": "bind", "ReadOnly": true,
                 "BindOptions": {"Propagation": "rslave"}},
            ])
        );
        assert_eq!((warm.cmd, warm.working_dir), (cold.cmd, cold.working_dir));
    }

    #[test]
    fn container_name_uses_short_instance_and_run_and_only_legal_characters() {
        assert_eq!(
            container_name("0123456789abcdef", "run-1"),
            "mercury-01234567-run-1"
        );
        assert_eq!(container_name("abc", "r/1 x"), "mercury-abc-r-1-x");
    }
}

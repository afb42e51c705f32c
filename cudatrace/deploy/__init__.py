"""The operator's surface: containers, Kubernetes and Slurm, budgets a container or a job gets
without running `cudatrace run` itself (docs/containers.md, docs/kubernetes.md, docs/slurm.md;
docs/ARCHITECTURE.md, "The deployment floor").

The floor of the deployment code, above record/ and present/: it hands containers the same
environment contract the preload library already reads ("Budgets without the launcher",
docs/budgets.md) and keeps a node's side of it.

    plan       the budgets a node offers (sizes, named groups from a small config) and the
               edits a fenced container gets: the preload library, its ledger directory, the
               environment
    install    the preload library installed where specs point: versioned, atomic
    cdi        Container Device Interface specs whose devices are budgets (`cudatrace cdi`)
    procscan   the processes of a node that map a ledger, seen from the host: host pid, pid in
               their namespace, container, the Kubernetes names their environment claims
    identity   who a process is: its cgroup's container and pod, confirmed by the API server
    enforce    `cudatrace node --enforce`: a process in breach stopped (SIGTERM, then SIGKILL)
    agent      `cudatrace node`: ledger directories, contexts of members in other pid
               namespaces (NVML reports host pids), denials, the watch (NVML against the
               ledgers), metrics with container and GPU labels
    kube       the Kubernetes API as the node agent and the DRA plugin use it (Events,
               ResourceClaims, ResourceSlices, token and access reviews), over HTTPS; answers
               read as anything, retryable errors tried again
    httpserver the services' one HTTP(S) server: handshakes on an event loop, deadlines, a
               bound on connections, every unreadable request answered
    webhook    the mutating admission webhook (`cudatrace webhook`): pod annotation -> JSONPatch
    admission  what `cudatrace webhook` serves: reviews read step by step, each failure
               answered with its reason (--on-error)
    dra        the DRA kubelet plugin (`cudatrace dra-plugin`): the node's GPUs as a
               ResourceSlice, a claim's consumed memory as its containers' budget (a CDI spec
               per claim)
    dra_grpc   its gRPC services on unix sockets (the kubelet's DRA and plugin registration
               APIs: dra.proto, pluginregistration.proto) and their client
    manifests  Kubernetes manifests (the DRA driver's too), the systemd unit
    tls        the services' TLS material: a CA and its certificates, renewed and rotated;
               served pairs read again when their files change
    objects    the Kubernetes and CDI objects written and read, as TypedDicts
    manifest_objects  the other objects the manifests deploy, as TypedDicts
    slurm      a Slurm job's share of its GPU's group: the record `slurm-prolog` seals,
               `slurm-epilog` removes, the environment `slurm-taskprolog` prints

May import the ground, the leaves, record/ and present/; nothing below imports it.
"""

# Enterprise Gateway 3.x running kernel-queue's process proxy: an example to copy and adapt.
#
#   pip install "kernel-queue[enterprise-gateway]"        # in EG's own environment
#   jupyter kernel-queue install --gateway enterprise-gateway --backend kubernetes \
#       --image <image with Python and ipykernel<7> --queue user-queue --gpus 1 --sys-prefix
#   jupyter enterprisegateway --config=enterprise_gateway_config.py
#
# The tests start EG with this file (tests/gateway/test_enterprise_gateway.py).
c = get_config()  # noqa: F821 - provided by traitlets when it loads this file

# -- Where kernels run --------------------------------------------------------------------------
# The kubernetes backend, as for jupyter_server: in-cluster credentials, else $KUBECONFIG.
# c.KubernetesBackend.kubeconfig = "/etc/kernel-queue/kubeconfig"
c.KubernetesBackend.namespace = "jupyter-kernels"  # kernels whose kernelspec names none
# Kernelspec keys can be defaulted for every kernelspec here (kernel.json wins):
# c.KernelOptions.startup_timeout = 600.0

# -- Timeouts: a queued kernel's POST /api/kernels lasts the whole queue wait -------------------
# EG_KERNEL_LAUNCH_TIMEOUT (default 30 s) does NOT bound the queue wait of kernel-queue's
# kernels. The wait ends at the kernelspec's `admission_timeout` or, when that is 0, at the
# KERNEL_LAUNCH_TIMEOUT the client sends (jupyter_server sends GatewayClient.request_timeout
# minus 2 s): the client then gets a 503 naming the timeout to raise, and the kernel leaves the
# queue. So raise the notebook server's GatewayClient.request_timeout (see
# jupyter_server_gateway_config.py) and every proxy's read timeout above the longest queue wait
# you accept; nothing to raise here.

# -- Who may start kernels ----------------------------------------------------------------------
# KERNEL_USERNAME from the client labels the pods (kernel-queue.dev/user). EG refuses 'root'.
c.EnterpriseGatewayApp.unauthorized_users = {"root"}
# Client env: EG forwards KERNEL_* into the launch, but kernel-queue never copies it into pods
# (only the kernelspec's env): per-launch queue or GPU choices need one kernelspec each.
c.EnterpriseGatewayApp.client_envs = []

# -- Culling --------------------------------------------------------------------------------------
# Idle kernels are culled by EG. A kernel waiting for its first admission is not in EG's list yet;
# one preempted and waiting to come back keeps its last_activity fresh: neither is culled.
c.RemoteMappingKernelManager.cull_idle_timeout = 43200  # 12 h
c.RemoteMappingKernelManager.cull_interval = 300
c.RemoteMappingKernelManager.cull_connected = False

# -- Persistence: a restarted EG reattaches to running kernels ------------------------------------
# Kernels are recorded once started (a kernel still queued when EG dies is not), in
# $EG_PERSISTENCE_ROOT (default: the Jupyter data dir)/kernel_sessions. 'standalone' revives them
# when EG starts; a kernel whose pod group is gone is reported dead at the first poll.
c.KernelSessionManager.enable_persistence = True
c.EnterpriseGatewayApp.availability_mode = "standalone"

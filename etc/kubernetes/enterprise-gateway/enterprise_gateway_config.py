# Enterprise Gateway 3.x in the cluster, running kernel-queue's process proxy (mounted from the
# ConfigMap enterprise-gateway-config). The same settings as the commented example
# etc/jupyter/enterprise_gateway_config.py, which explains each (a test keeps the two alike),
# except where kernels go: the gateway pod's own namespace, where this recipe's Role is (the
# backend's default; in-cluster credentials, the pod's service account `kernel-queue`).
c = get_config()  # noqa: F821 - provided by traitlets when it loads this file

c.EnterpriseGatewayApp.unauthorized_users = {"root"}
c.EnterpriseGatewayApp.client_envs = []
c.RemoteMappingKernelManager.cull_idle_timeout = 43200  # 12 h
c.RemoteMappingKernelManager.cull_interval = 300
c.RemoteMappingKernelManager.cull_connected = False
c.KernelSessionManager.enable_persistence = True  # in $EG_PERSISTENCE_ROOT/kernel_sessions
c.EnterpriseGatewayApp.availability_mode = "standalone"

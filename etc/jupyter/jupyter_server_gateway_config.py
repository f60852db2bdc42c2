# A notebook server (JupyterLab) in front of a gateway that runs kernel-queue's kernels: an
# example to copy and adapt (`jupyter lab --config=jupyter_server_gateway_config.py`).
c = get_config()  # noqa: F821 - provided by traitlets when it loads this file

c.GatewayClient.url = "http://enterprise-gateway.jupyter.svc:8888"  # or --gateway-url

# A gateway answers POST /api/kernels once the kernel runs, after its queue wait. Wait longer
# than the longest queue wait you accept plus the kernel's start (here one hour). jupyter_server
# then sends KERNEL_LAUNCH_TIMEOUT = request_timeout - launch_timeout_pad (2 s) to the gateway,
# which kernel-queue uses as the queue deadline when the kernelspec sets no admission_timeout.
c.GatewayClient.request_timeout = 3600.0
# Reverse proxies and ingresses between JupyterLab, this server and the gateway must allow as
# long (nginx/ingress-nginx: proxy-read-timeout; OpenShift routes: the
# haproxy.router.openshift.io/timeout annotation).

# Culling happens in the gateway (see enterprise_gateway_config.py), not here.
